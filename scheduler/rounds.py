"""The queue-round protocol: how a queue policy sees and changes the world, in the simulator and
on the live Master alike.

A policy (`multi.py`: CES-Multi, FIFO, SJF, ...) is handed a `Round` on each arrival,
completion and node change: the queued jobs in arrival order, the running ones and the cluster,
with `try_place` / `commit` / `preempt` / `hold`. A `Round` needs nothing but a `Cluster`, so
the simulator's engine and the Master's Scheduler drive the same policies. Every decision passes
`check_decision`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from .baselines import Algorithm
from .model import CannotPlace, Cluster, Decision, Job, Resources, Task, check_decision
from .perfmodel import IterationModel, collective_phases, collective_steps, compute_time_s

State = Literal["pending", "queued", "running", "finished", "failed", "rejected"]


@dataclass(eq=False)
class JobState:
    job: Job
    seq: int  # arrival order: the queue's FIFO order
    state: State = "pending"
    waited_s: float = 0.0  # time spent queued, up to `queued_since`
    queued_since: float = 0.0
    first_start: float | None = None
    finish: float | None = None
    done_iters: float = 0.0
    attained: float = 0.0  # service received: workers × seconds run (Tiresias' measure)
    preemptions: int = 0
    reroutes: int = 0  # runtime adjustments of its paths and rates (simulator: link changes)
    decision: Decision | None = None
    iter_s: float = math.inf  # iteration time at the rates the job gets now
    last_update: float = 0.0
    ready_at: float = 0.0  # after a restart: no progress before this (checkpoint reload)
    expected_end: float = math.inf
    version: int = 0  # invalidates stale completion events
    failed_at: tuple | None = None  # (release epoch, holds) of the last failed placement
    why: str = ""  # what the last failed placement said
    bw_satisfaction: float = 1.0  # granted/demanded of its last placement
    decision_s: list[float] = field(default_factory=list)
    admitted: bool | None = None  # queue-policy scratch (EDF's admission verdict)
    # The job as an elastic policy granted it (`Round.commit`): its tasks' cpu and its flows'
    # rates scaled from what it asked; None: as asked.
    granted: Job | None = None
    migrations: int = 0  # runs on a placement other than the previous run's
    last_placement: dict[str, str] | None = None  # task -> node of its last run
    _nominal_iter_s: float | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def submit(self) -> float:
        return self.job.submit_time

    @property
    def workers(self) -> int:
        return len(self.job.tasks)

    @property
    def allocated_job(self) -> Job:
        """The job as it runs: as granted, else as asked."""
        return self.granted or self.job

    @property
    def cpu_share(self) -> float:
        """The cpu it runs with × what it asked (`scale_job` scales every task alike)."""
        asked = self.job.tasks[0].demand.cpu
        return self.allocated_job.tasks[0].demand.cpu / asked if asked > 0 else 1.0

    def wait(self, now: float) -> float:
        return self.waited_s + (now - self.queued_since if self.state == "queued" else 0.0)

    def service(self, now: float) -> float:
        """Attained service up to `now`."""
        return self.attained + (
            self.workers * (now - self.last_update) if self.state == "running" else 0.0
        )

    def remaining_iters(self) -> float:
        return max((self.job.iterations or 0) - self.done_iters, 0.0)

    def remaining_iters_at(self, now: float) -> float:
        """Remaining iterations at `now`: a running job's progress since its last update counted
        at the pace it runs (`done_iters` is brought up to date only on its own events)."""
        if self.state != "running" or not math.isfinite(self.iter_s):
            return self.remaining_iters()
        ran = max(now - max(self.last_update, self.ready_at), 0.0) / self.iter_s
        return max(self.remaining_iters() - ran, 0.0)

    def estimated_remaining_s(self) -> float:
        """Remaining run time as known before placement (`estimated_iteration_s`)."""
        if self._nominal_iter_s is None:
            self._nominal_iter_s = estimated_iteration_s(self.job)
        return self.remaining_iters() * self._nominal_iter_s

    def observed_remaining_s(self, now: float) -> float:
        """Remaining run time at the pace a running job gets now (contention and slow nodes
        included: its expected end); the nominal estimate for a job that is not running."""
        if self.state == "running" and self.expected_end < math.inf:
            return max(self.expected_end - now, 0.0)
        return self.estimated_remaining_s()


def estimated_iteration_s(job: Job, model: IterationModel = IterationModel()) -> float:
    """The iteration time on reference nodes (speed 1.0) with every flow at its demanded rate:
    what a queue policy can know about a job before it is placed."""
    compute = [compute_time_s(job.compute_s, 1.0, t.demand.cpu) for t in job.tasks]
    rank = {t.name: r for r, t in enumerate(job.tasks)}
    flows = [(rank[f.src], rank[f.dst], (f.bytes_per_iter, f.demand_mbps)) for f in job.flows]
    return model.iteration_s(
        compute,
        *collective_phases(job.collective, flows),
        steps=collective_steps(job.collective, len(job.tasks)),
        buckets=job.ddp_buckets,
    )


# The cpu shares (× what a job asked) the elastic policies (Optimus-like, EdgeFlow) grant.
ELASTIC_SHARES = (1.0, 1.5, 2.0, 3.0, 4.0)


def scale_job(job: Job, cpu: float = 1.0, bw: float = 1.0) -> Job:
    """An elastic share of `job`: every task's cpu × `cpu`, every flow's demanded rate × `bw`
    (memory and gpu as asked). Committed as `granted`, it is what the job runs with."""
    return replace(
        job,
        tasks=[Task(t.name, replace(t.demand, cpu=t.demand.cpu * cpu)) for t in job.tasks],
        flows=[replace(f, demand_mbps=f.demand_mbps * bw) for f in job.flows],
    )


class QueuePolicy(Protocol):
    """Optional: `reallocates = True` for policies that re-allocate running jobs (elastic shares,
    migrations) and so want a round on every event, also with an empty queue."""

    name: str
    algorithm: Algorithm  # places each job the policy starts
    period_s: float | None  # also run a round every period_s while jobs run (None: on events only)

    def schedule(self, rnd: Round) -> None: ...


class Round:
    """One scheduling round at time `now`: what a queue policy may look at and do.

    `queue` holds the waiting jobs in arrival order, `running` the running ones. Placements go
    straight into `cluster` (later choices in the round see them); the caller starts the jobs in
    `placed` and re-queues those in `preempted` afterwards. `epoch` must change whenever resources
    were released since the last round (it lets `try_place` skip retrying hopeless jobs).
    """

    def __init__(
        self,
        now: float,
        cluster: Cluster,
        algorithm: Algorithm,
        queue: Sequence[JobState],
        running: Sequence[JobState],
        epoch: int = 0,
    ):
        self.now, self.cluster, self.algorithm, self.epoch = now, cluster, algorithm, epoch
        self.queue, self.running = list(queue), list(running)
        self.placed: list[JobState] = []
        self.preempted: list[JobState] = []
        self.moved: list[JobState] = []
        self.holds: dict[JobState, tuple[Decision, float]] = {}  # owner -> (decision, until)
        self._views: dict[frozenset, tuple[Cluster, FreeSpace]] = {}  # by holds applied

    def hold(self, owner: JobState, decision: Decision, until: float = -math.inf) -> None:
        """Keep the resources of `decision` (a placement computed for `owner`) for the rest of
        this round from every other job — except jobs expected to be done by `until` (when
        `owner` is expected to start; EASY backfilling). By default nobody may use them."""
        self.holds[owner] = (decision, until)
        self._views.clear()

    def _holds_against(self, js: JobState | None) -> frozenset:
        """The owners of the holds that bind `js`."""
        done_by = self.now + js.estimated_remaining_s() if js else math.inf
        return frozenset(
            o.name for o, (_, until) in self.holds.items() if o is not js and done_by > until
        )

    def view(self, js: JobState | None = None) -> Cluster:
        """The cluster as `js` may use it: without the resources held for other jobs."""
        return self._view(js)[0]

    def free_space(self, js: JobState | None = None) -> FreeSpace:
        return self._view(js)[1]

    def _view(self, js: JobState | None) -> tuple[Cluster, FreeSpace]:
        key = self._holds_against(js)
        if key not in self._views:
            view = self.cluster
            if key:
                view = self.cluster.copy(share_graph=True)
                for owner, (d, _) in self.holds.items():
                    if owner.name not in key:
                        continue
                    for task, node in d.placement.items():
                        view.used[node] = view.used[node] + owner.job.task(task).demand
                    for f in d.flows:
                        for link in f.directed_links():
                            view.reserved[link] = view.reserved.get(link, 0.0) + f.rate_mbps
            self._views[key] = (view, FreeSpace.of(view))
        return self._views[key]

    def try_place(
        self,
        js: JobState,
        accept: Callable[[Decision], bool] | None = None,
        avoid: Callable[[Cluster], set[str]] | None = None,
    ) -> Decision | None:
        """Place `js` with the policy's algorithm and commit it; None if it does not fit now
        (or the policy does not `accept` the decision the algorithm found). With `avoid`, the
        algorithm first places it without the nodes `avoid(view)` names, then, if that fails,
        on every node.

        A job that failed is not retried until resources are released or the holds change: in
        between the cluster only fills up (Kubernetes parks unschedulable pods the same way).
        """
        key = (self.epoch, self._holds_against(js))
        if js.failed_at == key:
            return None
        view, free = self._view(js)
        js.why = free.misfit(js.job)
        if not js.why:
            start = time.perf_counter()
            targets = [view]
            spared = avoid(view) if avoid else set()
            if spared:  # first off those nodes
                targets.insert(0, view.copy(share_graph=True))
                targets[0].offline |= spared
            placed = None
            for target in targets:
                try:
                    decision = self.algorithm.place(target, js.job)
                except CannotPlace as e:
                    js.why = str(e) or "it does not fit now"
                    continue
                if accept is not None and not accept(decision):
                    js.why = "the queue policy did not accept the placement found"
                elif self.commit(js, decision):
                    placed = decision
                    break
                else:
                    js.why = "the placement found is no longer feasible"
            js.decision_s.append(time.perf_counter() - start)
            if placed is not None:
                return placed
        if key[1]:
            js.why += f" (with the resources held for {', '.join(sorted(key[1]))})"
        js.failed_at = key
        return None

    def commit(self, js: JobState, decision: Decision, granted: Job | None = None) -> bool:
        """Start `js` with `decision` if it is feasible on what `js` may use. An elastic policy
        passes `granted`, the job as it grants it (`JobState.granted`). A running job preempted
        earlier in this round is re-allocated instead (`moved`)."""
        job = granted or js.job
        if check_decision(self.view(js), job, decision):
            return False
        self.cluster.allocate(job, decision)
        js.decision, js.granted = decision, granted
        self.holds.pop(js, None)
        if js in self.preempted:
            self.preempted.remove(js)
            self.running.append(js)
            if js not in self.moved:
                self.moved.append(js)
        else:
            self.queue.remove(js)
            self.placed.append(js)
        self._views.clear()
        return True

    def regrant(self, js: JobState, granted: Job | None) -> bool:
        """Give a running job (or one placed in this round) another elastic share in place (same
        nodes, paths and rates); False (nothing changed) if it does not fit."""
        trial = self.view(js).copy(share_graph=True)
        trial.release(js.name)
        if check_decision(trial, granted or js.job, js.decision):
            return False
        if js in self.placed:  # started in this round, not running yet
            self.cluster.release(js.name)
            self.cluster.allocate(granted or js.job, js.decision)
            js.granted = granted
            self._views.clear()
            return True
        decision = js.decision
        self.preempt(js)
        return self.commit(js, decision, granted)

    def preempt(self, js: JobState) -> None:
        """Stop a running job (it keeps its progress) and put it back in the queue."""
        self.cluster.release(js.name)
        self.running.remove(js)
        self.preempted.append(js)
        self.epoch += 1
        self._views.clear()


@dataclass(frozen=True)
class FreeSpace:
    """The free resources of a cluster's online nodes, for cheap necessary fit checks."""

    nodes: tuple[Resources, ...]
    total: Resources

    @classmethod
    def of(cls, cluster: Cluster) -> FreeSpace:
        free = tuple(cluster.free(n) for n in cluster.compute_nodes(online_only=True))
        # A node that a hold over-commits (its running job's resources and those held for a
        # waiting job) has nothing free, not less than nothing for the others to make up.
        return cls(
            free,
            Resources(
                sum(max(f.cpu, 0.0) for f in free),
                sum(max(f.mem_mb, 0.0) for f in free),
                sum(max(f.gpu, 0.0) for f in free),
            ),
        )

    def may_fit(self, job: Job) -> bool:
        """Every task fits some node and the job's total fits the total: spares calling an
        algorithm that must fail."""
        return not self.misfit(job)

    def misfit(self, job: Job) -> str:
        """Why `job` cannot fit (`may_fit`), or "" when it may."""
        if not job.total_demand().fits_in(self.total):
            return f"job {job.name}: its tasks together need more than the online nodes have free"
        for t in job.tasks:
            if not any(t.demand.fits_in(f) for f in self.nodes):
                return (
                    f"job {job.name}: task {t.name} (cpu {t.demand.cpu:g}, mem "
                    f"{t.demand.mem_mb:g} MB, gpu {t.demand.gpu:g}) fits on no online node"
                )
        return ""
