"""Scheduling a queue of concurrent training jobs: CES-Multi (DESIGN.md §4) and queue baselines.

Every policy implements `rounds.QueuePolicy`: it is handed a `Round` (the queue in arrival
order, the running jobs, the cluster) on each arrival, completion and node change, and starts
jobs through one single-job algorithm of the registry (`baselines.make_algorithm`), the same
for every policy in a comparison.

CES-Multi, per round:
  1. starving jobs — queued longer than `reserve_after_s` — get a *minimum reservation* (at most
     `max_reservations` at a time, longest waiting first): the placement the single-job algorithm
     finds on the cluster as it will be once running jobs end, releasing them in the order they
     are expected to finish until the job fits (EASY backfilling's shadow placement; the shadow
     time is the expected end of the last job released). The reservation is sticky until the job
     starts (or a reserved node leaves). With `reserve_preempts` (default) it is enforced by
     preemption: as soon as preempting running jobs that have not starved themselves (least
     attained service first) makes room, the job starts, so nobody keeps it out. Without, it is
     held: no other job may use those resources (node capacity and link bandwidth) unless its
     nominal run time ends before the shadow time (EASY backfilling), so they drain and the job
     starts — through the algorithm, or on the reserved decision itself once it is feasible;
  2. the *rolling window*: the first `window` queued jobs (arrival order) are candidates; the
     best-scoring one is placed, a job that does not fit is skipped (backfilling past it), and a
     started job's slot goes to the next job in the queue, until every job in the window failed;
     a start is also skipped when other jobs leave its flows less than `min_bw_share` of what
     their paths could carry (`uncontended_share`): better to wait a little than to crawl for
     hours on a sliver of bandwidth while holding nodes (a slow link is no reason to wait);
     with `balance_guard` set, a start is placed off the nodes more than the guard above the
     mean utilisation, unless it fits only there; with `spread_tolerance` set, in a round that
     begins with at most `spread_queue` queued jobs every placement is also made by the
     network-blind `spreader` and that one is taken when it predicts an iteration at most the
     tolerance slower and leaves node utilisation more even (`BalancedChoice`): a bounded
     slowdown of one job for the balance of all while there is idle capacity to spread into;
  3. score = a·fit + b·priority + c·wait + d·shortness, each in [0, 1]:
     fit       how the job's demand fits the cluster's free resources, per dimension as a share
               of the online total: cpu, memory, gpu (if any) and bandwidth (Σ of the job's flow
               demands vs. the residual of the nodes' access links); `fit="headroom"`: 1 - the
               largest share of a free resource the job takes (small jobs fit best);
               `fit="align"`: cosine of demand and free vectors (Tetris' alignment); 0 when the
               job cannot fit;
     priority  (priority + wait / age_every_s) / the window's largest — priority ageing;
     wait      waiting time / the window's longest;
     shortness 1 - the job's rank by nominal remaining run time in the window / (size - 1);
  4. with `preempt_ratio` set, a candidate that does not fit may preempt running jobs with at
     least that many times its nominal remaining run time, theirs taken at the pace they run
     now (`JobState.observed_remaining_s`; longest first, the fewest that make
     room; they keep their progress and pay the restart overhead): shortest remaining time
     first, the policy that minimises the average wait. A job that has waited past
     `reserve_after_s` is never preempted, so the reservation still bounds every wait;
  5. with `delay_lookahead` set, delay deployment (seed 004's wait action): a start is skipped
     when the job is expected to end sooner placed once one of the next running jobs (by
     expected end) has ended (`delay_pays`); it is tried again when resources are released.
     With `delay_holds`, it holds the placement it waits for until that release is due, as a
     reservation without preemption holds (EASY backfilling: shorter jobs may still use it).
Defaults come from the sweep and the runs in docs/multi.md (`experiments/bench_multi.py`).

Baselines (all backfill past jobs that do not fit, except strict FIFO):
  fifo           arrival order; stops at the first job that does not fit (no overtaking).
  fifo-backfill  arrival order; jobs that fit start (first-fit backfilling).
  sjf            shortest nominal remaining run time first (`JobState.estimated_remaining_s`).
  las            Tiresias' discretised least-attained-service: queues by attained service
                 (workers × seconds run) with `thresholds`, FIFO inside a queue; a job that does
                 not fit may preempt running jobs of lower queues (lowest first), re-evaluated
                 every `period_s` (the lease). No promotion knob.
  edf            earliest absolute deadline first among *admitted* jobs — a deadline job is
                 admitted while now + its nominal remaining run time still meets its deadline;
                 once it cannot, it is demoted for good — then the rest (demoted and
                 deadline-free jobs) in arrival order.
  min            TapFinger's Min (seed 002): random order, each job at its minimum (what it asked).
  optimus        TapFinger's Optimus-like baseline: minimum shares in arrival order, then spare
                 cpu to the running jobs by marginal gain of a fitted speed curve (elastic).
  edgeflow       seed 001 (`edgeflow.py`): deadline-aware elastic shares on always-on nodes
                 plus idle tidal edge nodes, re-allocated at every event; `elasticflow` the
                 same on the always-on nodes only (ElasticFlow-like admission).
  tapfinger      seed 002 (`tapfinger/`): one MAPPO agent per node picks a job and a cpu share
                 × bandwidth level; a Bayes arbiter settles conflicts (needs its checkpoint).
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from .baselines import Algorithm, algorithm_names, make_algorithm
from .edgeflow import EdgeFlow, EdgeFlowConfig
from .metrics import load_balance, node_utilisation, predicted_iteration_s
from .model import CannotPlace, Cluster, Decision, Job
from .rounds import ELASTIC_SHARES, FreeSpace, JobState, Round, scale_job

# The single-job scheduler CES-Multi uses until CES-PPO is registered (bench_scheduler's best
# heuristic on bandwidth satisfaction and iteration time).
BEST_HEURISTIC = "network-aware"


@functools.cache
def default_algorithm() -> str:
    """CES-PPO once its module registers it and a trained checkpoint exists, else the best
    heuristic."""
    if "ces-ppo" in algorithm_names():
        try:
            make_algorithm("ces-ppo")
            return "ces-ppo"
        except FileNotFoundError:  # registered, but no checkpoint trained yet
            pass
    return BEST_HEURISTIC


# --- baselines --------------------------------------------------------------------------------------


@dataclass
class Fifo:
    algorithm: Algorithm
    name: ClassVar[str] = "fifo"
    period_s: ClassVar[float | None] = None

    def schedule(self, rnd: Round) -> None:
        for js in list(rnd.queue):
            if rnd.try_place(js) is None:
                return


@dataclass
class FifoBackfill(Fifo):
    name: ClassVar[str] = "fifo-backfill"

    def schedule(self, rnd: Round) -> None:
        for js in list(rnd.queue):
            rnd.try_place(js)


@dataclass
class Sjf(Fifo):
    name: ClassVar[str] = "sjf"

    def schedule(self, rnd: Round) -> None:
        for js in sorted(rnd.queue, key=lambda j: (j.estimated_remaining_s(), j.seq)):
            rnd.try_place(js)


@dataclass
class Las:
    algorithm: Algorithm
    thresholds: tuple[float, ...] = (3600.0, 36000.0)  # workers × s between queues
    period_s: float | None = 600.0
    name: ClassVar[str] = "las"

    def level(self, js: JobState, now: float) -> int:
        return bisect.bisect_right(self.thresholds, js.service(now))

    def schedule(self, rnd: Round) -> None:
        for js in sorted(rnd.queue, key=lambda j: (self.level(j, rnd.now), j.seq)):
            if rnd.try_place(js) is None:
                # preempt running jobs of lower queues, lowest then youngest first
                mine = self.level(js, rnd.now)
                preempt_until_fits(
                    rnd,
                    js,
                    sorted(
                        (r for r in rnd.running if self.level(r, rnd.now) > mine),
                        key=lambda r: (-self.level(r, rnd.now), -r.seq),
                    ),
                )


def preempt_until_fits(rnd: Round, js: JobState, victims: list[JobState]) -> bool:
    """Start `js` by preempting the fewest of `victims`, in their order: release them one by one
    on a copy of what `js` may use until the algorithm places it; then preempt those and commit.
    False (nothing preempted) if it does not fit even without all of them."""
    for i, _, decision in placed_as_released(rnd, js, victims):
        for v in victims[:i]:
            rnd.preempt(v)
        return rnd.commit(js, decision)
    return False


def lapsed(rnd: Round, queued: set[JobState], owner: JobState, held: Decision) -> bool:
    """Whether a sticky hold is void: its job left the queue, or a node it holds went offline."""
    return owner not in queued or bool(rnd.cluster.offline & set(held.placement.values()))


def by_expected_end(running: list[JobState]) -> list[JobState]:
    """Running jobs in the order they are expected to end (then arrival)."""
    return sorted(running, key=lambda r: (r.expected_end, r.seq))


def placed_as_released(rnd: Round, js: JobState, jobs: list[JobState], now: bool = False):
    """Where the algorithm places `js`, on a copy of what `js` may use, as `jobs` end one by one
    in their order: (how many ended, the copy then, the decision) each time it fits — with
    `now`, first with none ended."""
    trial = rnd.view(js).copy(share_graph=True)
    for i in range(0 if now else 1, len(jobs) + 1):
        if i:
            trial.release(jobs[i - 1].name)
        if not FreeSpace.of(trial).may_fit(js.job):
            continue
        try:
            decision = rnd.algorithm.place(trial, js.job)
        except CannotPlace:
            continue
        yield i, trial, decision


@dataclass
class Edf(Fifo):
    name: ClassVar[str] = "edf"

    def schedule(self, rnd: Round) -> None:
        for js in rnd.queue:
            if js.job.deadline is None:
                js.admitted = False
            elif js.admitted is not False:
                js.admitted = rnd.now + js.estimated_remaining_s() <= js.submit + js.job.deadline
        admitted = sorted(
            (j for j in rnd.queue if j.admitted), key=lambda j: (j.submit + j.job.deadline, j.seq)
        )
        for js in admitted + [j for j in rnd.queue if not j.admitted]:
            rnd.try_place(js)


@dataclass
class Min(Fifo):
    """TapFinger's Min baseline: queued jobs in random order, each started with its minimum
    allocation — in CES what it asked — with backfilling."""

    seed: int = 0
    name: ClassVar[str] = "min"
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)

    def schedule(self, rnd: Round) -> None:
        queue = list(rnd.queue)
        for i in self.rng.permutation(len(queue)):
            rnd.try_place(queue[i])


@dataclass
class Optimus(Fifo):
    """Optimus-like (TapFinger's baseline, after Optimus, EuroSys'18): each round every running
    job falls back to its minimum share (what it asked), queued jobs start in arrival order at
    that share while they fit, then the spare cpu of the nodes goes one share step at a time to
    the running job whose remaining time the step shortens most per core. The remaining time
    comes from a speed curve fitted per job: iteration time t(s) = θ0/s + θ1 at cpu share s,
    least squares over profiles at `PROFILE` shares (Optimus profiles a job at a few resource
    configurations; here the profile is the shared iteration-time model on the job's nodes).
    Shares change in place: the job keeps its nodes, paths and rates (no migration)."""

    shares: tuple[float, ...] = ELASTIC_SHARES
    name: ClassVar[str] = "optimus"
    reallocates: ClassVar[bool] = True
    PROFILE: ClassVar[tuple[float, ...]] = (1.0, 2.0, 4.0)

    def schedule(self, rnd: Round) -> None:
        for js in list(rnd.running):
            if js.granted is not None:
                rnd.regrant(js, None)
        for js in list(rnd.queue):
            rnd.try_place(js)
        level = dict.fromkeys(rnd.running + rnd.placed, 0)
        curve = {js: speed_curve(rnd.cluster, js, self.PROFILE) for js in level}
        free = {n: rnd.cluster.free(n).cpu for n in rnd.cluster.compute_nodes(online_only=True)}
        while True:
            best, gain = None, 0.0
            for js, k in level.items():
                if k + 1 == len(self.shares):
                    continue
                step = self.shares[k + 1] - self.shares[k]
                need = cores_by_node(js, step)
                if any(c > free.get(n, 0.0) + 1e-9 for n, c in need.items()):
                    continue
                t0, t1 = (curve[js][0] / s + curve[js][1] for s in self.shares[k : k + 2])
                g = js.remaining_iters_at(rnd.now) * (t0 - t1) / sum(need.values())
                if g > gain:
                    best, gain = js, g
            if best is None:
                break
            for n, c in cores_by_node(
                best, self.shares[level[best] + 1] - self.shares[level[best]]
            ).items():
                free[n] -= c
            level[best] += 1
        for js, k in level.items():
            if k:
                rnd.regrant(js, scale_job(js.job, cpu=self.shares[k]))


def cores_by_node(js: JobState, share_step: float) -> dict[str, float]:
    """The cores a running job's share grows by per node when its share rises by `share_step`."""
    need: dict[str, float] = {}
    for task, node in js.decision.placement.items():
        need[node] = need.get(node, 0.0) + share_step * js.job.task(task).demand.cpu
    return need


def speed_curve(cluster: Cluster, js: JobState, shares: tuple[float, ...]) -> tuple[float, float]:
    """(θ0, θ1) of t(s) = θ0/s + θ1, fitted by least squares to a running job's iteration time
    profiled at cpu `shares` on its nodes (`metrics.predicted_iteration_s`)."""
    t = [predicted_iteration_s(cluster, scale_job(js.job, cpu=s), js.decision) for s in shares]
    a = np.array([[1.0 / s, 1.0] for s in shares])
    theta, *_ = np.linalg.lstsq(a, np.array(t), rcond=None)
    return float(theta[0]), float(theta[1])


# --- CES-Multi --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultiConfig:
    """CES-Multi's knobs (module doc). Defaults: the sweep in docs/multi.md
    (results/multi/sweep.json) chose fit, a_fit, min_bw_share, age_every_s and
    max_reservations (the fit term and the bandwidth deferral did not pay off there); the grid
    over the shortness weight, preemption and the reservation threshold in docs/multi.md
    ("Tuning for the targets") chose d_short, preempt_ratio, reserve_after_s and the whole-queue
    window, its session 6 runs reserve_preempts and balance_guard, and session 7's
    spread_tolerance."""

    window: int = 1000
    fit: str = "align"  # align | headroom
    a_fit: float = 0.0
    b_priority: float = 0.5  # not swept: the sweep's objective has no priority term
    c_wait: float = 1.0
    d_short: float = 4.0  # weight of shortness: 1 - rank by nominal remaining run time
    # Preempt running jobs with ≥ this × the candidate's nominal remaining run time (theirs at
    # the pace they run now) to start it (None: never); jobs that waited past reserve_after_s
    # are never preempted.
    preempt_ratio: float | None = 1.2
    # Place a start first off the nodes more than this above the mean utilisation (None: off).
    balance_guard: float | None = 0.05
    # While at most `spread_queue` jobs are queued, take the spreader's placement instead when
    # its predicted iteration time is at most this share slower and it leaves a lower std of
    # node utilisation (None: off). A longer queue means no idle capacity to spread into.
    spread_tolerance: float | None = 1.0
    spread_queue: int = 10
    spreader: str = "k8s-spread"
    age_every_s: float = 3600.0  # priority ageing: +1 level per this much waiting
    min_bw_share: float = 0.0  # defer a start granted less of what its links could give
    reservation: bool = True
    reserve_after_s: float = 57600.0
    max_reservations: int = 1
    # Enforce a reservation by preempting running jobs that have not starved themselves as
    # soon as that starts its job, instead of holding resources idle until they drain.
    reserve_preempts: bool = True
    backfill: bool = True
    # Delay deployment (seed 004's wait action): a job whose placement now is expected to end
    # later than the one it would get once one of the next `delay_lookahead` running jobs (by
    # expected end) has ended, waits for it (`delay_pays`). None: off.
    delay_lookahead: int | None = None
    # A job that waits holds the placement it waits for (`CesMulti.awaiting`), EASY-style: only
    # jobs expected to end before that release may use its resources meanwhile. Without it,
    # other starts may take what the ending job frees, and the wait buys nothing.
    delay_holds: bool = False

    def __post_init__(self) -> None:
        tol = self.spread_tolerance
        if tol is not None and (
            isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0
        ):
            raise ValueError(f"spread_tolerance: expected a number ≥ 0 or null, got {tol!r}")
        if (
            isinstance(self.spread_queue, bool)
            or not isinstance(self.spread_queue, int)
            or self.spread_queue < 0
        ):
            raise ValueError(f"spread_queue: expected an integer ≥ 0, got {self.spread_queue!r}")
        k = self.delay_lookahead
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"delay_lookahead: expected an integer ≥ 1 or null, got {k!r}")


@dataclass
class CesMulti:
    algorithm: Algorithm
    config: MultiConfig = MultiConfig()
    seed: int = 0  # the spreader's (k8s-spread breaks ties at random)
    name: ClassVar[str] = "ces-multi"
    period_s: ClassVar[float | None] = None
    reserved: dict[JobState, tuple[Decision, float]] = field(default_factory=dict)  # sticky
    # Jobs waiting for a release (`delay_holds`): the placement they wait for, and when
    awaiting: dict[JobState, tuple[Decision, float]] = field(default_factory=dict)
    balanced: BalancedChoice | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.config.spread_tolerance is not None:
            try:
                spreader = make_algorithm(self.config.spreader, seed=self.seed)
            except ValueError as e:
                raise ValueError(f"spreader: {e}") from None
            self.balanced = BalancedChoice(self.algorithm, spreader, self.config.spread_tolerance)

    def schedule(self, rnd: Round) -> None:
        cfg = self.config
        if self.balanced is not None and len(rnd.queue) <= cfg.spread_queue:
            rnd.algorithm = self.balanced  # this round's placements, reservations included
        if cfg.reservation:
            self._reserve(rnd)
        self._hold_awaited(rnd)
        for owner, (held, _) in list(self.reserved.items()):
            if (
                rnd.try_place(owner)
                or rnd.commit(owner, held)
                or self._preempt_for_reserved(rnd, owner)
            ):
                del self.reserved[owner]
        tried: set[JobState] = set()
        while True:
            window = rnd.queue[: cfg.window]
            candidates = [j for j in window if j not in tried and j not in self.reserved]
            if not candidates:
                return
            scores = self.scores(rnd, window)
            best = max(candidates, key=lambda j: (scores[j], -j.seq))
            delayed: list[JobState] = []
            if rnd.try_place(best, self._worth_it(rnd, best, delayed), self._crowded) is None and (
                delayed or not self._preempt_for(rnd, best)
            ):
                tried.add(best)
                if not cfg.backfill:
                    return

    def _preempt_for(self, rnd: Round, js: JobState) -> bool:
        """Shortest remaining time first, preemptively: make room for `js` by preempting running
        jobs with at least `preempt_ratio` × its nominal remaining run time (longest first)."""
        if self.config.preempt_ratio is None:
            return False
        bar = self.config.preempt_ratio * js.estimated_remaining_s()
        left = {r: r.observed_remaining_s(rnd.now) for r in rnd.running}
        return self._preempt(
            rnd, js, [r for r in rnd.running if left[r] >= bar], key=lambda r: (-left[r], r.seq)
        )

    def _preempt_for_reserved(self, rnd: Round, js: JobState) -> bool:
        """Start a reserved job now by preempting running jobs, least attained service (then
        youngest) first; they keep their progress and pay the restart. Resources held for a
        drain sit idle, and in overload the next starving job's hold follows the last one's: a
        convoy that makes more jobs starve."""
        if not self.config.reserve_preempts:
            return False
        return self._preempt(rnd, js, rnd.running, key=lambda r: (r.service(rnd.now), -r.seq))

    def _preempt(
        self, rnd: Round, js: JobState, candidates: list[JobState], key: Callable[[JobState], tuple]
    ) -> bool:
        """Start `js` by preempting the fewest of `candidates` in `key` order, never one that
        already waited past `reserve_after_s` (it would starve again)."""
        victims = sorted(
            (r for r in candidates if r.wait(rnd.now) < self.config.reserve_after_s), key=key
        )
        return bool(victims) and preempt_until_fits(rnd, js, victims)

    def _hold_awaited(self, rnd: Round) -> None:
        """Hold again what waiting jobs wait for, until the release they wait for is due: a job
        still queued past it competes as any other (and may wait, and hold, again)."""
        queued = set(rnd.queue)
        for owner, (held, until) in list(self.awaiting.items()):
            if lapsed(rnd, queued, owner, held) or until < rnd.now:
                del self.awaiting[owner]
            else:
                rnd.hold(owner, held, until)

    def _crowded(self, view: Cluster) -> set[str]:
        """Nodes to keep a start off while others have room (`balance_guard`): those whose
        utilisation Ū_n exceeds the online mean by more than the guard."""
        if self.config.balance_guard is None:
            return set()
        util = {n: node_utilisation(view, n) for n in view.compute_nodes(online_only=True)}
        bar = statistics.fmean(util.values()) + self.config.balance_guard if util else math.inf
        return {n for n, u in util.items() if u > bar}

    def _worth_it(
        self, rnd: Round, js: JobState, delayed: list[JobState]
    ) -> Callable[[Decision], bool]:
        """Start a job only if other jobs leave it enough bandwidth (one granted a sliver of
        what its links could carry would hold its resources for ages) and, with
        `delay_lookahead`, only if waiting for a running job to end would not finish it sooner
        (`delay_pays`; then it joins `delayed`, and is not started by preemption either)."""

        def worth(d: Decision) -> bool:
            if uncontended_share(rnd.cluster, js.job, d) < self.config.min_bw_share:
                return False
            waited_for = self.config.delay_lookahead and delay_pays(
                rnd, js, d, self.config.delay_lookahead
            )
            if waited_for:
                delayed.append(js)
                if self.config.delay_holds:
                    self.awaiting[js] = waited_for
                    rnd.hold(js, *waited_for)
                return False
            self.awaiting.pop(js, None)
            return True

        return worth

    def scores(self, rnd: Round, window: list[JobState]) -> dict[JobState, float]:
        """a·fit + b·priority + c·wait + d·shortness for the jobs of the window (module doc)."""
        cfg, space, free = self.config, rnd.free_space(), free_vector(rnd.view())
        age = {j: j.job.priority + j.wait(rnd.now) / cfg.age_every_s for j in window}
        wait = {j: j.wait(rnd.now) for j in window}
        top_age, top_wait = max(age.values(), default=0.0), max(wait.values(), default=0.0)
        short = shortness(window) if cfg.d_short else dict.fromkeys(window, 0.0)
        return {
            j: cfg.a_fit * fit(j.job, space, free, cfg.fit)
            + cfg.b_priority * (age[j] / top_age if top_age > 0 else 0.0)
            + cfg.c_wait * (wait[j] / top_wait if top_wait > 0 else 0.0)
            + cfg.d_short * short[j]
            for j in window
        }

    def _reserve(self, rnd: Round) -> None:
        """Keep the sticky reservations valid, add new ones for starving jobs; hold their
        resources from other jobs unless preemption enforces them (`reserve_preempts`)."""
        queued = set(rnd.queue)
        hold = not self.config.reserve_preempts
        for owner, (held, _) in list(self.reserved.items()):
            if lapsed(rnd, queued, owner, held):
                del self.reserved[owner]
        for owner, (held, until) in self.reserved.items():
            if hold:
                rnd.hold(owner, held, until)
        starving = sorted(
            (
                j
                for j in rnd.queue
                if j not in self.reserved and j.wait(rnd.now) >= self.config.reserve_after_s
            ),
            key=lambda j: (-j.wait(rnd.now), j.seq),
        )
        for js in starving[: max(self.config.max_reservations - len(self.reserved), 0)]:
            shadow = shadow_decision(rnd, js)
            if shadow is not None:
                self.reserved[js] = shadow
                if hold:
                    rnd.hold(js, *shadow)


@dataclass
class BalancedChoice:
    """A single-job algorithm that trades a bounded slowdown of a job for the balance of the
    cluster: `primary`'s placement, or `spreader`'s when that one predicts an iteration time at
    most `tolerance` × slower and leaves a lower std of node utilisation. CES-PPO co-locates a
    job's tasks on few well-connected nodes, which is fastest for the job; in a busy cluster a
    job that barely communicates loses little when spread, and the next jobs find room."""

    primary: Algorithm
    spreader: Algorithm
    tolerance: float

    @property
    def name(self) -> str:
        return f"{self.primary.name} (balanced by {self.spreader.name})"

    def place(self, cluster: Cluster, job: Job) -> Decision:
        decision = self.primary.place(cluster, job)
        try:
            spread = self.spreader.place(cluster, job)
        except CannotPlace:
            return decision
        if predicted_iteration_s(cluster, job, spread) > (
            1 + self.tolerance
        ) * predicted_iteration_s(cluster, job, decision):
            return decision
        return (
            spread
            if _std_after(cluster, job, spread) < _std_after(cluster, job, decision)
            else decision
        )


def _std_after(cluster: Cluster, job: Job, decision: Decision) -> float:
    after = cluster.copy(share_graph=True)
    after.allocate(job, decision)
    return load_balance(after)[0]


def shortness(jobs: list[JobState]) -> dict[JobState, float]:
    """1 for the job with the shortest nominal remaining run time, 0 for the longest, evenly
    by rank in between (ties share the rank): scale-free, as run times span hours to minutes."""
    if len(jobs) < 2:
        return dict.fromkeys(jobs, 1.0)
    remaining = sorted(j.estimated_remaining_s() for j in jobs)
    return {
        j: 1.0 - bisect.bisect_left(remaining, j.estimated_remaining_s()) / (len(jobs) - 1)
        for j in jobs
    }


def shadow_decision(rnd: Round, js: JobState) -> tuple[Decision, float] | None:
    """Where and when `js` will fit soonest: release running jobs in expected end order on a
    copy of the cluster (minus other holds) until the algorithm places it; the decision and the
    expected end of the last job released (the shadow time)."""
    ending = by_expected_end(rnd.running)
    for i, _, decision in placed_as_released(rnd, js, ending, now=True):
        return decision, ending[i - 1].expected_end if i else rnd.now
    return None


def delay_pays(
    rnd: Round, js: JobState, now: Decision, lookahead: int
) -> tuple[Decision, float] | None:
    """Whether `js` is expected to end sooner by waiting than by starting now on `now`: release
    the next `lookahead` running jobs in expected end order on a copy of what `js` may use; after
    each, the algorithm places it, and the job would end at that release plus its remaining
    iterations at the predicted iteration time there (seed 004's delay deployment, judged by
    the expected end rather than a learned value). A release later than the end now cannot
    pay and stops the search. (the placement waiting pays for, the release's expected end) of
    the first release that pays; None when starting now is as good."""
    iters = js.remaining_iters()
    if not iters:
        return None
    end_now = rnd.now + iters * predicted_iteration_s(rnd.view(js), js.job, now)
    ending = [r for r in by_expected_end(rnd.running)[:lookahead] if r.expected_end < end_now]
    for i, trial, later in placed_as_released(rnd, js, ending):
        release = ending[i - 1].expected_end
        if release + iters * predicted_iteration_s(trial, js.job, later) < end_now:
            return later, release
    return None


def uncontended_share(cluster: Cluster, job: Job, decision: Decision) -> float:
    """Σ granted / Σ what the flows could get on their paths with no other traffic (the demand
    capped by the path's bottleneck capacity): below 1 only because of other jobs."""
    demand = {(f.src, f.dst): f.demand_mbps for f in job.flows}
    granted = possible = 0.0
    for f in decision.flows:
        granted += f.rate_mbps
        possible += min(
            demand[(f.src, f.dst)], min(cluster.link_capacity(u, v) for u, v in f.directed_links())
        )
    return granted / possible if possible > 0 else 1.0


def free_vector(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """(free, total) over online nodes: cpu, mem, gpu, access-link bandwidth (min of the two
    directions' residual)."""
    free, total = np.zeros(4), np.zeros(4)
    for n in cluster.compute_nodes(online_only=True):
        sw = next(iter(cluster.graph.neighbors(n)))
        free += (*cluster.free(n).as_tuple(), min(cluster.residual(n, sw), cluster.residual(sw, n)))
        total += (*cluster.capacity(n).as_tuple(), cluster.link_capacity(n, sw))
    return free, total


def fit(
    job: Job, space: FreeSpace, free_total: tuple[np.ndarray, np.ndarray], kind: str = "headroom"
) -> float:
    """How well the job's demand fits the free resources (`free_vector`; module doc), in [0, 1];
    0 if it cannot fit (`space`)."""
    if not space.may_fit(job):
        return 0.0
    free, total = free_total
    demand = np.array((*job.total_demand().as_tuple(), sum(f.demand_mbps for f in job.flows)))
    has = total > 0
    d, f = demand[has] / total[has], np.maximum(free[has], 0.0) / total[has]
    if kind == "headroom":
        asked = d > 0
        return (
            float(1.0 - min(1.0, np.max(d[asked] / np.maximum(f[asked], 1e-12))))
            if asked.any()
            else 1.0
        )
    norm = np.linalg.norm(d) * np.linalg.norm(f)
    return float(d @ f / norm) if norm > 0 else 0.0


# --- the registry of queue policies -----------------------------------------------------------------


def _edgeflow(algorithm: Algorithm, edge: bool = True):
    return EdgeFlow(algorithm, EdgeFlowConfig(edge=edge))


def _tapfinger(algorithm: Algorithm):
    from .tapfinger.policy import TapFinger  # torch: imported only when asked for

    return TapFinger.load(algorithm)


# The policies that change running jobs' shares or placements (their `reallocates`; named here
# so that the Master can refuse them without building TapFinger's network).
REALLOCATING = frozenset({"optimus", "edgeflow", "elasticflow", "tapfinger"})

POLICIES: dict[str, Callable[..., object]] = {
    "ces-multi": CesMulti,
    "fifo": Fifo,
    "fifo-backfill": FifoBackfill,
    "sjf": Sjf,
    "las": Las,
    "edf": Edf,
    "min": Min,
    "optimus": Optimus,
    "edgeflow": _edgeflow,
    "elasticflow": functools.partial(_edgeflow, edge=False),
    "tapfinger": _tapfinger,
}


def policy_names(spec: str) -> list[str]:
    """The queue policies of "all" or a comma-separated list; ValueError naming an unknown one."""
    names = list(POLICIES) if spec == "all" else [a.strip() for a in spec.split(",")]
    for name in names:
        if name not in POLICIES:
            raise ValueError(
                f"unknown queue policy '{name}' (known: {', '.join(POLICIES)}, or all)"
            )
    return names


def make_policy(
    name: str,
    algorithm: str | Algorithm | None = None,
    seed: int = 0,
    config: MultiConfig = MultiConfig(),
):
    """A queue policy by name, placing jobs with single-job `algorithm`: a registry name
    (default: CES-Multi's) or an algorithm object (e.g. composed by `compose.build`)."""
    if name not in POLICIES:
        raise ValueError(f"unknown queue policy '{name}' (known: {', '.join(POLICIES)})")
    algo = (
        algorithm
        if algorithm is not None and not isinstance(algorithm, str)
        else make_algorithm(algorithm or default_algorithm(), seed=seed)
    )
    return CesMulti(algo, config, seed) if name == "ces-multi" else POLICIES[name](algo)


__all__ = [
    "BEST_HEURISTIC",
    "POLICIES",
    "REALLOCATING",
    "CesMulti",
    "Edf",
    "Fifo",
    "FifoBackfill",
    "Las",
    "Min",
    "MultiConfig",
    "Optimus",
    "Sjf",
    "default_algorithm",
    "fit",
    "free_vector",
    "make_policy",
    "preempt_until_fits",
    "shadow_decision",
    "shortness",
    "speed_curve",
]
