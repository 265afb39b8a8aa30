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
