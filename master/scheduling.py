"""The Scheduler: which queued jobs start, and the joint decision (placement + path + rate) for
each, behind the Master.

Two pluggable parts, the same objects the simulator runs:
  - a *queue policy* of `scheduler.multi` (`fifo-backfill` by default, `ces-multi`, `sjf`, `edf`,
    `fifo`): given a `rounds.Round` over the Master's view of the cluster, it picks the jobs
    to start and places each through
  - a *single-job algorithm* of the registry (`scheduler.baselines`: the baselines, `exact`,
    `ces-ppo`, ...), with its network part composed in (`scheduler.compose`: `k8s-spread` runs
    best-effort, `k8s-spread/ces` on CES's paths and rates, `ces-ppo/best-effort`, ...).
Every decision the Round commits has passed `check_decision` on the view it was made on.
Preempting policies (`las`) are refused: the testbed does not checkpoint jobs; so are the ones
that re-allocate running jobs (`multi.REALLOCATING`: elastic shares, migrations).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from scheduler.baselines import algorithm_names
from scheduler import compose
from scheduler.model import EPS, Cluster, Decision, Job
from scheduler.multi import POLICIES, REALLOCATING, MultiConfig, make_policy
from scheduler.rounds import JobState, Round

# The testbed does not checkpoint workers, so nothing on it may be preempted: no LAS, and
# CES-Multi without its preemption (its reservations are held until they drain instead). Nor
# does it resize or move a running worker: no policy that re-allocates running jobs.
QUEUES = tuple(name for name in POLICIES if name != "las" and name not in REALLOCATING)
NO_PREEMPTION = replace(MultiConfig(), preempt_ratio=None, reserve_preempts=False)


class UnknownAlgorithm(ValueError):
    """A scheduler or queue name that is not known, or whose algorithm cannot be built;
    `field`: the request field that named it."""

    def __init__(self, message: str, field: str = "algorithm"):
        super().__init__(message)
        self.field = field


@dataclass
class Placed:
    job: str
    decision: Decision


class Scheduler:
    def __init__(self, default: str, seed: int = 0, queue: str = "fifo-backfill"):
        self._policies: dict[str, object] = {}
        self._seq = itertools.count()
        self._epoch = 0
        self._room: dict | None = None  # what the last round left free (`_room`)
        self.states: dict[str, JobState] = {}
        self.configure(default, seed, queue)

    @staticmethod
    def _check(name: str) -> str:
        """A scheduler spec (`compose`: NAME[:PATH_RULE][/NETWORK]) whose parts are known."""
        known = algorithm_names()
        try:
            base, _ = compose.parse(name)
        except ValueError as e:
            raise UnknownAlgorithm(str(e)) from None
        if base.partition(":")[0] not in known:
            raise UnknownAlgorithm(f"unknown scheduler '{name}' (known: {', '.join(known)}; "
                                   f"optionally /{'|/'.join(compose.NETWORKS)})")
        return name

    def configure(self, default: str, seed: int, queue: str = "fifo-backfill") -> None:
        """A new default algorithm, seed and queue policy (policies and their algorithms are
        re-created: seeded at construction). Fails, changing nothing, when the algorithm cannot
        be built (e.g. a missing checkpoint)."""
        if queue not in QUEUES:
            raise UnknownAlgorithm(f"unknown queue policy '{queue}' (known: {', '.join(QUEUES)})",
                                   "queue")
        policy = self._build(queue, self._check(default), seed)
        self._policies = {default: policy}
        self.default, self.seed, self.queue = default, seed, queue

    def resolve(self, name: str | None) -> str:
        if not name:
            return self.default
        self.policy(self._check(name))
        return name

    def policy(self, algorithm: str):
        """The queue policy placing with `algorithm` (kept: policies remember reservations)."""
        if algorithm not in self._policies:
            self._policies[algorithm] = self._build(self.queue, algorithm, self.seed)
        return self._policies[algorithm]

    @staticmethod
    def _build(queue: str, algorithm: str, seed: int):
        try:
            return make_policy(queue, compose.build(algorithm, seed), seed, NO_PREEMPTION)
        except (OSError, ValueError, RuntimeError) as e:
            raise UnknownAlgorithm(f"scheduler '{algorithm}' cannot be used: {e}") from None

    # --- rounds -------------------------------------------------------------------------------
    def submitted(self, job: Job, at: float) -> None:
        self.states[job.name] = JobState(job, next(self._seq), state="queued", queued_since=at)

    def round(self, view: Cluster, algorithm: str, queued: list[Job],
              running: list[tuple[Job, Decision, float]], now: float) -> tuple[list[Placed],
                                                                                 dict[str, str]]:
        """One round of the queue policy over `view` (a copy it may fill). Returns the jobs to
        start with their decisions, in the policy's order, and why each other queued job waits.
        `running` holds (job, decision, expected end) of the jobs the Master runs."""
        policy = self.policy(algorithm)
        queue = []
        for job in queued:
            js = self.states[job.name]
            js.state, js.decision = "queued", None
            queue.append(js)
        active = [JobState(job, -1, state="running", decision=d, expected_end=end)
                  for job, d, end in running]
        rnd = Round(now, view, policy.algorithm, queue, active, epoch=self._next_epoch(view))
        policy.schedule(rnd)
        self._epoch, self._room = max(self._epoch, rnd.epoch), _room(rnd.cluster)
        placed = []
        for js in rnd.placed:
            js.decision.decision_s = js.decision_s[-1] if js.decision_s else 0.0
            placed.append(Placed(js.name, js.decision))
        reasons = {js.name: js.why if js.failed_at and js.failed_at[0] == rnd.epoch else
                   "the queue policy holds it back (ordering or a reservation for another job)"
                   for js in rnd.queue}
        return placed, reasons

    def _next_epoch(self, view: Cluster) -> int:
        """The release epoch of a round on `view` (`Round.try_place` does not retry a job that
        failed in the same epoch): a new one when some node or link has more room free than
        the last round left (its placements made) — only then can a job that did not fit fit
        now. A burst of submissions thus costs each queued job one placement, not one per
        round."""
        room, last = _room(view), self._room
        if last is None or last.keys() != room.keys() or any(
                x > y + EPS for k, free in room.items() for x, y in zip(free, last[k])):
            self._epoch += 1
        return self._epoch

    def finished(self, name: str) -> None:
        self.states.pop(name, None)


def _room(view: Cluster) -> dict:
    """What `view` has free: by node (cpu, memory, gpu) and by directed link (Mbit/s)."""
    room = {n: view.free(n).as_tuple() for n in view.compute_nodes()}
    room |= {(u, v): (view.residual(u, v),)
             for a, b in view.graph.edges for u, v in ((a, b), (b, a))}
    return room


def expected_end(started_at: float, job: Job, predicted_iteration_s: float) -> float:
    """When a running job should end, as far as the Master can know before it does."""
    if job.iterations is None or not math.isfinite(predicted_iteration_s):
        return math.inf
    return started_at + job.iterations * predicted_iteration_s
