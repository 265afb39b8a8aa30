"""The single-job placement MDP CES-PPO learns in (DESIGN §3), and its gymnasium front end.

One episode places one job; one step places one task, in the order of the job's logical graph
(`baselines.placement_order`: breadth-first, so every task after the first has a placed peer).
The action is a compute node; the nodes the task cannot use are masked: those it does not fit,
those from which the job could no longer be completed (its tasks must stay connected over links
with bandwidth left, and the remaining tasks must still find room). The job's network part — a
path and a rate for every flow between tasks on different nodes — is CES's network decision for
the final placement (`paths.route_placement`), the one the Master's runtime adjustment uses as
well: the policy decides where the tasks go, and the paths and rates follow from where they went
(docs/ppo.md, "Design", says what a learned path and rate branch gave).

What the policy sees is built to be cheap on a thousand nodes:
  - once per episode, the graph (`graph_input`): per vertex its kind, free capacity, speed,
    degree and the residual bandwidth of its links against the job's flows; per directed link
    its residual, capacity and delay; the job. The encoder runs on it once per decision;
  - at each step, per compute node (`observe`): may this task go there, what would be free, how
    many of the remaining tasks would still fit, how far (hops) and how wide (the smallest
    residual along the shortest path) its placed peers are, how many of them and of the job's
    tasks are there already.

`PlacementEpisode` is the MDP on one (cluster, job); it never mutates the cluster.
`PlacementEnv` is the `gymnasium.Env` around it on random instances (`TrainingInstances`): router
graphs and tiered networks from the generators and real networks of topohub kept apart from the
benchmarks (`instances.held_out`), with plain CPU edge nodes or capacities from the Alibaba
machine table, background load, and jobs of every size — half of them jobs no node can hold.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import networkx as nx
import numpy as np
from gymnasium import spaces

from topologies import Topology, load_topology

from .baselines import make_algorithm, placement_order
from .instances import (
    GPU_CLUSTER_JOBS,
    JobDistribution,
    background_load,
    fill_with_jobs,
    held_out,
    random_job,
    random_spread_jobs,
    random_topology,
)
from .layout import capacities, flow_hops, layout, reservations, shortest_tree, widths
from .metrics import DEFAULT_MODEL, predicted_iteration_s
from .model import EPS, CannotPlace, Cluster, Decision, Job, LogicalFlow
from .paths import route_placement
from .perfmodel import compute_time_s
from .trace import Machine, apply_machine_spec

NODE_FEATURES = 12  # per vertex of G (compute nodes first, then switches)
EDGE_FEATURES = 4  # per directed link
JOB_FEATURES = 14
STEP_FEATURES = 12  # per compute node at each step
GUIDE_FEATURES = 2  # per compute node at each step: network-aware's measure (`_guidance`)
COLLECTIVES = ("ring", "star", "tree", "all-to-all", "custom")
BW_CAP = 2.0  # bandwidth features are min(bw / demand, BW_CAP) / BW_CAP
FAILED = -3.0  # the return of an episode that could not place its job


@dataclass
class GraphInput:
    """The encoder's input, once per episode."""

    node_x: np.ndarray  # (V, NODE_FEATURES) float32; vertices 0..n_compute-1 are compute nodes
    edge_index: np.ndarray  # (2, E) int64, directed links
    edge_x: np.ndarray  # (E, EDGE_FEATURES) float32
    job_x: np.ndarray  # (JOB_FEATURES,) float32
    n_compute: int


@dataclass
class StepObservation:
    x: np.ndarray  # (n_compute, STEP_FEATURES) float32
    mask: np.ndarray  # (n_compute,) bool: where this step's task may go
    guide: np.ndarray  # (n_compute, GUIDE_FEATURES) float32

    def features(self) -> np.ndarray:
        """(n_compute, STEP_FEATURES + GUIDE_FEATURES): all a policy sees of the step."""
        return np.concatenate([self.x, self.guide], axis=1)


class PlacementEpisode:
    """The MDP on one cluster and one job (module doc). Never mutates `cluster`."""

    def __init__(self, cluster: Cluster, job: Job):
        self.cluster, self.job = cluster, job
        lay = self.layout = layout(cluster)
        self.compute, self.vertices, self.index = lay.compute, lay.vertices, lay.index
        self.src, self.dst = lay.src, lay.dst
        self.cap = capacities(lay)
        self.delay = np.array(lay.delay_ms)
        self.residual = (self.cap - reservations(cluster, lay)).clip(min=0.0)
        self.capacity, self.free, self.speed = cluster.resource_table(self.compute)
        self.online = np.array([c not in cluster.offline for c in self.compute], bool)
        self.cap_scale = np.maximum(self.capacity.max(axis=0), EPS)
        self.cap_scale[2] = max(self.cap_scale[2], 1.0)
        self.has_res = self.capacity > 0
        self.saturated = bool((self.residual <= EPS).any())
        self._comp: np.ndarray | None = None
        self._bottleneck_of: dict[tuple[int, bool], np.ndarray] = {}  # `_bottleneck`
        self._tight: dict[tuple[int, float, bool], np.ndarray] = {}  # `flow_hops`' searches

        self.order = [t.name for t in placement_order(job)]
        self.tasks = {t.name: t for t in job.tasks}
        self.flows_of: dict[str, list[LogicalFlow]] = {t: [] for t in self.tasks}
        for f in job.flows:
            self.flows_of[f.src].append(f)
            if f.dst != f.src:
                self.flows_of[f.dst].append(f)
        self.strongly_connected_job = nx.is_strongly_connected(job.logical_graph())
        self.demand_ref = max((f.demand_mbps for f in job.flows), default=1.0) or 1.0

        self.t = 0
        self.placement: dict[str, int] = {}
        self.job_used = np.zeros_like(self.free)
        self.done = False
        self.failed = ""  # why the episode ended without a placement
        self._obs: StepObservation | None = None
        self._first = self.observe()
        self._check_start()

    def _check_start(self) -> None:
        if not self._first.mask.any():
            self.done = True
            self.failed = (
                f"task {self.task}: fits on no node that can still hold the rest of the job"
            )

    def restart(self) -> PlacementEpisode:
        """A new episode on the same instance, sharing what no step changes (the cluster's
        arrays, the path caches): another rollout of the same decision costs only its steps."""
        ep = copy.copy(self)
        ep.t, ep.placement, ep.job_used = 0, {}, np.zeros_like(self.free)
        ep.done, ep.failed, ep._obs = False, "", self._first
        ep._check_start()
        return ep

    @property
    def task(self) -> str | None:
        """The task this step places (None once all are placed)."""
        return self.order[self.t] if self.t < len(self.order) else None

    # --- the graph, once ---------------------------------------------------------------------
    def graph_input(self) -> GraphInput:
        n, nv = len(self.compute), len(self.vertices)
        x = np.zeros((nv, NODE_FEATURES), np.float32)
        x[:n, 0] = 1.0
        x[n:, 1] = 1.0
        x[:n, 2:5] = np.clip(self.free / self.cap_scale, 0, 1)
        x[:n, 5:8] = np.clip(self.capacity / self.cap_scale, 0, 1)
        x[:n, 8] = self.speed / max(self.speed.max(), EPS)
        x[:, 9] = np.minimum(self.layout.degree / 10, 1)
        out_bw, in_bw = np.zeros(nv), np.zeros(nv)
        np.maximum.at(out_bw, self.src, self.residual)
        np.maximum.at(in_bw, self.dst, self.residual)
        x[:, 10] = np.minimum(out_bw / self.demand_ref, BW_CAP) / BW_CAP
        x[:, 11] = np.minimum(in_bw / self.demand_ref, BW_CAP) / BW_CAP
        edge_x = np.zeros((len(self.src), EDGE_FEATURES), np.float32)
        edge_x[:, 0] = np.minimum(self.residual / self.demand_ref, BW_CAP) / BW_CAP
        edge_x[:, 1] = self.residual / np.maximum(self.cap, EPS)
        edge_x[:, 2] = np.minimum(np.log10(1 + self.cap) / 5, 1)
        edge_x[:, 3] = np.minimum(self.delay / 10, 1)

        job, j = self.job, np.zeros(JOB_FEATURES, np.float32)
        big = np.max([t.demand.as_tuple() for t in job.tasks], axis=0)
        j[0:3] = np.clip(big / self.cap_scale, 0, 1)
        j[3] = min(len(job.tasks) / 32, 1)
        if job.collective in COLLECTIVES:
            j[4 + COLLECTIVES.index(job.collective)] = 1
        j[9] = min(math.log10(1 + self.demand_ref) / 5, 1)
        comm = max(
            (f.bytes_per_iter * 8 / (f.demand_mbps * 1e6) for f in job.flows if f.demand_mbps > 0),
            default=0.0,
        )
        compute = compute_time_s(job.compute_s, 1.0, max(big[0], EPS))
        j[10] = comm / (comm + compute) if comm + compute > 0 else 0.0
        j[11] = min(math.log10(1 + 1e3 * (comm + compute)) / 6, 1)
        total = job.total_demand().as_tuple()
        free = self.free[self.online].sum(axis=0) if self.online.any() else np.zeros(3)
        j[12] = min(max((u / f for u, f in zip(total, free) if f > 0), default=1.0), 1)
        j[13] = float(not ((self.free >= np.array(total) - EPS).all(axis=1) & self.online).any())
        return GraphInput(x, np.stack([self.src, self.dst]), edge_x, j, n)

    # --- a step --------------------------------------------------------------------------------
    def observe(self) -> StepObservation:
        if self._obs is None:
            self._obs = self._observe()
        return self._obs

    def _observe(self) -> StepObservation:
        n = len(self.compute)
        name = self.task
        x = np.zeros((n, STEP_FEATURES), np.float32)
        guide = np.zeros((n, GUIDE_FEATURES), np.float32)
        if name is None:
            return StepObservation(x, np.zeros(n, bool), guide)
        demand = np.array(self.tasks[name].demand.as_tuple())
        free_now = self.free - self.job_used
        zone = self._zone(free_now)
        fits = (demand[None, :] <= free_now + EPS).all(axis=1) & zone
        fits &= self._room_for_the_rest(free_now, demand, fits, zone)
        peers = self._peer_flows(name)
        if peers and self.saturated and not self.strongly_connected_job:  # else `_zone` did
            res = self.residual.tolist()
            for _, peer, inward in peers:
                pv = self.placement[peer]
                ok = np.array(widths(self.layout, res, pv, inward)) > EPS
                ok[pv] = True  # co-location needs no path
                fits &= ok[:n]
        x[:, 0] = fits
        x[:, 1:4] = np.clip(free_now / self.cap_scale, 0, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            copies = np.where(demand > 0, free_now / np.maximum(demand, EPS), np.inf).min(axis=1)
        remaining = len(self.order) - self.t
        x[:, 4] = np.clip(np.nan_to_num(copies, posinf=remaining) / remaining, 0, 1)
        if peers:
            hops, width = np.zeros(n), np.full(n, np.inf)
            for f, peer, inward in peers:
                pv = self.placement[peer]
                hops += self._hops_from(pv)[:n]
                x[pv, 5] += 1 / len(peers)
                w = self._bottleneck(pv, inward)[:n]
                width = np.minimum(width, w / max(f.demand_mbps, EPS))
            x[:, 6] = np.minimum(hops / len(peers) / 10, 1)
            x[:, 7] = np.minimum(width, BW_CAP) / BW_CAP
            x[:, 10] = 1.0
            guide[:] = self._guidance(peers)
        for v in self.placement.values():
            x[v, 8] += 1 / len(self.order)
        x[:, 9] = self.t / len(self.order)
        if self.placement:
            first = self.placement[self.order[0]]
            x[:, 11] = np.minimum(self._hops_from(first)[:n] / 10, 1)
        return StepObservation(x, fits, guide)

    def step(self, node: int) -> None:
        """Place this step's task on compute node `node` (ValueError if it is masked)."""
        obs = self.observe()
        if self.done or not (0 <= node < len(self.compute) and obs.mask[node]):
            raise ValueError(f"task {self.task}: node index {node} is masked (infeasible)")
        task = self.task
        self.placement[task] = node
        self.job_used[node] += np.array(self.tasks[task].demand.as_tuple())
        self.t += 1
        self._obs = None
        if self.t == len(self.order):
            self.done = True
        elif not self.observe().mask.any():
            self.done, self.failed = True, f"task {self.task}: no feasible node left"

    def placement_names(self) -> dict[str, str]:
        return {t: self.compute[v] for t, v in self.placement.items()}

    def decision(self) -> Decision:
        """The job's decision once every task is placed: CES's paths and rates for where the
        tasks went (`paths.route_placement`; `NoPath`, a CannotPlace, when a flow has none)."""
        if self.failed or self.t < len(self.order):
            raise CannotPlace(f"job {self.job.name}: {self.failed or 'not every task placed'}")
        placement = self.placement_names()
        return Decision(
            self.job.name, placement, route_placement(self.cluster, self.job, placement)
        )

    # --- what the features are made of ---------------------------------------------------------
    def _peer_flows(self, task: str) -> list[tuple[LogicalFlow, str, bool]]:
        """(flow, peer task, inward: the flow goes into the peer) for `task`'s flows to and from
        already-placed tasks. The searches behind the features start at the peer's node."""
        out = []
        for f in self.flows_of[task]:
            peer, inward = (f.dst, True) if f.src == task else (f.src, False)
            if peer in self.placement and peer != task:
                out.append((f, peer, inward))
        return out

    def _hops_from(self, v: int) -> np.ndarray:
        """Hop distance from vertex v to every vertex (`layout.shortest_tree`)."""
        return shortest_tree(self.layout, v).hops

    def _bottleneck(self, v: int, inward: bool) -> np.ndarray:
        """The smallest residual along the shortest path from vertex v to every vertex, or
        `inward`, from every vertex to v (links in the other direction). inf at v, 0 where
        unreachable."""
        key = (v, inward)
        if key not in self._bottleneck_of:
            tree = shortest_tree(self.layout, v)
            links = tree.inward if inward else tree.outward
            width = np.zeros(len(self.vertices))
            width[v] = math.inf
            for level in tree.levels:
                width[level] = np.minimum(width[tree.parent[level]], self.residual[links[level]])
            self._bottleneck_of[key] = width
        return self._bottleneck_of[key]

    def _guidance(self, peers: list[tuple[LogicalFlow, str, bool]]) -> np.ndarray:
        """(n_compute, GUIDE_FEATURES): what network-aware weighs when it places a task (its key,
        `layout.flow_hops`) — whether some flow to a placed peer finds no path with
        its demand free, and the flows' hops weighted by demand (over links with the demand free,
        over any link where there is none), per unit of demand, / 10. A policy that sees the
        heuristic's measure can follow it where it is right and learn where it is not."""
        n = len(self.compute)
        blocked, cost = flow_hops(
            self.layout,
            self.residual,
            [(self.placement[peer], f.demand_mbps, inward) for f, peer, inward in peers],
            self._tight,
        )
        total = sum(f.demand_mbps for f, _, _ in peers)
        out = np.zeros((n, GUIDE_FEATURES), np.float32)
        out[:, 0] = blocked[:n]
        out[:, 1] = np.minimum(cost[:n] / max(total, EPS) / 10, 1)
        return out

    def _zone(self, free_now: np.ndarray) -> np.ndarray:
        """Compute nodes where the job can still be completed. Every collective's logical graph
        is strongly connected, so all its tasks must sit in one strongly connected component of
        the links with residual bandwidth (or share a node): the component of the tasks placed
        so far, or for the first task a component with room for the whole job (by the same
        sufficient test as `_room_for_the_rest`; where none passes, every node passes)."""
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
        """Strongly connected component id of every compute node over links with residual. A
        path through a compute node would leave it by the link it came in on (each has exactly
        one link: `topologies` checks it), so `layout.relays` changes none of them."""
        if self._comp is None:
            g = nx.DiGraph()
            g.add_nodes_from(range(len(self.vertices)))
            live = self.residual > EPS
            g.add_edges_from(zip(self.src[live].tolist(), self.dst[live].tolist()))
            comp = np.zeros(len(self.vertices), np.int64)
            for i, members in enumerate(nx.strongly_connected_components(g)):
                comp[list(members)] = i
            self._comp = comp[: len(self.compute)]
        return self._comp

    def _copies(self, free: np.ndarray, demand: np.ndarray, most: int) -> np.ndarray:
        """How many tasks of `demand` fit in each node's `free` (online nodes, at most `most`)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            c = np.where(demand > 0, (free + EPS) / np.maximum(demand, EPS), np.inf).min(axis=-1)
        return np.where(self.online, np.floor(np.minimum(c, most)), 0)

    def _room_for_the_rest(
        self, free_now: np.ndarray, demand: np.ndarray, fits: np.ndarray, zone: np.ndarray
    ) -> np.ndarray:
        """Nodes after which the remaining tasks still have room, by a cheap sufficient test:
        copies of their component-wise largest demand that fit. Where no node passes the test
        (it is only sufficient), every node that fits passes."""
        rest = [self.tasks[t].demand.as_tuple() for t in self.order[self.t + 1 :]]
        if not rest:
            return np.ones(len(fits), bool)
        big = np.max(np.array(rest), axis=0)
        before = self._copies(free_now, big, len(rest)) * zone
        after = self._copies(free_now - demand[None, :], big, len(rest)) * zone
        room = before.sum() - before + after >= len(rest)
        return room if (room & fits).any() else np.ones(len(fits), bool)


# --- random instances ----------------------------------------------------------------------------
@dataclass(frozen=True)
class EnvConfig:
    """The training instances (`TrainingInstances`): every share and size in one place."""

    sites: tuple[int, int] = (10, 200)  # compute nodes of the generated networks
    real_share: float = 0.3  # networks from topohub (those not kept out: `instances.held_out`)
    topohub_sites: tuple[int, int] = (10, 200)  # compute nodes of the real networks drawn
    alibaba_share: float = 0.5  # networks with the Alibaba machine table's capacities
    background: tuple[float, float] = (0.0, 0.6)  # share of nodes and links already in use
    jobs_share: float = 0.5  # of which by random jobs (`instances.fill_with_jobs`), the others
    #                          by the benchmarks' background load (`instances.background_load`)
    spread_share: float = 0.5  # jobs no node can hold (`instances.random_spread_jobs`)
    small_jobs: JobDistribution = JobDistribution(max_workers=8)  # the other jobs
    gpu_jobs: JobDistribution = GPU_CLUSTER_JOBS  # jobs no node can hold, where there are GPUs
    cpu_jobs: JobDistribution = JobDistribution(  # jobs no node can hold, where there are none
        min_workers=2,
        max_workers=32,
        log_workers=True,
        min_params=1e5,
        max_params=1.1e8,
        cpu_choices=(0.25, 0.5, 1.0, 2.0),
        mem_choices=(256.0, 512.0, 1024.0, 2048.0),
        min_mbps=10.0,
        max_mbps=5000.0,
    )
    episodes_per_topology: int = 16  # jobs drawn on one network before the next
    max_nodes: int = 256  # PlacementEnv's action space


def training_networks() -> list[str]:
    """The topohub networks training may draw (held-out ones and their versions left out)."""
    import topohub

    data = Path(topohub.__file__).parent / "data"
    keys = []
    for kind in ("topozoo", "sndlib"):
        for f in sorted((data / kind).glob("*.json")):
            key = f"{kind}/{f.stem}"
            if not held_out(key):
                keys.append(key)
    return keys


_TOPOHUB: dict[str, Topology] = {}


class TrainingInstances:
    """Random (cluster, job) pairs for training (`EnvConfig`), reproducible from a seed."""

    def __init__(self, cfg: EnvConfig, seed: int, machines: list[Machine] | None = None):
        self.cfg, self.rng, self.machines = cfg, np.random.default_rng(seed), machines
        self.networks = training_networks() if cfg.real_share > 0 else []
        self.cluster: Cluster | None = None
        self.left = 0
        self.count = 0

    def next(self) -> tuple[Cluster, Job]:
        cfg = self.cfg
        while True:
            if self.cluster is None or self.left == 0:
                self.cluster = self._network()
                self.left = cfg.episodes_per_topology
            self.left -= 1
            self.count += 1
            job = self._job(self.cluster)
            if job is not None:
                return self.cluster, job

    def _network(self) -> Cluster:
        rng, cfg = self.rng, self.cfg
        topo = None
        if self.networks and rng.random() < cfg.real_share:
            key = self.networks[int(rng.integers(len(self.networks)))]
            if key not in _TOPOHUB:
                _TOPOHUB[key] = load_topology(key)
            topo = _TOPOHUB[key]
            if not cfg.topohub_sites[0] <= len(topo.nodes) <= cfg.topohub_sites[1]:
                topo = None
        cluster = Cluster.from_topology(topo or random_topology(rng, cfg.sites))
        if self.machines and rng.random() < cfg.alibaba_share:
            cluster = apply_machine_spec(cluster, self.machines, rng)
        level = float(rng.uniform(*cfg.background))
        if rng.random() < cfg.jobs_share:
            fill_with_jobs(rng, cluster, level, cfg.small_jobs)
            return cluster
        return background_load(cluster, rng, level)

    def _job(self, cluster: Cluster) -> Job | None:
        rng, cfg = self.rng, self.cfg
        if rng.random() < cfg.spread_share:
            gpus = any(cluster.capacity(n).gpu > 0 for n in cluster.compute_nodes())
            dist = cfg.gpu_jobs if gpus else cfg.cpu_jobs
            try:  # a job that must span nodes, which this network can hold
                return random_spread_jobs(
                    rng, cluster, 1, dist, prefix=f"job{self.count}-", tries=200
                )[0]
            except CannotPlace:
                return None
        return random_job(rng, f"job{self.count}", cfg.small_jobs)


# --- the gymnasium front end ---------------------------------------------------------------------
class PlacementEnv(gym.Env):
    """gymnasium front end of `PlacementEpisode` on `TrainingInstances` (or a given instance:
    `reset(options={"cluster": c, "job": j})`).

    observation: {"graph": GraphInstance(nodes (V, NODE_FEATURES + STEP_FEATURES + GUIDE_FEATURES)
                  — the step's features and guidance on compute nodes, zeros on switches —,
                  edges (E, EDGE_FEATURES), edge_links (E, 2)), "job": (JOB_FEATURES,)};
                  compute nodes come first.
    action: the index of a compute node.
    reward: 0 until the last step, then log(network-aware's iteration time / this decision's)
            (> 0: faster than the heuristic), or FAILED.
    info: "node_mask" (max_nodes,) — the feasible nodes —, "n_compute"; at the end "placed",
          "iteration_s", "heuristic_iteration_s" (and "reason" when it failed)."""

    metadata = {"render_modes": []}

    def __init__(self, cfg: EnvConfig = EnvConfig(), machines: list[Machine] | None = None):
        self.cfg, self.machines = cfg, machines
        self.observation_space = spaces.Dict(
            {
                "graph": spaces.Graph(
                    node_space=spaces.Box(
                        0.0, 1.0, (NODE_FEATURES + STEP_FEATURES + GUIDE_FEATURES,), np.float32
                    ),
                    edge_space=spaces.Box(0.0, 1.0, (EDGE_FEATURES,), np.float32),
                ),
                "job": spaces.Box(0.0, 1.0, (JOB_FEATURES,), np.float32),
            }
        )
        self.action_space = spaces.Discrete(cfg.max_nodes)
        self.instances: TrainingInstances | None = None
        self.episode: PlacementEpisode | None = None
        self._graph: GraphInput | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "cluster" in options:
            cluster, job = options["cluster"], options["job"]
        else:
            if self.instances is None or seed is not None:
                self.instances = TrainingInstances(
                    self.cfg, int(self.np_random.integers(2**31)), self.machines
                )
            while True:
                cluster, job = self.instances.next()
                if len(cluster.compute_nodes()) <= self.cfg.max_nodes:
                    break
        self.episode = PlacementEpisode(cluster, job)
        self._graph = self.episode.graph_input()
        return self._obs(), self._info()

    def _obs(self) -> dict:
        g, step = self._graph, self.episode.observe()
        nodes = np.zeros(
            (len(g.node_x), NODE_FEATURES + STEP_FEATURES + GUIDE_FEATURES), np.float32
        )
        nodes[:, :NODE_FEATURES] = g.node_x
        nodes[: g.n_compute, NODE_FEATURES:] = step.features()
        return {
            "graph": spaces.GraphInstance(nodes, g.edge_x.copy(), g.edge_index.T.copy()),
            "job": g.job_x.copy(),
        }

    def _info(self) -> dict:
        mask = np.zeros(self.cfg.max_nodes, np.int8)
        m = self.episode.observe().mask[: self.cfg.max_nodes]
        mask[: len(m)] = m
        return {"node_mask": mask, "n_compute": len(self.episode.compute)}

    def step(self, action):
        ep = self.episode
        try:
            ep.step(int(action))
        except ValueError as e:
            return self._obs(), FAILED, True, False, {"placed": False, "reason": str(e)}
        if not ep.done:
            return self._obs(), 0.0, False, False, self._info()
        reward, info = episode_return(ep)
        return self._obs(), reward, True, False, info


def episode_return(ep: PlacementEpisode) -> tuple[float, dict]:
    """The return of a finished episode against network-aware's decision on the same instance."""
    try:
        decision = ep.decision()
    except CannotPlace as e:
        return FAILED, {"placed": False, "reason": str(e)}
    t = predicted_iteration_s(ep.cluster, ep.job, decision, DEFAULT_MODEL)
    info = {"placed": True, "iteration_s": t}
    try:
        ref = make_algorithm("network-aware").place(ep.cluster, ep.job)
        info["heuristic_iteration_s"] = predicted_iteration_s(ep.cluster, ep.job, ref)
        return math.log(info["heuristic_iteration_s"] / t), info
    except CannotPlace:
        return 1.0, info  # placed where the heuristic could not
