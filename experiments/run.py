#!/usr/bin/env python3
"""The end-to-end comparison of schedulers on the emulated network.

    sudo python experiments/run.py --topo campus                 # the default scenario
    sudo python experiments/run.py --quick                       # a small one (CI)
    sudo python experiments/run.py --schedulers ces-ppo,k8s-spread --seeds 3 --out results/e2e
    sudo python experiments/run.py --jobs workloads/jobs/ring-cnn.yaml
    sudo python experiments/run.py --cleanup [--prefix cesXXXX]  # remove what a killed run left

Once: build the testbed (`testbed.Emulation`, switches connected to the SDN app), start the SDN
app, the Master and one edge agent per compute node (real processes), and the scenario's
background traffic. Then per scheduler and seed: submit the scenario's jobs to the Master, follow
them live (jobs, accuracy, link utilisation), collect what the workers measured, and wait until
the testbed is idle again. Finally tear everything down and write DIR/results.json,
DIR/results.csv, DIR/summary.md and the PNG figures (each re-made by experiments/plots.py from
the JSON). Logs of every process are in DIR/logs/, the workers' metric lines in DIR/agents/.

Exit codes: 0 done, 1 the testbed failed, 2 bad input (topology, jobs, scenario, schedulers;
nothing is created), 130 interrupted (torn down).
"""
from __future__ import annotations

import _venv  # noqa: F401  (re-exec under .venv)

import argparse
import json
import logging
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml
from docker.errors import DockerException
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from scheduler.baselines import make_algorithm
from scheduler.evaluate import machine_info
from scheduler.jobs import JobError, load_jobs, parse_job
from scheduler.multi import default_algorithm, make_policy
from scheduler.service.client import MasterClient, job_documents
from scheduler.service.http import ApiError, Unreachable
from scheduler.service.scheduling import QUEUES
from sdn_app.client import FlowRequest, SdnClient, SdnError
from testbed import Emulation, EmulationError, cleanup, detect_datapath
from testbed.image import worker_image_tag
from testbed.names import check_prefix, new_prefix
from topologies import Topology, TopologyError, load_topology
from workloads.metrics import busy_rate_mbps, wire_rate_mbps

import plots
import report

log = logging.getLogger("run")
HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SCENARIOS = HERE / "scenarios"
TERMINAL = ("finished", "failed", "cancelled")


# --- the scenario ------------------------------------------------------------------------------
class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the field and what was expected."""


@dataclass(frozen=True)
class Background:
    src: str
    dst: str
    mbps: float
    path: tuple[str, ...] = ()  # switches; empty: the SDN app's default forwarding


@dataclass
class Scenario:
    name: str
    source: str
    topology: str
    schedulers: list[str]
    seeds: int
    timeout_s: float
    jobs: list[tuple[str, dict]]  # (source, job mapping as in a job YAML)
    background: list[Background] = field(default_factory=list)
    description: str = ""


SCENARIO_KEYS = {"name", "description", "topology", "schedulers", "seeds", "timeout_s",
                 "background", "jobs"}


def load_scenario(path: Path) -> Scenario:
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ScenarioError(f"{where}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{where}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a mapping with {', '.join(sorted(SCENARIO_KEYS))}")

    def bad(field_: str, expected: str) -> ScenarioError:
        got = doc.get(field_.split(".")[0].split("[")[0], None)
        return ScenarioError(f"{where}: field '{field_}': expected {expected}, got {got!r}")

    unknown = sorted(set(doc) - SCENARIO_KEYS)
    if unknown:
        raise bad(unknown[0], f"one of the known keys ({', '.join(sorted(SCENARIO_KEYS))})")
    if not isinstance(doc.get("name"), str):
        raise bad("name", "a string")
    schedulers = doc.get("schedulers")
    if not isinstance(schedulers, list) or not schedulers or \
            not all(isinstance(s, str) for s in schedulers):
        raise bad("schedulers", "a non-empty list of scheduler names")
    seeds, timeout = doc.get("seeds", 1), doc.get("timeout_s", 600)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise bad("seeds", "an integer >= 1")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise bad("timeout_s", "a number of seconds > 0")
    jobs = doc.get("jobs")
    if isinstance(jobs, str):
        jobs_path = (path.parent / jobs).resolve()
        try:
            docs = job_documents(jobs_path)
        except JobError as e:
            raise ScenarioError(f"{where}: field 'jobs': {e}") from None
    elif isinstance(jobs, list) and jobs:
        docs = [(where, j) for j in jobs]
        for i, j in enumerate(jobs):
            try:
                parse_job(j, where, i)
            except JobError as e:
                raise ScenarioError(str(e)) from None
    else:
        raise bad("jobs", "a non-empty list of jobs or the path of a job file/folder")
    background = []
    for i, b in enumerate(doc.get("background") or []):
        f = f"background[{i}]"
        if not isinstance(b, dict) or set(b) - {"src", "dst", "mbps", "path"} or \
                not isinstance(b.get("src"), str) or not isinstance(b.get("dst"), str) or \
                not isinstance(b.get("mbps"), (int, float)) or b["mbps"] <= 0 or \
                not isinstance(b.get("path", []), list):
            raise ScenarioError(f"{where}: field '{f}': expected {{src: NODE, dst: NODE, mbps: "
                                f"RATE > 0, path: [SWITCH, ...] (optional)}}, got {b!r}")
        background.append(Background(b["src"], b["dst"], float(b["mbps"]),
                                     tuple(b.get("path", []))))
    return Scenario(doc["name"], where, str(doc.get("topology", "campus")), list(schedulers),
                    seeds, float(timeout), docs, background, str(doc.get("description", "")))


@dataclass
class Plan:
    """Everything a run needs, checked before anything is created."""
    scenario: Scenario
    topo: Topology
    schedulers: list[str]
    seeds: int
    out: Path
    warnings: list[str] = field(default_factory=list)


def plan(args: argparse.Namespace) -> Plan:
    """Resolve and check every input; any problem is a ScenarioError/TopologyError/JobError."""
    scenario = load_scenario(Path(args.scenario) if args.scenario
                             else SCENARIOS / ("quick.yaml" if args.quick else "default.yaml"))
    seeds = scenario.seeds if args.seeds is None else args.seeds
    if seeds < 1:
        raise ScenarioError(f"--seeds: expected an integer >= 1, got {seeds}")
    topo = load_topology(args.topo or scenario.topology)
    if args.jobs:
        load_jobs(args.jobs)
        scenario.jobs = job_documents(args.jobs)
    names = [parse_job(d, src).name for src, d in scenario.jobs]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{scenario.source}: job names must be unique, got {names}")
    schedulers = args.schedulers.split(",") if args.schedulers else scenario.schedulers
    for name in schedulers:
        try:
            make_policy(name) if name in QUEUES else make_algorithm(name, seed=0)
        except (OSError, ValueError, RuntimeError) as e:
            raise ScenarioError(f"--schedulers: '{name}' cannot be used: {e}") from None
    nodes = {n.name for n in topo.nodes}
    switches = {s.name for s in topo.switches}
    warnings, background = [], []
    for b in scenario.background:
        missing = [v for v in (b.src, b.dst) if v not in nodes] + \
                  [v for v in b.path if v not in switches]
        if missing:
            warnings.append(f"background {b.src}->{b.dst} skipped: {', '.join(missing)} not in "
                            f"topology {topo.name}")
        else:
            background.append(b)
    scenario.background = background
    out = Path(args.out or REPO / "results" / "e2e" / (scenario.name + "-" + topo.name))
    return Plan(scenario, topo, schedulers, seeds, out, warnings)


# --- the testbed stack -------------------------------------------------------------------------
class RunError(RuntimeError):
    """The testbed broke (a component did not start, the network does not connect)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """SDN app + emulated network + Master + one agent per node + background traffic, brought up
    in that order and torn down in reverse on exit, exception, Ctrl-C or SIGTERM."""

    def __init__(self, topo: Topology, prefix: str, out: Path, console: Console):
        self.topo, self.prefix, self.out, self.console = topo, prefix, out, console
        self.logs = out / "logs"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.net: Emulation | None = None
        self.sdn: SdnClient | None = None
        self.master: MasterClient | None = None
        self.timings: dict[str, float] = {}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        logf = (self.logs / f"{name}.log").open("w")
        # A session of its own: Ctrl-C reaches only us, and we stop children in order.
        p = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.procs.append((name, p))
        return p

    def _check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                raise RunError(f"{name} exited with code {p.returncode} (see "
                               f"{self.logs / (name + '.log')})")

    def __enter__(self) -> Stack:
        try:
            self._up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _up(self) -> None:
        t0 = time.monotonic()
        image = worker_image_tag()
        topo_arg = self.topo.source or self.topo.name
        of_port, rest_port, master_port = free_port(), free_port(), free_port()
        self.console.print(f"[bold]bring-up[/] {self.topo.name} (prefix {self.prefix})")
        self._spawn("sdn_app", ["-m", "sdn_app", "--topo", topo_arg, "--of-port", str(of_port),
                                "--of-host", "127.0.0.1", "--rest", f"127.0.0.1:{rest_port}"])
        self.sdn = SdnClient(f"http://127.0.0.1:{rest_port}")
        self.net = Emulation(self.topo, prefix=self.prefix, controller=("127.0.0.1", of_port),
                             image=image)
        self.net.__enter__()
        try:
            self.sdn.wait_ready(timeout_s=60)
        except SdnError as e:
            self._check_alive()
            raise RunError(f"the SDN app did not get every switch: {e.message}") from None
        loss = self.net.ping_all(timeout_s=1.0)
        if loss > 0:
            raise RunError(f"{loss:.0%} of pings lost with no job scheduled")
        self._spawn("master", ["-m", "scheduler.service", "serve", "--topo", topo_arg,
                               "--port", str(master_port), "--sdn", self.sdn.url,
                               "--sdn-job-id", f"{self.prefix}-jobs", "--image", image])
        self.master = MasterClient(f"http://127.0.0.1:{master_port}")
        for n in self.topo.nodes:
            self._spawn(f"agent-{n.name}", [
                "-m", "testbed.agent", "--node", n.name, "--master", self.master.url,
                "--node-container", self.net.node_container_name(n.name),
                "--workdir", str(self.out / "agents" / n.name)])
        try:
            self.master.wait_ready(len(self.topo.nodes), timeout_s=60)
        except TimeoutError as e:
            self._check_alive()
            raise RunError(str(e)) from None
        self.timings["up_s"] = time.monotonic() - t0
        self.console.print(f"  up in {self.timings['up_s']:.1f} s: {len(self.topo.switches)} "
                           f"switches on the SDN app, {len(self.topo.nodes)} agents on the Master")

    def start_background(self, flows: list[Background]) -> list[dict]:
        """Cordon each flow's endpoints (another tenant's machines), pin its path if given, and
        start a paced iperf3 TCP transfer (server and client as containers in the nodes'
        namespaces) that runs until teardown; return once the switches see it flowing."""
        started = []
        for i, b in enumerate(flows):
            dst = self.topo.node(b.dst)
            for node in (b.src, b.dst):
                self.master.set_schedulable(node, False)
            if b.path:
                # The tenant's own route; its meter only guards against a runaway sender.
                self.sdn.put_job_flows(f"{self.prefix}-bg{i}", [
                    FlowRequest(b.src, b.dst, list(b.path), round(b.mbps * 1.2, 3))])
            port = 5201 + i
            self.net.start_worker(b.dst, f"bg{i}-server", ["iperf3", "-s", "-p", str(port)],
                                  cpu=0.5, mem_mb=64)
            _poll(lambda: self.net.exec(b.dst, f"ss -ltn | grep -q ':{port} '")[0] == 0, 15,
                  f"background: the iperf3 server on {b.dst} does not listen")
            self.net.start_worker(b.src, f"bg{i}-client",
                                  ["iperf3", "-c", dst.ip, "-p", str(port), "-t", "86400",
                                   "-b", f"{b.mbps:g}M"], cpu=0.5, mem_mb=64)
            first_hop = b.path[0] if b.path else self.topo.access_link(b.src).other(b.src)
            _poll(lambda: any(lk.src == b.src and lk.dst == first_hop and
                              (lk.mbps or 0) >= 0.5 * b.mbps for lk in self.sdn.links()), 20,
                  f"background {b.src}->{b.dst}: no traffic seen on {b.src}->{first_hop}")
            started.append({**asdict(b), "path": list(b.path)})
        return started

    def __exit__(self, *exc: object) -> None:
        t0 = time.monotonic()
        for name, p in reversed(self.procs):  # agents, then the Master, then the SDN app
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop: killing it", name)
                p.kill()
                p.wait()
        self.procs.clear()
        if self.net is not None:
            self.net.__exit__(None, None, None)
            self.net = None
        self.timings["down_s"] = time.monotonic() - t0


def _poll(ok: Callable[[], bool], timeout_s: float, error: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not ok():
        if time.monotonic() > deadline:
            raise RunError(error)
        time.sleep(0.3)


# --- one run: one scheduler, one seed ----------------------------------------------------------
def measured_mbps(records: list[dict], outgoing: int) -> float | None:
    """Goodput of a sender's inter-node flow while its collective runs: the median over
    iterations of payload bytes sent / collective time, split evenly over its `outgoing`
    inter-node flows. Application payload only (no TCP/IP headers), and the collective's waits
    for its slowest flow count as time: a lower bound of what the network delivered."""
    rates = [r["payload_tx_bytes"] * 8 / r["comm_s"] / 1e6 for r in records
             if r.get("type") == "iter" and r.get("comm_s", 0) > 0 and r.get("payload_tx_bytes")]
    rates = rates[2:] if len(rates) > 4 else rates  # the first iterations include warm-up
    return round(statistics.median(rates) / max(outgoing, 1), 3) if rates else None


def tcp_view(sender: list[dict], receiver: list[dict]) -> dict:
    """The network's view of one flow, from the kernel counters the sender's last record (its
    end, or its last evaluation if it was stopped) has of its connection to the receiver's
    address (`workloads.metrics.tcp_send_counters`):
    `tcp_mbps` (goodput while the socket had data to send: what the shaping and the switches
    delivered, application pauses excluded), `wire_mbps` (the same time's bytes on the wire,
    headers and retransmissions included: what the grant limits), the retransmitted share and
    the share of busy time the receiver's window held it back."""
    def last(records: list[dict]) -> dict:  # end, or the last evaluation of a stopped task
        return next((r["tcp"] for r in reversed(records) if "tcp" in r), {})
    c = last(sender).get("peers", {}).get(last(receiver).get("address"))
    if not c or not c.get("busy_us"):
        return {"tcp_mbps": None, "wire_mbps": None}
    return {"tcp_mbps": busy_rate_mbps(c), "wire_mbps": wire_rate_mbps(c),
            "tcp_retrans_share": round(c.get("bytes_retrans", 0) / max(c["bytes_acked"], 1), 5),
            "tcp_rwnd_limited_share": round(c.get("rwnd_limited_us", 0) / c["busy_us"], 4)}


def job_row(scheduler: str, seed: int, base: str, view: dict, timed_out: bool) -> dict:
    """One results row (see docs/e2e.md "results.json") from the Master's view of a job."""
    att = view["attempts"][-1] if view["attempts"] else None
    records = view.get("records", {})
    rank0 = records.get(att["workers"][view["tasks"][0]], []) if att else []
    evals = [r for r in rank0 if r.get("type") == "eval"]
    end = next((r for r in rank0 if r.get("type") == "end"), None)
    iters = [r["iter_s"] for r in rank0 if r.get("type") == "iter"]
    reached = bool(end and end.get("reached_target"))
    flows = []
    if att:
        out_count: dict[str, int] = {}
        for f in att["flows"]:
            out_count[f["src"]] = out_count.get(f["src"], 0) + 1
        for f in att["flows"]:
            sender = records.get(att["workers"][f["src"]], [])
            receiver = records.get(att["workers"][f["dst"]], [])
            flows.append({**f, "measured_mbps": measured_mbps(sender, out_count[f["src"]]),
                          **tcp_view(sender, receiver)})
    state = "timeout" if timed_out else view["state"]
    return {
        "scheduler": scheduler, "seed": seed, "job": base, "collective": view["collective"],
        "model": view["workload"].get("model", ""), "state": state, "reason": view["reason"],
        "reached_target": reached, "tta_s": end.get("tta_s") if reached else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "jct_s": view["jct_s"] if state == "finished" else None,
        "startup_s": end.get("startup_s") if end else None,
        "iterations": end.get("iters") if end else (len(iters) or None),
        "median_iter_s": round(statistics.median(iters), 4) if iters else None,
        "predicted_iter_s": att.get("predicted_iteration_s") if att else None,
        "decision_ms": round(att["decision_s"] * 1000, 3) if att else None,
        "attempts": len(view["attempts"]), "placement": att["placement"] if att else {},
        "flows": flows, "curve": [[round(e["elapsed_s"], 3), e["accuracy"]] for e in evals],
        "events": view["events"]}


class Display:
    """Live progress: the run, its jobs (state, placement, accuracy) and the busiest links."""

    def __init__(self, console: Console):
        self.console = console
        self.live: Live | None = None
        self._last: dict[str, str] = {}
        self._printed = 0.0

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=2, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.__exit__(None, None, None)

    def update(self, title: str, elapsed: float, jobs: list[dict], links: list[dict]) -> None:
        if self.live is None:  # a log (CI): one line per state change, a summary every 30 s
            for j in jobs:
                key = f"{j['state']} {j['reason']}"
                if self._last.get(j["name"]) != key:
                    self._last[j["name"]] = key
                    self.console.print(f"  {elapsed:6.1f} s  {j['name']}: {key}")
            if elapsed - self._printed >= 30:
                self._printed = elapsed
                self.console.print(f"  {elapsed:6.1f} s  " + ", ".join(
                    f"{j['name']} acc={_fmt(j['progress']['accuracy'])}" for j in jobs))
            return
        jt = Table("job", "state", "placement", "accuracy", "iter", title=f"{title}  "
                   f"[dim]{elapsed:.0f} s[/]", title_justify="left")
        for j in jobs:
            att = j["attempts"][-1] if j["attempts"] else None
            where = " ".join(sorted(att["placement"].values())) if att else j["reason"][:50]
            jt.add_row(j["name"], j["state"], where, _fmt(j["progress"]["accuracy"]),
                       str(j["progress"]["iteration"] or ""))
        lt = Table("link", "measured Mbit/s", "granted", "background", "capacity",
                   title="busiest links", title_justify="left")
        busy = sorted((lk for lk in links if lk["measured_mbps"]),
                      key=lambda lk: -lk["measured_mbps"] / lk["capacity_mbps"])[:6]
        for lk in busy:
            lt.add_row(f"{lk['src']}→{lk['dst']}", f"{lk['measured_mbps']:.1f}",
                       f"{lk['granted_mbps']:.0f}", f"{lk['background_mbps']:.0f}",
                       f"{lk['capacity_mbps']:.0f}")
        self.live.update(Group(jt, lt))


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"


def run_once(stack: Stack, scenario: Scenario, scheduler: str, seed: int, index: int,
             title: str, display: Display) -> dict:
    """Submit the scenario's jobs under `scheduler`/`seed`, follow them, collect the results."""
    master = stack.master
    if scheduler in QUEUES:  # a queue policy (CES-Multi, ...) over its default single-job one
        master.set_scheduler(default_algorithm(), seed, queue=scheduler)
    else:
        master.set_scheduler(scheduler, seed)
    pending = sorted(((parse_job(doc, src).submit_time, src, doc) for src, doc in scenario.jobs),
                     key=lambda p: p[0])
    names: dict[str, str] = {}  # submitted name -> base name
    samples: dict[str, Any] = {"t": [], "links": {}}
    t0 = time.monotonic()
    deadline = t0 + scenario.timeout_s
    next_links = 0.0
    views: list[dict] = []
    while True:
        now = time.monotonic()
        while pending and pending[0][0] <= now - t0:
            _, src, doc = pending.pop(0)
            name = f"{doc['name']}.r{index}"  # unique per run: worker containers are named by it
            names[name] = doc["name"]
            master.submit({**doc, "name": name}, source=src)
        views = [v for v in master.jobs() if v["name"] in names]
        if now >= next_links:
            next_links = now + 2.0
            links = master.links()
            samples["t"].append(round(now - t0, 2))
            for lk in links:
                samples["links"].setdefault(f"{lk['src']}>{lk['dst']}", []).append(
                    lk["measured_mbps"])
            display.update(title, now - t0, views, links)
        if not pending and views and all(v["state"] in TERMINAL for v in views):
            break
        if now > deadline:
            break
        stack._check_alive()
        time.sleep(1.0)
    timed_out = set()
    for v in views:
        if v["state"] not in TERMINAL:
            timed_out.add(v["name"])
            try:
                master.cancel(v["name"])
            except ApiError as e:
                log.warning("cancel %s: %s", v["name"], e.message)
    rows = [job_row(scheduler, seed, names[n], master.job(n, records=True), n in timed_out)
            for n in names]
    wall = time.monotonic() - t0
    _wait_idle(master)
    capacity = {f"{lk['src']}>{lk['dst']}": lk["capacity_mbps"] for lk in master.links()}
    busy = {k: v for k, v in samples["links"].items() if max((x or 0) for x in v) >= 1.0}
    return {"scheduler": scheduler, "seed": seed, "wall_s": round(wall, 2), "jobs": rows,
            "links": {"t": samples["t"], "mbps": busy,
                      "capacity_mbps": {k: capacity[k] for k in busy}}}


def _wait_idle(master: MasterClient, timeout_s: float = 120.0) -> None:
    """Until no node runs a worker or holds an allocation (the next run starts clean)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes = master.nodes()
        if all(not n.get("workers") and n["allocated"]["cpu"] == 0 for n in nodes):
            return
        time.sleep(0.5)
    raise RunError("the testbed did not become idle after a run: "
                   f"{[n['node'] for n in master.nodes() if n.get('workers')]} still run workers")


# --- main --------------------------------------------------------------------------------------
def machine(datapath: str) -> dict:
    """What the run was measured on: `scheduler.evaluate.machine_info` plus the testbed's side."""
    info = machine_info()
    mem_kb = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal")), 0)

    def version(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            return ""
    return {**info, "host": platform.node(), "kernel": platform.release(),
            "mem_gb": round(mem_kb / 2**20, 1), "datapath": datapath,
            "loadavg": list(os.getloadavg()), "docker": version(["docker", "--version"]),
            "ovs": version(["ovs-vswitchd", "--version"])}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--topo", help="topology name or file (default: the scenario's, campus)")
    p.add_argument("--schedulers", help="comma-separated single-job algorithms or queue "
                                        "policies (ces-multi, ...) (default: the scenario's)")
    p.add_argument("--jobs", help="a job YAML file or folder instead of the scenario's jobs")
    p.add_argument("--seeds", type=int, help="runs per scheduler, seeds 0..N-1")
    p.add_argument("--quick", action="store_true", help="the small scenario (a few minutes)")
    p.add_argument("--scenario", help="a scenario YAML (default: scenarios/default.yaml)")
    p.add_argument("--out", help="results folder (default: results/e2e/SCENARIO-TOPO)")
    p.add_argument("--cleanup", action="store_true",
                   help="remove what killed runs left (all runs, or --prefix)")
    p.add_argument("--prefix", help="run prefix: 'ces' + 4 hex digits")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    console = Console()
    if args.prefix:
        try:
            check_prefix(args.prefix)
        except ValueError as e:
            build_parser().error(str(e))  # exit code 2
    if os.geteuid() != 0:
        print("error: run as root (sudo): the testbed creates bridges, veths and containers",
              file=sys.stderr)
        return 2
    if args.cleanup:
        removed = cleanup(args.prefix)
        print(f"cleanup{f' of {args.prefix}' if args.prefix else ''}: removed {removed.summary()}")
        return 0
    try:
        p = plan(args)
    except (ScenarioError, TopologyError, JobError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in p.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    return execute(p, args.prefix or new_prefix(), console)


def execute(p: Plan, prefix: str, console: Console) -> int:
    p.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "version": 1, "scenario": {"name": p.scenario.name, "source": p.scenario.source,
                                   "description": p.scenario.description,
                                   "jobs": [d for _, d in p.scenario.jobs],
                                   "timeout_s": p.scenario.timeout_s},
        "topology": p.topo.name, "schedulers": p.schedulers, "seeds": p.seeds,
        "machine": machine(detect_datapath()), "started_at": time.time(), "runs": []}
    t0 = time.monotonic()
    total = len(p.schedulers) * p.seeds
    try:
        with Stack(p.topo, prefix, p.out, console) as stack:
            results["background"] = stack.start_background(p.scenario.background)
            results["bringup_s"] = round(stack.timings["up_s"], 2)
            with Display(console) as display:
                for i, (scheduler, seed) in enumerate(
                        (s, seed) for s in p.schedulers for seed in range(p.seeds)):
                    title = f"run {i + 1}/{total}: {scheduler}, seed {seed}"
                    console.print(f"[bold]{title}[/]")
                    run = run_once(stack, p.scenario, scheduler, seed, i, title, display)
                    results["runs"].append(run)
                    for row in run["jobs"]:
                        console.print(f"  {row['job']}: {row['state']}, tta "
                                      f"{_fmt(row['tta_s'])} s, accuracy "
                                      f"{_fmt(row['final_accuracy'])}, on "
                                      f"{' '.join(sorted(row['placement'].values()))}")
                    _write(p.out, results, t0)
        results["teardown_s"] = round(stack.timings["down_s"], 2)
    except (RunError, EmulationError, DockerException, ApiError, Unreachable, SdnError) as e:
        print(f"error: {e}", file=sys.stderr)
        _write(p.out, results, t0)
        return 1
    except KeyboardInterrupt:
        print("interrupted: torn down", file=sys.stderr)
        _write(p.out, results, t0)
        return 130
    _write(p.out, results, t0)
    figures = plots.make_all(results, p.out)
    report.write(results, p.out)
    console.print(f"[bold]done[/] in {results['wall_s']:.0f} s: {p.out}/results.json, "
                  f"results.csv, summary.md, {', '.join(f.name for f in figures)}")
    return 0


def _write(out: Path, results: dict, t0: float) -> None:
    results["wall_s"] = round(time.monotonic() - t0, 2)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / "results.json")


if __name__ == "__main__":
    sys.exit(main())
