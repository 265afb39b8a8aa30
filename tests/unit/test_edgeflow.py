"""EdgeFlow (seed 001): re-allocation at every event, migrations when an edge node turns busy,
the online correction of κ and λ; ElasticFlow-like stays off the edge; the elastic Optimus-like
and Min baselines; the simulator's new figures."""

from __future__ import annotations

import math

import pytest

from scheduler.baselines import make_algorithm
from scheduler.edgeflow import EdgeFlow, EdgeFlowConfig
from scheduler.jobs import custom_job
from scheduler.model import Cluster, Decision, Job, Resources, Task
from scheduler.multi import Min, Optimus
from scheduler.rounds import JobState, Round, scale_job
from scheduler.simulator import NodeJoin, NodeLeave, Simulator
from topologies import parse_topology


def cluster_of(cpus: list[float]) -> Cluster:
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [{"name": f"n{i}", "cpu": c, "mem_mb": 1024} for i, c in enumerate(cpus)],
        "links": [{"ends": [f"n{i}", "s"], "bw_mbps": 100} for i in range(len(cpus))],
    }
    return Cluster.from_topology(parse_topology(doc, "test"))


def job(
    name: str, cpu: float, iterations: int, submit: float = 0.0, deadline: float | None = None
) -> Job:
    """One worker without flows; an iteration takes 1 s at the asked cpu on a speed-1 node."""
    return custom_job(
        name,
        [Task("w0", Resources(cpu, 100))],
        [],
        compute_s=cpu,
        iterations=iterations,
        submit_time=submit,
        deadline=deadline,
    )


def edgeflow(edge: bool = True) -> EdgeFlow:
    return EdgeFlow(make_algorithm("first-fit"), EdgeFlowConfig(edge=edge))


def by_name(result):
    return {js.name: js for js in result.jobs}


def test_running_jobs_get_their_minimum_satisfactory_share_again_at_every_event():
    # a: 100 iterations, due 65 s after submit. At t=0: 10 s restart + 100 / s ≤ 65 → share 2
    # (0.5 s per iteration). At b's arrival (t=20, 40 done): 60 left at share 1.5 take 40 s,
    # 20 + 40 ≤ 65, share 1 would end at 80 → a shrinks to 1.5 in place and ends at t=60.
    result = Simulator(cluster_of([1.0]), edgeflow()).run(
        [job("a", 0.25, 100, deadline=65.0), job("b", 0.25, 10, submit=20.0)]
    )
    a = by_name(result)["a"]
    assert a.granted.tasks[0].demand.cpu == pytest.approx(0.375)
    assert a.finish == pytest.approx(60.0)
    assert [(t, name) for t, name, _ in result.starts] == [(0.0, "a"), (20.0, "a"), (20.0, "b")]
    assert a.migrations == 0 and a.preemptions == 0  # same node: no migration, no restart
    summary = result.summary()
    assert summary["deadline_satisfaction"] == 1.0 and summary["migrations_per_job"] == 0.0
    assert summary["decision_ms"] > 0  # its placements are timed like every policy's


def test_a_job_offloaded_to_an_idle_edge_node_migrates_when_the_node_turns_busy():
    # n1 is busy at t=0 (so EdgeFlow knows it as an edge node) and idle from t=5 to t=50.
    events = [NodeLeave(0.0, "n1"), NodeJoin(5.0, "n1"), NodeLeave(50.0, "n1")]
    jobs = [job("a", 1.0, 1000, submit=1.0), job("b", 1.0, 100, submit=6.0)]
    result = Simulator(cluster_of([1.0, 1.0]), edgeflow()).run(jobs, events)
    starts = [(t, name, dict(p)["w0"]) for t, name, p in result.starts]
    assert starts == [(1.0, "a", "n0"), (6.0, "b", "n1"), (1001.0, "b", "n0")]
    b = by_name(result)["b"]
    assert b.migrations == 1 and result.summary()["migrations_per_job"] == 0.5
    # 44 iterations on n1, then the restart (10 s) and 56 more on n0
    assert b.finish == pytest.approx(1001.0 + 10.0 + 56.0)


def test_elasticflow_like_admission_stays_on_the_always_on_nodes():
    events = [NodeLeave(0.0, "n1"), NodeJoin(5.0, "n1")]
    jobs = [job("a", 1.0, 1000, submit=1.0), job("b", 1.0, 100, submit=6.0)]
    result = Simulator(cluster_of([1.0, 1.0]), edgeflow(edge=False)).run(jobs, events)
    assert [dict(p)["w0"] for _, _, p in result.starts] == ["n0", "n0"]


def test_kappa_and_lambda_are_corrected_from_the_pace_the_jobs_report():
    policy = edgeflow()
    policy.left_at["n1"] = 0.0  # n1 is an edge node
    cluster = cluster_of([1.0, 1.0])
    running = []
    for name, node, pace in (("cloud", "n0", 2.0), ("edge", "n1", 4.0)):
        js = JobState(
            job(name, 0.25, 100),
            len(running),
            "running",
            iter_s=pace,
            decision=Decision(name, {"w0": node}, []),
        )
        running.append(js)
    policy.observe(Round(10.0, cluster, policy.algorithm, [], running))
    # cloud: nominal 1 s / measured 2 s → κ = 1 + 0.2 (0.5 - 1) = 0.9
    assert policy.kappa == pytest.approx(0.9)
    # edge: (1 / 4) / κ = 0.2778 → λ = 0.5 + 0.2 (0.2778 - 0.5)
    assert policy.lam == pytest.approx(0.5 + 0.2 * (0.25 / 0.9 - 0.5))
    # the estimates follow: an iteration on an edge node takes 1 / (κ λ)
    assert policy.iteration_s(job("x", 0.25, 1), edge=True) == pytest.approx(1 / (0.9 * policy.lam))


def test_a_deadline_no_share_can_meet_is_demoted_to_best_effort():
    result = Simulator(cluster_of([1.0]), edgeflow()).run([job("late", 0.25, 1000, deadline=100.0)])
    late = by_name(result)["late"]
    assert late.granted is None and late.finish == pytest.approx(1000.0)
    assert result.summary()["deadline_satisfaction"] == 0.0


def test_optimus_gives_spare_cpu_to_the_jobs_by_marginal_gain_and_min_the_asked_share():
    cluster = cluster_of([2.0])
    q = [JobState(job(n, 0.5, 100), i, "queued") for i, n in enumerate("ab")]
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), q, [])
    Optimus(make_algorithm("first-fit")).schedule(rnd)
    assert [js.granted.tasks[0].demand.cpu for js in rnd.placed] == [1.0, 1.0]
    assert cluster.free("n0").cpu == pytest.approx(0.0)
    result = Simulator(cluster_of([2.0]), Min(make_algorithm("first-fit"))).run(
        [job("a", 0.5, 100), job("b", 0.5, 100)]
    )
    assert all(js.granted is None and js.finish == pytest.approx(100.0) for js in result.jobs)


def test_a_regrant_that_does_not_fit_changes_nothing():
    cluster = cluster_of([1.0])
    js = JobState(job("a", 0.5, 10), 0, "queued")
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [js], [])
    assert rnd.try_place(js)
    assert not rnd.regrant(js, scale_job(js.job, cpu=3.0))
    assert js.granted is None and cluster.free("n0").cpu == pytest.approx(0.5)
    assert rnd.regrant(js, scale_job(js.job, cpu=2.0)) and cluster.free("n0").cpu == 0.0
    assert math.isclose(js.allocated_job.tasks[0].demand.cpu, 1.0)
