"""The Manager: the job table and every job's life cycle.

    queued --schedule--> scheduled --workers up--> running --all exit 0--> finished
       ^                     |                        |
       +---- retry (attempts left, retryable) --------+--> failed (reason)
    any non-terminal state --cancel--> cancelled

One *attempt* is one placement of the job: a decision, its workers and its flows. A worker that
dies or a node that stops heartbeating ends the attempt; the job is queued again while attempts
remain and the failure is retryable (bad parameters, exit code 2, are not), else it fails with the
reason. Pure bookkeeping: the Master does the talking to agents and the SDN app.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from scheduler.model import Decision, Job

log = logging.getLogger(__name__)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")  # fullmatch; a container-name fragment
EXIT_BAD_PARAMETERS = 2  # workloads.train's exit code for a job that can never run


class Phase(StrEnum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = (Phase.FINISHED, Phase.FAILED, Phase.CANCELLED)
ACTIVE = (Phase.SCHEDULED, Phase.RUNNING)


class ManagerError(ValueError):
    """A request the Manager refuses (the message says why); maps to HTTP 4xx."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Attempt:
    number: int  # 1, 2, ...
    decision: Decision
    workers: dict[str, str]  # task -> worker name
    master_port: int  # rank 0's rendezvous port
    started_at: float
    ended_at: float | None = None
    outcome: str = ""  # "" while it runs, "finished", or why it ended
    info: dict = field(default_factory=dict)  # figures known at launch (prediction, ...)


@dataclass
class JobRecord:
    job: Job
    algorithm: str
    submitted_at: float
    state: Phase = Phase.QUEUED
    reason: str = ""  # why it waits / failed
    attempts: list[Attempt] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    records: dict[str, list[dict]] = field(default_factory=dict)  # worker -> metric lines
    finished_at: float | None = None
    document: dict | None = None  # the job mapping as submitted (what `master.store` keeps)
    source: str = ""  # where it came from (a file name, for messages)
    changed: bool = True  # since `master.store` last wrote it

    @property
    def name(self) -> str:
        return self.job.name

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts and self.state in ACTIVE else None

    def log(self, now: float, text: str) -> None:
        """Every transition is logged: the record has changed."""
        self.events.append((now, text))
        self.changed = True
        log.info("job %s: %s", self.name, text)

    def task_records(self, task: str, attempt: Attempt | None = None) -> list[dict]:
        attempt = attempt or (self.attempts[-1] if self.attempts else None)
        if attempt is None or task not in attempt.workers:
            return []
        return self.records.get(attempt.workers[task], [])

    def last_of(self, kind: str, task: str) -> dict | None:
        return next((r for r in reversed(self.task_records(task)) if r.get("type") == kind), None)

    def progress(self) -> dict:
        """What the live display shows: rank 0's latest evaluation and iteration."""
        first = self.job.tasks[0].name
        ev, it = self.last_of("eval", first), self.last_of("iter", first)
        return {
            "accuracy": ev["accuracy"] if ev else None,
            "elapsed_s": ev["elapsed_s"] if ev else None,
            "iteration": it["iter"] if it else None,
        }


class Manager:
    def __init__(self, max_attempts: int = 2, clock: Callable[[], float] = time.time):
        self.max_attempts = max_attempts
        self.clock = clock
        self.jobs: dict[str, JobRecord] = {}
        # The current attempts' workers, by worker and by node: each heartbeat asks, so built
        # once per change of the active set (`_enter`) instead of a scan of every job per call.
        self._owners: dict[str, tuple[JobRecord, str]] | None = None
        self._on_node: dict[str, list[str]] = {}

    # --- views ---------------------------------------------------------------------------------
    def get(self, name: str) -> JobRecord:
        if name not in self.jobs:
            raise ManagerError(404, f"no job named '{name}'")
        return self.jobs[name]

    def queued(self) -> list[JobRecord]:
        return sorted(
            (r for r in self.jobs.values() if r.state == Phase.QUEUED), key=lambda r: r.submitted_at
        )

    def active(self) -> list[JobRecord]:
        return [r for r in self.jobs.values() if r.state in ACTIVE]

    def on_node(self, node: str) -> list[JobRecord]:
        """Active jobs with a task on `node`."""
        return [r for r in self.active() if node in r.current.decision.placement.values()]

    def worker_owner(self, worker: str) -> tuple[JobRecord, str] | None:
        """(job, task) of a worker of a current attempt."""
        return self._index()[0].get(worker)

    def expected_workers(self, node: str) -> list[str]:
        return list(self._index()[1].get(node, ()))

    def _index(self) -> tuple[dict[str, tuple[JobRecord, str]], dict[str, list[str]]]:
        if self._owners is None:
            self._owners, self._on_node = {}, {}
            for r in self.active():
                for task, name in r.current.workers.items():
                    self._owners[name] = (r, task)
                    self._on_node.setdefault(r.current.decision.placement[task], []).append(name)
        return self._owners, self._on_node

    def _enter(self, rec: JobRecord, state: Phase) -> None:
        """Every change of a job's state goes through here."""
        rec.state = state
        self._owners = None

    def adopt(self, rec: JobRecord) -> None:
        """A job record from elsewhere (a restarted Master's store)."""
        self.jobs[rec.name] = rec
        self._owners = None

    # --- transitions ---------------------------------------------------------------------------
    def submit(
        self, job: Job, algorithm: str, document: dict | None = None, source: str = ""
    ) -> JobRecord:
        if not NAME_RE.fullmatch(job.name):
            raise ManagerError(
                400,
                f"job name '{job.name}': expected letters, digits, '_', '.', "
                "'-' (at most 40, starting with a letter or digit)",
            )
        for t in job.tasks:
            if not NAME_RE.fullmatch(t.name):
                raise ManagerError(
                    400,
                    f"job '{job.name}': task name '{t.name}': expected "
                    "letters, digits, '_', '.', '-'",
                )
        old = self.jobs.get(job.name)
        if old is not None and old.state not in TERMINAL:
            raise ManagerError(409, f"job '{job.name}' already exists and is {old.state.value}")
        now = self.clock()
        rec = JobRecord(job, algorithm, now, document=document, source=source)
        rec.log(now, f"submitted (scheduler {algorithm})")
        self.adopt(rec)
        return rec

    def wait(self, rec: JobRecord, reason: str) -> None:
        if rec.reason != reason:
            rec.reason = reason
            rec.log(self.clock(), f"waiting: {reason}")

    def start_attempt(
        self, rec: JobRecord, decision: Decision, workers: dict[str, str], master_port: int
    ) -> Attempt:
        now = self.clock()
        attempt = Attempt(len(rec.attempts) + 1, decision, workers, master_port, now)
        rec.attempts.append(attempt)
        self._enter(rec, Phase.SCHEDULED)
        rec.reason = ""
        where = ", ".join(f"{t}@{n}" for t, n in decision.placement.items())
        rec.log(now, f"attempt {attempt.number} scheduled: {where}")
        return attempt

    def mark_running(self, rec: JobRecord) -> None:
        if rec.state == Phase.SCHEDULED:
            self._enter(rec, Phase.RUNNING)
            rec.log(self.clock(), "running")

    def finish(self, rec: JobRecord) -> None:
        now = self.clock()
        rec.current.ended_at, rec.current.outcome = now, "finished"
        self._enter(rec, Phase.FINISHED)
        rec.finished_at, rec.reason = now, ""
        rec.log(now, "finished")

    def end_attempt(self, rec: JobRecord, reason: str, retryable: bool = True) -> Phase:
        """The current attempt failed: queue the job again or fail it. Returns the new state."""
        now = self.clock()
        attempt = rec.current
        attempt.ended_at, attempt.outcome = now, reason
        if retryable and len(rec.attempts) < self.max_attempts:
            self._enter(rec, Phase.QUEUED)
            rec.reason = f"rescheduling: {reason}"
            rec.log(now, f"attempt {attempt.number} ended ({reason}); rescheduling")
        else:
            self._enter(rec, Phase.FAILED)
            rec.finished_at = now
            left = "" if retryable else " (not retryable)"
            rec.reason = (
                f"{reason}{left}"
                if len(rec.attempts) == 1 or not retryable
                else f"{reason} (after {len(rec.attempts)} attempts)"
            )
            rec.log(now, f"failed: {rec.reason}")
        return rec.state

    def reject(self, rec: JobRecord, reason: str) -> None:
        """A queued job that can never be scheduled (its algorithm fails): failed, with why."""
        now = self.clock()
        self._enter(rec, Phase.FAILED)
        rec.finished_at, rec.reason = now, reason
        rec.log(now, f"failed: {reason}")

    def cancel(self, rec: JobRecord) -> None:
        if rec.state in TERMINAL:
            raise ManagerError(409, f"job '{rec.name}' is already {rec.state.value}")
        now = self.clock()
        if rec.current:
            rec.current.ended_at, rec.current.outcome = now, "cancelled"
        self._enter(rec, Phase.CANCELLED)
        rec.finished_at, rec.reason = now, "cancelled by the user"
        rec.log(now, "cancelled")
