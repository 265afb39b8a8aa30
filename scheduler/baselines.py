"""The `Algorithm` protocol, the registry every scheduler registers into, and the baselines.

An algorithm places one job on a cluster: `place(cluster, job) -> Decision` or raises
`CannotPlace(reason)`. It never mutates the cluster (the caller allocates) and takes its
randomness from the seed it was constructed with. `make_algorithm("first-fit", seed=1)` builds
one by name; `"NAME:RULE"` joins a baseline with another path rule (`paths.PATH_RULES`), e.g.
`first-fit:widest`. Algorithms that only apply to small instances (exact) also have
`applies(cluster, job) -> bool`.

Baselines place tasks one at a time (breadth-first over the job's logical graph, so peers come
one after another), each on a node chosen among the online nodes where the task fits what is
still free, then route the flows with their path rule and the rate split of `paths`:
  random         uniform among the fitting nodes (seed 004's Random).
  first-fit      the first fitting node in the topology's order (seed 004's Greedy).
  best-fit       the node left with the least free resources: min Σ_r (free_r - demand_r) / max_r,
                 max_r the largest capacity of resource r in the cluster (seed 004's BestFit).
  utilization    the node whose free resources are most proportional to the task's demand:
                 max cosine(demand_r / cap_r, free_r / cap_r) (seed 004's Utilization).
  k8s-spread     Kubernetes' default scoring: NodeResourcesFit LeastAllocated (mean over cpu and
                 memory of the free share after placing) + NodeResourcesBalancedAllocation
                 (1 - std of the cpu/mem(/gpu) used shares after placing), both ×100, random among
                 the best; network-blind: shortest paths and equal fair share of bandwidth.
  network-aware  in the style of Kubernetes' network-aware plugins (NetworkOverhead): the node
                 minimising network cost Σ demand × hops to the task's already-placed peers over
                 paths whose every link has the flow's demand free; nodes with such paths for all
                 peer flows come first (ties: the node with the most free cpu). Routes with the
                 bandwidth-constrained shortest path.
All but the last two default to shortest paths. All but network-aware are network-blind: they run
best-effort by default (`compose.py`), as they would on a plain network.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import networkx as nx
import numpy as np

from .layout import flow_hops, layout, residuals
from .model import EPS, CannotPlace, Cluster, Decision, Job, Task
from .paths import PATH_RULES, assign_flows


class Algorithm(Protocol):
    name: str

    def place(self, cluster: Cluster, job: Job) -> Decision: ...


ALGORITHMS: dict[str, Callable[..., Algorithm]] = {}
# Algorithms defined in modules of their own, imported on first use (they register themselves).
PLUGINS = {
    "exact": "scheduler.exact",
    "ces-ppo": "scheduler.ppo",
    "eade-ddpg": "scheduler.eade.ces",
}


def register(name: str) -> Callable:
    """Class/factory decorator: `@register("my-algo")`; the factory takes `seed=` and keywords."""

    def deco(factory: Callable[..., Algorithm]) -> Callable[..., Algorithm]:
        ALGORITHMS[name] = factory
        return factory

    return deco


def _load_plugin(name: str) -> None:
    module = PLUGINS.get(name)
    if module is None or name in ALGORITHMS:
        return
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # the plugin exists but is broken: say so
            raise


def algorithm_names() -> list[str]:
    """Every registered algorithm, plugins included when their module exists (found, not
    imported: a plugin's import — torch — waits until it is built)."""
    return [n for n in ALGORITHMS if n not in PLUGINS] + [
        n for n, module in PLUGINS.items() if n in ALGORITHMS or importlib.util.find_spec(module)
    ]


def algorithm_factory(name: str) -> Callable[..., Algorithm]:
    """The registered class or factory of `NAME` (a path rule suffix is ignored)."""
    base = name.partition(":")[0]
    _load_plugin(base)
    if base not in ALGORITHMS:
        raise ValueError(f"unknown algorithm '{name}' (known: {', '.join(algorithm_names())})")
    return ALGORITHMS[base]


def make_algorithm(name: str, seed: int = 0, **kw) -> Algorithm:
    """Build an algorithm by registry name (`NAME` or `NAME:PATH_RULE`)."""
    factory = algorithm_factory(name)
    rule = name.partition(":")[2]
    if rule:
        if rule not in PATH_RULES:
            raise ValueError(
                f"unknown path rule '{rule}' in '{name}' (expected one of {', '.join(PATH_RULES)})"
            )
        kw["path_rule"] = rule
    algo = factory(seed=seed, **kw)
    if rule:
        algo.name = name
    return algo


def placement_order(job: Job) -> list[Task]:
    """Tasks breadth-first over the (undirected) logical graph from the first task, so each task
    after the first usually has a placed peer; disconnected parts follow in job order."""
    g = nx.Graph()  # the logical graph's shape only: copying its attributes is the slow part
    g.add_nodes_from(t.name for t in job.tasks)
    g.add_edges_from((f.src, f.dst) for f in job.flows)
    order: list[str] = []
    for t in job.tasks:
        if t.name not in order:
            order += [v for v in nx.bfs_tree(g, t.name) if v not in order]
    return [job.task(n) for n in order]


@dataclass
class Placing:
    """The state of one `place` call as arrays over the online nodes (scoring 1000 nodes per
    task must be cheap): capacities and what is still free (this job's tasks so far subtracted),
    one row per node, columns RESOURCES; and the placement so far."""

    cluster: Cluster
    job: Job
    nodes: list[str]
    cap: np.ndarray
    free: np.ndarray
    placement: dict[str, str] = field(default_factory=dict)
    memo: dict = field(default_factory=dict)  # per-call caches (the cluster does not change)

    @classmethod
    def start(cls, cluster: Cluster, job: Job) -> Placing:
        nodes = cluster.compute_nodes(online_only=True)
        cap = np.array([cluster.capacity(n).as_tuple() for n in nodes], dtype=float).reshape(-1, 3)
        used = np.array([cluster.used[n].as_tuple() for n in nodes], dtype=float).reshape(-1, 3)
        return cls(cluster, job, nodes, cap, cap - used)


@dataclass
class TaskPlacer:
    """Place task by task with `choose`, then route with `path_rule` and the rate split."""

    name: ClassVar[str] = ""
    # Whether placement ignores the network (runs on a plain network by default: compose.py).
    network_blind: ClassVar[bool] = True
    seed: int = 0
    path_rule: str = "shortest"
    k: int = 4  # candidate paths for the ksplit rule
    weighting: str = "bytes"  # rate split weights (paths.WEIGHTINGS)
    first: str = ""  # the first task's node (a search tries several); "": the rule's choice
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.path_rule not in PATH_RULES:
            raise ValueError(
                f"unknown path rule '{self.path_rule}' (expected one of {', '.join(PATH_RULES)})"
            )
        self.rng = np.random.default_rng(self.seed)

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        placement = self.positions(cluster, job)
        flows = assign_flows(cluster, job, placement, self.path_rule, self.k, self.weighting)
        return Decision(job.name, placement, flows, time.perf_counter() - start)

    def positions(self, cluster: Cluster, job: Job) -> dict[str, str]:
        """The placement alone (task -> node), before any routing."""
        st = Placing.start(cluster, job)
        for task in placement_order(job):
            d = np.array(task.demand.as_tuple())
            fits = np.flatnonzero(np.all(st.free >= d - EPS, axis=1))
            if not len(fits):
                raise CannotPlace(
                    f"job {job.name}: task {task.name} (cpu {task.demand.cpu:g}, "
                    f"mem {task.demand.mem_mb:g} MB, gpu {task.demand.gpu:g}) fits "
                    "on no online node"
                )
            if self.first and not st.placement:
                if self.first not in st.nodes or st.nodes.index(self.first) not in fits:
                    raise CannotPlace(
                        f"job {job.name}: task {task.name} does not fit on {self.first}"
                    )
                i = st.nodes.index(self.first)
            else:
                i = int(fits[self.choose(st, d, task, fits)])
            st.free[i] -= d
            st.placement[task.name] = st.nodes[i]
        return st.placement

    def choose(self, st: Placing, d: np.ndarray, task: Task, fits: np.ndarray) -> int:
        """The position in `fits` (node indices, topology order) of the node for `task`
        (demand `d`)."""
        raise NotImplementedError


def _shares(x: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """x / cap per resource, 0 where the node has none of it."""
    return np.divide(x, cap, out=np.zeros_like(x), where=cap > 0)


@register("random")
@dataclass
class RandomPlacer(TaskPlacer):
    name: ClassVar[str] = "random"

    def choose(self, st, d, task, fits):
        return int(self.rng.integers(len(fits)))


@register("first-fit")
@dataclass
class FirstFit(TaskPlacer):
    name: ClassVar[str] = "first-fit"

    def choose(self, st, d, task, fits):
        return 0


@register("best-fit")
@dataclass
class BestFit(TaskPlacer):
    name: ClassVar[str] = "best-fit"

    def choose(self, st, d, task, fits):
        scale = st.cap.max(axis=0)
        leftover = (st.free[fits] - d)[:, scale > 0] / scale[scale > 0]
        return int(np.argmin(leftover.sum(axis=1)))


@register("utilization")
@dataclass
class UtilizationPlacer(TaskPlacer):
    name: ClassVar[str] = "utilization"

    def choose(self, st, d, task, fits):
        cap = st.cap[fits]
        want = _shares(np.broadcast_to(d, cap.shape).copy(), cap)
        have = _shares(st.free[fits], cap)
        norm = np.linalg.norm(want, axis=1) * np.linalg.norm(have, axis=1)
        cosine = np.divide((want * have).sum(axis=1), norm, out=np.zeros(len(fits)), where=norm > 0)
        return int(np.argmax(cosine))


@register("k8s-spread")
@dataclass
class K8sSpread(TaskPlacer):
    name: ClassVar[str] = "k8s-spread"
    weighting: str = "equal"

    def choose(self, st, d, task, fits):
        cap = st.cap[fits]
        after = _shares(st.free[fits] - d, cap)  # free share after placing
        least = 100 * (after[:, 0] + after[:, 1]) / 2
        has = cap > 0
        used = np.where(has, 1 - after, 0.0)
        n = has.sum(axis=1)
        mean = used.sum(axis=1) / n
        std = np.sqrt((np.where(has, used - mean[:, None], 0.0) ** 2).sum(axis=1) / n)
        score = least + 100 * (1 - std)
        top = np.flatnonzero(score >= score.max() - 1e-9)
        return int(top[self.rng.integers(len(top))])


@register("network-aware")
@dataclass
class NetworkAware(TaskPlacer):
    name: ClassVar[str] = "network-aware"
    network_blind: ClassVar[bool] = False
    path_rule: str = "constrained"

    def choose(self, st, d, task, fits):
        placement = st.placement
        # (peer node, demand, inward: the flow goes into the peer) for flows to and from
        # placed peers
        peer_flows = [
            (placement[f.dst], f.demand_mbps, True)
            for f in st.job.flows
            if f.src == task.name and f.dst in placement
        ] + [
            (placement[f.src], f.demand_mbps, False)
            for f in st.job.flows
            if f.dst == task.name and f.src in placement
        ]
        if "layout" not in st.memo:
            lay = layout(st.cluster)
            st.memo["layout"] = (
                lay,
                residuals(st.cluster, lay),
                np.array([lay.index[n] for n in st.nodes], np.int64),
            )
        lay, res, at = st.memo["layout"]
        blocked, cost = flow_hops(
            lay,
            res,
            [(lay.index[node], demand, inward) for node, demand, inward in peer_flows],
            st.memo,
        )
        # the smallest (blocked, demand-weighted hops, most CPU free first) among the candidates
        cand = at[fits]
        return int(np.lexsort((-st.free[fits, 0], cost[cand], blocked[cand]))[0])
