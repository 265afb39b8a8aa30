"""Metrics against values computed by hand (topology of test_sched_paths: h1,h3 on s1, h2 on s2,
short path h1-s1-s2-h2 with 4 ms one way)."""

from __future__ import annotations

import math

import pytest
from test_sched_paths import LONG, SHORT, diamond, reserve

from scheduler.metrics import (
    bandwidth_satisfaction,
    cluster_metrics,
    decision_metrics,
    deployed_count,
    fragmentation,
    job_completion_s,
    load_balance,
    load_variance,
    network_cost,
    node_utilisation,
    packable,
    predicted_iteration_s,
    spare_iteration_s,
)
from scheduler.model import Cluster, Decision, FlowAssignment, Job, LogicalFlow, Resources, Task
from scheduler.perfmodel import IterationModel
from topologies import parse_topology

BACK = tuple(reversed(SHORT))


def ring2(speed_h2: float = 2.0) -> tuple[Cluster, Job, Decision]:
    c = diamond()
    c.graph.nodes["h2"]["speed"] = speed_h2
    job = Job(
        "r",
        [Task("w0", Resources(0.5, 100)), Task("w1", Resources(0.5, 100))],
        [LogicalFlow("w0", "w1", 100, 1e6), LogicalFlow("w1", "w0", 100, 1e6)],
        collective="ring",
        model_bytes=1e6,
        compute_s=0.1,
        iterations=1000,
    )
    dec = Decision(
        "r",
        {"w0": "h1", "w1": "h2"},
        [FlowAssignment("w0", "w1", SHORT, 50), FlowAssignment("w1", "w0", BACK, 100)],
        decision_s=0.002,
    )
    return c, job, dec


def test_predicted_iteration_time_by_hand():
    c, job, dec = ring2()
    # compute: 0.1 / (1·0.5) = 0.2 on h1, 0.1 / (2·0.5) = 0.1 on h2 → 0.2
    # transfer: 8 Mbit at 50 Mbit/s / 0.92 efficiency; 2(k-1) = 2 steps of (0.5 ms + 8 ms rtt)
    expected = 0.2 + 8 / 50 / 0.92 + 2 * (0.0005 + 0.008)
    assert predicted_iteration_s(c, job, dec) == pytest.approx(expected)
    assert job_completion_s(c, job, dec) == pytest.approx(1000 * expected)
    assert job_completion_s(c, job, dec, start_s=30.0) == pytest.approx(30 + 1000 * expected)
    ideal = IterationModel(efficiency=1.0, per_message_latency_s=0.0)
    assert predicted_iteration_s(c, job, dec, ideal) == pytest.approx(0.2 + 0.16 + 2 * 0.008)


def test_the_time_with_the_spare_takes_each_flow_to_what_its_path_has_left():
    c, job, dec = ring2()  # granted 50 and 100 Mbit/s on the 100 Mbit/s s1-s2 link
    steps = 2 * (0.0005 + 0.008)
    # each direction alone on its links: both at 100, whatever their grants
    assert spare_iteration_s(c, job, dec) == pytest.approx(0.2 + 8 / 100 / 0.92 + steps)
    reserve(c, SHORT, 40)  # another tenant's 40 Mbit/s on h1 -> h2: w0 -> w1 gets the other 60
    assert spare_iteration_s(c, job, dec) == pytest.approx(0.2 + 8 / 60 / 0.92 + steps)
    assert predicted_iteration_s(c, job, dec) == pytest.approx(0.2 + 8 / 50 / 0.92 + steps)
    colocated = Decision("r", {"w0": "h1", "w1": "h1"}, [])
    assert spare_iteration_s(c, job, colocated) == predicted_iteration_s(c, job, colocated)


def test_colocated_job_has_no_communication():
    c, job, _ = ring2()
    dec = Decision("r", {"w0": "h1", "w1": "h1"}, [])
    assert predicted_iteration_s(c, job, dec) == pytest.approx(0.2)
    assert bandwidth_satisfaction(job, dec) == (1.0, 1.0)
    assert network_cost(dec) == 0.0


def test_target_accuracy_job_has_no_completion_time():
    c, job, dec = ring2()
    job.iterations, job.target_accuracy = None, 0.9
    assert math.isnan(job_completion_s(c, job, dec))


def test_bandwidth_satisfaction_and_cost_by_hand():
    c, job, dec = ring2()
    assert bandwidth_satisfaction(job, dec) == pytest.approx((150 / 200, 0.5))
    assert network_cost(dec) == pytest.approx(50 * 3 + 100 * 3)
    dec.flows[0] = FlowAssignment("w0", "w1", LONG, 50)
    assert network_cost(dec) == pytest.approx(50 * 5 + 100 * 3)
    m = decision_metrics(c, job, dec)
    assert m.decision_ms == pytest.approx(2.0)
    assert m.bw_satisfaction == pytest.approx(0.75) and m.flows_satisfied == 0.5


def loaded_cluster() -> Cluster:
    """h1: cpu 1/2 used, mem 512/1024; h2: cpu 2/2, mem 0; h3: idle, 1 GPU of 2 in use."""
    c = diamond()
    c.graph.nodes["h3"]["gpu"] = 2
    job = Job(
        "load",
        [Task("a", Resources(1, 512)), Task("b", Resources(2, 0)), Task("c", Resources(0, 0, 1))],
        [],
        collective="custom",
    )
    c.allocate(job, Decision("load", {"a": "h1", "b": "h2", "c": "h3"}, []))
    return c


def test_seed004_cluster_metrics_by_hand():
    c = loaded_cluster()
    # Ū: h1 (0.5 + 0.5)/2 = 0.5; h2 (1 + 0)/2 = 0.5; h3 (0 + 0 + 0.5)/3 = 1/6
    u = [0.5, 0.5, 1 / 6]
    assert [node_utilisation(c, n) for n in ("h1", "h2", "h3")] == pytest.approx(u)
    mean = sum(u) / 3
    var = sum((x - mean) ** 2 for x in u) / 3
    assert load_variance(c) == pytest.approx(var)
    assert load_balance(c) == pytest.approx((math.sqrt(var), 0.5 / mean))
    # F = 1/N Σ_n Σ_r free share: h1 0.5 + 0.5, h2 0 + 1, h3 1 + 1 + 0.5
    assert fragmentation(c) == pytest.approx((1 + 1 + 2.5) / 3)
    assert load_variance(c, "gpu") == 0.0  # only h3 has GPUs
    assert load_variance(c, "cpu") == pytest.approx(
        ((0.5 - 0.5) ** 2 + (1 - 0.5) ** 2 + (0 - 0.5) ** 2) / 3
    )
    m = cluster_metrics(c)
    assert m.fragmentation == pytest.approx(1.5) and m.balance_max_mean == pytest.approx(0.5 / mean)
    with pytest.raises(ValueError, match="unknown resource 'disk'"):
        load_variance(c, "disk")


def test_offline_nodes_are_left_out():
    c = loaded_cluster()
    c.offline.add("h3")
    assert load_variance(c) == 0.0  # h1 and h2 both 0.5
    assert fragmentation(c) == pytest.approx(1.0)


def test_idle_cluster():
    c = diamond()
    assert load_balance(c) == (0.0, 1.0)
    assert fragmentation(c) == pytest.approx(2.0)  # cpu and mem all free on every node


def test_packable_is_exact():
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [
            {"name": "a", "cpu": 1.0, "mem_mb": 100},
            {"name": "b", "cpu": 1.0, "mem_mb": 100},
        ],
        "links": [{"ends": ["a", "s"], "bw_mbps": 10}, {"ends": ["b", "s"], "bw_mbps": 10}],
    }
    c = Cluster.from_topology(parse_topology(doc, "two"))

    def job(*cpus: float) -> Job:
        return Job("j", [Task(f"t{i}", Resources(x, 1)) for i, x in enumerate(cpus)], [])

    assert packable(c, job(0.6, 0.6)) is True
    assert packable(c, job(0.6, 0.6, 0.6)) is False
    # first-fit in this order fails (0.5+0.3 | 0.5+0.3 leaves 0.4 nowhere) but a packing exists
    assert packable(c, job(0.3, 0.5, 0.3, 0.5, 0.4)) is True
    assert packable(c, job(*[0.1] * 30), budget=5) is None
    assert deployed_count(7, 3) == 10
