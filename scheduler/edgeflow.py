"""EdgeFlow (seed 001, Journal of Software 2025) in CES's multi-job simulator: deadline-sensitive
training jobs on a cluster's always-on nodes (the paper's GPU cluster, "cloud") plus edge nodes
that are free only while their own users are idle (seed 001's tidal availability, `arrivals.py`).

What it knows (nothing a real scheduler could not):
  edge nodes      the nodes it has seen leave; a tide is daily, so an edge node that left at t is
                  expected busy again at t + `day_s`;
  throughput      a job's cloud throughput is its nominal one (`rounds.estimated_iteration_s` of
                  the job at its share) × κ, its edge throughput λ × that; κ and λ start at 1
                  and `lam0` and are corrected online (EWMA) from the iteration times the
                  running jobs report: jobs wholly on always-on nodes correct κ, jobs wholly on
                  edge nodes correct λ.

At every event (arrival, completion, a node leaving or joining; `reallocates`) every unfinished job
is re-allocated:
  1. running jobs get the smallest elastic share (cpu × asked, `shares`) that still meets their
     deadline at the pace they report, in place; a job that no share keeps on time is demoted
     and, like best-effort jobs, falls back to share 1;
  2. queued deadline jobs in earliest-deadline order, each at its minimum satisfactory share:
     on the always-on nodes, else — if it still meets its deadline at λ × the throughput and
     ends before the edge nodes it uses turn busy — offloaded to idle edge nodes (suitable jobs);
     a job that cannot meet its deadline even at the largest share on the cloud is demoted for
     good (EDF's admission);
  3. then best-effort jobs (no deadline, demoted) in arrival order at share 1, cloud first, edge
     when suitable.
A job on an edge node that turns busy is re-queued by the simulator and placed again here: a
migration (counted, and it pays the restart). `elasticflow` is the same policy without the edge
(`edge=False`): ElasticFlow-like admission and elastic shares on the always-on nodes only.

What the paper leaves open and we chose: shares are cpu scale factors (CES's jobs have a fixed
number of workers); λ is one number for all edge nodes; no running job is preempted for another
(only its share changes, or it moves when its node leaves).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

from .baselines import Algorithm
from .model import CannotPlace, Decision, Job
from .rounds import ELASTIC_SHARES, FreeSpace, JobState, Round, estimated_iteration_s, scale_job
from .simulator import SimConfig


@dataclass(frozen=True)
class EdgeFlowConfig:
    edge: bool = True  # False: ElasticFlow-like, always-on nodes only
    lam0: float = 0.5  # prior edge / cloud throughput ratio λ
    ewma: float = 0.2  # weight of a new measurement in κ and λ
    shares: tuple[float, ...] = ELASTIC_SHARES  # elastic cpu shares (× asked)
    day_s: float = 86400.0  # period of the tide
    restart_s: float = SimConfig.restart_overhead_s  # a (re)start reloads a checkpoint


@dataclass
class EdgeFlow:
    algorithm: Algorithm
    config: EdgeFlowConfig = EdgeFlowConfig()
    period_s: ClassVar[float | None] = None
    reallocates: ClassVar[bool] = True
    kappa: float = 1.0  # cloud throughput / nominal
    lam: float = field(init=False)  # edge throughput / cloud throughput
    left_at: dict[str, float] = field(default_factory=dict)  # edge node -> its last leave
    demoted: set[str] = field(default_factory=set)  # jobs that cannot meet their deadline
    _offline: set[str] = field(default_factory=set)
    _failed: dict[tuple, tuple] = field(default_factory=dict)  # (job, share, where) -> state

    def __post_init__(self) -> None:
        self.lam = self.config.lam0

    @property
    def name(self) -> str:
        return "edgeflow" if self.config.edge else "elasticflow"

    # --- what it learns ----------------------------------------------------------------------
    def observe(self, rnd: Round) -> None:
        """Note nodes that left (edge nodes) and correct κ and λ from the running jobs' pace."""
        for node in rnd.cluster.offline - self._offline:
            self.left_at[node] = rnd.now
        self._offline = set(rnd.cluster.offline)
        a = self.config.ewma
        for js in rnd.running:
            if js.ready_at > rnd.now or not math.isfinite(js.iter_s):
                continue
            ratio = estimated_iteration_s(js.allocated_job) / js.iter_s  # measured / nominal
            where = {n in self.left_at for n in js.decision.placement.values()}
            if where == {False}:
                self.kappa += a * (ratio - self.kappa)
            elif where == {True}:
                self.lam += a * (ratio / self.kappa - self.lam)

    def iteration_s(self, job: Job, edge: bool) -> float:
        """Estimated iteration time of `job` (as granted) on the cloud or on edge nodes."""
        return estimated_iteration_s(job) / (self.kappa * (self.lam if edge else 1.0))

    def min_share(self, js: JobState, now: float, edge: bool) -> float | None:
        """The smallest share that meets `js`'s deadline if it starts now, None if none does."""
        for s in self.config.shares:
            end = (
                now
                + self.config.restart_s
                + js.remaining_iters() * self.iteration_s(scale_job(js.job, cpu=s), edge)
            )
            if end <= js.submit + js.job.deadline:
                return s
        return None

    def idle_until(self, node: str) -> float:
        """When an edge node is expected busy again (a daily tide); inf for always-on nodes."""
        return self.left_at[node] + self.config.day_s if node in self.left_at else math.inf

    # --- the round ---------------------------------------------------------------------------
    def schedule(self, rnd: Round) -> None:
        self.observe(rnd)
        for js in list(rnd.running):
            self._reshare(rnd, js)
        due = [
            js for js in rnd.queue if js.job.deadline is not None and js.name not in self.demoted
        ]
        for js in sorted(due, key=lambda j: (j.submit + j.job.deadline, j.seq)):
            if self.min_share(js, rnd.now, edge=False) is None and (
                not self.config.edge or self.min_share(js, rnd.now, True) is None
            ):
                self.demoted.add(js.name)
                continue
            self._start(rnd, js)
        for js in [j for j in rnd.queue if j.job.deadline is None or j.name in self.demoted]:
            self._start(rnd, js, best_effort=True)

    def _reshare(self, rnd: Round, js: JobState) -> None:
        """The smallest share that keeps a running job on time at the pace it reports."""
        current = js.cpu_share
        want = 1.0
        if js.job.deadline is not None and js.name not in self.demoted and math.isfinite(js.iter_s):
            base = js.iter_s / estimated_iteration_s(js.allocated_job)  # measured / nominal
            want = next(
                (
                    s
                    for s in self.config.shares
                    if max(rnd.now, js.ready_at)
                    + js.remaining_iters_at(rnd.now)
                    * base
                    * estimated_iteration_s(scale_job(js.job, cpu=s))
                    <= js.submit + js.job.deadline
                ),
                None,
            )
            if want is None:  # late whatever it gets: best effort from now on
                self.demoted.add(js.name)
                want = 1.0
        if not math.isclose(want, current):
            rnd.regrant(js, None if want == 1.0 else scale_job(js.job, cpu=want))

    def _start(self, rnd: Round, js: JobState, best_effort: bool = False) -> None:
        """Place a queued job on the cloud, else on idle edge nodes where it is suitable."""
        for edge in (False, True) if self.config.edge else (False,):
            share = 1.0 if best_effort else self.min_share(js, rnd.now, edge)
            if share is None:
                continue
            granted = scale_job(js.job, cpu=share)
            end = (
                rnd.now
                + self.config.restart_s
                + js.remaining_iters() * self.iteration_s(granted, edge)
            )
            decision = self._place(rnd, js, granted, edge, end)
            if decision is not None and rnd.commit(js, decision, None if share == 1.0 else granted):
                return

    def _place(
        self, rnd: Round, js: JobState, granted: Job, edge: bool, end: float
    ) -> Decision | None:
        """The single-job algorithm's placement of `granted` on the always-on nodes, or (edge)
        on them plus the edge nodes idle until `end`; None if it does not fit."""
        view = rnd.view(js).copy(share_graph=True)
        view.offline |= {n for n in self.left_at if not edge or self.idle_until(n) < end}
        key = (js.name, granted.tasks[0].demand.cpu, edge)
        state = (rnd.epoch, frozenset(view.offline))  # placements since only fill it up
        if self._failed.get(key) == state or not FreeSpace.of(view).may_fit(granted):
            return None
        start = time.perf_counter()
        try:
            return self.algorithm.place(view, granted)
        except CannotPlace:
            self._failed[key] = state
            return None
        finally:  # every attempt, as `Round.try_place` counts them (decision_ms)
            js.decision_s.append(time.perf_counter() - start)
