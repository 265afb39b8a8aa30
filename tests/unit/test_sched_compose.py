"""Schedulers composed from parts (`scheduler.compose`) and CES's network decision for a given
placement (`paths.route_placement`)."""

from __future__ import annotations

import numpy as np
import pytest
from two_paths import TWO_PATHS

from scheduler import compose
from scheduler.baselines import make_algorithm
from scheduler.instances import random_instance
from scheduler.jobs import ring_job
from scheduler.metrics import predicted_iteration_s
from scheduler.model import (
    BEST_EFFORT,
    ENFORCED,
    CannotPlace,
    Cluster,
    Decision,
    Job,
    LogicalFlow,
    Resources,
    Task,
    check_decision,
)
from scheduler.paths import NoPath, assign_flows, route_placement
from topologies.routes import default_path

DIRECT, AROUND = ("a", "s1", "s2", "b"), ("a", "s1", "s3", "s2", "b")


def spread_job(name: str = "j", mbps: float = 400.0) -> Job:
    """Two 1-core tasks: one on a, one on b."""
    return ring_job(name, 2, Resources(1.0, 256), 4e6, mbps, iterations=10)


def test_specs_parse_and_default_by_network_blindness():
    assert compose.parse("k8s-spread/ces") == ("k8s-spread", "ces")
    assert compose.parse("first-fit:widest") == ("first-fit:widest", None)
    with pytest.raises(ValueError, match="unknown network 'fast'"):
        compose.parse("ces-ppo/fast")
    assert [
        compose.network_of(s)
        for s in (
            "k8s-spread",
            "first-fit:widest",
            "network-aware",
            "exact",
            "network-aware/best-effort",
        )
    ] == ["best-effort", "best-effort", "enforced", "enforced", "best-effort"]
    assert [
        compose.adjustable(s)
        for s in ("network-aware", "k8s-spread/ces", "network-aware/static", "k8s-spread")
    ] == [True, True, False, False]


def test_best_effort_takes_the_default_paths_and_holds_no_bandwidth():
    cluster = Cluster.from_topology(TWO_PATHS)
    for link in ((("s1", "s2")), ("s2", "s1"), ("s1", "s3"), ("s3", "s2")):
        cluster.reserved[link] = cluster.link_capacity(*link)  # nothing left anywhere
    job = spread_job()
    with pytest.raises(NoPath):
        make_algorithm("k8s-spread").place(cluster, job)  # its enforced form finds no bandwidth
    d = compose.build("k8s-spread").place(cluster, job)  # a plain network: TCP shares
    assert d.network == BEST_EFFORT and sorted(d.placement.values()) == ["a", "b"]
    for f in d.flows:
        src, dst = f.path[0], f.path[-1]
        assert f.path == (src, *default_path(cluster.graph, src, dst), dst)
        assert f.rate_mbps == pytest.approx(100.0)  # the direct link's capacity, alone on it
    assert check_decision(cluster, job, d) == []
    before = dict(cluster.reserved)
    cluster.allocate(job, d)
    assert cluster.reserved == before  # nothing reserved
    cluster.release(job.name)
    assert cluster.reserved == before


def test_ces_network_keeps_the_placement_and_chooses_paths_and_rates():
    cluster = Cluster.from_topology(TWO_PATHS)
    job = spread_job()
    own = make_algorithm("k8s-spread", seed=3).place(cluster, job)
    composed = compose.build("k8s-spread/ces", seed=3).place(cluster, job)
    assert composed.placement == own.placement and composed.network == ENFORCED
    assert {f.path for f in own.flows} == {DIRECT, DIRECT[::-1]}  # shortest: 100 Mbit/s
    assert {f.path for f in composed.flows} == {AROUND, AROUND[::-1]}  # widest: 400 granted
    assert all(f.rate_mbps == pytest.approx(400.0) for f in composed.flows)
    assert predicted_iteration_s(cluster, job, composed) < predicted_iteration_s(cluster, job, own)


def test_route_placement_spreads_flows_over_parallel_paths():
    """Two flows a->b that together need more than either path: one each (with the direct link
    at 100 Mbit/s both share the wide path instead: the collective waits for its slowest flow)."""
    cluster = Cluster.from_topology(TWO_PATHS)
    cluster.graph.edges["s1", "s2"]["bw_mbps"] = 300.0
    tasks = [Task(n, Resources(0.25, 64)) for n in ("x", "y", "p", "q")]
    job = Job(
        "two",
        tasks,
        [LogicalFlow("x", "p", 300, 3e6), LogicalFlow("y", "q", 300, 3e6)],
        collective="custom",
    )
    placement = {"x": "a", "y": "a", "p": "b", "q": "b"}
    flows = route_placement(cluster, job, placement)
    assert {f.path for f in flows} == {DIRECT, AROUND}
    assert sorted(f.rate_mbps for f in flows) == pytest.approx([300.0, 300.0])
    assert check_decision(cluster, job, Decision("two", placement, flows)) == []
    cluster.graph.edges["s1", "s2"]["bw_mbps"] = 100.0
    assert {f.path for f in route_placement(cluster, job, placement)} == {AROUND}
    pinned = route_placement(cluster, job, placement, fixed={("a", "b"): DIRECT})
    assert {f.path for f in pinned} == {DIRECT}


def test_route_placement_is_never_worse_than_the_path_rules():
    rng = np.random.default_rng(7)
    checked = 0
    for i in range(120):
        cluster, job = random_instance(rng, max_switches=5, max_nodes=6, max_workers=5)
        try:
            placement = make_algorithm("random", seed=i).place(cluster, job).placement
        except CannotPlace:
            continue
        ours = predicted_iteration_s(
            cluster, job, Decision(job.name, placement, route_placement(cluster, job, placement))
        )
        for rule in ("shortest", "widest", "ksplit", "constrained"):
            try:
                other = Decision(job.name, placement, assign_flows(cluster, job, placement, rule))
            except NoPath:
                continue
            # the closed form leaves out the path's round trip: a hair's breadth either way
            assert ours <= predicted_iteration_s(cluster, job, other) * 1.001
            checked += 1
    assert checked > 200


def test_route_placement_refuses_a_flow_without_bandwidth():
    cluster = Cluster.from_topology(TWO_PATHS)
    for link in (("s1", "s2"), ("s1", "s3")):
        cluster.reserved[link] = cluster.link_capacity(*link)
    with pytest.raises(NoPath, match="w0->w1"):
        route_placement(cluster, spread_job(), {"w0": "a", "w1": "b"})


def test_the_lower_bound_is_below_the_exact_optimum_and_every_algorithm():
    from scheduler.bounds import iteration_lower_bound

    rng = np.random.default_rng(3)
    exact = make_algorithm("exact")
    tight = 0
    for i in range(40):
        cluster, job = random_instance(rng, max_switches=4, max_nodes=5, max_workers=4)
        bound = iteration_lower_bound(cluster, job)
        try:
            best = predicted_iteration_s(cluster, job, exact.place(cluster, job))
        except CannotPlace:
            continue
        assert bound <= best * (1 + 1e-9), (i, bound, best)
        for name in ("network-aware", "k8s-spread", "first-fit"):
            try:
                d = make_algorithm(name, seed=i).place(cluster, job)
            except CannotPlace:
                continue
            assert bound <= predicted_iteration_s(cluster, job, d) * (1 + 1e-9)
        tight += bound >= 0.5 * best
    assert tight >= 10  # not a trivial bound
