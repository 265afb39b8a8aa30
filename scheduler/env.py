"""The single-job placement MDP CES-PPO learns in (DESIGN §3), with a gymnasium front end.

One episode places one job; one step places one task, in an order that follows the job's logical
graph (`baselines.placement_order`: breadth-first, so every task after the first has a placed
peer).
A step's action is dual:
  - the *placement*: a compute node (infeasible nodes are masked);
  - the *bandwidth* choice, per new logical flow between this task and an already-placed peer on
    another node: one of up to k candidate paths (`scheduler.paths.candidate_paths`, with the
    widest path standing in when none of them has residual bandwidth) and a rate level, the
    fraction of the flow's demand the job asks for on it.
The job's flows then share the residual bandwidth of their links by the project's rate split
(`scheduler.paths.fair_rates`, weighted by bytes per iteration, capped at the requested rate), so
a choice that is not masked is always feasible: every unmasked path has residual on every link.

`PlacementEpisode` is the MDP on one (cluster, job): observations as arrays for a graph encoder,
masks, the flow options of a chosen node, rewards, and the final `Decision`. It never mutates the
cluster: the job's own use is kept in arrays, and the decision is checked with `check_decision`.
`PlacementEnv` is the `gymnasium.Env` around it, drawing a random topology (router graphs through
`topologies.from_graph`, and campus-like tiered networks), random capacities, random background
load (random jobs, or `scheduler.instances.background_load`) and a random job
(`scheduler.instances.random_job`) on every `reset`.
"""
from __future__ import annotations

import heapq
import math
import weakref
from dataclasses import dataclass, field

import gymnasium as gym
import networkx as nx
import numpy as np
from gymnasium import spaces

from .baselines import make_algorithm, placement_order
from .instances import JobDistribution, background_load, load_background, random_job, \
    random_topology
from .metrics import DEFAULT_MODEL, predicted_iteration_s
from .model import EPS, CannotPlace, Cluster, Decision, FlowAssignment, Job, LogicalFlow
from .paths import NoPath, candidate_paths, fair_rates, widest_path
from .perfmodel import collective_steps, compute_time_s

Path = tuple[str, ...]

# Feature layouts (every feature is scaled into [0, 1]).
NODE_FEATURES = 18  # per vertex of G (compute nodes first, then switches)
EDGE_FEATURES = 4  # per directed link
JOB_FEATURES = 16
FLOW_FEATURES = 5  # per new flow of a step
PATH_FEATURES = 7  # per candidate path of a new flow
COLLECTIVES = ("ring", "star", "tree", "all-to-all", "custom")
BW_CAP = 2.0  # bandwidth features are min(bw / demand, BW_CAP) / BW_CAP


@dataclass(frozen=True)
class RewardConfig:
    """The heuristic reward of DESIGN §3: every weight in one place."""
    balance: float = 3.0  # × decrease of the std of node utilisation Ū_n this step
    bandwidth: float = 0.5  # × change of the job's Σ(granted - demanded)/Σ demanded this step
    hops: float = 0.05  # × hops/10 of each new flow, weighted by its share of the job's demand
    iteration: float = 1.0  # × log(reference / predicted iteration time), at the end ...
    iteration_floor: float = -4.0  # ... clipped below here, so that ...
    infeasible: float = 6.0  # ... failing (a masked choice, a dead end) is always worse


@dataclass(frozen=True)
class EnvConfig:
    k_paths: int = 4
    rate_levels: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)  # fractions of a flow's demand
    max_nodes: int = 48  # node action-space size of PlacementEnv (random topologies stay below)
    max_flows: int = 16  # per step, action-space size of PlacementEnv
    sites: tuple[int, int] = (2, 30)  # compute nodes of the random topologies
    background: tuple[float, float] = (0.0, 0.5)  # share of nodes/links already in use
    jobs: JobDistribution = JobDistribution(max_workers=8)  # the random jobs
    episodes_per_topology: int = 16  # random jobs placed one after another on one network
    # Heuristics that guide early training: the teacher of an episode is the one whose decision
    # has the best predicted iteration time (only the first is run when `PlacementEnv.compare`
    # is off: it is the yardstick of the learning curve). Empty: no teacher.
    teachers: tuple[str, ...] = ("network-aware", "first-fit", "best-fit", "utilization")
    reward: RewardConfig = field(default_factory=RewardConfig)


@dataclass
class Layout:
    """G's structure as index arrays (compute nodes first, then switches; both directions of
    every link), with what depends on structure only: hop distances and the k shortest paths;
    and the links' attribute dicts themselves, so that reading a capacity needs no graph view.
    Kept per graph object, as a real scheduler keeps its routes per topology: a Cluster's graph
    is read-only in structure (node leave/join and capacity changes do not touch it); the size
    is checked all the same."""
    size: tuple[int, int]
    compute: list[str]
    vertices: list[str]
    index: dict[str, int]
    src: np.ndarray  # (E,) int64
    dst: np.ndarray  # (E,) int64
    edge_id: dict[tuple[str, str], int]
    out_edges: list[list[tuple[int, int]]]  # per vertex: (neighbour, link)
    in_edges: list[list[tuple[int, int]]]
    degree: np.ndarray  # (V,)
    links: list[dict]  # G's link attribute dicts (live: a link's new bandwidth shows), G's order
    hops: dict[int, np.ndarray] = field(default_factory=dict)
    routes: dict[tuple[str, str, int], list[Path]] = field(default_factory=dict)


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layout(cluster: Cluster) -> Layout:
    g = cluster.graph
    size = (len(g), len(g.edges))
    lay = _LAYOUTS.get(g)
    if lay is None or lay.size != size:
        compute = cluster.compute_nodes()
        vertices = compute + [v for v, d in g.nodes(data=True) if d["kind"] == "switch"]
        index = {v: i for i, v in enumerate(vertices)}
        links = list(g.edges(data=True))
        pairs = [(a, b) for u, v, _ in links for a, b in ((u, v), (v, u))]
        src = np.array([index[a] for a, _ in pairs], np.int64)
        dst = np.array([index[b] for _, b in pairs], np.int64)
        out_edges: list[list[tuple[int, int]]] = [[] for _ in vertices]
        in_edges: list[list[tuple[int, int]]] = [[] for _ in vertices]
        for e, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
            out_edges[a].append((b, e))
            in_edges[b].append((a, e))
        lay = _LAYOUTS[g] = Layout(size, compute, vertices, index, src, dst,
                                   {pr: e for e, pr in enumerate(pairs)}, out_edges, in_edges,
                                   np.bincount(src, minlength=len(vertices)),
                                   [d for _, _, d in links])
    return lay


def shortest_candidates(cluster: Cluster, a: str, b: str, k: int,
                        lay: Layout | None = None) -> list[Path]:
    """`paths.candidate_paths(cluster, a, b, k)`, remembered per graph (`lay`: its layout)."""
    routes = (lay or layout(cluster)).routes
    if (a, b, k) not in routes:
        routes[(a, b, k)] = candidate_paths(cluster, a, b, k)
    return routes[(a, b, k)]


@dataclass
class Observation:
    node_x: np.ndarray  # (V, NODE_FEATURES) float32; vertices 0..n_compute-1 are compute nodes
    edge_index: np.ndarray  # (2, E) int64, directed links (both directions of every link)
    edge_x: np.ndarray  # (E, EDGE_FEATURES) float32
    job_x: np.ndarray  # (JOB_FEATURES,) float32
    node_mask: np.ndarray  # (n_compute,) bool: feasible nodes for this step's task
    n_compute: int


@dataclass
class FlowOptions:
    """The bandwidth choices of one step once its node is chosen (F new flows, K paths)."""
    flows: list[LogicalFlow]
    paths: list[list[Path]]  # per flow, up to K candidates
    flow_x: np.ndarray  # (F, FLOW_FEATURES)
    peer: np.ndarray  # (F,) int64: vertex index of the peer task's node
    path_x: np.ndarray  # (F, K, PATH_FEATURES)
    path_mask: np.ndarray  # (F, K) bool


class PlacementEpisode:
    """The MDP on one cluster and one job (see module doc). Never mutates `cluster`."""

    def __init__(self, cluster: Cluster, job: Job, cfg: EnvConfig = EnvConfig(),
                 shaping: bool = True):
        """`shaping=False` (inference) skips the rewards: `step` returns 0 and the end's info
        has no predicted iteration time."""
        self.cluster, self.job, self.cfg, self.shaping = cluster, job, cfg, shaping
        lay = self.layout = layout(cluster)
        self.compute, self.vertices, self.index = lay.compute, lay.vertices, lay.index
        self.src, self.dst, self.edge_id = lay.src, lay.dst, lay.edge_id
        self.out_edges, self.in_edges, self.degree = lay.out_edges, lay.in_edges, lay.degree
        self.cap = np.repeat([d["bw_mbps"] for d in lay.links], 2).astype(float)
        self.delay = np.repeat([d.get("delay_ms", 0.0) for d in lay.links], 2).astype(float)
        # Cluster.residual, for all directed links at once (capacity as read above).
        reserved = cluster.reserved
        self.residual = (self.cap - np.array([reserved.get(pr, 0.0) for pr in self.edge_id])
                         ).clip(min=0.0)
        self.capacity = np.array([cluster.capacity(c).as_tuple() for c in self.compute])
        self.free = np.array([cluster.free(c).as_tuple() for c in self.compute])
        self.online = np.array([c not in cluster.offline for c in self.compute])
        self.speed = np.array([cluster.speed(c) for c in self.compute])
        self.cap_scale = np.maximum(self.capacity.max(axis=0), EPS)
        self.cap_scale[2] = max(self.cap_scale[2], 1.0)
        self.has_res = self.capacity > 0  # R_n of metrics.node_utilisation
        self.base_used = self.capacity - self.free
        self.saturated = bool((self.residual <= EPS).any())
        self._candidates: dict[tuple[str, str], list[Path]] = {}
        self._comp: np.ndarray | None = None
        self._opts: dict[int, FlowOptions] = {}  # this step's options per node
        self._width_memo: dict[tuple[int, bool, bool], np.ndarray] = {}  # see `_widths`
        self._static_node_x, self._static_edge_x = self._static_features()

        self.order = [t.name for t in placement_order(job)]
        self.tasks = {t.name: t for t in job.tasks}
        self.flows_of: dict[str, list[LogicalFlow]] = {t: [] for t in self.tasks}
        for f in job.flows:
            self.flows_of[f.src].append(f)
            if f.dst != f.src:
                self.flows_of[f.dst].append(f)
        self.strongly_connected_job = nx.is_strongly_connected(job.logical_graph())
        self.total_demand = sum(f.demand_mbps for f in job.flows) or 1.0
        self.demand_ref = max((f.demand_mbps for f in job.flows), default=1.0) or 1.0

        self.t = 0
        self.placement: dict[str, int] = {}
        self.job_used = np.zeros_like(self.free)
        self.routed: dict[tuple[str, str], tuple[Path, float]] = {}  # flow -> (path, requested)
        self.job_load = np.zeros_like(self.residual)  # Mbit/s this job requested per link
        self.job_flows = np.zeros_like(self.residual)  # this job's flows per link
        self.rates: dict[tuple[str, str], float] = {}
        self.satisfaction = 0.0  # Σ over decided flows of (granted - demand) / total demand
        self.balance = self._balance_std() if shaping else 0.0
        self.done = False
        self._obs: Observation | None = None
        self.reference_s = self._reference_iteration_s()

    # --- views -----------------------------------------------------------------------------------
    @property
    def task(self) -> str | None:
        """The task this step places (None once all are placed)."""
        return self.order[self.t] if self.t < len(self.order) else None

    def _hops_from(self, v: int) -> np.ndarray:
        """Hop distance from vertex v to every vertex. Plain BFS over G is right: a compute
        node hangs on one link, so no shortest path passes through one."""
        hops = self.layout.hops
        if v not in hops:
            dist = np.full(len(self.vertices), np.inf)
            for u, d in nx.single_source_shortest_path_length(self.cluster.graph,
                                                               self.vertices[v]).items():
                dist[self.index[u]] = d
            hops[v] = dist
        return hops[v]

    def _widths(self, v: int, outward: bool, effective: bool = True) -> np.ndarray:
        """Best bottleneck over paths from v to every vertex (to v if not `outward`) of the
        links' residuals, minus this job's requests if `effective` (which `paths.widest_path`
        cannot see): max-min Dijkstra on the index arrays, all destinations at once. Remembered
        until this job's requests change (co-located tasks ask again for the same node's)."""
        key = (v, outward, effective)
        if key not in self._width_memo:
            residual = self._effective() if effective else self.residual
            self._width_memo[key] = self._max_min(v, residual, outward)
        return self._width_memo[key]

    def _max_min(self, v: int, residual: np.ndarray, outward: bool) -> np.ndarray:
        res = residual.tolist()  # plain floats: numpy scalars make this loop several times slower
        width = [0.0] * len(self.vertices)
        width[v] = math.inf
        done = [False] * len(self.vertices)
        heap = [(-math.inf, v)]
        edges = self.out_edges if outward else self.in_edges
        pop, push = heapq.heappop, heapq.heappush
        while heap:
            w, u = pop(heap)
            if done[u]:
                continue
            done[u] = True
            w = -w
            for x, e in edges[u]:
                cand = w if w < res[e] else res[e]
                if cand > width[x]:
                    width[x] = cand
                    push(heap, (-cand, x))
        return np.array(width)

    def _effective(self) -> np.ndarray:
        """Each directed link's residual minus what this job has requested on it so far."""
        return np.maximum(self.residual - self.job_load, 0.0)

    def _balance_std(self) -> float:
        used = self.base_used + self.job_used
        share = np.where(self.has_res, used / np.maximum(self.capacity, EPS), 0.0)
        u = share.sum(axis=1) / np.maximum(self.has_res.sum(axis=1), 1)
        u = u[self.online]
        return float(u.std()) if len(u) else 0.0

    def _reference_iteration_s(self) -> float:
        """What the job would take on the fastest online node with every flow at its demand: a
        per-instance scale for the terminal reward."""
        top = float(self.speed[self.online].max()) if self.online.any() else 1.0
        compute = [compute_time_s(self.job.compute_s, top, t.demand.cpu) for t in self.job.tasks]
        flows = [(f.bytes_per_iter, f.demand_mbps) for f in self.job.flows]
        steps = collective_steps(self.job.collective, len(self.job.tasks)) if flows else 0
        return max(DEFAULT_MODEL.iteration_s(compute, flows, steps=steps), 1e-6)

    def _peer_flows(self, task: str) -> list[tuple[LogicalFlow, str, bool]]:
        """(flow, peer task, outward from `task`) for flows to already-placed tasks."""
        out = []
        for f in self.flows_of[task]:
            peer, outward = (f.dst, True) if f.src == task else (f.src, False)
            if peer in self.placement and peer != task:
                out.append((f, peer, outward))
        return out

    # --- observation -----------------------------------------------------------------------------
    def observe(self) -> Observation:
        if self._obs is None:
            self._obs = self._observe()
        return self._obs

    def _observe(self) -> Observation:
        n, nv = len(self.compute), len(self.vertices)
        name = self.task  # None after the last step: the final state, nothing feasible
        demand = np.array(self.tasks[name].demand.as_tuple() if name else (0.0, 0.0, 0.0))
        free_now = self.free - self.job_used
        zone = self._zone(free_now)
        fits = (demand[None, :] <= free_now + EPS).all(axis=1) & zone & (name is not None)
        fits &= self._room_for_the_rest(free_now, demand, fits, zone)
        effective = self._effective()

        peers = self._peer_flows(name) if name else []
        hop_sum = np.zeros(nv)
        width_min = np.full(nv, np.inf)
        reachable = np.ones(nv, bool)
        for f, peer, outward in peers:
            pv = self.placement[peer]
            hop_sum += self._hops_from(pv)
            # A flow task→peer leaves the candidate node: widths *to* the peer's node.
            w = self._widths(pv, outward=not outward)
            width_min = np.minimum(width_min, w / f.demand_mbps if f.demand_mbps > 0 else np.inf)
            if self.saturated and not self.strongly_connected_job:  # else `_zone` saw to it
                ok = self._widths(pv, outward=not outward, effective=False) > EPS
                ok[pv] = True  # co-location needs no path
                reachable &= ok
        mask = fits & reachable[:n]
        placed_all = np.zeros(nv)
        for t, v in self.placement.items():
            placed_all += self._hops_from(v)
        peer_here = np.zeros(nv)
        for f, peer, _ in peers:
            peer_here[self.placement[peer]] += 1
        job_here = np.zeros(nv)
        for v in self.placement.values():
            job_here[v] += 1

        x = self._static_node_x.copy()
        x[:n, 2:5] = np.clip(free_now / self.cap_scale, 0, 1)
        x[:n, 5] = mask
        used = self.base_used + self.job_used
        share = np.where(self.has_res, used / np.maximum(self.capacity, EPS), 0.0)
        x[:n, 6] = np.clip(share.sum(axis=1) / np.maximum(self.has_res.sum(axis=1), 1), 0, 1)
        x[:n, 7] = np.clip(share.max(axis=1), 0, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            copies = np.where(demand > 0, free_now / np.maximum(demand, EPS), np.inf).min(axis=1)
        remaining = max(len(self.order) - self.t, 1)
        x[:n, 9] = np.clip(np.nan_to_num(copies, posinf=remaining) / remaining, 0, 1)
        # Residual bandwidth around each vertex (effective: minus this job's requests).
        out_bw = np.zeros(nv)
        np.maximum.at(out_bw, self.src, effective)
        in_bw = np.zeros(nv)
        np.maximum.at(in_bw, self.dst, effective)
        x[:, 10] = np.minimum(out_bw / self.demand_ref, BW_CAP) / BW_CAP
        x[:, 11] = np.minimum(in_bw / self.demand_ref, BW_CAP) / BW_CAP
        if peers:
            x[:, 12] = np.minimum(hop_sum / len(peers) / 10, 1)
            x[:, 13] = np.minimum(width_min, BW_CAP) / BW_CAP
            x[:, 14] = peer_here / len(peers)
        if self.placement:
            x[:, 15] = np.minimum(placed_all / len(self.placement) / 10, 1)
            x[:, 16] = job_here / len(self.order)
        edge_x = self._static_edge_x.copy()
        edge_x[:, 0] = np.minimum(effective / self.demand_ref, BW_CAP) / BW_CAP
        edge_x[:, 1] = effective / np.maximum(self.cap, EPS)

        j = np.zeros(JOB_FEATURES, np.float32)
        j[0:3] = np.clip(demand / self.cap_scale, 0, 1)
        j[3] = (len(self.order) - self.t) / len(self.order)
        j[4] = self.t / len(self.order)
        j[5] = min(len(self.order) / 16, 1)
        if self.job.collective in COLLECTIVES:
            j[6 + COLLECTIVES.index(self.job.collective)] = 1
        j[11] = len(peers) / max(len(self.flows_of[name]), 1) if name else 0.0
        j[12] = min(math.log10(1 + self.demand_ref) / 5, 1)
        comm = max((f.bytes_per_iter * 8 / (f.demand_mbps * 1e6) for f in self.job.flows
                    if f.demand_mbps > 0), default=0.0)
        compute = compute_time_s(self.job.compute_s, 1.0, max(demand[0], EPS))
        j[13] = comm / (comm + compute) if comm + compute > 0 else 0
        j[14] = min(math.log10(1 + self.reference_s) / 4, 1)
        j[15] = float(bool(peers))
        return Observation(x, np.stack([self.src, self.dst]), edge_x, j, mask, n)

    def _static_features(self) -> tuple[np.ndarray, np.ndarray]:
        """The columns of node_x and edge_x that no step changes (the rest stay 0)."""
        n, nv = len(self.compute), len(self.vertices)
        x = np.zeros((nv, NODE_FEATURES), np.float32)
        x[:n, 0] = 1.0  # compute node
        x[n:, 1] = 1.0  # switch
        x[:n, 8] = self.speed / max(self.speed.max(), EPS)
        x[:, 17] = np.minimum(self.degree / 10, 1)
        edge_x = np.zeros((len(self.src), EDGE_FEATURES), np.float32)
        edge_x[:, 2] = np.minimum(np.log10(1 + self.cap) / 5, 1)
        edge_x[:, 3] = np.minimum(self.delay / 10, 1)
        return x, edge_x

    def _zone(self, free_now: np.ndarray) -> np.ndarray:
        """Compute nodes where the job can still be completed. Every collective's logical graph
        is strongly connected, so all its tasks must sit in one strongly connected component of
        the links with residual bandwidth (or share a node): the component of the tasks placed
        so far, or for the first task a component with room for the whole job (by the same
        sufficient test as `_room_for_the_rest`; where none passes, every node passes)."""
        n = len(self.compute)
        if not self.saturated or not self.job.flows or not self.strongly_connected_job:
            return self.online.copy()
        comp = self._components()
        if self.placement:
            return self.online & (comp == comp[next(iter(self.placement.values()))])
        big = np.max([t.demand.as_tuple() for t in self.job.tasks], axis=0)
        copies = self._copies(free_now, big, len(self.order))
        room = np.bincount(comp, weights=copies)
        ok = room[comp] >= len(self.order)
        return self.online & (ok if ok.any() else True)

    def _components(self) -> np.ndarray:
        """Strongly connected component id of every compute node over links with residual."""
        if self._comp is None:
            g = nx.DiGraph()
            g.add_nodes_from(range(len(self.vertices)))
            live = self.residual > EPS
            g.add_edges_from(zip(self.src[live].tolist(), self.dst[live].tolist()))
            comp = np.zeros(len(self.vertices), np.int64)
            for i, members in enumerate(nx.strongly_connected_components(g)):
                comp[list(members)] = i
            self._comp = comp[:len(self.compute)]
        return self._comp

    def _copies(self, free: np.ndarray, demand: np.ndarray, most: int) -> np.ndarray:
        """How many tasks of `demand` fit in each node's `free` (online nodes, at most `most`)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.where(demand > 0, (free + EPS) / np.maximum(demand, EPS), np.inf).min(axis=-1)
        return np.where(self.online, np.floor(np.minimum(c, most)), 0)

    def _room_for_the_rest(self, free_now: np.ndarray, demand: np.ndarray, fits: np.ndarray,
                           zone: np.ndarray) -> np.ndarray:
        """Nodes after which the remaining tasks still have room, by a cheap sufficient test:
        copies of their component-wise largest demand that fit. Where no node passes the test
        (it is only sufficient), every node that fits passes."""
        rest = [self.tasks[t].demand.as_tuple() for t in self.order[self.t + 1:]]
        if not rest:
            return np.ones(len(fits), bool)
        big = np.max(np.array(rest), axis=0)
        before = self._copies(free_now, big, len(rest)) * zone
        after = self._copies(free_now - demand[None, :], big, len(rest)) * zone
        room = before.sum() - before + after >= len(rest)
        return room if (room & fits).any() else np.ones(len(fits), bool)

    # --- bandwidth options -----------------------------------------------------------------------
    def options(self, node: int) -> FlowOptions:
        """The new inter-node flows if this step's task goes on compute node `node`, each with
        up to K candidate paths and their features."""
        if node not in self._opts:
            self._opts[node] = self._options(node)
        return self._opts[node]

    def _options(self, node: int) -> FlowOptions:
        k = self.cfg.k_paths
        effective = self._effective()
        here = self.compute[node]
        flows, paths, fx, peer, px, pm = [], [], [], [], [], []
        for f, p, outward in self._peer_flows(self.task):
            pv = self.placement[p]
            if pv == node:
                continue  # co-located: no network
            a, b = (here, self.compute[pv]) if outward else (self.compute[pv], here)
            cands = self._candidate_paths(a, b)
            feats = np.zeros((k, PATH_FEATURES), np.float32)
            mask = np.zeros(k, bool)
            for i, path in enumerate(cands):
                es = [self.edge_id[lk] for lk in zip(path, path[1:])]
                raw = self.residual[es].min()
                mask[i] = raw > EPS
                share = (self.residual[es] / (1 + self.job_flows[es])).min()
                feats[i] = (min((len(path) - 1) / 10, 1),
                            min(effective[es].min() / f.demand_mbps, BW_CAP) / BW_CAP,
                            min(raw / f.demand_mbps, BW_CAP) / BW_CAP,
                            min(share / f.demand_mbps, BW_CAP) / BW_CAP,
                            min(self.delay[es].sum() / 10, 1),
                            i / k,
                            float((self.job_flows[es] > 0).mean()))
            flows.append(f)
            paths.append(cands)
            fx.append((f.demand_mbps / self.demand_ref, f.demand_mbps / self.total_demand,
                       float(outward),
                       min(f.bytes_per_iter * 8 / (f.demand_mbps * 1e6) / max(self.reference_s,
                                                                               1e-6), 1),
                       min(math.log10(1 + f.demand_mbps) / 5, 1)))
            peer.append(pv)
            px.append(feats)
            pm.append(mask)
        return FlowOptions(flows, paths,
                           np.array(fx, np.float32).reshape(-1, FLOW_FEATURES),
                           np.array(peer, np.int64),
                           np.array(px, np.float32).reshape(-1, k, PATH_FEATURES),
                           np.array(pm, bool).reshape(-1, k))

    def _candidate_paths(self, a: str, b: str) -> list[Path]:
        """k shortest paths; when none has residual on every link, the widest path replaces the
        last one (the mask guarantees a path with residual exists)."""
        if (a, b) not in self._candidates:
            cands = shortest_candidates(self.cluster, a, b, self.cfg.k_paths, self.layout)
            if self.saturated and not any(self._path_residual(p) > EPS for p in cands):
                try:
                    wide = widest_path(self.cluster, a, b)
                    cands = cands[:self.cfg.k_paths - 1] + [wide]
                except NoPath:
                    pass
            self._candidates[(a, b)] = cands
        return self._candidates[(a, b)]

    def _path_residual(self, path: Path) -> float:
        return min(self.residual[self.edge_id[lk]] for lk in zip(path, path[1:]))

    # --- transition ------------------------------------------------------------------------------
    def step(self, node: int, path_choice: np.ndarray | list[int],
             rate_choice: np.ndarray | list[int]) -> tuple[float, bool, dict]:
        """Place this step's task on compute node `node`; `path_choice[i]`/`rate_choice[i]` are
        for the i-th flow of `options(node)`. Returns (reward, done, info)."""
        if self.done:
            raise RuntimeError("step() on a finished episode")
        w = self.cfg.reward
        obs = self.observe()
        if not (0 <= node < obs.n_compute and obs.node_mask[node]):
            return self._fail(f"task {self.task}: node index {node} is masked (infeasible)")
        opts = self.options(node)
        chosen: list[tuple[LogicalFlow, Path, float]] = []
        for i, f in enumerate(opts.flows):
            pi, ri = int(path_choice[i]), int(rate_choice[i])
            if not (0 <= pi < len(opts.paths[i]) and opts.path_mask[i, pi]):
                return self._fail(f"flow {f.src}->{f.dst}: path choice {pi} is masked")
            if not 0 <= ri < len(self.cfg.rate_levels):
                return self._fail(f"flow {f.src}->{f.dst}: rate level {ri} out of range")
            chosen.append((f, opts.paths[i][pi], self.cfg.rate_levels[ri] * f.demand_mbps))

        task = self.task
        self.placement[task] = node
        self.job_used[node] += np.array(self.tasks[task].demand.as_tuple())
        hop_cost = 0.0
        for f, path, requested in chosen:
            self.routed[(f.src, f.dst)] = (path, requested)
            es = [self.edge_id[lk] for lk in zip(path, path[1:])]
            self.job_load[es] += requested
            self.job_flows[es] += 1
            hop_cost += (len(path) - 1) / 10 * f.demand_mbps / self.total_demand
        if chosen:  # the effective widths changed
            self._width_memo = {k: w for k, w in self._width_memo.items() if not k[2]}
        reward = 0.0
        if self.shaping:
            self.rates = self._rate_split()
            satisfaction = self._satisfaction()
            balance = self._balance_std()
            reward = (w.balance * (self.balance - balance) + w.bandwidth * (satisfaction -
                      self.satisfaction) - w.hops * hop_cost)
            self.balance, self.satisfaction = balance, satisfaction
        self.t += 1
        self._obs, self._opts = None, {}
        info: dict = {}
        if self.t == len(self.order):
            self.done = True
            info = {"placed": True}
            if self.shaping:
                iteration_s = predicted_iteration_s(self.cluster, self.job, self.decision())
                reward += w.iteration * max(math.log(self.reference_s / iteration_s),
                                            w.iteration_floor)
                info["iteration_s"] = iteration_s
        elif not self.observe().node_mask.any():
            reward_fail, _, info = self._fail(f"task {self.task}: no feasible node left")
            reward += reward_fail
        return float(reward), self.done, info

    def _fail(self, reason: str) -> tuple[float, bool, dict]:
        self.done = True
        return -self.cfg.reward.infeasible, True, {"placed": False, "reason": reason}

    def _weights(self) -> dict[tuple[str, str], float]:
        by_pair = {(f.src, f.dst): f.bytes_per_iter for f in self.job.flows}
        if all(by_pair[k] > 0 for k in self.routed):
            return {k: by_pair[k] for k in self.routed}
        return {k: 1.0 for k in self.routed}

    def _satisfaction(self) -> float:
        """Σ over flows with both ends placed of (granted - demanded), over the job's demand."""
        gap = 0.0
        for f in self.job.flows:
            if f.src in self.placement and f.dst in self.placement and \
                    self.placement[f.src] != self.placement[f.dst]:
                gap += min(self.rates.get((f.src, f.dst), 0.0), f.demand_mbps) - f.demand_mbps
        return gap / self.total_demand

    def _rate_split(self) -> dict[tuple[str, str], float]:
        return fair_rates(self.cluster, {k: p for k, (p, _) in self.routed.items()},
                          {k: r for k, (_, r) in self.routed.items()}, self._weights())

    def decision(self) -> Decision:
        """The job's decision once every task is placed; infeasibility here is a bug."""
        placement = {t: self.compute[v] for t, v in self.placement.items()}
        rates = self._rate_split()
        flows = [FlowAssignment(s, d, path, rates[(s, d)])
                 for (s, d), (path, _) in self.routed.items()]
        return Decision(self.job.name, placement, flows)


class PlacementEnv(gym.Env):
    """gymnasium front end of `PlacementEpisode` on random instances (or a given one:
    `reset(options={"cluster": c, "job": j})`).

    observation: {"graph": GraphInstance(nodes (V, NODE_FEATURES), edges (E, EDGE_FEATURES),
                  edge_links (E, 2)), "job": (JOB_FEATURES,)}; compute nodes are the first
                  vertices (feature 0 is 1 for them).
    action: {"node": index of a compute node, "paths": per new flow a candidate index,
             "rates": per new flow a rate level}; entries past the step's flows are ignored.
    info: "node_mask" (max_nodes,) bool — the feasible nodes; "n_compute"; at the end "placed",
          "iteration_s" (and "reason" on failure), "heuristic_iteration_s": the predicted
          iteration time of the first teacher's decision (when it placed the job).
    The flow options of a chosen node (paths, their features and mask) are
    `env.unwrapped.episode.options(node)`.
    """
    metadata = {"render_modes": []}

    def __init__(self, cfg: EnvConfig = EnvConfig()):
        self.cfg = cfg
        self.observation_space = spaces.Dict({
            "graph": spaces.Graph(node_space=spaces.Box(0.0, 1.0, (NODE_FEATURES,), np.float32),
                                  edge_space=spaces.Box(0.0, 1.0, (EDGE_FEATURES,), np.float32)),
            "job": spaces.Box(0.0, 1.0, (JOB_FEATURES,), np.float32)})
        self.action_space = spaces.Dict({
            "node": spaces.Discrete(cfg.max_nodes),
            "paths": spaces.MultiDiscrete([cfg.k_paths] * cfg.max_flows),
            "rates": spaces.MultiDiscrete([len(cfg.rate_levels)] * cfg.max_flows)})
        self.episode: PlacementEpisode | None = None
        self.teacher: Decision | None = None
        self.compare = True  # the best of all `cfg.teachers` (else only the first)
        self.heuristic_s = math.nan
        self.cluster: Cluster | None = None  # the current random network
        self.left, self.count, self.target = 0, 0, 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "cluster" in options:
            self.episode = PlacementEpisode(options["cluster"], options["job"], self.cfg)
        else:
            if seed is not None:
                self.cluster = None  # a seeded reset starts from a fresh network
            self.episode = self._random_episode()
        self.teacher = self._teach()
        return self._obs(), self._info()

    def _random_episode(self) -> PlacementEpisode:
        """A random job on the current random network; a network serves
        `episodes_per_topology` jobs, each placed job staying on it as load (the oldest leave
        when the load passes the network's drawn target)."""
        rng = self.np_random
        while True:
            if self.cluster is None or self.left == 0:
                topo = random_topology(rng, self.cfg.sites)
                if len(topo.nodes) > self.cfg.max_nodes:
                    continue
                self.cluster = Cluster.from_topology(topo)
                self.target = float(rng.uniform(*self.cfg.background))
                if rng.random() < 0.5:
                    load_background(rng, self.cluster, self.target, self.cfg.jobs)
                else:  # the evaluation's kind: a task per node, flows on shortest paths
                    self.cluster = background_load(self.cluster, rng, self.target)
                self.left = self.cfg.episodes_per_topology
            self.left -= 1
            self.count += 1
            job = random_job(rng, name=f"job{self.count}", dist=self.cfg.jobs)
            ep = PlacementEpisode(self.cluster, job, self.cfg)
            if ep.observe().node_mask.any() and max(len(ep.flows_of[t]) for t in ep.order) \
                    <= self.cfg.max_flows:
                return ep

    def _keep(self, ep: PlacementEpisode) -> None:
        """The placed job stays on the network; the oldest jobs leave above the target load."""
        if ep.cluster is not self.cluster:
            return
        self.cluster.allocate(ep.job, ep.decision())
        nodes = self.cluster.compute_nodes()
        total = sum(self.cluster.capacity(n).cpu for n in nodes)
        while self.cluster.jobs and \
                sum(self.cluster.used[n].cpu for n in nodes) > self.target * total:
            self.cluster.release(next(iter(self.cluster.jobs)))

    def _teach(self) -> Decision | None:
        """The teacher's decision; also records the first heuristic's predicted iteration time
        (`heuristic_s`, the learning curve's yardstick)."""
        ep = self.episode
        best, best_s = None, math.inf
        self.heuristic_s = math.nan
        for i, name in enumerate(self.cfg.teachers[:None if self.compare else 1]):
            try:
                d = make_algorithm(name, seed=0).place(ep.cluster, ep.job)
            except CannotPlace:
                continue
            t = predicted_iteration_s(ep.cluster, ep.job, d)
            if i == 0:
                self.heuristic_s = t
            if t < best_s:
                best, best_s = d, t
        return best

    def teacher_node(self) -> int:
        """The teacher's node for this step's task (-1 if none or masked)."""
        ep = self.episode
        if self.teacher is None or ep.done:
            return -1
        v = ep.index[self.teacher.placement[ep.task]]
        return v if ep.observe().node_mask[v] else -1

    def _obs(self) -> dict:
        o = self.episode.observe()
        return {"graph": spaces.GraphInstance(o.node_x.copy(), o.edge_x.copy(),
                                              o.edge_index.T.copy()),
                "job": o.job_x.copy()}

    def _info(self) -> dict:
        o = self.episode.observe()
        mask = np.zeros(self.cfg.max_nodes, np.int8)
        mask[:o.n_compute] = o.node_mask[:self.cfg.max_nodes]
        return {"node_mask": mask, "n_compute": o.n_compute}

    def step(self, action: dict):
        ep = self.episode
        reward, done, end = ep.step(int(action["node"]), np.asarray(action["paths"]),
                                    np.asarray(action["rates"]))
        info = end if done else self._info()
        if done and not math.isnan(self.heuristic_s):
            info["heuristic_iteration_s"] = self.heuristic_s
        if done and info["placed"]:
            self._keep(ep)
        return self._obs(), reward, done, False, info
