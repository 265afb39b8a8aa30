"""The Master's queue scheduling: CES-Multi there may preempt nothing (workers are not
checkpointed on the testbed), not even for a starving job's reservation; policies that preempt,
resize or move running jobs are refused."""
from __future__ import annotations

import pytest

from scheduler.baselines import make_algorithm
from scheduler.jobs import custom_job
from scheduler.model import Cluster, Decision, Resources, Task
from scheduler.multi import POLICIES, REALLOCATING, make_policy
from master.scheduling import Scheduler, UnknownAlgorithm
from topologies import parse_topology


def test_the_master_never_preempts_even_for_a_starving_job():
    doc = {"switches": [{"name": "s"}], "nodes": [{"name": "n0", "cpu": 1.0, "mem_mb": 1024}],
           "links": [{"ends": ["n0", "s"], "bw_mbps": 100.0}]}
    view = Cluster.from_topology(parse_topology(doc, "test"))
    runner, starving = (custom_job(name, [Task("w0", Resources(1.0, 100))], [], compute_s=1.0,
                                   iterations=10 ** 6) for name in ("runner", "starving"))
    decision = Decision("runner", {"w0": "n0"}, [])
    view.allocate(runner, decision)
    sched = Scheduler("first-fit", queue="ces-multi")
    sched.submitted(starving, at=-10 ** 7)  # waited far past any reservation threshold
    placed, reasons = sched.round(view, "first-fit", [starving], [(runner, decision, 10 ** 7)],
                                  now=0.0)
    assert placed == [] and "runner" in view.jobs and "starving" in reasons


@pytest.mark.parametrize("queue", sorted(REALLOCATING | {"las"}))
def test_the_master_refuses_policies_that_preempt_resize_or_move_running_jobs(queue):
    with pytest.raises(UnknownAlgorithm, match=f"unknown queue policy '{queue}'"):
        Scheduler("first-fit", queue=queue)


def test_the_reallocating_policies_are_the_ones_that_say_so():
    algorithm = make_algorithm("first-fit")
    assert {name for name in POLICIES
            if getattr(make_policy(name, algorithm), "reallocates", False)} == REALLOCATING


def _two_nodes() -> Cluster:
    doc = {"switches": [{"name": "s"}],
           "nodes": [{"name": f"n{i}", "cpu": 1.0, "mem_mb": 1024} for i in range(2)],
           "links": [{"ends": [f"n{i}", "s"], "bw_mbps": 100.0} for i in range(2)]}
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
    big = custom_job("big", [Task(f"w{i}", Resources(1.0, 100)) for i in range(2)], [],
                     compute_s=1.0)
    small = custom_job("small", [Task("w0", Resources(0.5, 100))], [], compute_s=1.0)
    sched = Scheduler("first-fit", queue="fifo-backfill")
    counting = _Counting(sched.policy("first-fit").algorithm)
    sched.policy("first-fit").algorithm = counting
    for job in (big, small):
        sched.submitted(job, at=0.0)

    placed, reasons = sched.round(view.copy(), "first-fit", [big, small],
                                  [(runner, held, 10.0)], now=0.0)
    assert [p.job for p in placed] == ["small"]  # backfilled beside the runner
    assert "fits on no online node" in reasons["big"] or "more than" in reasons["big"]
    view.allocate(small, placed[0].decision)
    calls = counting.calls
    # The cluster only filled up since: the waiting job is not placed again, and says why still.
    placed, again = sched.round(view.copy(), "first-fit", [big],
                                [(runner, held, 10.0), (small, placed[0].decision, 10.0)],
                                now=1.0)
    assert placed == [] and counting.calls == calls and again["big"] == reasons["big"]
    # Room released (both running jobs end): it is placed.
    view.release("runner")
    view.release("small")
    placed, _ = sched.round(view.copy(), "first-fit", [big], [], now=2.0)
    assert [p.job for p in placed] == ["big"] and counting.calls == calls + 1


def test_a_job_that_failed_behind_one_started_in_its_round_starts_when_that_one_ends():
    view = _two_nodes()
    first, second = (custom_job(name, [Task(f"w{i}", Resources(1.0, 100)) for i in range(2)],
                                [], compute_s=1.0) for name in ("first", "second"))
    sched = Scheduler("first-fit", queue="fifo-backfill")
    for job in (first, second):
        sched.submitted(job, at=0.0)
    placed, _ = sched.round(view.copy(), "first-fit", [first, second], [], now=0.0)
    assert [p.job for p in placed] == ["first"]
    # `first` ran and ended: the cluster is as free as at the start of that round, no freer.
    placed, _ = sched.round(view.copy(), "first-fit", [second], [], now=1.0)
    assert [p.job for p in placed] == ["second"]
