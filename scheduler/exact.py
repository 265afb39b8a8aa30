"""The exact reference: an optimal joint placement + path + rate for small instances.

Objective (stated): minimise the job's predicted iteration time, `metrics.predicted_iteration_s`
(the shared `perfmodel.IterationModel`), on the cluster as it is; ties go to the solution found
first (co-location and fast nodes are tried first). For a placement and one path per inter-node
flow, the best rates give the collective time in closed form

    T = max( max_f b_f / d_f ,  max_l Σ_{f ∋ l} b_f / res_l )        (b_f in Mbit, d_f in Mbit/s)

(each flow at most its demand; every directed link l carries its flows within its residual), and
the iteration time is  C + max(T/η, b_max/g) + s·(ℓ + R) + overhead  with C the slowest task's
compute, η the model's efficiency, g its per-worker goodput cap (`max_rate_mbps`), b_max the
largest inter-node flow, ℓ the per-message latency, s the collective's step count and R the round
trip of the longest path. The rates granted are `paths.fair_rates` weighted by bytes, which reach
exactly this T (its first filling level) and give any slack to flows up to their demand. A
collective of several sequential phases (star, tree: `perfmodel.collective_phases`) takes the
sum of its phases' times, which has no such closed form: there T only bounds the search, and each
complete solution is valued by the model at the rates granted.

Search: depth-first branch and bound over task placements (tasks in `placement_order`) and then
over one path per inter-node flow among the `max_paths` shortest loop-free paths with residual > 0
of its node pair. Bounds: compute of the placed tasks and the cheapest possible compute of the
others; each placed flow alone on its pair's widest candidate path; link loads of the paths chosen
so far. Empty nodes with identical attachment (same switch neighbours, link capacities, residuals,
delays) and identical capacity, free resources and speed are interchangeable, so only the first
is tried. The result is optimal over all placements and those candidate paths (all paths on the
small topologies it is used on); `last_optimal` is False when the `time_limit_s` cut it short.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .baselines import placement_order, register
from .metrics import DEFAULT_MODEL, path_delay_ms
from .model import EPS, CannotPlace, Cluster, Decision, FlowAssignment, Job, LogicalFlow
from .paths import NoPath, candidate_paths, fair_rates, links
from .perfmodel import IterationModel, collective_phases, collective_steps, compute_time_s


@dataclass(frozen=True)
class _Path:
    vertices: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    width: float  # bottleneck residual, Mbit/s
    rtt_s: float


class _Timeout(Exception):
    pass


@register("exact")
@dataclass
class Exact:
    name: str = "exact"
    seed: int = 0  # unused: the search is deterministic; kept for the registry's signature
    max_nodes: int = 16
    max_tasks: int = 6
    max_paths: int = 8
    time_limit_s: float = 60.0
    model: IterationModel = DEFAULT_MODEL
    last_optimal: bool = field(default=False, init=False)
    last_objective_s: float = field(default=math.inf, init=False)

    def applies(self, cluster: Cluster, job: Job) -> bool:
        return (
            len(cluster.compute_nodes(online_only=True)) <= self.max_nodes
            and len(job.tasks) <= self.max_tasks
        )

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        search = _Search(cluster, job, self.model, self.max_paths, start + self.time_limit_s)
        self.last_optimal = search.run()
        if search.best is None:
            raise CannotPlace(
                f"job {job.name}: no placement with paths fits the cluster"
                + ("" if self.last_optimal else " (search timed out)")
            )
        self.last_objective_s = search.best_value
        placement, chosen = search.best
        crossing = [f for f in job.flows if placement[f.src] != placement[f.dst]]
        rates = grant(cluster, chosen, crossing)
        flows = [
            FlowAssignment(f.src, f.dst, chosen[f.src, f.dst], rates[f.src, f.dst])
            for f in crossing
        ]
        return Decision(job.name, placement, flows, time.perf_counter() - start)


def grant(
    cluster: Cluster, chosen: dict[tuple[str, str], tuple[str, ...]], crossing: list[LogicalFlow]
) -> dict[tuple[str, str], float]:
    """The rates of the inter-node flows on their chosen paths: the bytes-weighted split."""
    top = max((f.bytes_per_iter for f in crossing), default=1.0) or 1.0
    return fair_rates(
        cluster,
        chosen,
        {(f.src, f.dst): f.demand_mbps for f in crossing},
        {(f.src, f.dst): max(f.bytes_per_iter, 1e-9 * top) for f in crossing},
    )


class _Search:
    """One branch-and-bound run (state kept here so the recursion stays readable)."""

    def __init__(
        self, cluster: Cluster, job: Job, model: IterationModel, max_paths: int, deadline: float
    ):
        self.cluster, self.job, self.model = cluster, job, model
        self.max_paths, self.deadline = max_paths, deadline
        self.nodes = cluster.compute_nodes(online_only=True)
        self.free = {n: cluster.free(n) for n in self.nodes}
        self.tasks = placement_order(job)
        self.compute = {
            (t.name, n): compute_time_s(job.compute_s, cluster.speed(n), t.demand.cpu)
            for t in job.tasks
            for n in self.nodes
        }
        self.min_compute = {
            t.name: min(
                (self.compute[t.name, n] for n in self.nodes if t.demand.fits_in(self.free[n])),
                default=math.inf,
            )
            for t in job.tasks
        }
        self.steps = collective_steps(job.collective, len(job.tasks))
        self.rank = {t.name: r for r, t in enumerate(job.tasks)}
        every = [(self.rank[f.src], self.rank[f.dst], f) for f in job.flows]
        self.phased = len(collective_phases(job.collective, every)) > 1
        self.signature = {n: self._signature(n) for n in self.nodes}
        self._paths: dict[tuple[str, str], list[_Path]] = {}
        self.best: tuple[dict[str, str], dict[tuple[str, str], tuple[str, ...]]] | None = None
        self.best_value = math.inf
        self.ticks = 0

    def _signature(self, n: str) -> tuple:
        c = self.cluster
        edges = tuple(
            sorted(
                (
                    v,
                    c.link_capacity(n, v),
                    c.residual(n, v),
                    c.residual(v, n),
                    c.graph.edges[n, v].get("delay_ms", 0.0),
                )
                for v in c.graph.neighbors(n)
            )
        )
        return (edges, c.capacity(n), self.free[n], c.speed(n))

    def paths(self, a: str, b: str) -> list[_Path]:
        if (a, b) not in self._paths:
            try:
                cands = candidate_paths(self.cluster, a, b, self.max_paths)
            except NoPath:
                cands = []
            out = [
                _Path(
                    p,
                    tuple(links(p)),
                    self.cluster.path_residual(p),
                    2 * path_delay_ms(self.cluster, p) / 1000,
                )
                for p in cands
            ]
            out = [p for p in out if p.width > EPS]
            self._paths[a, b] = sorted(out, key=lambda p: (-p.width, len(p.vertices)))
        return self._paths[a, b]

    def value(self, compute: float, transfer: float, rtt: float, biggest: float) -> float:
        """The iteration time; `biggest` is the largest flow crossing nodes, in Mbit (0: none),
        which alone takes biggest / max_rate_mbps when the model caps a worker's goodput."""
        comm = (
            max(transfer / self.model.efficiency, biggest / self.model.max_rate_mbps)
            + self.steps * (self.model.per_message_latency_s + rtt)
            if biggest > 0
            else 0.0
        )
        return compute + comm + self.model.overhead_s

    def phased_value(
        self,
        placement: dict[str, str],
        chosen: dict[tuple[str, str], tuple[str, ...]],
        compute: float,
        rtt: float,
        crossing: list[LogicalFlow],
    ) -> float:
        """The iteration time of a collective of several phases on these paths at the rates
        `Exact.place` grants (`grant`): no closed form, the model's own sum over the phases."""
        rates = grant(self.cluster, chosen, crossing)
        phases = collective_phases(
            self.job.collective,
            [
                (self.rank[f.src], self.rank[f.dst], (f.bytes_per_iter, rates[f.src, f.dst]))
                for f in crossing
            ],
        )
        comm = self.model.communication_s(*phases, steps=self.steps, rtt_s=rtt)
        return compute + comm + self.model.overhead_s

    def flow_alone(self, f: LogicalFlow, a: str, b: str) -> tuple[float, float] | None:
        """(transfer time, rtt) lower bounds of flow f from a to b; None if no path."""
        ps = self.paths(a, b)
        if not ps:
            return None
        mbit = 8 * f.bytes_per_iter / 1e6
        return mbit / min(f.demand_mbps, ps[0].width), min(p.rtt_s for p in ps)

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % 256 == 1 and time.perf_counter() > self.deadline:
            raise _Timeout

    def run(self) -> bool:
        try:
            self.place(0, {}, dict(self.free))
        except _Timeout:
            return False
        return True

    # --- placements -------------------------------------------------------------------------------
    def place(self, i: int, placement: dict[str, str], free: dict) -> None:
        self.tick()
        if self.bound(placement) >= self.best_value - 1e-12:
            return
        if i == len(self.tasks):
            self.route(placement)
            return
        task = self.tasks[i]
        used = set(placement.values())
        tried_empty: set[tuple] = set()
        # co-location first, then the fastest nodes: good incumbents early prune the rest
        order = sorted(self.nodes, key=lambda n: (n not in used, self.compute[task.name, n]))
        for n in order:
            if not task.demand.fits_in(free[n]):
                continue
            if n not in used:
                if self.signature[n] in tried_empty:
                    continue
                tried_empty.add(self.signature[n])
            placement[task.name] = n
            free[n] = free[n] - task.demand
            self.place(i + 1, placement, free)
            free[n] = free[n] + task.demand
            del placement[task.name]

    def bound(self, placement: dict[str, str]) -> float:
        compute = max((self.compute[t, n] for t, n in placement.items()), default=0.0)
        compute = max(
            [compute]
            + [self.min_compute[t.name] for t in self.job.tasks if t.name not in placement]
        )
        transfer = rtt = 0.0
        biggest = 0.0
        for f in self.job.flows:
            a, b = placement.get(f.src), placement.get(f.dst)
            if a is None or b is None or a == b:
                continue
            alone = self.flow_alone(f, a, b)
            if alone is None:
                return math.inf
            transfer, rtt = max(transfer, alone[0]), max(rtt, alone[1])
            biggest = max(biggest, 8 * f.bytes_per_iter / 1e6)
        return self.value(compute, transfer, rtt, biggest)

    # --- paths for one complete placement ---------------------------------------------------------
    def route(self, placement: dict[str, str]) -> None:
        crossing = sorted(
            (f for f in self.job.flows if placement[f.src] != placement[f.dst]),
            key=lambda f: -f.bytes_per_iter,
        )
        compute = max(self.compute[t, n] for t, n in placement.items())
        biggest = max((8 * f.bytes_per_iter / 1e6 for f in crossing), default=0.0)
        floor = [self.flow_alone(f, placement[f.src], placement[f.dst]) for f in crossing]
        # remaining flows' own lower bounds, from position j on
        rest_t = [max((x[0] for x in floor[j:]), default=0.0) for j in range(len(crossing) + 1)]
        rest_r = [max((x[1] for x in floor[j:]), default=0.0) for j in range(len(crossing) + 1)]
        chosen: dict[tuple[str, str], tuple[str, ...]] = {}
        load: dict[tuple[str, str], float] = {}

        def step(j: int, transfer: float, rtt: float) -> None:
            self.tick()
            if (
                self.value(compute, max(transfer, rest_t[j]), max(rtt, rest_r[j]), biggest)
                >= self.best_value - 1e-12
            ):
                return
            if j == len(crossing):
                found = self.value(compute, transfer, rtt, biggest)
                if self.phased:  # the closed form was a lower bound: the model itself
                    found = self.phased_value(placement, chosen, compute, rtt, crossing)
                if found < self.best_value - 1e-12:
                    self.best_value = found
                    self.best = (dict(placement), dict(chosen))
                return
            f = crossing[j]
            mbit = 8 * f.bytes_per_iter / 1e6
            for p in self.paths(placement[f.src], placement[f.dst]):
                t = transfer
                for lk in p.links:
                    load[lk] = load.get(lk, 0.0) + mbit
                    t = max(t, load[lk] / self.cluster.residual(*lk))
                chosen[f.src, f.dst] = p.vertices
                step(j + 1, t, max(rtt, p.rtt_s))
                for lk in p.links:
                    load[lk] -= mbit
            chosen.pop((f.src, f.dst), None)

        start_t = max((8 * f.bytes_per_iter / 1e6 / f.demand_mbps for f in crossing), default=0.0)
        step(0, start_t, 0.0)
