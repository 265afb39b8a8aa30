"""The scheduler's data model: the cluster it sees, the jobs it places, the decisions it makes.

A `Cluster` is the physical graph G=(V,E) (built from a `topologies.Topology`) with what is in use:
resources allocated per compute node and bandwidth reserved per *directed* link (links are full
duplex: each direction has the link's capacity). A `Job` is a set of tasks plus a logical
communication graph between them (any directed graph: ring, star, tree, all-to-all, custom, cycles
allowed). A `Decision` places every task on a node and gives every flow between tasks on different
nodes a path in G and a rate. `check_decision` is the one feasibility check used everywhere.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from topologies import Topology

RESOURCES = ("cpu", "mem_mb", "gpu")
EPS = 1e-9
# How the network carries a decision's flows:
ENFORCED = "enforced"  # on its paths at its rates: installed in the network, reserved in the view
BEST_EFFORT = "best-effort"  # nothing installed or reserved: the network's default paths, TCP's
#                               share (the decision's paths and rates are what it expects then)
NETWORK_MODES = (ENFORCED, BEST_EFFORT)


@dataclass(frozen=True)
class Resources:
    cpu: float = 0.0  # cores
    mem_mb: float = 0.0
    gpu: float = 0.0

    def __add__(self, o: Resources) -> Resources:
        return Resources(self.cpu + o.cpu, self.mem_mb + o.mem_mb, self.gpu + o.gpu)

    def __sub__(self, o: Resources) -> Resources:
        return Resources(self.cpu - o.cpu, self.mem_mb - o.mem_mb, self.gpu - o.gpu)

    def fits_in(self, o: Resources) -> bool:
        return self.cpu <= o.cpu + EPS and self.mem_mb <= o.mem_mb + EPS and self.gpu <= o.gpu + EPS

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.cpu, self.mem_mb, self.gpu)


@dataclass(frozen=True)
class Task:
    name: str
    demand: Resources


@dataclass(frozen=True)
class LogicalFlow:
    """A directed edge of the job's communication graph."""

    src: str  # task name
    dst: str
    demand_mbps: float  # the bandwidth the job asks for on this flow
    bytes_per_iter: float  # what it carries per training iteration


@dataclass
class Job:
    name: str
    tasks: list[Task]
    flows: list[LogicalFlow]
    collective: str = "ring"  # ring | star | tree | all-to-all | custom
    model_bytes: float = 0.0  # parameters exchanged per iteration (bytes)
    compute_s: float = 0.0  # seconds of compute per iteration per task on one reference core
    iterations: int | None = None
    target_accuracy: float | None = None
    priority: int = 0
    submit_time: float = 0.0
    deadline: float | None = None  # seconds after submit
    image: str = ""
    command: str = ""
    workload: dict = field(default_factory=dict)  # what the real worker runs (model, dataset, ...)
    # A ring's gradient as DDP buckets it (bytes per bucket, in launch order: `perfmodel.
    # overlapped_s`); empty: one bucket, all-reduced after the backward pass.
    ddp_buckets: tuple[float, ...] = ()

    def task(self, name: str) -> Task:
        return next(t for t in self.tasks if t.name == name)

    def total_demand(self) -> Resources:
        total = Resources()
        for t in self.tasks:
            total = total + t.demand
        return total

    def logical_graph(self) -> nx.DiGraph:
        g = nx.DiGraph(name=self.name)
        for t in self.tasks:
            g.add_node(t.name, demand=t.demand)
        for f in self.flows:
            g.add_edge(f.src, f.dst, demand_mbps=f.demand_mbps, bytes_per_iter=f.bytes_per_iter)
        return g


@dataclass(frozen=True)
class FlowAssignment:
    src: str  # task names
    dst: str
    path: tuple[str, ...]  # vertices of G from src's node to dst's node (both compute nodes)
    rate_mbps: float

    def directed_links(self) -> list[tuple[str, str]]:
        return list(zip(self.path, self.path[1:]))


@dataclass
class Decision:
    job: str
    placement: dict[str, str]  # task -> compute node
    flows: list[FlowAssignment]  # one per logical flow whose ends are on different nodes
    decision_s: float = 0.0  # wall time the algorithm took
    network: str = ENFORCED  # NETWORK_MODES

    def flow(self, src: str, dst: str) -> FlowAssignment | None:
        return next((f for f in self.flows if f.src == src and f.dst == dst), None)


def placement_key(placement: dict[str, str]) -> tuple:
    """A placement as a hashable value: the same tasks on the same nodes, the same key."""
    return tuple(sorted(placement.items()))


class CannotPlace(Exception):
    """An algorithm's clear answer that the job does not fit now (the message says why)."""


class Cluster:
    """G with its capacities and what is in use. Mutated only through `allocate`/`release`."""

    def __init__(self, graph: nx.Graph):
        self.graph = graph
        self.offline: set[str] = set()  # nodes that left or stopped heartbeating
        self.used: dict[str, Resources] = {n: Resources() for n in self.compute_nodes()}
        self.reserved: dict[tuple[str, str], float] = {}  # directed link -> Mbit/s
        self.jobs: dict[str, tuple[Job, Decision]] = {}

    @classmethod
    def from_topology(cls, topo: Topology) -> Cluster:
        return cls(topo.graph().copy())

    def copy(self, share_graph: bool = False) -> Cluster:
        """An independent copy; with `share_graph` the (read-only) graph is shared, which makes
        the copy cheap for a what-if view of the allocations."""
        c = copy.copy(self)
        c.graph = self.graph if share_graph else self.graph.copy()
        c.used, c.reserved = dict(self.used), dict(self.reserved)
        c.offline, c.jobs = set(self.offline), dict(self.jobs)
        return c

    # --- views ------------------------------------------------------------------------------------
    def compute_nodes(self, online_only: bool = False) -> list[str]:
        return [
            n
            for n, d in self.graph.nodes(data=True)
            if d["kind"] == "compute" and not (online_only and n in self.offline)
        ]

    def capacity(self, node: str) -> Resources:
        d = self.graph.nodes[node]
        return Resources(d["cpu"], d["mem_mb"], d.get("gpu", 0))

    def free(self, node: str) -> Resources:
        if node in self.offline:
            return Resources()
        return self.capacity(node) - self.used[node]

    def speed(self, node: str) -> float:
        return self.graph.nodes[node].get("speed", 1.0)

    def resource_table(self, nodes: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`capacity`, `free` (as (cpu, mem_mb, gpu) rows) and `speed` of many nodes at once:
        the placement policy reads a thousand nodes per decision."""
        attrs = [self.graph.nodes[n] for n in nodes]
        capacity = np.array(
            [(d["cpu"], d["mem_mb"], d.get("gpu", 0)) for d in attrs], float
        ).reshape(-1, 3)
        used = np.array([self.used[n].as_tuple() for n in nodes], float).reshape(-1, 3)
        offline = np.array([n in self.offline for n in nodes], bool)
        free = np.where(offline[:, None], 0.0, capacity - used)
        return capacity, free, np.array([d.get("speed", 1.0) for d in attrs], float)

    def link_capacity(self, u: str, v: str) -> float:
        return self.graph.edges[u, v]["bw_mbps"]

    def residual(self, u: str, v: str) -> float:
        """Unreserved Mbit/s on the directed link u→v."""
        return self.link_capacity(u, v) - self.reserved.get((u, v), 0.0)

    def path_residual(self, path: Iterable[str]) -> float:
        path = list(path)
        return min((self.residual(u, v) for u, v in itertools.pairwise(path)), default=float("inf"))

    def utilisation(self, node: str) -> tuple[float, float, float]:
        """Fraction of each resource in use (gpu 0 where the node has none)."""
        cap, used = self.capacity(node), self.used[node]
        return tuple(u / c if c > 0 else 0.0 for u, c in zip(used.as_tuple(), cap.as_tuple()))

    # --- changes ----------------------------------------------------------------------------------
    def allocate(self, job: Job, decision: Decision) -> None:
        problems = check_decision(self, job, decision)
        if problems:
            raise ValueError(f"infeasible decision for job {job.name}: {problems[0]}")
        for task, node in decision.placement.items():
            self.used[node] = self.used[node] + job.task(task).demand
        self._reserve(decision, +1)
        self.jobs[job.name] = (job, decision)

    def release(self, job_name: str) -> None:
        job, decision = self.jobs.pop(job_name)
        for task, node in decision.placement.items():
            self.used[node] = self.used[node] - job.task(task).demand
        self._reserve(decision, -1)

    def _reserve(self, decision: Decision, sign: int) -> None:
        if decision.network != ENFORCED:
            return  # best-effort flows hold nothing: TCP shares whatever is there
        for f in decision.flows:
            for link in f.directed_links():
                self.reserved[link] = self.reserved.get(link, 0.0) + sign * f.rate_mbps


def check_decision(cluster: Cluster, job: Job, decision: Decision) -> list[str]:
    """Every reason `decision` is infeasible on `cluster` as it is now (empty: feasible).

    Checks: every task placed exactly once on an online compute node; per-node capacity; one
    assignment per inter-node logical flow (none for co-located ones) whose path is contiguous in
    G, starts at the src task's node and ends at the dst task's node, passes through no other
    compute node, with a rate > 0 that fits the residual bandwidth of every directed link (summed
    over this decision's flows) — the last for enforced decisions only (a best-effort decision
    reserves nothing).
    """
    if decision.network not in NETWORK_MODES:
        return [f"network mode {decision.network!r} is not one of {', '.join(NETWORK_MODES)}"]
    problems: list[str] = []
    tasks = {t.name for t in job.tasks}
    placed = set(decision.placement)
    if placed != tasks:
        missing, extra = sorted(tasks - placed), sorted(placed - tasks)
        problems += [f"task {t} not placed" for t in missing]
        problems += [f"unknown task {t} placed" for t in extra]
    load: dict[str, Resources] = {}
    for task, node in decision.placement.items():
        if node not in cluster.graph or cluster.graph.nodes[node]["kind"] != "compute":
            problems.append(f"task {task} placed on {node}, which is not a compute node")
            continue
        if node in cluster.offline:
            problems.append(f"task {task} placed on offline node {node}")
        if task in tasks:
            load[node] = load.get(node, Resources()) + job.task(task).demand
    for node, demand in load.items():
        if not demand.fits_in(cluster.free(node)):
            problems.append(
                f"node {node} over capacity: needs {demand.as_tuple()}, "
                f"free {cluster.free(node).as_tuple()}"
            )
    if problems:
        return problems

    wanted = {
        (f.src, f.dst) for f in job.flows if decision.placement[f.src] != decision.placement[f.dst]
    }
    given = [(f.src, f.dst) for f in decision.flows]
    if len(given) != len(set(given)):
        problems.append("a logical flow has more than one assignment")
    for pair in sorted(wanted - set(given)):
        problems.append(f"flow {pair[0]}->{pair[1]} crosses nodes but has no path")
    for pair in sorted(set(given) - wanted):
        problems.append(f"flow {pair[0]}->{pair[1]} is not an inter-node flow of the job")

    reserve: dict[tuple[str, str], float] = {}
    for f in decision.flows:
        if (f.src, f.dst) not in wanted:
            continue
        src_node, dst_node = decision.placement[f.src], decision.placement[f.dst]
        name = f"flow {f.src}->{f.dst}"
        if len(f.path) < 2 or f.path[0] != src_node or f.path[-1] != dst_node:
            problems.append(f"{name}: path must run from {src_node} to {dst_node}, got {f.path}")
            continue
        if any(cluster.graph.nodes.get(v, {}).get("kind") != "switch" for v in f.path[1:-1]):
            problems.append(f"{name}: path passes through a compute node or unknown vertex")
            continue
        if len(set(f.path)) != len(f.path):
            problems.append(f"{name}: path has a loop")
            continue
        if not all(cluster.graph.has_edge(u, v) for u, v in f.directed_links()):
            problems.append(f"{name}: path is not contiguous in the topology")
            continue
        if not f.rate_mbps > 0:
            problems.append(f"{name}: rate must be > 0, got {f.rate_mbps}")
            continue
        for link in f.directed_links():
            reserve[link] = reserve.get(link, 0.0) + f.rate_mbps
    for (u, v), rate in sorted(reserve.items()):
        if decision.network == ENFORCED and rate > cluster.residual(u, v) + 1e-6:
            problems.append(
                f"link {u}->{v} over capacity: {rate:.3f} Mbit/s requested, "
                f"{cluster.residual(u, v):.3f} free"
            )
    return problems
