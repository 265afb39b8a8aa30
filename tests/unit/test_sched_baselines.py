"""The algorithm registry and the baselines: every decision is feasible or a clear CannotPlace
(property tests over random instances), the cluster is never mutated, and each baseline picks
what its definition says on hand-made cases."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.baselines import ALGORITHMS, algorithm_names, make_algorithm, placement_order
from scheduler.instances import random_instance
from scheduler.jobs import ring_job, star_job
from scheduler.metrics import predicted_iteration_s
from scheduler.model import CannotPlace, Cluster, Decision, Job, Resources, Task, check_decision
from scheduler.paths import PATH_RULES
from topologies import parse_topology

BASELINES = ["random", "first-fit", "best-fit", "utilization", "k8s-spread", "network-aware"]
VARIANTS = (
    BASELINES
    + [f"first-fit:{rule}" for rule in PATH_RULES]
    + [f"random:{rule}" for rule in PATH_RULES]
)


def snapshot(cluster: Cluster) -> tuple:
    return (
        dict(cluster.used),
        dict(cluster.reserved),
        set(cluster.jobs),
        {n: dict(d) for n, d in cluster.graph.nodes(data=True)},
    )


def outcome(algo, cluster: Cluster, job: Job) -> Decision | None:
    before = snapshot(cluster)
    try:
        decision = algo.place(cluster, job)
    except CannotPlace as e:
        assert str(e), "a CannotPlace must say why"
        decision = None
    assert snapshot(cluster) == before, f"{algo.name} mutated the cluster"
    if decision is not None:
        assert check_decision(cluster, job, decision) == [], algo.name
        assert decision.job == job.name and decision.decision_s > 0
    return decision


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_every_decision_is_feasible_or_a_clear_cannot_place(seed):
    cluster, job = random_instance(
        np.random.default_rng(seed), max_switches=5, max_nodes=6, max_workers=5
    )
    for name in VARIANTS:
        decision = outcome(make_algorithm(name, seed=seed), cluster, job)
        if decision is not None:  # and it can really be allocated
            c = cluster.copy()
            c.allocate(job, decision)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_exact_is_feasible_and_never_worse_than_a_baseline(seed):
    # ≤ 4 switches: every node pair has ≤ 5 loop-free paths, all among exact's candidates,
    # so exact is optimal over everything a baseline can choose.
    cluster, job = random_instance(
        np.random.default_rng(seed), max_switches=4, max_nodes=5, max_workers=4
    )
    exact = make_algorithm("exact")
    best = outcome(exact, cluster, job)
    assert exact.last_optimal
    for name in VARIANTS:
        decision = outcome(make_algorithm(name, seed=seed), cluster, job)
        if decision is None:
            continue
        assert best is not None, f"{name} placed a job exact found impossible"
        assert predicted_iteration_s(cluster, job, best) <= predicted_iteration_s(
            cluster, job, decision
        ) * (1 + 1e-9), name


def test_registry():
    names = algorithm_names()
    assert set(BASELINES) | {"exact"} <= set(names)
    assert make_algorithm("first-fit:widest").name == "first-fit:widest"
    assert make_algorithm("first-fit:widest").path_rule == "widest"
    assert make_algorithm("network-aware").path_rule == "constrained"
    with pytest.raises(ValueError, match="unknown algorithm 'nope' \\(known: random, first-fit"):
        make_algorithm("nope")
    with pytest.raises(ValueError, match="unknown path rule 'fastest' in 'random:fastest'"):
        make_algorithm("random:fastest")
    assert all(callable(f) for f in ALGORITHMS.values())


def test_seeded_randomness():
    rng = np.random.default_rng(5)
    instances = [random_instance(rng, max_nodes=6) for _ in range(10)]

    def placements(seed: int) -> list:
        algo = make_algorithm("random", seed=seed)
        out = []
        for cluster, job in instances:
            d = outcome(algo, cluster, job)
            out.append(d and d.placement)
        return out

    assert placements(1) == placements(1)
    assert placements(1) != placements(2)


def cluster_of(
    *nodes: tuple[str, float, float], uplink: dict[str, str] | None = None, core_bw: float = 1000
) -> Cluster:
    """Nodes (name, cpu, mem) on access switch s1, or on s2 when uplink says so; s1-s2 core."""
    uplink = uplink or {}
    doc = {
        "switches": [{"name": "s1"}, {"name": "s2"}],
        "nodes": [{"name": n, "cpu": c, "mem_mb": m} for n, c, m in nodes],
        "links": [{"ends": ["s1", "s2"], "bw_mbps": core_bw}]
        + [{"ends": [n, uplink.get(n, "s1")], "bw_mbps": 1000} for n, _, _ in nodes],
    }
    return Cluster.from_topology(parse_topology(doc, "hand"))


def load(cluster: Cluster, node: str, cpu: float, mem: float) -> None:
    job = Job(f"bg-{node}", [Task("t", Resources(cpu, mem))], [])
    cluster.allocate(job, Decision(job.name, {"t": node}, []))


def one_task(cpu: float, mem: float) -> Job:
    return Job("one", [Task("t", Resources(cpu, mem))], [])


def choice(name: str, cluster: Cluster, job: Job) -> str:
    return make_algorithm(name).place(cluster, job).placement["t"]


def test_first_fit_and_best_fit():
    c = cluster_of(("n1", 4, 1000), ("n2", 1, 1000), ("n3", 2, 4000))
    job = one_task(0.5, 500)
    assert choice("first-fit", c, job) == "n1"
    # leftover / (4 cores, 4000 MB): n1 3.5/4 + 500/4000 = 1.0, n2 0.25, n3 1.25
    assert choice("best-fit", c, job) == "n2"
    assert choice("first-fit", c, one_task(3, 500)) == "n1"
    with pytest.raises(CannotPlace, match="task t \\(cpu 5, mem 500 MB, gpu 0\\) fits on no"):
        choice("best-fit", c, one_task(5, 500))


def test_utilization_matches_proportions():
    c = cluster_of(("n1", 2, 2000), ("n2", 2, 2000))
    load(c, "n1", 1, 0)  # n1 has memory left, n2 has cpu left
    load(c, "n2", 0, 1000)
    assert choice("utilization", c, one_task(0.2, 800)) == "n1"
    assert choice("utilization", c, one_task(0.8, 100)) == "n2"


def test_k8s_spread_prefers_least_allocated_then_balanced():
    c = cluster_of(("n1", 2, 2000), ("n2", 2, 2000), ("n3", 2, 2000))
    load(c, "n1", 1.5, 1500)
    load(c, "n2", 1.0, 0)  # least allocated on average as n3 below, but unbalanced
    load(c, "n3", 0.5, 500)
    assert choice("k8s-spread", c, one_task(0.5, 500)) == "n3"
    # the ring's workers spread over the three nodes rather than packing
    ring = ring_job("r", 3, Resources(0.25, 100), 1e6, 10, iterations=1)
    assert (
        len(
            set(
                make_algorithm("k8s-spread")
                .place(cluster_of(("a", 2, 2000), ("b", 2, 2000), ("c", 2, 2000)), ring)
                .placement.values()
            )
        )
        == 3
    )


def test_network_aware_keeps_peers_close_under_bandwidth():
    # a and b on s1, c and d on s2, the s1-s2 core has 50 Mbit/s; tasks fit one per node
    c = cluster_of(
        ("a", 1, 1000),
        ("c", 1.5, 1000),
        ("b", 1, 1000),
        ("d", 1, 1000),
        uplink={"c": "s2", "d": "s2"},
        core_bw=50,
    )
    ring = ring_job("r", 2, Resources(1, 100), 1e6, 100, iterations=1)
    placement = make_algorithm("network-aware").place(c, ring).placement
    assert placement == {"w0": "c", "w1": "d"}  # most free cpu first, then its switch-mate
    # network-blind first-fit crosses the narrow core
    ff = make_algorithm("first-fit").place(c, ring)
    assert ff.placement == {"w0": "a", "w1": "c"}
    assert all(f.rate_mbps == pytest.approx(50) for f in ff.flows)


def test_network_aware_colocates_when_it_fits():
    c = cluster_of(("a", 1, 1000), ("b", 4, 4000))
    star = star_job("s", 3, Resources(0.5, 100), 1e6, 100, iterations=1)
    d = make_algorithm("network-aware").place(c, star)
    assert set(d.placement.values()) == {"b"} and d.flows == []


def test_placement_order_follows_the_logical_graph():
    ring = ring_job("r", 5, Resources(0.1, 1), 1e6, 10, iterations=1)
    order = [t.name for t in placement_order(ring)]
    assert order[0] == "w0" and set(order[1:3]) == {"w1", "w4"} and len(order) == 5
    star = star_job("s", 3, Resources(0.1, 1), 1e6, 10, iterations=1)
    assert placement_order(star)[0].name == "ps"
