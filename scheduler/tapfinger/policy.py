"""TapFinger as a CES queue policy (`multi.POLICIES["tapfinger"]`).

One agent per compute node. Every agent's K pending slots hold the first K queued jobs (CES's
network reaches every node, so every job is pending at every agent). Each step every agent picks a
job (pointer) and an allocation cell: a cpu share (× what each task asked: `CPU_SHARES`) × a
bandwidth level (× what each flow asked: `BW_LEVELS`), or waits. Masks: a node that is offline or
lacks a task's memory or gpu (the minimum demand) allows only waiting; a share is allowed while a
task at that share fits the node's free cpu and the job may fit the cluster at all
(`FreeSpace.may_fit`); a bandwidth level while what a task's outgoing flows take of the node's
access link at that level fits what the link has free (jobs without flows: level 1 only). The
arbiter settles conflicts. The winner's job, at the granted share, goes on the winning node whole
when it fits there (no network traffic), else wherever the policy's single-job algorithm places
it. Steps repeat within a round until no agent takes a job. A placement that failed is not tried
again in the round (the cluster only fills up within it). While the cluster is idle (nothing
running or started) no event would bring the agents back, so waiting is not allowed then: the
agents act until a job starts or every allowed allocation has failed. Actions are sampled, seeded,
as in training: "wait" is one cell against twelve, so the likeliest cell is often "wait" while
going is likelier.

The reward of agent i is -(jobs queued + jobs running on node i), integrated over time (hours),
given to the agents' last step before it accrues (`Recorder`); TapFinger asks for a round at
every event (`reallocates`) so that the integral is exact.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from ..baselines import Algorithm
from ..model import CannotPlace, Cluster
from ..perfmodel import compute_time_s
from ..rounds import FreeSpace, JobState, Round, estimated_iteration_s, scale_job
from .net import Obs, Step, TapFingerNet, act, allocation_mask, load

CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "tapfinger.pt"
CPU_SHARES = (1.0, 1.5, 2.0, 3.0)
BW_LEVELS = (0.25, 0.5, 1.0)
GRID = 1 + len(CPU_SHARES) * len(BW_LEVELS)
PENDING = 10  # K
DIMS = {"server": 7, "task": 8, "running": 5, "central": 1}


def cell_share(cell: int) -> tuple[float, float]:
    """(cpu share, bandwidth level) of a grid cell (> 0)."""
    c, b = divmod(cell - 1, len(BW_LEVELS))
    return CPU_SHARES[c], BW_LEVELS[b]


def uplink(cluster: Cluster, node: str) -> tuple[float, float]:
    """(free, capacity) of a compute node's access link, the smaller direction's."""
    sw = next(iter(cluster.graph.neighbors(node)))
    return (
        min(cluster.residual(node, sw), cluster.residual(sw, node)),
        cluster.link_capacity(node, sw),
    )


def out_demand(js: JobState) -> float:
    """The largest sum of demanded rates leaving one task of the job."""
    out: dict[str, float] = {}
    for f in js.job.flows:
        out[f.src] = out.get(f.src, 0.0) + f.demand_mbps
    return max(out.values(), default=0.0)


def idle(rnd: Round) -> bool:
    """Nothing runs or was started in the round: no event of the agents' making is to come."""
    return not (rnd.running or rnd.placed)


def observe(
    rnd: Round, nodes: list[str], failed: frozenset[tuple[JobState, str, int]] = frozenset()
) -> tuple[Obs, list[JobState]]:
    """The agents' view of a round: nodes, the first K queued jobs, the running jobs, masks.
    `failed`: the (job, node, cell) whose placement failed earlier in the round, masked."""
    view = rnd.view()
    jobs = rnd.queue[:PENDING]
    a, k = len(nodes), PENDING
    cap = {n: view.capacity(n) for n in nodes}
    free = {n: view.free(n) for n in nodes}
    up = {n: uplink(view, n) for n in nodes}
    top_cpu = max(c.cpu for c in cap.values())
    servers = [
        [
            free[n].cpu / cap[n].cpu,
            free[n].mem_mb / cap[n].mem_mb,
            up[n][0] / up[n][1],
            cap[n].cpu / top_cpu,
            view.speed(n),
            n not in view.offline,
            len(rnd.queue) / 100,
        ]
        for n in nodes
    ]
    median_cpu = statistics.median(c.cpu for c in cap.values())
    space = FreeSpace.of(view)
    tasks, slots = [], np.full((a, k), -1)
    masks = np.zeros((a, k, GRID), bool)
    ratio = np.zeros((a, k))
    for s, js in enumerate(jobs):
        job, nominal = js.job, estimated_iteration_s(js.job)
        demand = job.tasks[0].demand
        flows = out_demand(js)
        tasks.append(
            [
                len(job.tasks) / 16,
                demand.cpu / median_cpu,
                math.log10(1 + sum(f.demand_mbps for f in job.flows)) / 3,
                compute_time_s(job.compute_s, 1.0, demand.cpu) / nominal,
                math.log10(1 + js.estimated_remaining_s()) / 5,
                math.log1p(js.wait(rnd.now) / 60) / 5,
                job.deadline is not None,
                job.priority / 2,
            ]
        )
        top = max((sh for sh in CPU_SHARES if space.may_fit(scale_job(job, cpu=sh))), default=0)
        for i, n in enumerate(nodes):
            slots[i, s] = s
            if (
                n in view.offline
                or not top
                or free[n].mem_mb < demand.mem_mb - 1e-9
                or free[n].gpu < demand.gpu - 1e-9
            ):
                continue
            # What a task's flows take of the link: at most its capacity, whatever they ask (CES
            # grants rates below the demand). So every level fits an idle link; else a job whose
            # lowest level exceeded every link's capacity was never allowed and held a slot.
            levels = [
                np.array(CPU_SHARES) * demand.cpu,
                np.minimum(np.array(BW_LEVELS) * flows, up[n][1]),
            ]
            lo = [demand.cpu, 0.0]
            hi = [min(free[n].cpu, top * demand.cpu), up[n][0] if flows else 0.0]
            if not flows:
                levels[1], lo[1], hi[1] = np.array(BW_LEVELS), 1.0, 1.0
            masks[i, s] = allocation_mask(levels, np.array(lo), np.array(hi))
            masks[i, s, [c for c in range(1, GRID) if (js, n, c) in failed]] = False
            ratio[i, s] = min(
                free[n].cpu / max(demand.cpu, 1e-9), free[n].mem_mb / max(demand.mem_mb, 1e-9)
            )
    masks[..., 0] = not idle(rnd)  # a wait lasts until the next event; idle, none may come
    running, hosts = [], [[], []]
    for r, js in enumerate(rnd.running):
        share = js.cpu_share
        bw = (
            js.allocated_job.flows[0].demand_mbps / js.job.flows[0].demand_mbps
            if js.job.flows and js.job.flows[0].demand_mbps > 0
            else 1.0
        )
        running.append(
            [
                len(js.job.tasks) / 16,
                share / CPU_SHARES[-1],
                bw,
                js.done_iters / js.job.iterations,
                math.log10(1 + js.observed_remaining_s(rnd.now)) / 5,
            ]
        )
        for node in set(js.decision.placement.values()):
            if node in nodes:
                hosts[0].append(nodes.index(node))
                hosts[1].append(r)
    obs = Obs(
        np.array(servers, np.float32),
        np.array(tasks, np.float32).reshape(-1, 8),
        np.array(running, np.float32).reshape(-1, 5),
        np.array(hosts, int),
        slots,
        masks,
        ratio,
    )
    return obs, jobs


@dataclass
class Recorder:
    """Training: every step the agents took, and their rewards -(jobs at node i) × hours."""

    steps: list[tuple[Obs, Step]] = field(default_factory=list)
    rewards: list[np.ndarray] = field(default_factory=list)
    _count: np.ndarray | None = None
    _since: float = 0.0

    def accrue(self, now: float) -> None:
        """Charge the time since the last round to the last step."""
        if self._count is not None and self.rewards:
            self.rewards[-1] -= self._count * (now - self._since) / 3600
        self._since = now

    def record(self, obs: Obs, step: Step) -> None:
        self.steps.append((obs, step))
        self.rewards.append(np.zeros(len(obs.servers)))

    def count(self, rnd: Round, nodes: list[str]) -> None:
        on = np.zeros(len(nodes))
        for js in rnd.running:
            for node in set(js.decision.placement.values()):
                on[nodes.index(node)] += 1
        self._count = on + len(rnd.queue)


@dataclass
class TapFinger:
    algorithm: Algorithm
    net: TapFingerNet
    greedy: bool = False  # sampled (seeded), as trained: the likeliest cell is often "wait"
    seed: int = 0
    recorder: Recorder | None = None
    name: ClassVar[str] = "tapfinger"
    period_s: ClassVar[float | None] = None
    reallocates: ClassVar[bool] = True  # a round at every event: exact reward integrals
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    @classmethod
    def load(cls, algorithm: Algorithm, path: Path = CHECKPOINT) -> TapFinger:
        return cls(algorithm, load(path, "ces", DIMS, GRID))

    def schedule(self, rnd: Round) -> None:
        nodes = rnd.cluster.compute_nodes()
        if self.recorder:
            self.recorder.accrue(rnd.now)
        failed: set[tuple[JobState, str, int]] = set()
        while rnd.queue:
            obs, jobs = observe(rnd, nodes, frozenset(failed))
            step = act(self.net, obs, self.greedy, self.rng)
            if self.recorder:
                self.recorder.record(obs, step)
            tries = [(jobs[t], nodes[i], int(step.cell[i])) for t, i in step.winners.items()]
            started = [self._start(rnd, *t) for t in tries]
            failed |= {t for t, ok in zip(tries, started) if not ok}
            if not any(started) and (not idle(rnd) or not tries):
                break  # the agents wait for the next event, or no agent can take a job
        if self.recorder:
            self.recorder.count(rnd, nodes)

    def _start(self, rnd: Round, js: JobState, node: str, cell: int) -> bool:
        """Start the job at the cell's share, whole on `node` if it fits there, else wherever
        the single-job algorithm places it."""
        cpu, bw = cell_share(cell)
        granted = scale_job(js.job, cpu, bw)
        start = time.perf_counter()
        alone = rnd.view(js).copy(share_graph=True)
        alone.offline |= set(alone.compute_nodes()) - {node}
        for target in (alone, rnd.view(js)):
            if not FreeSpace.of(target).may_fit(granted):
                continue
            try:
                decision = self.algorithm.place(target, granted)
            except CannotPlace:
                continue
            if rnd.commit(js, decision, None if (cpu, bw) == (1.0, 1.0) else granted):
                js.decision_s.append(time.perf_counter() - start)
                return True
        js.decision_s.append(time.perf_counter() - start)
        return False
