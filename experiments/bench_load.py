#!/usr/bin/env python3
"""Load: a burst of job submissions through the Master's API while hundreds of agents heartbeat.

    python experiments/bench_load.py --seed 0 [--nodes 200] [--jobs 1000] [--out FILE]

A real Master (`python -m master serve` in its own process on loopback, no SDN app, as it runs in
a deployment) and `--nodes` simulated agents (`edge.simulated`: the real Messenger —
registration, a heartbeat every second, the command channel over HTTP — in front of workers that
only exist as records), spread over `--agent-procs` processes: real agents are one process per
host, and hundreds of them in one process wait for that process's GIL and garbage collector,
which their round trips would count as the Master's. The nodes sit in racks of 20 under a
top-of-rack switch, the racks under one core switch.

1. Burst: `--jobs` submissions from 16 client threads at once; the seed draws each job (ring or
   star, 1-4 workers, 0.25-1 core, 256-1024 MiB, 10-100 Mbit/s) and makes 5 % of them invalid
   (a task no node can hold, an unknown collective, a negative demand). Each must be accepted or
   refused with a 4xx naming the problem; none may go unanswered.
2. Drain: a job's workers "run" for `--work-s` seconds × a factor drawn per job (seeded) within
   1 ± `--work-spread` after their agents start them, writing `--lines-per-s` metric lines a
   second (sent with the heartbeats, as a training worker's), then exit 0 — the workers of one
   job together, as a DDP job's do. (With `--work-spread 0` every job lasts the same: jobs
   started in one scheduling round all end in the same instant, and each agent reports an exit
   at once, so heartbeats arrive in bursts of 50-80 that no real mix of jobs produces.) The
   Master keeps its jobs in a state file as run.py runs it (`--no-state`: in memory only), so
   each heartbeat with lines is committed to SQLite before it is answered. The Master
   schedules the queue as nodes free up, until every accepted job has finished or `--max-s`
   passed.
3. Checks: every accepted job is listed exactly once and finished; every worker was started once
   (no job run twice); the refused ones are not listed; the Master holds every metric line
   written, once.

With `--tls` every connection is mutual TLS, as in a lab (`lab.pki`: a CA, the control machine's
identity for the Master and the submitting clients, one per agent; ECDSA P-256), the Master on
loopback still; the agents and clients keep their connections (`protocol.http.KEEP_ALIVE`)
unless `--no-keep-alive`, when every request is a new connection and a full handshake.

Figures: submission latency (p50/p99), heartbeat round trip seen by the agents during the burst
and the drain (p50/p99/max; target p99 ≤ 50 ms), nodes that went offline (target 0), jobs lost or
run twice (target 0), time to drain. Writes results/bench_load.json with the machine it ran on.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import gc
import json
import multiprocessing
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from edge.simulated import SimulatedAgent
from experiments.common import REPO, RESULTS, percentile
from experiments.machine import machine
from lab import pki as lab_pki
from master.client import MasterClient
from master.manager import TERMINAL
from protocol import http as protocol_http
from protocol.http import ApiError, Unreachable
from protocol.tls import CONTROL, agent_identity, load_tls
from topologies import Topology, parse_topology

RACK = 20  # nodes per top-of-rack switch
CLIENTS = 16  # submitting threads
INVALID_SHARE = 0.05


def racks(nodes: int) -> dict:
    """A topology document: `nodes` 1-core 2 GiB nodes, RACK to a top-of-rack switch, the racks
    under one core."""
    tors = (nodes + RACK - 1) // RACK
    return {
        "name": f"racks{nodes}",
        "switches": [{"name": "core"}] + [{"name": f"tor{r}"} for r in range(tors)],
        "nodes": [{"name": f"n{i}", "cpu": 1.0, "mem_mb": 2048} for i in range(nodes)],
        "links": [{"ends": [f"n{i}", f"tor{i // RACK}"], "bw_mbps": 1000} for i in range(nodes)]
        + [{"ends": [f"tor{r}", "core"], "bw_mbps": 10000} for r in range(tors)],
    }


def make_pki(folder: Path, topo: Topology) -> Path:
    """A CA, the control machine's identity and one per node, all named for loopback."""
    ca_key, ca = lab_pki.make_ca()
    for identity in [CONTROL] + [agent_identity(n.name) for n in topo.nodes]:
        key, cert = lab_pki.issue(ca_key, ca, identity, ["127.0.0.1", "localhost"])
        lab_pki.write_identity(folder / identity, key, cert, ca)
    return folder


def start_master(
    topo_file: Path,
    log_file: Path,
    algorithm: str,
    seed: int,
    state: Path | None,
    pki: Path | None = None,
) -> tuple[subprocess.Popen, str]:
    """`python -m master serve` on a free loopback port, keeping its jobs in `state` (as
    experiments/run.py runs it) if given, over TLS with `pki`'s control identity if given; (the
    process, its URL)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "master",
            "serve",
            "--topo",
            str(topo_file),
            "--port",
            "0",
            "--algorithm",
            algorithm,
            "--seed",
            str(seed),
            *(["--state", str(state)] if state else []),
            *(["--tls", str(pki / CONTROL)] if pki else []),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log_file.open("w"),
        text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"listening on (https?://\S+)", line)
    if not found:
        proc.kill()
        raise RuntimeError(
            f"the Master did not start: {line.strip()!r} {log_file.read_text()[-500:]}"
        )
    return proc, found.group(1)


def draw_jobs(rng: random.Random, n: int) -> list[tuple[dict, bool]]:
    """(job document, valid?) × n."""
    out = []
    for i in range(n):
        job = {
            "name": f"load{i}",
            "collective": rng.choice(["ring", "star"]),
            "workers": rng.randint(1, 4),
            "task": {"cpu": rng.choice([0.25, 0.5, 1.0]), "mem_mb": rng.choice([256, 512, 1024])},
            "model_params": rng.choice([1e5, 1e6, 5e6]),
            "demand_mbps": rng.choice([10, 50, 100]),
            "iterations": 10,
        }
        valid = rng.random() >= INVALID_SHARE
        if not valid:
            flaw = rng.randrange(3)
            if flaw == 0:
                job["task"] = {"cpu": 8.0, "mem_mb": 512}  # no node holds it
            elif flaw == 1:
                job["collective"] = "gossip"
            else:
                job["demand_mbps"] = -5
        out.append((job, valid))
    return out


def ms(x: float | None) -> float | None:
    return None if x is None else round(1000 * x, 2)


def work_s(seed: int, job: str, mean_s: float, spread: float) -> float:
    """How long the workers of `job` run: `mean_s` × a factor within 1 ± `spread`, the same in
    every agent process (drawn from the seed and the job's name)."""
    return mean_s * random.Random(f"{seed}:{job}").uniform(1 - spread, 1 + spread)


class Runner:
    """Ends every worker its job's `work_s` after it was first seen running, as if its process
    exited 0, and meanwhile has it write `lines_per_s` metric lines a second, as a training
    worker logs its iterations (in each agent process)."""

    def __init__(
        self,
        agents: list[SimulatedAgent],
        seed: int,
        mean_s: float,
        spread: float,
        lines_per_s: float,
    ):
        self.agents, self.lines_per_s = agents, lines_per_s
        self.work_s = lambda job: work_s(seed, job, mean_s, spread)
        self.seen: dict[str, float] = {}
        self.lines: dict[str, int] = {}  # worker -> lines written
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            now = time.monotonic()
            for a in self.agents:
                for w in a.compute.states():
                    if w.state != "running":
                        continue
                    first = self.seen.setdefault(w.name, now)
                    while self.lines.get(w.name, 0) < self.lines_per_s * (now - first):
                        i = self.lines[w.name] = self.lines.get(w.name, 0) + 1
                        a.compute.log(
                            w.name,
                            {
                                "type": "iter",
                                "iter": i,
                                "loss": 1.0 / i,
                                "iter_s": 1.0 / self.lines_per_s,
                            },
                        )
                    if now - first >= self.work_s(w.job):
                        a.finish(w.name, 0)


def run_agents(
    url: str,
    nodes: list[tuple[str, str, float, float]],
    work: tuple[int, float, float],
    lines_per_s: float,
    measuring,
    done,
    out,
    pki: Path | None = None,
    keep_alive: bool = True,
) -> None:
    """One agent process: its share of the agents heartbeat until `done`; their round trips
    since `measuring` and every worker they were asked to start go back through `out`."""
    protocol_http.KEEP_ALIVE = keep_alive
    agents = [  # with `pki`, each over TLS with its own identity
        SimulatedAgent(
            name,
            url,
            ip,
            cpu,
            mem_mb,
            1.0,
            tls=load_tls(pki / agent_identity(name)) if pki else None,
        )
        for name, ip, cpu, mem_mb in nodes
    ]
    for a in agents:
        a.start()
    gc.freeze()  # the agents' own start-up is not garbage: short collections, as in the Master
    measuring.wait()
    for a in agents:
        a.messenger.round_trips.clear()
    runner = Runner(agents, *work, lines_per_s)
    runner.thread.start()
    done.wait()
    runner.stop.set()
    for a in agents:  # before the Master stops, so that none is seen going silent
        a.stop()
    out.send(
        {
            "trips": [t for a in agents for t in a.messenger.round_trips],
            "started": [w for a in agents for w in a.compute.specs],
            "lines": sum(runner.lines.values()),
        }
    )


class AgentProcesses:
    """`procs` processes sharing the topology's nodes, each running `run_agents`."""

    def __init__(
        self,
        url: str,
        topo: Topology,
        procs: int,
        work: tuple[int, float, float],
        lines_per_s: float,
        pki: Path | None = None,
        keep_alive: bool = True,
    ):
        """`work`: (seed, mean seconds, spread) of the jobs' running times (`work_s`); `pki`:
        the agents' identities (TLS)."""
        ctx = multiprocessing.get_context("spawn")  # no threads or sockets of ours inherited
        self.measuring, self.done = ctx.Event(), ctx.Event()
        self.procs, self.pipes = [], []
        nodes = [(n.name, n.ip, n.cpu, n.mem_mb) for n in topo.nodes]
        for i in range(procs):
            here, there = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=run_agents,
                daemon=True,
                args=(
                    url,
                    nodes[i::procs],
                    work,
                    lines_per_s,
                    self.measuring,
                    self.done,
                    there,
                    pki,
                    keep_alive,
                ),
            )
            p.start()
            self.procs.append(p)
            self.pipes.append(here)

    def results(self, timeout_s: float = 60.0) -> tuple[list[float], list[str], int]:
        """Stop the agents: (every round trip measured, every worker started, metric lines
        written)."""
        self.done.set()
        trips, started, lines = [], [], 0
        for pipe, p in zip(self.pipes, self.procs):
            if not pipe.poll(timeout_s):
                raise RuntimeError(f"agent process {p.pid} did not report within {timeout_s} s")
            r = pipe.recv()
            trips += r["trips"]
            started += r["started"]
            lines += r["lines"]
        for p in self.procs:
            p.join(timeout=10)
        return trips, started, lines

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()


def run(args: argparse.Namespace) -> dict:
    spec = racks(args.nodes)
    topo = parse_topology(spec, "bench_load")
    jobs = draw_jobs(random.Random(args.seed), args.jobs)
    with tempfile.TemporaryDirectory(prefix="ces-bench-load-") as tmp:
        topo_file = Path(tmp) / "racks.yaml"
        topo_file.write_text(yaml.safe_dump(spec))
        pki = make_pki(Path(tmp) / "pki", topo) if args.tls else None
        proc, url = start_master(
            topo_file,
            Path(tmp) / "master.log",
            args.algorithm,
            args.seed,
            Path(tmp) / "master.sqlite" if args.state else None,
            pki,
        )
        agents = AgentProcesses(
            url,
            topo,
            min(args.agent_procs, args.nodes),
            (args.seed, args.work_s, args.work_spread),
            args.lines_per_s,
            pki,
            args.keep_alive,
        )
        protocol_http.KEEP_ALIVE = args.keep_alive
        client = MasterClient(url, timeout_s=60.0, tls=load_tls(pki / CONTROL) if pki else None)
        try:
            return measure(client, agents, jobs, args)
        finally:
            agents.kill()
            proc.terminate()
            proc.wait(timeout=30)


def measure(
    client: MasterClient,
    agents: AgentProcesses,
    jobs: list[tuple[dict, bool]],
    args: argparse.Namespace,
) -> dict:
    stop_health = threading.Event()
    try:
        client.wait_ready(args.nodes, timeout_s=60)
        agents.measuring.set()
        offline = 0

        def watch_health() -> None:
            nonlocal offline
            while not stop_health.wait(0.5):
                offline = max(offline, args.nodes - client.health()["nodes_online"])

        threading.Thread(target=watch_health, daemon=True).start()

        def submit(item: tuple[dict, bool]) -> dict:
            job, valid = item
            t0 = time.monotonic()
            try:
                client.submit(job)
                outcome, detail = "accepted", ""
            except ApiError as e:
                outcome, detail = (
                    ("refused", f"{e.status} {e}")
                    if 400 <= e.status < 500
                    else ("error", f"{e.status} {e}")
                )
            except Unreachable as e:
                outcome, detail = "unanswered", str(e)
            return {
                "name": job["name"],
                "valid": valid,
                "outcome": outcome,
                "detail": detail,
                "s": time.monotonic() - t0,
            }

        t_burst = time.monotonic()
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(submit, jobs))
        burst_s = time.monotonic() - t_burst
        accepted = {a["name"] for a in answers if a["outcome"] == "accepted"}
        deadline = time.monotonic() + args.max_s
        while time.monotonic() < deadline:  # the counts, not every job's view: as a monitor would
            counts = client.health()["jobs"]
            if sum(counts.get(s, 0) for s in TERMINAL) >= len(accepted):
                break
            time.sleep(1.0)
        drain_s = time.monotonic() - t_burst
        final = client.jobs()
        listed = Counter(j["name"] for j in final)
        states = {j["name"]: j["state"] for j in final}
        views = {n: client.job(n, records=True) for n in accepted}
    finally:
        stop_health.set()
    trips, started, lines = agents.results()
    by_state: dict[str, int] = {}
    for n in accepted:
        by_state[states.get(n, "missing")] = by_state.get(states.get(n, "missing"), 0) + 1
    return {
        "seed": args.seed,
        "nodes": args.nodes,
        "jobs": args.jobs,
        "algorithm": args.algorithm,
        "work_s": args.work_s,
        "work_spread": args.work_spread,
        "agent_procs": min(args.agent_procs, args.nodes),
        "state": args.state,
        "tls": args.tls,
        "keep_alive": args.keep_alive,
        "lines_per_s": args.lines_per_s,
        "lines": lines,
        "machine": machine(),
        "submissions": {
            "accepted": len(accepted),
            "refused": sum(a["outcome"] == "refused" for a in answers),
            "server_errors": [a for a in answers if a["outcome"] == "error"],
            "unanswered": [a for a in answers if a["outcome"] == "unanswered"],
            "valid_refused": [a for a in answers if a["valid"] and a["outcome"] != "accepted"],
            "invalid_accepted": [
                a["name"] for a in answers if not a["valid"] and a["outcome"] == "accepted"
            ],
            "refusal_examples": sorted({a["detail"] for a in answers if a["outcome"] == "refused"})[
                :5
            ],
            "burst_s": round(burst_s, 3),
            "latency_ms": {
                "p50": ms(percentile([a["s"] for a in answers], 50)),
                "p99": ms(percentile([a["s"] for a in answers], 99)),
                "max": ms(max(a["s"] for a in answers)),
            },
        },
        "jobs_by_state": by_state,
        "lost": sorted(n for n in accepted if n not in states),
        "listed_twice": sorted(n for n, times in listed.items() if times > 1),
        "refused_but_listed": sorted(
            a["name"] for a in answers if a["outcome"] != "accepted" and a["name"] in states
        ),
        "run_twice": sorted(n for n, v in views.items() if len(v["attempts"]) > 1),
        "workers_started": len(started),
        "workers_started_twice": len(started) - len(set(started)),
        "drain_s": round(drain_s, 1),
        "lines_held": sum(len(ls) for v in views.values() for ls in v["records"].values()),
        "heartbeats": {
            "count": len(trips),
            "p50_ms": ms(percentile(trips, 50)),
            "p99_ms": ms(percentile(trips, 99)),
            "max_ms": ms(max(trips, default=None)),
        },
        "nodes_offline_max": offline,
    }


def verdict(r: dict) -> list[str]:
    """What failed (empty: all targets met)."""
    s = r["submissions"]
    bad = [
        f"{k}: {len(s[k])}"
        for k in ("server_errors", "unanswered", "valid_refused", "invalid_accepted")
        if s[k]
    ]
    bad += [
        f"{k}: {r[k]}" for k in ("lost", "listed_twice", "refused_but_listed", "run_twice") if r[k]
    ]
    if r["lines_held"] != r["lines"]:
        bad.append(f"metric lines: {r['lines']} written, the Master holds {r['lines_held']}")
    if r["workers_started_twice"]:
        bad.append(f"workers started twice: {r['workers_started_twice']}")
    unfinished = {k: v for k, v in r["jobs_by_state"].items() if k != "finished"}
    if unfinished:
        bad.append(f"accepted jobs not finished: {unfinished}")
    if r["nodes_offline_max"]:
        bad.append(f"nodes offline: {r['nodes_offline_max']}")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nodes", type=int, default=200)
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--algorithm", default="network-aware")
    p.add_argument(
        "--work-s", type=float, default=2.0, help="how long a job's workers run, on average"
    )
    p.add_argument(
        "--work-spread",
        type=float,
        default=0.5,
        help="each job runs --work-s × a factor within 1 ± this (0: all alike)",
    )
    p.add_argument(
        "--agent-procs", type=int, default=4, help="processes the simulated agents are spread over"
    )
    p.add_argument(
        "--lines-per-s",
        type=float,
        default=1.0,
        help="metric lines each running worker writes a second (0: none)",
    )
    p.add_argument(
        "--state",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the Master keeps its jobs in a state file, as run.py runs it (it "
        "commits every heartbeat's lines before answering)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="every connection mutual TLS (the Master's, the agents', the clients'), as in a lab",
    )
    p.add_argument(
        "--keep-alive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --tls: agents and clients keep their connections (--no-keep-alive: a new "
        "connection and handshake per request)",
    )
    p.add_argument("--max-s", type=float, default=600.0, help="give up draining after this")
    p.add_argument("--out", default=str(RESULTS / "bench_load.json"))
    a = p.parse_args(argv)
    if (
        a.nodes < 1
        or a.jobs < 1
        or a.agent_procs < 1
        or a.work_s < 0
        or a.max_s <= 0
        or a.lines_per_s < 0
        or not 0 <= a.work_spread <= 1
    ):
        p.error(
            "--nodes, --jobs and --agent-procs must be ≥ 1, --work-s and --lines-per-s ≥ 0, "
            "--work-spread within 0..1, --max-s > 0"
        )
    r = run(a)
    bad = verdict(r)
    s, hb = r["submissions"], r["heartbeats"]
    print(
        f"{a.jobs} submissions in {s['burst_s']} s: {s['accepted']} accepted, {s['refused']} "
        f"refused; latency p50 {s['latency_ms']['p50']} ms p99 {s['latency_ms']['p99']} ms"
    )
    print(
        f"drained in {r['drain_s']} s: {r['jobs_by_state']}; {r['workers_started']} workers, "
        f"{r['lines']} metric lines, state file {'on' if a.state else 'off'}"
    )
    print(
        f"heartbeats ({a.nodes} agents in {r['agent_procs']} processes, every 1 s"
        f"{', TLS' if a.tls else ''}): "
        f"{hb['count']}, p50 {hb['p50_ms']} ms, p99 {hb['p99_ms']} ms (target ≤ 50), "
        f"max {hb['max_ms']} ms; nodes offline {r['nodes_offline_max']}"
    )
    print("all checks passed" if not bad else "FAILED: " + "; ".join(bad))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({**r, "failed": bad}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
