"""Path rules and the rate split on a hand-made topology whose answers are known.

    h1, h3 ── s1 ──(100 Mbit/s, 2 ms)── s2 ── h2
               └─ s3 ──(150)── s4 ──(150)─┘     (s1-s3 150 Mbit/s; 1 ms each)
Access links 1000 Mbit/s, 1 ms.
"""

from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest

from scheduler.layout import hops_over, layout, residuals
from scheduler.model import (
    CannotPlace,
    Cluster,
    Decision,
    FlowAssignment,
    Job,
    LogicalFlow,
    Resources,
    Task,
    check_decision,
)
from scheduler.paths import (
    NoPath,
    assign_flows,
    candidate_paths,
    fair_rates,
    shortest_path,
    widest_path,
)
from topologies import parse_topology

SHORT = ("h1", "s1", "s2", "h2")
LONG = ("h1", "s1", "s3", "s4", "s2", "h2")


def diamond() -> Cluster:
    doc = {
        "name": "diamond",
        "switches": [{"name": s} for s in ("s1", "s2", "s3", "s4")],
        "nodes": [{"name": h, "cpu": 2, "mem_mb": 1024} for h in ("h1", "h2", "h3")],
        "links": [
            {"ends": ["s1", "s2"], "bw_mbps": 100, "delay_ms": 2},
            {"ends": ["s1", "s3"], "bw_mbps": 150, "delay_ms": 1},
            {"ends": ["s3", "s4"], "bw_mbps": 150, "delay_ms": 1},
            {"ends": ["s4", "s2"], "bw_mbps": 150, "delay_ms": 1},
            {"ends": ["h1", "s1"], "bw_mbps": 1000, "delay_ms": 1},
            {"ends": ["h2", "s2"], "bw_mbps": 1000, "delay_ms": 1},
            {"ends": ["h3", "s1"], "bw_mbps": 1000, "delay_ms": 1},
        ],
    }
    return Cluster.from_topology(parse_topology(doc, "diamond"))


def two_flow_job(demand: float, bytes_a: float = 1e6, bytes_b: float = 1e6) -> tuple[Job, dict]:
    tasks = [Task(n, Resources(0.1, 10)) for n in "abcd"]
    job = Job(
        "j",
        tasks,
        [LogicalFlow("a", "b", demand, bytes_a), LogicalFlow("c", "d", demand, bytes_b)],
        collective="custom",
    )
    return job, {"a": "h1", "c": "h1", "b": "h2", "d": "h2"}


def reserve(cluster: Cluster, path: tuple[str, ...], rate: float) -> None:
    job = Job(
        f"bg{len(cluster.jobs)}",
        [Task("x", Resources()), Task("y", Resources())],
        [LogicalFlow("x", "y", rate, 0)],
        collective="custom",
    )
    cluster.allocate(
        job,
        Decision(job.name, {"x": path[0], "y": path[-1]}, [FlowAssignment("x", "y", path, rate)]),
    )


def test_shortest_widest_and_candidates():
    c = diamond()
    assert shortest_path(c, "h1", "h2") == SHORT
    assert widest_path(c, "h1", "h2") == LONG
    assert candidate_paths(c, "h1", "h2", 5) == [SHORT, LONG]
    assert candidate_paths(c, "h1", "h2", 1) == [SHORT]
    # paths never transit a compute node: h1 -> h3 stays on s1
    assert shortest_path(c, "h1", "h3") == ("h1", "s1", "h3")


def test_widest_follows_residual_and_direction():
    c = diamond()
    reserve(c, LONG, 120)  # the long path has 30 left from h1 to h2
    assert widest_path(c, "h1", "h2") == SHORT
    assert widest_path(c, "h2", "h1") == tuple(reversed(LONG))  # the other direction is untouched


def test_bandwidth_constrained_shortest_path():
    c = diamond()
    assert shortest_path(c, "h1", "h2", min_residual=120) == LONG
    with pytest.raises(NoPath, match="h1 to h2 with 200 Mbit/s free"):
        shortest_path(c, "h1", "h2", min_residual=200)
    with pytest.raises(ValueError, match="not a compute node"):
        shortest_path(c, "h1", "s2")


def test_hops_over_links_with_a_demand_free():
    def hops(c: Cluster, origin: str, min_residual: float = 0.0, inward: bool = False):
        lay = layout(c)
        h = hops_over(lay, residuals(c, lay), lay.index[origin], min_residual, inward)
        return {lay.vertices[i]: int(x) for i, x in enumerate(h[: lay.n_compute]) if x != math.inf}

    c = diamond()
    assert hops(c, "h1") == {"h1": 0, "h3": 2, "h2": 3}
    assert hops(c, "h1", min_residual=120) == {"h1": 0, "h3": 2, "h2": 5}
    reserve(c, LONG, 100)
    assert hops(c, "h2", min_residual=120, inward=True) == {"h2": 0}
    assert hops(c, "h2", min_residual=120)["h1"] == 5  # h2 -> h1 is still free


def test_fair_rates_weighted_and_capped():
    c = diamond()
    paths = {1: SHORT, 2: SHORT}
    assert fair_rates(c, paths, {1: 100, 2: 100}) == pytest.approx({1: 50, 2: 50})
    assert fair_rates(c, paths, {1: 100, 2: 100}, {1: 1, 2: 3}) == pytest.approx({1: 25, 2: 75})
    # a capped flow leaves its share to the other
    assert fair_rates(c, paths, {1: 20, 2: 100}) == pytest.approx({1: 20, 2: 80})
    # flows on disjoint paths get their whole demand up to their own bottleneck
    assert fair_rates(c, {1: SHORT, 2: LONG}, {1: 500, 2: 500}) == pytest.approx({1: 100, 2: 150})


@pytest.mark.parametrize("seed", range(40))
def test_fair_rates_are_weighted_max_min_fair(seed):
    """The characterisation of weighted max-min fairness, on random flows over the diamond (links
    partly reserved, demands finite, infinite or zero, keys of mixed types): no link carries more
    than its residual, no flow more than its demand, and every flow below its demand crosses a
    full link on which no flow has a larger rate per weight (its bottleneck)."""
    rng = random.Random(seed)
    c = diamond()
    for link in rng.sample(sorted(c.graph.edges), 3):
        c.reserved[link] = rng.uniform(0, c.link_capacity(*link))
    hosts = ["h1", "h2", "h3"]
    paths, demands, weights = {}, {}, {}
    for i in range(rng.randint(1, 12)):
        a, b = rng.sample(hosts, 2)
        route = list(nx.all_simple_paths(c.graph, a, b))
        key = i if i % 2 else (a, b, i)
        paths[key] = tuple(
            rng.choice([p for p in route if all(v.startswith("s") for v in p[1:-1])])
        )
        demands[key] = rng.choice([0.0, 5.0, rng.uniform(1, 300), math.inf])
        weights[key] = rng.choice([1.0, 3.0, rng.uniform(0.1, 10)])
    rates = fair_rates(c, paths, demands, weights)
    load: dict = {}
    for f, p in paths.items():
        for lk in itertools.pairwise(p):
            load.setdefault(lk, []).append(f)
    tol = 1e-6
    for lk, fs in load.items():
        assert sum(rates[f] for f in fs) <= max(c.residual(*lk), 0.0) + tol
    for f, p in paths.items():
        assert 0 <= rates[f] <= demands[f] + tol
        if rates[f] >= demands[f] - tol:
            continue
        assert any(
            sum(rates[g] for g in load[lk]) >= max(c.residual(*lk), 0.0) - tol
            and all(rates[g] / weights[g] <= rates[f] / weights[f] + tol for g in load[lk])
            for lk in itertools.pairwise(p)
        ), f"flow {f} has no bottleneck"


@pytest.mark.parametrize(
    "rule, paths, rates",
    [
        ("shortest", [SHORT, SHORT], [50, 50]),
        ("widest", [LONG, LONG], [75, 75]),
        ("ksplit", [LONG, SHORT], [150, 100]),  # 150 > 100, then 150/2 < 100: spread
        ("constrained", [LONG, LONG], [75, 75]),  # 200 fits nowhere: widest, both
    ],
)
def test_path_rules_on_a_job(rule, paths, rates):
    c = diamond()
    job, placement = two_flow_job(200)
    flows = assign_flows(c, job, placement, rule, k=4)
    assert [f.path for f in flows] == paths
    assert [f.rate_mbps for f in flows] == pytest.approx(rates)
    assert check_decision(c, job, Decision("j", placement, flows)) == []


def test_constrained_routes_around_a_full_link():
    c = diamond()
    job, placement = two_flow_job(80)
    flows = assign_flows(c, job, placement, "constrained")
    assert [f.path for f in flows] == [SHORT, LONG]  # 100 - 80 < 80 on the short one
    assert [f.rate_mbps for f in flows] == pytest.approx([80, 80])


def test_bytes_weighting_vs_equal():
    c = diamond()
    job, placement = two_flow_job(200, bytes_a=1e6, bytes_b=3e6)
    by_bytes = assign_flows(c, job, placement, "shortest")
    equal = assign_flows(c, job, placement, "shortest", weighting="equal")
    assert [f.rate_mbps for f in by_bytes] == pytest.approx([25, 75])
    assert [f.rate_mbps for f in equal] == pytest.approx([50, 50])


def test_no_bandwidth_is_cannot_place():
    c = diamond()
    reserve(c, SHORT, 100)
    job, placement = two_flow_job(10)
    with pytest.raises(CannotPlace, match="no residual bandwidth"):
        assign_flows(c, job, placement, "shortest")
    assert len(assign_flows(c, job, placement, "widest")) == 2
    with pytest.raises(ValueError, match="unknown path rule 'best'"):
        assign_flows(c, job, placement, "best")
