"""The Master's queue scheduling: CES-Multi there may preempt nothing (workers are not
checkpointed on the testbed), not even for a starving job's reservation."""
from __future__ import annotations

from scheduler.jobs import custom_job
from scheduler.model import Cluster, Decision, Resources, Task
from master.scheduling import Scheduler
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
