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
All but the last two default to shortest paths (they are network-blind placements).
"""
from __future__ import annotations

import importlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol

import networkx as nx
import numpy as np

from .model import CannotPlace, Cluster, Decision, Job, Resources, Task
from .paths import PATH_RULES, assign_flows, hop_distances


class Algorithm(Protocol):
    name: str

    def place(self, cluster: Cluster, job: Job) -> Decision: ...


ALGORITHMS: dict[str, Callable[..., Algorithm]] = {}
# Algorithms defined in modules of their own, imported on first use (they register themselves).
PLUGINS = {"exact": "scheduler.exact", "ces-ppo": "scheduler.ppo"}


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
    """Every registered algorithm, plugins included when their module exists."""
    for name in PLUGINS:
        _load_plugin(name)
    return list(ALGORITHMS)


def make_algorithm(name: str, seed: int = 0, **kw) -> Algorithm:
    """Build an algorithm by registry name (`NAME` or `NAME:PATH_RULE`)."""
    base, _, rule = name.partition(":")
    _load_plugin(base)
    if base not in ALGORITHMS:
        raise ValueError(f"unknown algorithm '{name}' (known: {', '.join(algorithm_names())})")
    if rule:
        if rule not in PATH_RULES:
            raise ValueError(f"unknown path rule '{rule}' in '{name}' (expected one of "
                             f"{', '.join(PATH_RULES)})")
        kw["path_rule"] = rule
    algo = ALGORITHMS[base](seed=seed, **kw)
    if rule:
        algo.name = name
    return algo


def placement_order(job: Job) -> list[Task]:
    """Tasks breadth-first over the (undirected) logical graph from the first task, so each task
    after the first usually has a placed peer; disconnected parts follow in job order."""
    g = job.logical_graph().to_undirected()
    order: list[str] = []
    for t in job.tasks:
        if t.name not in order:
            order += [v for v in nx.bfs_tree(g, t.name) if v not in order]
    return [job.task(n) for n in order]


@dataclass
class Placing:
    """The state of one `place` call: what is free (this job's tasks so far subtracted), node
    capacities as tuples (read once: scoring 1000 nodes per task must be cheap), and the
    placement so far."""
    cluster: Cluster
    job: Job
    free: dict[str, Resources]
    caps: dict[str, tuple[float, float, float]]
    placement: dict[str, str] = field(default_factory=dict)


@dataclass
class TaskPlacer:
    """Place task by task with `choose`, then route with `path_rule` and the rate split."""
    name: ClassVar[str] = ""
    seed: int = 0
    path_rule: str = "shortest"
    k: int = 4  # candidate paths for the ksplit rule
    weighting: str = "bytes"  # rate split weights (paths.WEIGHTINGS)
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.path_rule not in PATH_RULES:
            raise ValueError(f"unknown path rule '{self.path_rule}' (expected one of "
                             f"{', '.join(PATH_RULES)})")
        self.rng = np.random.default_rng(self.seed)

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        nodes = cluster.compute_nodes(online_only=True)
        st = Placing(cluster, job, {n: cluster.free(n) for n in nodes},
                     {n: cluster.capacity(n).as_tuple() for n in nodes})
        for task in placement_order(job):
            fits = [n for n, f in st.free.items() if task.demand.fits_in(f)]
            if not fits:
                raise CannotPlace(f"job {job.name}: task {task.name} (cpu {task.demand.cpu:g}, "
                                  f"mem {task.demand.mem_mb:g} MB, gpu {task.demand.gpu:g}) fits "
                                  "on no online node")
            node = self.choose(st, task, fits)
            st.free[node] = st.free[node] - task.demand
            st.placement[task.name] = node
        flows = assign_flows(cluster, job, st.placement, self.path_rule, self.k, self.weighting)
        return Decision(job.name, st.placement, flows, time.perf_counter() - start)

    def choose(self, st: Placing, task: Task, fits: list[str]) -> str:
        raise NotImplementedError


@register("random")
@dataclass
class RandomPlacer(TaskPlacer):
    name: ClassVar[str] = "random"

    def choose(self, st, task, fits):
        return fits[int(self.rng.integers(len(fits)))]


@register("first-fit")
@dataclass
class FirstFit(TaskPlacer):
    name: ClassVar[str] = "first-fit"

    def choose(self, st, task, fits):
        return fits[0]


@register("best-fit")
@dataclass
class BestFit(TaskPlacer):
    name: ClassVar[str] = "best-fit"

    def choose(self, st, task, fits):
        scale = [max(c[i] for c in st.caps.values()) for i in range(3)]
        d = task.demand.as_tuple()

        def leftover(n: str) -> float:
            f = st.free[n].as_tuple()
            return sum((f[i] - d[i]) / scale[i] for i in range(3) if scale[i] > 0)
        return min(fits, key=leftover)


def _cosine(a: list[float], b: list[float]) -> float:
    na, nb = math.hypot(*a), math.hypot(*b)
    return sum(x * y for x, y in zip(a, b)) / (na * nb) if na > 0 and nb > 0 else 0.0


@register("utilization")
@dataclass
class UtilizationPlacer(TaskPlacer):
    name: ClassVar[str] = "utilization"

    def choose(self, st, task, fits):
        d = task.demand.as_tuple()

        def match(n: str) -> float:
            cap, f = st.caps[n], st.free[n].as_tuple()
            idx = [i for i in range(3) if cap[i] > 0]
            return _cosine([d[i] / cap[i] for i in idx], [f[i] / cap[i] for i in idx])
        return max(fits, key=match)


@register("k8s-spread")
@dataclass
class K8sSpread(TaskPlacer):
    name: ClassVar[str] = "k8s-spread"
    weighting: str = "equal"

    def choose(self, st, task, fits):
        d = task.demand.as_tuple()

        def score(n: str) -> float:
            cap, f = st.caps[n], st.free[n].as_tuple()
            after = [f[i] - d[i] for i in range(3)]
            least = 100 * (after[0] / cap[0] + after[1] / cap[1]) / 2
            used = [1 - after[i] / cap[i] for i in range(3) if cap[i] > 0]
            mean = sum(used) / len(used)
            std = math.sqrt(sum((u - mean) ** 2 for u in used) / len(used))
            return least + 100 * (1 - std)
        scores = {n: score(n) for n in fits}
        best = max(scores.values())
        top = [n for n in fits if scores[n] >= best - 1e-9]
        return top[int(self.rng.integers(len(top)))]


@register("network-aware")
@dataclass
class NetworkAware(TaskPlacer):
    name: ClassVar[str] = "network-aware"
    path_rule: str = "constrained"

    def choose(self, st, task, fits):
        cluster, placement = st.cluster, st.placement
        # (peer node, demand, flow goes towards the new task?) for flows to placed peers
        peer_flows = [(placement[f.dst], f.demand_mbps, False) for f in st.job.flows
                      if f.src == task.name and f.dst in placement] + \
                     [(placement[f.src], f.demand_mbps, True) for f in st.job.flows
                      if f.dst == task.name and f.src in placement]
        # hops from the new node to a peer = BFS from the peer against the flow's direction
        tight = [hop_distances(cluster, node, demand, towards=not to_new)
                 for node, demand, to_new in peer_flows]
        loose: list[dict[str, int] | None] = [None] * len(peer_flows)

        def key(n: str) -> tuple[bool, float, float]:
            cost, blocked = 0.0, False
            for i, (node, demand, to_new) in enumerate(peer_flows):
                if n == node:
                    continue
                hops = tight[i].get(n)
                if hops is None:
                    blocked = True
                    if loose[i] is None:
                        loose[i] = hop_distances(cluster, node, towards=not to_new)
                    hops = loose[i].get(n, math.inf)
                cost += demand * hops
            return (blocked, cost, -st.free[n].cpu)
        return min(fits, key=key)
