"""The fault suite: faults injected into the real stack, what must happen, and what did.

Five faults hit a running `Stack` (run.py's: the SDN app, the emulated network on Open vSwitch,
the Master with its --state file and one edge agent per node, each its own process, and DDP
workers in containers), one job each; two hit `experiments/run.py` itself. Each returns a `Row`
of the table; tests/integration/test_faults.py asserts them, experiments/bench_faults.py prints
and writes them. `detect_s` runs from the fault to the moment named here:

- master_kill: kill -9 of the Master mid-job, started again on its state file and port. The job
  is taken over (same attempt, same worker containers, never restarted) and finishes once with
  every metric line once; the scheduler the operator set holds. detect_s: until the restarted
  Master has the job's workers reported by their agents.
- agent_kill: kill -9 of the agent of a node running a worker, started again. The worker is
  adopted, not restarted; the job finishes once with every metric line once. detect_s: until
  the new agent has registered and reported the worker.
- ovs_restart: the host's ovs-vswitchd exits and is started again (every bridge of the host
  loses its flow entries). The SDN app installs them again when the switches reconnect; the
  job's nodes ping and the job trains on and finishes once with every metric line once.
  detect_s: until every switch is connected and re-synchronised.
- oom_kill: a job whose workers allocate beyond their memory limit. It fails, its reason naming
  the memory limit. detect_s: from Docker's OOM event to the Master ending the attempt.
- node_stop: `docker stop` of a node container whose node runs a worker. The node goes offline
  within `DETECT_S`, the job moves to other nodes (nothing of it left running on the dead node)
  and finishes once. detect_s: until the Master takes the node offline.
- out_unwritable: `run.py --out` where results cannot be written (a file in the way, a folder
  under a file, a read-only file system). One line, exit code 2, no traceback, nothing created.
  detect_s: the slowest refusal.
- orchestrator_kill: kill -9 of run.py mid-run, then `run.py --cleanup --prefix P`. Nothing of
  the run is left: processes, containers, bridges, veths, namespaces, tc, cgroups. detect_s:
  the cleanup's duration.

`lost`: jobs that did not end as they must (finished; for oom_kill failed with the reason).
`duplicated`: jobs whose workers ran twice at once or were started again.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import yaml
from rich.console import Console

from master.client import MasterClient
from master.manager import TERMINAL, Phase
from protocol.http import ApiError, Unreachable
from testbed import leftovers
from topologies import load_topology

from .scenario import REPO
from .stack import RunError, Stack, poll

TOPOLOGY = {
    "name": "faults",
    "switches": [{"name": "s1"}, {"name": "s2"}],
    "nodes": [{"name": f"n{i}", "cpu": 1.0, "mem_mb": 1024} for i in range(1, 5)],
    "links": [
        {"ends": ["s1", "s2"], "bw_mbps": 200},
        {"ends": ["n1", "s1"], "bw_mbps": 200},
        {"ends": ["n2", "s1"], "bw_mbps": 200},
        {"ends": ["n3", "s2"], "bw_mbps": 200},
        {"ends": ["n4", "s2"], "bw_mbps": 200},
    ],
}
ALGORITHM = "network-aware"
QUEUE = "fifo"  # not the Master's default: master_kill checks that a restarted Master keeps it
DETECT_S = 10.0  # a node or worker lost is noticed within this
TRAIN_S = 15.0  # how long a fault's job trains: long enough to outlive the fault
OOM_MB = 64  # the oom_kill job's memory limit; its workers allocate 4 times that
RUN = [sys.executable, str(REPO / "experiments" / "run.py")]


@dataclass
class Row:
    fault: str
    detect_s: float | None  # from the fault to the system's answer (the module doc says which)
    recovered: bool  # everything that must happen did
    lost: int | None  # jobs that did not end as they must (None: no job involved)
    duplicated: int | None  # jobs whose workers ran twice at once or were started again
    what: str  # what happened


def job(name: str, seconds: float = TRAIN_S) -> dict:
    """Two 0.75-core workers in a ring, on two nodes (no node holds both), training `seconds`
    and exiting 0 (the target accuracy is out of reach)."""
    return {
        "name": name,
        "collective": "ring",
        "workers": 2,
        "task": {"cpu": 0.75, "mem_mb": 600},
        "model_params": 85000,
        "demand_mbps": 50,
        "target_accuracy": 0.999,
        "workload": {"model": "mlp-small", "eval_every": 50, "max_seconds": seconds},
    }


@contextmanager
def bring_up(prefix: str, workdir: Path, seed: int) -> Iterator[Stack]:
    """The stack the faults hit: `TOPOLOGY`, the Master scheduling with `ALGORITHM`, `QUEUE`
    and `seed` (set as run.py sets them, through the API)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "faults.yaml"
    path.write_text(yaml.safe_dump(TOPOLOGY))
    with Stack(load_topology(path), prefix, workdir, Console(quiet=True)) as stack:
        stack.master.set_scheduler(ALGORITHM, seed, QUEUE)
        yield stack


def run(fault: Callable[..., Row], *args) -> Row:
    """`fault(*args)`, or its row when it gave up waiting (not recovered, the wait named)."""
    try:
        return fault(*args)
    except RunError as e:
        return Row(fault.__name__, None, False, None, None, f"gave up: {e}")


# --- on a running stack ------------------------------------------------------------------------
def master_kill(stack: Stack) -> Row:
    m = stack.master
    v = _training(m, "f-master")
    before, scheduler = _containers(stack, "f-master"), _scheduler(m)
    t0 = time.monotonic()
    stack.restart("master")
    poll(lambda: _reported(m, v), 60, "the restarted Master to have the job's workers")
    detect = time.monotonic() - t0
    kept = _containers(stack, "f-master") == before
    same = _scheduler(m) == scheduler
    end = _ended(m, "f-master")
    lost, duplicated = _fate(end, kept)
    lines = _lines(m, "f-master")
    return Row(
        "master_kill",
        detect,
        kept and same and not lost and not lines,
        lost,
        duplicated,
        f"workers {'kept' if kept else 'RESTARTED'}, scheduler "
        f"{'kept' if same else 'LOST'} ({scheduler} -> {_scheduler(m)}); {_story(end)}; "
        f"metric lines {lines or 'whole'}",
    )


def agent_kill(stack: Stack) -> Row:
    m = stack.master
    v = _training(m, "f-agent")
    node, worker = v["attempts"][0]["placement"]["w1"], v["attempts"][0]["workers"]["w1"]
    before, url = _containers(stack, "f-agent"), _node(m, node)["url"]

    def adopted() -> bool:
        n = _ask(lambda: _node(m, node))
        return bool(n and n["online"] and n["url"] != url and worker in n["workers"])

    t0 = time.monotonic()
    stack.restart(f"agent-{node}")
    poll(adopted, 30, f"the new agent of {node} to report {worker}")
    detect = time.monotonic() - t0
    kept = _containers(stack, "f-agent") == before
    end = _ended(m, "f-agent")
    lost, duplicated = _fate(end, kept)
    lines = _lines(m, "f-agent")
    return Row(
        "agent_kill",
        detect,
        kept and not lost and not lines,
        lost,
        duplicated,
        f"agent of {node} restarted, {worker} {'adopted' if kept else 'RESTARTED'}; "
        f"{_story(end)}; metric lines {lines or 'whole'}",
    )


def ovs_restart(stack: Stack) -> Row:
    m, net = stack.master, stack.net
    v = _training(m, "f-ovs")
    a, b = sorted(set(v["attempts"][0]["placement"].values()))
    before = _last_iter(v)
    t0, wall = time.monotonic(), time.time()
    net.restart_vswitchd()

    def synced() -> bool:
        switches = stack.sdn.switches()["switches"]
        return all(s["synced"] and (s["connected_at"] or 0) > wall for s in switches)

    poll(synced, 30, "every switch to reconnect and be re-synchronised")
    detect = time.monotonic() - t0
    pings = net.exec(a, f"ping -c1 -W1 {stack.topo.node(b).ip}")[0] == 0
    poll(
        lambda: _last_iter(_ask(lambda: m.job("f-ovs", records=True))) > before,
        30,
        "the job to train on",
    )
    end = _ended(m, "f-ovs")
    lost, duplicated = _fate(end, True)
    lines = _lines(m, "f-ovs")
    return Row(
        "ovs_restart",
        detect,
        pings and not lost and not lines,
        lost,
        duplicated,
        f"switches back in {detect:.1f} s, {a}->{b} ping {'ok' if pings else 'LOST'}, "
        f"the job trained on past iteration {before}; {_story(end)}; metric lines "
        f"{lines or 'whole'}",
    )


def oom_kill(stack: Stack) -> Row:
    m = stack.master
    t0 = time.time()
    m.submit(
        {
            "name": "f-oom",
            "collective": "ring",
            "workers": 2,
            "iterations": 10,
            "task": {"cpu": 0.25, "mem_mb": OOM_MB},
            "model_params": 1000,
            "demand_mbps": 10,
            "command": f"python3 -c \"x = b'x' * ({4 * OOM_MB} << 20)\"",
        }
    )
    end = _ended(m, "f-oom", 60)
    events = stack.net.client.events(
        since=int(t0),
        until=int(time.time()) + 1,
        decode=True,
        filters={"type": "container", "event": "oom", "label": "ces.job=f-oom"},
    )
    oom_at = min((e["timeNano"] / 1e9 for e in events), default=None)
    first = end["attempts"][0]
    detect = first["ended_at"] - oom_at if oom_at and first["ended_at"] else None
    named = (
        end["state"] == "failed" and f"out of memory (memory limit {OOM_MB:g} MiB)" in end["reason"]
    )
    return Row(
        "oom_kill",
        detect,
        named,
        int(not named),
        _overlapping(end),
        f"{end['state']}: {end['reason']}",
    )


def node_stop(stack: Stack) -> Row:
    m, net = stack.master, stack.net
    v = _training(m, "f-node")
    node = v["attempts"][0]["placement"]["w1"]
    net.client.containers.get(net.node_container_name(node)).stop(timeout=1)
    t0 = time.time()
    offline = f"node {node} stopped heartbeating"
    v = poll(
        lambda: (x := _ask(lambda: m.job("f-node"))) and _event_at(x, offline) and x,
        DETECT_S + 10,
        "the stopped node to go offline",
    )
    detect = _event_at(v, offline) - t0
    agent = stack.process(f"agent-{node}")
    poll(lambda: agent.poll() is not None, 30, f"the agent of {node} to leave")
    stale = [c for c in _containers(stack, "f-node") if c.startswith(f"{stack.prefix}-{node}-")]
    v = _training(m, "f-node", attempt=2)
    elsewhere = node not in v["attempts"][1]["placement"].values()
    # Both attempts' workers at once: the job would run twice.
    twice = [
        c
        for c, (_, state) in _containers(stack, "f-node").items()
        if c.endswith("-a1") and state == "running"
    ]
    end = _ended(m, "f-node")
    lost, duplicated = _fate(end, not twice)
    return Row(
        "node_stop",
        detect,
        detect <= DETECT_S and elsewhere and not stale and not lost,
        lost,
        duplicated,
        f"{node} offline after {detect:.1f} s, its agent left (exit code "
        f"{agent.returncode}) "
        f"{'removing' if not stale else 'LEAVING'} its workers, attempt 2 on "
        f"{' '.join(sorted(set(v['attempts'][1]['placement'].values())))}; "
        f"{_story(end)}",
    )


ON_STACK = [master_kill, agent_kill, ovs_restart, oom_kill, node_stop]  # node_stop kills a node


# --- on the orchestrator -----------------------------------------------------------------------
def out_unwritable(workdir: Path, prefix: str) -> Row:
    """run.py --out where nothing can be written: one line, exit 2, nothing created."""
    in_the_way = workdir / "a-file"
    in_the_way.write_text("kept\n")
    cases = {"a file": in_the_way, "a folder under a file": in_the_way / "results"}
    readonly = workdir / "read-only"
    readonly.mkdir(exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(readonly)],
            capture_output=True,
        ).returncode
        == 0
    )
    if mounted:
        cases["a read-only file system"] = readonly / "results"
    problems, slowest = [], 0.0
    try:
        for what, out in cases.items():
            t0 = time.monotonic()
            done = subprocess.run(
                RUN
                + ["--quick", "--schedulers", "k8s-spread", "--out", str(out), "--prefix", prefix],
                capture_output=True,
                text=True,
                timeout=120,
            )
            slowest = max(slowest, time.monotonic() - t0)
            lines = done.stderr.strip().splitlines()
            if done.returncode != 2 or len(lines) != 1 or "cannot write results" not in lines[0]:
                problems.append(f"{what}: exit {done.returncode}, stderr {done.stderr[-300:]!r}")
        created = [str(p) for p in (in_the_way / "results", readonly / "results") if p.exists()]
        if in_the_way.read_text() != "kept\n" or created:
            problems.append(f"created {created or in_the_way}")
        left = leftovers_of(prefix)
        if left:
            problems.append(f"left {left}")
    finally:
        if mounted:
            subprocess.run(["umount", str(readonly)], check=True)
    return Row(
        "out_unwritable",
        slowest,
        not problems,
        None,
        None,
        "; ".join(problems)
        or f"{', '.join(cases)}: one line, exit 2, nothing created"
        + ("" if mounted else " (no read-only mount allowed here: not tried)"),
    )


def orchestrator_kill(workdir: Path, prefix: str) -> Row:
    """kill -9 of run.py with a job running, then run.py --cleanup --prefix."""
    topo = workdir / "faults.yaml"
    topo.write_text(yaml.safe_dump(TOPOLOGY))
    scenario = workdir / "kill.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "kill",
                "topology": str(topo),
                "schedulers": ["k8s-spread"],
                "seeds": 1,
                "timeout_s": 300,
                "jobs": [job("f-orch", 300)],
            }
        )
    )
    log = (workdir / "run.log").open("w")
    proc = subprocess.Popen(
        RUN + ["--scenario", str(scenario), "--prefix", prefix, "--out", str(workdir / "out")],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = docker.from_env()
        poll(
            lambda: (
                proc.poll() is None
                and len(
                    client.containers.list(
                        filters={"label": "ces.job=f-orch.r0", "name": f"^{prefix}-"}
                    )
                )
                == 2
            ),
            120,
            "run.py's job to run",
        )
    finally:
        proc.kill()
        proc.wait()
    before = leftovers_of(prefix)
    t0 = time.monotonic()
    done = subprocess.run(
        RUN + ["--cleanup", "--prefix", prefix], capture_output=True, text=True, timeout=120
    )
    took = time.monotonic() - t0
    after = leftovers_of(prefix)
    survived = len(before.get("processes", []))
    return Row(
        "orchestrator_kill",
        took,
        done.returncode == 0 and not after and survived > 0,
        None,
        None,
        f"after the kill: {', '.join(f'{len(v)} {k}' for k, v in before.items())}; "
        f"cleanup exit {done.returncode}: {done.stdout.strip()}; left: {after or 'nothing'}",
    )


def leftovers_of(prefix: str) -> dict[str, list]:
    """What the run `prefix` left, kinds with nothing omitted."""
    return {kind: found for kind, found in leftovers(prefix).items() if found}


# --- observing ---------------------------------------------------------------------------------
def _ask(fn: Callable):
    """fn(), or None while the Master does not answer (it restarts)."""
    try:
        return fn()
    except (Unreachable, ApiError):
        return None


def _training(m: MasterClient, name: str, attempt: int = 1) -> dict:
    """Submit `name` (for attempt 1) and return its view once attempt `attempt` runs and its rank
    0 has iterated."""
    if attempt == 1:
        m.submit(job(name))

    def ready():
        v = m.job(name, records=True)
        if Phase(v["state"]) in TERMINAL:
            raise RunError(f"job {name} ended before the fault: {v['state']} {v['reason']}")
        if v["state"] != "running" or len(v["attempts"]) != attempt:
            return None
        return v if _last_iter(v) > 0 else None

    return poll(ready, 120, f"job {name}: attempt {attempt} to train")


def _ended(m: MasterClient, name: str, timeout_s: float = TRAIN_S + 60) -> dict:
    return poll(
        lambda: (v := _ask(lambda: m.job(name))) and Phase(v["state"]) in TERMINAL and v,
        timeout_s,
        f"job {name} to end",
    )


def _last_iter(v: dict | None) -> int:
    """The last iteration rank 0 of the current attempt reported (0: none yet)."""
    if not v or not v["attempts"]:
        return 0
    rank0 = v["attempts"][-1]["workers"]["w0"]
    return max((r["iter"] for r in v["records"].get(rank0, []) if r["type"] == "iter"), default=0)


def _lines(m: MasterClient, name: str) -> str:
    """'' when the Master holds every metric line of the job's last attempt once (iterations
    1..n, one start, one end), else what is missing or doubled."""
    v = m.job(name, records=True)
    problems = []
    for task, worker in v["attempts"][-1]["workers"].items():
        kinds = [r["type"] for r in v["records"].get(worker, [])]
        iters = [r["iter"] for r in v["records"].get(worker, []) if r["type"] == "iter"]
        if (
            iters != list(range(1, len(iters) + 1))
            or kinds.count("start") != 1
            or kinds.count("end") != 1
        ):
            problems.append(
                f"{task}: {len(iters) - len(set(iters))} iterations doubled, "
                f"{max(iters, default=0) - len(set(iters))} missing, "
                f"{kinds.count('start')} start and {kinds.count('end')} end lines"
            )
    return "; ".join(problems)


def _containers(stack: Stack, job_name: str) -> dict[str, tuple[str, str]]:
    """The job's worker containers: name -> (id, state). A worker started again is a new
    container (listed without inspecting each: one being removed meanwhile is no error)."""
    return {
        c.attrs["Names"][0].lstrip("/"): (c.id, c.attrs["State"])
        for c in stack.net.client.containers.list(
            all=True,
            sparse=True,
            filters={"label": f"ces.job={job_name}", "name": f"^{stack.prefix}-"},
        )
    }


def _node(m: MasterClient, node: str) -> dict:
    return next(n for n in m.nodes() if n["node"] == node)


def _reported(m: MasterClient, v: dict) -> bool:
    """Every worker of the job's attempt reported running by its node's agent."""
    nodes = _ask(m.nodes)
    if not nodes:
        return False
    by_node = {n["node"]: n for n in nodes}
    a = v["attempts"][-1]
    return all(
        by_node[a["placement"][t]]["online"] and w in by_node[a["placement"][t]]["workers"]
        for t, w in a["workers"].items()
    )


def _scheduler(m: MasterClient) -> tuple:
    h = m.health()
    return h["scheduler"], h["seed"], h["queue"]


def _event_at(v: dict, needle: str) -> float | None:
    """Epoch time of the job's first event containing `needle`."""
    return next((v["submitted_at"] + e["t"] for e in v["events"] if needle in e["event"]), None)


def _overlapping(v: dict) -> int:
    """1 if an attempt of the job started before the one before it had ended."""
    a = v["attempts"]
    return int(
        any(
            x["ended_at"] is None or y["started_at"] < x["ended_at"]
            for x, y in itertools.pairwise(a)
        )
    )


def _fate(end: dict, once: bool) -> tuple[int, int]:
    """(lost, duplicated) of a job that must finish: not finished; its workers ran twice (`once`
    false: started again, or two attempts' at once)."""
    return int(end["state"] != "finished"), int(not once or bool(_overlapping(end)))


def _story(end: dict) -> str:
    outcomes = [a["outcome"] for a in end["attempts"]]
    return f"the job {end['state']} after {len(outcomes)} attempt(s) ({'; '.join(outcomes)})"
