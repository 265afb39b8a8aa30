"""Scenarios: what `experiments/run.py` runs (jobs, background traffic, schedulers, seeds), read
and checked completely before anything is created. Every problem is a `ScenarioError` naming the
file, the field and what was expected."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import networkx as nx
import numpy as np

from lab.inventory import Inventory, load_inventory
from master.scheduling import QUEUES
from scheduler import compose
from scheduler.instances import background_load
from scheduler.jobs import JobDocument, JobError, load_job_documents, parse_job
from scheduler.metrics import packable
from scheduler.model import Cluster
from scheduler.multi import make_policy
from topologies import Topology, is_number, load_topology, read_yaml

HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent
SCENARIOS = HERE / "scenarios"


# --- the scenario ------------------------------------------------------------------------------
class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the field and what was expected."""


@dataclass(frozen=True)
class BackgroundFlow:
    """Another tenant's paced TCP transfer (iperf3) between two compute nodes."""

    src: str
    dst: str
    mbps: float
    path: tuple[str, ...] = ()  # switches; empty: the SDN app's default forwarding
    start_s: float | None = None  # after each run's start (then it stops with the run); None:
    #                               from bring-up to teardown
    cordon: bool = True  # the endpoints are the tenant's machines: no job runs there
    along: str | None = None  # a job: from start_s, the path crosses the link it loads most
    #                           (`tenant_path`), whatever the scheduler decided

    def label(self) -> str:
        return f"{self.src}->{self.dst}"


class BackgroundLoad(NamedTuple):
    """What other tenants hold of the network (`loaded`): `instances.background_load`'s draw."""

    level: float
    seed: int


@dataclass
class Scenario:
    name: str
    source: str
    topology: str
    schedulers: list[str]
    seeds: int
    timeout_s: float
    jobs: list[JobDocument]
    background: list[BackgroundFlow] = field(default_factory=list)
    description: str = ""
    link_scale: float = 1.0  # every link's capacity × this (see `scaled`)
    spread: bool = False  # size the jobs so that no node holds one whole (`spread_out`)
    background_load: BackgroundLoad | None = None  # see `loaded`


SCENARIO_KEYS = {
    "name",
    "description",
    "topology",
    "schedulers",
    "seeds",
    "timeout_s",
    "background",
    "jobs",
    "link_scale",
    "spread",
    "background_load",
}
BACKGROUND_KEYS = {"src", "dst", "mbps", "path", "start_s", "cordon", "along"}
TRAFFIC_CPU, TRAFFIC_MEM_MB = 0.25, 64  # an iperf3 end at most; less on a smaller node


def load_scenario(path: Path) -> Scenario:
    where = str(path)
    doc = read_yaml(path, ScenarioError)
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a mapping with {', '.join(sorted(SCENARIO_KEYS))}")

    def bad(field_: str, expected: str) -> ScenarioError:
        got = doc.get(field_.split(".")[0].split("[")[0], None)
        return ScenarioError(f"{where}: field '{field_}': expected {expected}, got {got!r}")

    unknown = sorted(str(k) for k in set(doc) - SCENARIO_KEYS)  # YAML keys need not be str
    if unknown:
        raise bad(unknown[0], f"one of the known keys ({', '.join(sorted(SCENARIO_KEYS))})")
    if not isinstance(doc.get("name"), str):
        raise bad("name", "a string")
    schedulers = doc.get("schedulers")
    if (
        not isinstance(schedulers, list)
        or not schedulers
        or not all(isinstance(s, str) for s in schedulers)
    ):
        raise bad("schedulers", "a non-empty list of scheduler names")
    seeds, timeout = doc.get("seeds", 1), doc.get("timeout_s", 600)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise bad("seeds", "an integer >= 1")
    if not is_number(timeout) or timeout <= 0:
        raise bad("timeout_s", "a number of seconds > 0")
    scale = doc.get("link_scale", 1.0)
    if not is_number(scale) or not 0 < scale <= 10:
        raise bad("link_scale", "a number in (0, 10]")
    if not isinstance(doc.get("spread", False), bool):
        raise bad("spread", "true or false")
    load = doc.get("background_load")
    if load is not None and not (
        isinstance(load, dict)
        and set(load) == {"level", "seed"}
        and is_number(load["level"])
        and 0 <= load["level"] < 1
        and isinstance(load["seed"], int)
        and not isinstance(load["seed"], bool)
        and load["seed"] >= 0
    ):
        raise bad("background_load", "{level: a number in [0, 1), seed: an integer >= 0}")
    jobs = doc.get("jobs")
    if isinstance(jobs, str):
        try:
            docs = load_job_documents((path.parent / jobs).resolve())
        except ValueError as e:  # a JobError, or a path the OS cannot take (a NUL byte)
            raise ScenarioError(f"{where}: field 'jobs': {e}") from None
    elif isinstance(jobs, list) and jobs:
        try:
            docs = [JobDocument(where, j, parse_job(j, where, i)) for i, j in enumerate(jobs)]
        except JobError as e:
            raise ScenarioError(str(e)) from None
    else:
        raise bad("jobs", "a non-empty list of jobs or the path of a job file/folder")
    background = doc.get("background") or []
    if not isinstance(background, list):
        raise bad("background", "a list of {src, dst, mbps, path?, start_s?, cordon?, along?}")
    return Scenario(
        doc["name"],
        where,
        str(doc.get("topology", "campus")),
        list(schedulers),
        seeds,
        float(timeout),
        docs,
        [
            _background_flow(b, f"{where}: field 'background[{i}]'")
            for i, b in enumerate(background)
        ],
        str(doc.get("description", "")),
        float(scale),
        doc.get("spread", False),
        None if load is None else BackgroundLoad(float(load["level"]), load["seed"]),
    )


def _background_flow(b: object, where: str) -> BackgroundFlow:
    expected = (
        "{src: NODE, dst: NODE, mbps: RATE > 0, path: [SWITCH, ...] (optional), "
        "start_s: SECONDS >= 0 (optional), cordon: true|false (optional), "
        "along: JOB (optional; needs start_s, excludes path)}"
    )
    if (
        not isinstance(b, dict)
        or set(b) - BACKGROUND_KEYS
        or not isinstance(b.get("src"), str)
        or not isinstance(b.get("dst"), str)
        or not is_number(b.get("mbps"))
        or b["mbps"] <= 0
        or not isinstance(b.get("path", []), list)
        or not all(isinstance(v, str) for v in b.get("path", []))
        or not (b.get("start_s") is None or (is_number(b["start_s"]) and b["start_s"] >= 0))
        or not isinstance(b.get("cordon", True), bool)
        or not (
            b.get("along") is None
            or (isinstance(b["along"], str) and b.get("start_s") is not None and not b.get("path"))
        )
    ):
        raise ScenarioError(f"{where}: expected {expected}, got {b!r}")
    start = b.get("start_s")
    return BackgroundFlow(
        b["src"],
        b["dst"],
        float(b["mbps"]),
        tuple(b.get("path", [])),
        None if start is None else float(start),
        b.get("cordon", True),
        b.get("along"),
    )


@dataclass
class Plan:
    """Everything a run needs, checked before anything is created."""

    scenario: Scenario
    topo: Topology
    schedulers: list[str]
    seeds: int
    out: Path
    warnings: list[str] = field(default_factory=list)
    inventory: Inventory | None = None  # --hosts: the real hosts instead of the emulation


def scenario_path(args: argparse.Namespace) -> Path:
    """The scenario file `--scenario`/`--quick` name (default: contention); both is an error."""
    if args.scenario and args.quick:
        raise ScenarioError("--quick and --scenario each name a scenario: give one")
    return (
        Path(args.scenario)
        if args.scenario
        else SCENARIOS / ("quick.yaml" if args.quick else "contention.yaml")
    )


def plan(args: argparse.Namespace) -> Plan:
    """Resolve and check every input; any problem is a ScenarioError/TopologyError/JobError
    (InventoryError for `--hosts`, checked against the topology).
    What could only fail later — a job no node can hold, a background flow its nodes cannot
    send or its path cannot carry — is refused here."""
    scenario = load_scenario(scenario_path(args))
    seeds = scenario.seeds if args.seeds is None else args.seeds
    if seeds < 1:
        raise ScenarioError(f"--seeds: expected an integer >= 1, got {seeds}")
    topo = scaled(load_topology(args.topo or scenario.topology), scenario.link_scale)
    if args.background_seed is not None:
        if scenario.background_load is None:
            raise ScenarioError(f"--background-seed: {scenario.source} has no 'background_load'")
        if args.background_seed < 0:
            raise ScenarioError(
                f"--background-seed: expected an integer >= 0, got {args.background_seed}"
            )
        scenario.background_load = scenario.background_load._replace(seed=args.background_seed)
    if scenario.background_load is not None:
        topo = loaded(topo, *scenario.background_load)
    if args.jobs:
        scenario.jobs = load_job_documents(args.jobs)
    names = [d.job.name for d in scenario.jobs]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{scenario.source}: job names must be unique, got {names}")
    schedulers = args.schedulers.split(",") if args.schedulers else scenario.schedulers
    for name in schedulers:
        try:
            make_policy(name) if name in QUEUES else compose.build(name)
        except (OSError, ValueError, RuntimeError) as e:
            raise ScenarioError(f"--schedulers: '{name}' cannot be used: {e}") from None
    warnings, background = [], []
    for b in scenario.background:
        problem = _background_problem(topo, b)
        if problem:
            warnings.append(f"background {b.label()} skipped: {problem}")
        else:
            background.append(b)
    scenario.background = background
    strays = [b for b in background if b.along is not None and b.along not in names]
    if strays:
        raise ScenarioError(
            f"{scenario.source}: field 'background': along '{strays[0].along}' "
            f"is not a job of the scenario ({', '.join(names)})"
        )
    cordoned = {v for b in background if b.cordon for v in (b.src, b.dst)}
    if scenario.spread:
        scenario.jobs = spread_out(scenario.jobs, topo, cordoned)
    cluster = Cluster.from_topology(topo)
    cluster.offline |= cordoned
    for d in scenario.jobs:
        _check_runnable(d, cluster, topo.name, cordoned)
    waiting = _not_at_once(scenario.jobs, cluster)
    if waiting:
        warnings.append(
            f"the jobs cannot all run at once on {topo.name} (their tasks fit on "
            f"no set of nodes together): some of {', '.join(waiting)} will wait "
            "for another to end"
        )
    inventory = load_inventory(args.hosts, topo) if args.hosts else None
    out = Path(args.out) if args.out else default_out(scenario, topo)
    results_folder(out, "--out")
    return Plan(scenario, topo, schedulers, seeds, out, warnings, inventory)


def results_folder(out: Path, what: str) -> None:
    """Make the folder `out` and check that files can be written in it, last of the checks: a
    run that could not keep its results is refused before anything is built. A ScenarioError
    naming `what` (the option), the folder and why; nothing is left behind."""
    made = [p for p in (out, *out.parents) if not p.exists()]
    probe = out / ".ces-write-test"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        for p in made:  # innermost first
            with contextlib.suppress(OSError):
                p.rmdir()
        why = (
            "exists and is not a folder"
            if isinstance(e, FileExistsError)
            else f"{e.strerror}: {e.filename}"
        )
        raise ScenarioError(f"{what} {out}: cannot write results there ({why})") from None


def scaled(topo: Topology, factor: float) -> Topology:
    """`topo` with every link's capacity × `factor`. The emulation switches packets in software
    on the host's cores: a scenario scales the links down so that they, and not the host's CPU,
    bound what the jobs get (docs/e2e.md, "Sizing")."""
    if factor == 1.0:
        return topo
    return replace(
        topo,
        links=[replace(lk, bw_mbps=lk.bw_mbps * factor) for lk in topo.links],
        source="",
        description=f"{topo.description} (links at {factor:g} × capacity)".strip(),
    )


def loaded(topo: Topology, level: float, seed: int) -> Topology:
    """`topo` as other tenants leave it: the background load the benchmarks draw
    (`instances.background_load` at `level` with numpy's generator at `seed`: each node's CPU and
    memory less a uniform share in [0, level) of it; as many flows as nodes between random pairs
    along shortest paths, each a uniform share in [0, level) of its path's residual), taken off
    the nodes' and links' capacities. A link keeps the smaller of its two directions' residuals
    (an emulated link has one rate). The tenants are not run: what a scheduler is judged on is
    where it puts jobs on a network whose nodes and links differ, and the emulation's CPU is
    better left to the jobs."""
    cluster = background_load(Cluster.from_topology(topo), np.random.default_rng(seed), level)
    free = {n.name: cluster.free(n.name) for n in topo.nodes}
    nodes = [replace(n, cpu=free[n.name].cpu, mem_mb=int(free[n.name].mem_mb)) for n in topo.nodes]
    links = [
        replace(lk, bw_mbps=min(cluster.residual(lk.a, lk.b), cluster.residual(lk.b, lk.a)))
        for lk in topo.links
    ]
    return replace(
        topo,
        nodes=nodes,
        links=links,
        source="",
        description=f"{topo.description} (background load {level:g}, seed {seed})".strip(),
    )


def undelayed(topo: Topology) -> Topology:
    """`topo` with no link delay: the network an emulation runs where the kernel has no sch_netem
    (edge/tc.py shapes the rate and drops the delay), on which the Master must decide."""
    return replace(
        topo,
        links=[replace(lk, delay_ms=0.0) for lk in topo.links],
        source="",
        description=f"{topo.description} (links without their delays)".strip(),
    )


def default_out(scenario: Scenario, topo: Topology) -> Path:
    """Where a run writes when not told: a fresh folder under results/runs/ (not committed),
    so a run never rewrites the results the repository ships."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return REPO / "results" / "runs" / f"{scenario.name}-{topo.name}-{stamp}"


def _background_problem(topo: Topology, b: BackgroundFlow) -> str:
    """Why a background flow cannot run on `topo` ('' if it can)."""
    nodes, switches = {n.name for n in topo.nodes}, {s.name for s in topo.switches}
    missing = [v for v in (b.src, b.dst) if v not in nodes] + [
        v for v in b.path if v not in switches
    ]
    if missing:
        return f"{', '.join(missing)} not in topology {topo.name}"
    if b.src == b.dst:
        return "src and dst are the same node"
    for v in (b.src, b.dst):
        if topo.node(v).cpu < 0.01 or topo.node(v).mem_mb < 32:
            return (
                f"node {v} is too small to run a traffic end (cpu {topo.node(v).cpu:g}, "
                f"{topo.node(v).mem_mb:g} MiB)"
            )
    if b.path:
        graph = topo.graph()
        ends = [topo.access_link(b.src).other(b.src), topo.access_link(b.dst).other(b.dst)]
        if [b.path[0], b.path[-1]] != ends or not all(
            graph.has_edge(u, v) for u, v in zip(b.path, b.path[1:])
        ):
            return f"path {list(b.path)} is not a path from {ends[0]} to {ends[1]}"
    return ""


def tenant_path(
    topo: Topology, b: BackgroundFlow, flows: list[dict]
) -> tuple[list[str], tuple[str, str]] | None:
    """The switches `b`'s transfer takes to cross the inter-switch link that the job's `flows`
    (each with `path`, nodes included, and `rate_mbps`) load most, relative to its capacity, and
    that link; None if the flows cross no switch-to-switch link or no loop-free path from b.src
    through it to b.dst exists. Among equally loaded links: the tenant's path that shares the
    fewest other links with the job, then the link with the widest detour (the tenant lands
    where a re-route has somewhere to go, so that runtime adjustment is what the run measures),
    then the tenant's widest and shortest path."""
    g = topo.graph()
    switches = g.subgraph(s.name for s in topo.switches)
    load: dict[tuple[str, str], float] = {}
    for f in flows:
        hops = f.get("path") or []
        for u, v in itertools.pairwise(hops):
            if switches.has_edge(u, v):
                load[(u, v)] = load.get((u, v), 0.0) + (f.get("rate_mbps") or 0.0)

    def detour(u: str, v: str) -> float:  # the bottleneck of the widest u-v path avoiding u-v
        for width in sorted({d["bw_mbps"] for *_, d in switches.edges(data=True)}, reverse=True):
            wide = nx.subgraph_view(
                switches,
                filter_edge=lambda x, y, width=width: (
                    {x, y} != {u, v} and switches.edges[x, y]["bw_mbps"] >= width
                ),
            )
            if nx.has_path(wide, u, v):
                return width
        return 0.0

    first, last = (topo.access_link(n).other(n) for n in (b.src, b.dst))
    ranked = []
    for u, v in load:
        try:
            head = nx.shortest_path(switches.subgraph(set(switches) - {v}), first, u)
            tail = nx.shortest_path(switches.subgraph(set(switches) - set(head)), v, last)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            continue
        path = head + tail
        hops = list(itertools.pairwise(path))
        width = min(g.edges[x, y]["bw_mbps"] for x, y in hops)
        shared = sum(hop in load for hop in hops) - 1  # the job's other links the tenant loads
        ranked.append(
            (
                load[u, v] / g.edges[u, v]["bw_mbps"],
                shared,
                -detour(u, v),
                -width,
                len(path),
                path,
                (u, v),
            )
        )
    if not ranked:
        return None
    top = max(r[0] for r in ranked)  # within 5 % of the most loaded counts as equally loaded
    return min(ranked, key=lambda r: (-min(r[0], 0.95 * top), *r[1:5]))[5:]


def traffic_quota(node) -> tuple[float, int]:
    """(cpu, MiB) of one traffic end on `node`: within what the node has."""
    return min(TRAFFIC_CPU, node.cpu), int(min(TRAFFIC_MEM_MB, node.mem_mb))


def spread_out(docs: list[JobDocument], topo: Topology, cordoned: set[str]) -> list[JobDocument]:
    """The jobs with every task asking at least the least memory with which no node of `topo`
    (but the `cordoned` ones) holds the whole job: ⌊the largest node's memory / the job's
    tasks⌋ + 1 MiB, so that every job spans nodes whatever the topology (a scenario's `spread:
    true`). A task that asks for more keeps it; a one-task job cannot be spread and stays."""
    sizes = [n.mem_mb for n in topo.nodes if n.name not in cordoned]
    if not sizes:
        raise ScenarioError(
            f"topology {topo.name}: every compute node is a background "
            "endpoint (cordoned): no node is left to spread the jobs over"
        )
    largest = max(sizes)
    out = []
    for d in docs:
        if len(d.job.tasks) < 2:
            out.append(d)
            continue
        least = largest // len(d.job.tasks) + 1

        def sized(task: dict, least: int = least) -> dict:
            return {**task, "mem_mb": max(task.get("mem_mb") or 0, least)}

        mapping = dict(d.mapping)
        for key in ("task", "ps"):
            if isinstance(mapping.get(key), dict):
                mapping[key] = sized(mapping[key])
        if isinstance(mapping.get("tasks"), list):
            mapping["tasks"] = [sized(t) for t in mapping["tasks"]]
        out.append(JobDocument(d.source, mapping, parse_job(mapping, d.source)))
    return out


def _not_at_once(docs: list[JobDocument], cluster: Cluster) -> list[str]:
    """The jobs' names if their tasks together fit on no set of the `cluster`'s online nodes
    (network ignored; [] when they do, or when the search could not settle it)."""
    if len(docs) < 2:
        return []
    together = replace(docs[0].job, tasks=[t for d in docs for t in d.job.tasks], flows=[])
    return (
        []
        if packable(cluster, together, budget=20_000) is not False
        else [d.job.name for d in docs]
    )


def _check_runnable(d: JobDocument, cluster: Cluster, topo: str, cordoned: set[str]) -> None:
    """Refuse a job whose tasks fit on no set of the online nodes of `cluster` (topology `topo`,
    the `cordoned` nodes offline)."""
    job = d.job
    if packable(cluster, job, budget=20_000) is False:
        raise ScenarioError(
            f"{d.source}: job '{job.name}': its tasks fit on no set of "
            f"{'uncordoned ' if cordoned else ''}nodes of topology {topo}, "
            "even with nothing else running"
        )
