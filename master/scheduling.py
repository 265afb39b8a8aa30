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
The Master runs its Scheduler in a process of its own (`SchedulerProcess`), as kube-scheduler
runs apart from the API server: a round's algorithm is CPU work, and in the Master's process it
would hold the interpreter lock that the threads answering the agents' heartbeats wait for.
Preempting policies (`las`) are refused: the testbed does not checkpoint jobs; so are the ones
that re-allocate running jobs (`multi.REALLOCATING`: elastic shares, migrations).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path

from scheduler import compose
from scheduler.baselines import algorithm_names
from scheduler.model import EPS, Cluster, Decision, Job
from scheduler.multi import POLICIES, REALLOCATING, MultiConfig, make_policy
from scheduler.rounds import JobState, Round

# The testbed does not checkpoint workers, so nothing on it may be preempted: no LAS, and
# CES-Multi without its preemption (its reservations are held until they drain instead). Nor
# does it resize or move a running worker: no policy that re-allocates running jobs.
QUEUES = tuple(name for name in POLICIES if name != "las" and name not in REALLOCATING)
NO_PREEMPTION = replace(MultiConfig(), preempt_ratio=None, reserve_preempts=False)

log = logging.getLogger(__name__)


class UnknownAlgorithm(ValueError):
    """A scheduler or queue name that is not known, or whose algorithm cannot be built;
    `field`: the request field that named it."""

    def __init__(self, message: str, field: str = "algorithm"):
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # the field crosses from the scheduler's process too
        return UnknownAlgorithm, (str(self), self.field)


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
            raise UnknownAlgorithm(
                f"unknown scheduler '{name}' (known: {', '.join(known)}; "
                f"optionally /{'|/'.join(compose.NETWORKS)})"
            )
        return name

    def configure(self, default: str, seed: int, queue: str = "fifo-backfill") -> None:
        """A new default algorithm, seed and queue policy (policies and their algorithms are
        re-created: seeded at construction). Fails, changing nothing, when the algorithm cannot
        be built (e.g. a missing checkpoint)."""
        if queue not in QUEUES:
            raise UnknownAlgorithm(
                f"unknown queue policy '{queue}' (known: {', '.join(QUEUES)})", "queue"
            )
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

    def round(
        self,
        view: Cluster,
        algorithm: str,
        queued: list[str],
        running: list[tuple[Job, Decision, float]],
        now: float,
    ) -> tuple[list[Placed], dict[str, str]]:
        """One round of the queue policy over `view` (a copy it may fill) for the `queued` jobs
        (names of jobs `submitted`). Returns the jobs to start with their decisions, in the
        policy's order, and why each other queued job waits. `running` holds (job, decision,
        expected end) of the jobs the Master runs."""
        policy = self.policy(algorithm)
        queue = []
        for name in queued:
            js = self.states[name]
            js.state, js.decision = "queued", None
            queue.append(js)
        active = [
            JobState(job, -1, state="running", decision=d, expected_end=end)
            for job, d, end in running
        ]
        rnd = Round(now, view, policy.algorithm, queue, active, epoch=self._next_epoch(view))
        policy.schedule(rnd)
        self._epoch, self._room = max(self._epoch, rnd.epoch), _room(rnd.cluster)
        placed = []
        for js in rnd.placed:
            js.decision.decision_s = js.decision_s[-1] if js.decision_s else 0.0
            placed.append(Placed(js.name, js.decision))
        reasons = {
            js.name: js.why
            if js.failed_at and js.failed_at[0] == rnd.epoch
            else "the queue policy holds it back (ordering or a reservation for another job)"
            for js in rnd.queue
        }
        return placed, reasons

    def _next_epoch(self, view: Cluster) -> int:
        """The release epoch of a round on `view` (`Round.try_place` does not retry a job that
        failed in the same epoch): a new one when some node or link has more room free than
        the last round left (its placements made) — only then can a job that did not fit fit
        now. A burst of submissions thus costs each queued job one placement, not one per
        round."""
        room, last = _room(view), self._room
        if (
            last is None
            or last.keys() != room.keys()
            or any(x > y + EPS for k, free in room.items() for x, y in zip(free, last[k]))
        ):
            self._epoch += 1
        return self._epoch

    def finished(self, name: str) -> None:
        self.states.pop(name, None)


class SchedulerProcess:
    """A `Scheduler` in a child process, with the Master's side of its interface: `configure`,
    `resolve` and `round` are calls answered by the child (its policies, reservations and job
    states live there); `submitted` and `finished` only note the change, sent ahead of the next
    call — the API's threads make them under the Master's lock and must not wait for a round.
    The child leaves when the Master closes it or dies (its end of the socket closes). A child
    that died is replaced at the next call, told the jobs it must know again; what its policies
    remembered (reservations, a random state) is lost, and the log says so."""

    def __init__(self, default: str, seed: int = 0, queue: str = "fifo-backfill"):
        self._call_lock = threading.Lock()  # one call on the socket at a time
        self._notes_lock = threading.Lock()
        self._notes: list[tuple] = []  # ("submitted", job, at) / ("finished", name), in order
        self._live: dict[str, tuple[Job, float]] = {}  # submitted, not finished, in order
        self._start()
        try:
            self.configure(default, seed, queue)
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        # A fresh interpreter, not a fork of the Master's threads and sockets (nor multiprocessing's
        # spawn, which would import the Master's main module — run.py's testbed — again there).
        ours, theirs = socket.socketpair()
        path = [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from master.scheduling import serve; serve(int(sys.argv[1]))",
                str(theirs.fileno()),
            ],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env=env,
        )
        theirs.close()
        self._conn = Connection(ours.detach())

    def _exchange(self, notes: list[tuple], method: str, args: tuple):
        self._conn.send((notes, method, args))
        ok, value = self._conn.recv()
        if not ok:
            raise value
        return value

    def _call(self, method: str, *args):
        with self._call_lock:
            with self._notes_lock:
                notes, self._notes = self._notes, []
            try:
                return self._exchange(notes, method, args)
            except (EOFError, OSError) as e:
                if not hasattr(self, "default"):  # never configured: nothing to restart
                    raise RuntimeError(f"the scheduler's process is gone ({e!r})") from None
                log.error(
                    "the scheduler's process is gone (%r): starting another; its "
                    "policies' reservations and random state are lost",
                    e,
                )
            self._stop_child()
            self._start()
            with self._notes_lock:  # the live jobs stand for every note so far
                self._notes = []
                replay = [("submitted", job, at) for job, at in self._live.values()]
            try:
                self._exchange([], "configure", (self.default, self.seed, self.queue))
                return self._exchange(replay, method, args)
            except (EOFError, OSError) as e:
                raise RuntimeError(f"the scheduler's process is gone again ({e!r})") from None

    def configure(self, default: str, seed: int, queue: str = "fifo-backfill") -> None:
        self._call("configure", default, seed, queue)
        self.default, self.seed, self.queue = default, seed, queue

    def resolve(self, name: str | None) -> str:
        return self._call("resolve", name) if name else self.default

    def submitted(self, job: Job, at: float) -> None:
        with self._notes_lock:
            self._notes.append(("submitted", job, at))
            self._live[job.name] = (job, at)

    def finished(self, name: str) -> None:
        with self._notes_lock:
            self._notes.append(("finished", name))
            self._live.pop(name, None)

    def round(
        self,
        view: Cluster,
        algorithm: str,
        queued: list[str],
        running: list[tuple[Job, Decision, float]],
        now: float,
    ) -> tuple[list[Placed], dict[str, str]]:
        return self._call("round", view, algorithm, queued, running, now)

    def close(self) -> None:
        with self._call_lock:
            self._stop_child()

    def _stop_child(self) -> None:
        self._conn.close()  # the child sees the end of its socket and returns
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def serve(fd: int) -> None:
    """The scheduler's process (`SchedulerProcess`) on socket `fd`: apply the notes, answer the
    call, until the socket closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the Master's to handle
    conn = Connection(fd)
    sched: Scheduler | None = None
    while True:
        try:
            notes, method, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            for note in notes:
                getattr(sched, note[0])(*note[1:])
            if sched is None:  # the first call configures
                sched = Scheduler(*args)
                value = None
            else:
                value = getattr(sched, method)(*args)
            reply = (True, value)
        except Exception as e:  # raised on the Master's side, with where it was raised here
            e.add_note(traceback.format_exc())
            reply = (False, e)
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return
        except Exception:  # an exception that does not pickle: its type and message
            conn.send((False, RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}")))


def _room(view: Cluster) -> dict:
    """What `view` has free: by node (cpu, memory, gpu) and by directed link (Mbit/s)."""
    room = {n: view.free(n).as_tuple() for n in view.compute_nodes()}
    room |= {
        (u, v): (view.residual(u, v),) for a, b in view.graph.edges for u, v in ((a, b), (b, a))
    }
    return room


def expected_end(started_at: float, job: Job, predicted_iteration_s: float) -> float:
    """When a running job should end, as far as the Master can know before it does."""
    if job.iterations is None or not math.isfinite(predicted_iteration_s):
        return math.inf
    return started_at + job.iterations * predicted_iteration_s
