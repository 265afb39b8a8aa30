"""The Master's queue scheduling: CES-Multi there may preempt nothing (workers are not
checkpointed on the testbed), not even for a starving job's reservation; policies that preempt,
resize or move running jobs are refused. The Scheduler in its own process decides as it does in
the Master's, says why it refuses, is replaced when it dies and leaves with the Master."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from master.scheduling import Scheduler, SchedulerProcess, UnknownAlgorithm
from scheduler.baselines import make_algorithm
from scheduler.jobs import custom_job, ring_job
from scheduler.model import Cluster, Decision, Resources, Task
from scheduler.multi import POLICIES, REALLOCATING, make_policy
from topologies import parse_topology


def test_the_master_never_preempts_even_for_a_starving_job():
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [{"name": "n0", "cpu": 1.0, "mem_mb": 1024}],
        "links": [{"ends": ["n0", "s"], "bw_mbps": 100.0}],
    }
    view = Cluster.from_topology(parse_topology(doc, "test"))
    runner, starving = (
        custom_job(name, [Task("w0", Resources(1.0, 100))], [], compute_s=1.0, iterations=10**6)
        for name in ("runner", "starving")
    )
    decision = Decision("runner", {"w0": "n0"}, [])
    view.allocate(runner, decision)
    sched = Scheduler("first-fit", queue="ces-multi")
    sched.submitted(starving, at=-(10**7))  # waited far past any reservation threshold
    placed, reasons = sched.round(
        view, "first-fit", [starving.name], [(runner, decision, 10**7)], now=0.0
    )
    assert placed == [] and "runner" in view.jobs and "starving" in reasons


@pytest.mark.parametrize("queue", sorted(REALLOCATING | {"las"}))
def test_the_master_refuses_policies_that_preempt_resize_or_move_running_jobs(queue):
    with pytest.raises(UnknownAlgorithm, match=f"unknown queue policy '{queue}'"):
        Scheduler("first-fit", queue=queue)


def test_the_reallocating_policies_are_the_ones_that_say_so():
    algorithm = make_algorithm("first-fit")
    assert {
        name for name in POLICIES if getattr(make_policy(name, algorithm), "reallocates", False)
    } == REALLOCATING


def _two_nodes() -> Cluster:
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [{"name": f"n{i}", "cpu": 1.0, "mem_mb": 1024} for i in range(2)],
        "links": [{"ends": [f"n{i}", "s"], "bw_mbps": 100.0} for i in range(2)],
    }
    return Cluster.from_topology(parse_topology(doc, "test"))


class _Counting:
    """An algorithm that counts its placements."""

    def __init__(self, inner):
        self.inner, self.calls = inner, 0
        self.name = inner.name

    def place(self, cluster, job):
        self.calls += 1
        return self.inner.place(cluster, job)


def test_a_job_that_did_not_fit_is_retried_only_once_room_was_released():
    view = _two_nodes()
    runner = custom_job("runner", [Task("w0", Resources(1.0, 100))], [], compute_s=1.0)
    held = Decision("runner", {"w0": "n0"}, [])
    view.allocate(runner, held)
    big = custom_job(
        "big", [Task(f"w{i}", Resources(1.0, 100)) for i in range(2)], [], compute_s=1.0
    )
    small = custom_job("small", [Task("w0", Resources(0.5, 100))], [], compute_s=1.0)
    sched = Scheduler("first-fit", queue="fifo-backfill")
    counting = _Counting(sched.policy("first-fit").algorithm)
    sched.policy("first-fit").algorithm = counting
    for job in (big, small):
        sched.submitted(job, at=0.0)

    placed, reasons = sched.round(
        view.copy(), "first-fit", [big.name, small.name], [(runner, held, 10.0)], now=0.0
    )
    assert [p.job for p in placed] == ["small"]  # backfilled beside the runner
    assert "fits on no online node" in reasons["big"] or "more than" in reasons["big"]
    view.allocate(small, placed[0].decision)
    calls = counting.calls
    # The cluster only filled up since: the waiting job is not placed again, and says why still.
    placed, again = sched.round(
        view.copy(),
        "first-fit",
        [big.name],
        [(runner, held, 10.0), (small, placed[0].decision, 10.0)],
        now=1.0,
    )
    assert placed == [] and counting.calls == calls and again["big"] == reasons["big"]
    # Room released (both running jobs end): it is placed.
    view.release("runner")
    view.release("small")
    placed, _ = sched.round(view.copy(), "first-fit", [big.name], [], now=2.0)
    assert [p.job for p in placed] == ["big"] and counting.calls == calls + 1


def test_a_job_that_failed_behind_one_started_in_its_round_starts_when_that_one_ends():
    view = _two_nodes()
    first, second = (
        custom_job(name, [Task(f"w{i}", Resources(1.0, 100)) for i in range(2)], [], compute_s=1.0)
        for name in ("first", "second")
    )
    sched = Scheduler("first-fit", queue="fifo-backfill")
    for job in (first, second):
        sched.submitted(job, at=0.0)
    placed, _ = sched.round(view.copy(), "first-fit", [first.name, second.name], [], now=0.0)
    assert [p.job for p in placed] == ["first"]
    # `first` ran and ended: the cluster is as free as at the start of that round, no freer.
    placed, _ = sched.round(view.copy(), "first-fit", [second.name], [], now=1.0)
    assert [p.job for p in placed] == ["second"]


def _jobs(n: int) -> list:
    return [ring_job(f"j{k}", 2, Resources(0.5, 100), 1e6, 10.0, compute_s=1.0) for k in range(n)]


def _rounds(sched, jobs: list) -> list[list[tuple[str, dict]]]:
    """Submit `jobs` one by one, each followed by a round over what waits; each round's
    (job, placement) list. The first job finishes after the second round."""
    view, out, waiting = _two_nodes(), [], []
    for k, job in enumerate(jobs):
        sched.submitted(job, at=float(k))
        waiting.append(job.name)
        if k == 2:
            sched.finished(jobs[0].name)
            view.release(jobs[0].name)
        placed, _ = sched.round(view.copy(), "random", waiting, [], now=float(k))
        for p in placed:
            view.allocate(next(j for j in jobs if j.name == p.job), p.decision)
            waiting.remove(p.job)
        out.append([(p.job, p.decision.placement) for p in placed])
    return out


def test_the_scheduler_in_its_own_process_decides_as_in_the_masters():
    child = SchedulerProcess("random", seed=3)
    try:
        assert _rounds(child, _jobs(5)) == _rounds(Scheduler("random", seed=3), _jobs(5))
    finally:
        child.close()
    assert child._proc.poll() is not None


def test_the_scheduler_process_refuses_as_the_scheduler_does_and_changes_nothing():
    with pytest.raises(UnknownAlgorithm, match="unknown scheduler 'nope'") as e:
        SchedulerProcess("nope")
    assert e.value.field == "algorithm"
    child = SchedulerProcess("first-fit")
    try:
        with pytest.raises(UnknownAlgorithm) as e:
            child.configure("first-fit", 0, "las")
        assert e.value.field == "queue" and child.queue == "fifo-backfill"
        with pytest.raises(UnknownAlgorithm, match="nope"):
            child.resolve("nope")
        assert child.resolve("network-aware") == "network-aware"
        # A round over a job never submitted: the child's exception, with where it was raised.
        with pytest.raises(KeyError) as e:
            child.round(_two_nodes(), "first-fit", ["ghost"], [], now=0.0)
        assert any("Traceback" in note for note in e.value.__notes__)
        assert _rounds(child, _jobs(2))[0]  # and it still places
    finally:
        child.close()


def test_a_scheduler_process_that_died_is_replaced_and_knows_the_waiting_jobs(caplog):
    child = SchedulerProcess("first-fit")
    try:
        jobs = _jobs(2)
        for job in jobs:
            child.submitted(job, at=0.0)
        child.finished(jobs[0].name)
        child.resolve("first-fit")  # the notes are delivered
        os.kill(child._proc.pid, signal.SIGKILL)
        child._proc.wait(timeout=10)
        with caplog.at_level(logging.ERROR, logger="master.scheduling"):
            placed, _ = child.round(_two_nodes(), "first-fit", [jobs[1].name], [], now=1.0)
        assert [p.job for p in placed] == [jobs[1].name]
        assert "scheduler's process is gone" in caplog.text and child._proc.poll() is None
        with pytest.raises(KeyError):  # the finished job was not told again
            child.round(_two_nodes(), "first-fit", [jobs[0].name], [], now=2.0)
    finally:
        child.close()


def test_the_scheduler_process_leaves_when_its_master_is_killed():
    script = (
        "from master.scheduling import SchedulerProcess\n"
        "s = SchedulerProcess('first-fit')\n"
        "print(s._proc.pid, flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    root = Path(__file__).resolve().parents[2]
    master = subprocess.Popen(
        [sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(master.stdout.readline())
        assert _running(pid)
    finally:
        master.kill()
        master.wait()
    deadline = time.monotonic() + 10
    while _running(pid):
        assert time.monotonic() < deadline, f"the scheduler's process {pid} outlived its Master"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (one nobody reaped has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
