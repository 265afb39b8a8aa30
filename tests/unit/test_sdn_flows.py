"""Request parsing, path validation, rules, meters and change plans of the SDN app (pure logic)."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdn_app.flows import (
    COOKIE_DEFAULT,
    COOKIE_RETURN,
    ETH_ARP,
    ETH_IPV4,
    PRIORITY_DEFAULT,
    PRIORITY_FLOW,
    FlowSpec,
    Meter,
    MeterPolicy,
    RequestError,
    Rule,
    default_rules,
    flow_priority,
    flow_rules,
    job_cookie,
    job_rules,
    parse_dpid,
    parse_flows,
    parse_job_id,
    plan_change,
    return_rules,
)
from topologies import Topology, load_topology, parse_topology
from topologies.routes import default_path


@pytest.fixture(scope="module")
def campus() -> Topology:
    return load_topology("campus")


def flow(**kw):
    return {"src": "lab1", "dst": "srv1", "path": ["acc1", "agg1", "acc4"], "rate_mbps": 20} | kw


def test_parse_accepts_names_ips_and_dpids(campus):
    acc1, agg1, acc4 = (campus.switch(n).dpid for n in ("acc1", "agg1", "acc4"))
    specs = parse_flows(
        {
            "flows": [
                flow(),
                flow(
                    src=campus.node("lab2").ip,
                    dst="srv2",
                    path=[acc1, f"{agg1:#x}", str(acc4)],
                    tcp_dst=29500,
                    name="t1->t2",
                ),
                flow(path=["acc1", "agg1", "core1", "agg3", "acc4"], tcp_src=1234, tcp_dst=29500),
            ]
        },
        campus,
    )
    assert specs[0] == FlowSpec("lab1", "srv1", ("acc1", "agg1", "acc4"), 20.0)
    assert specs[1].src == "lab2" and specs[1].path == ("acc1", "agg1", "acc4")
    assert specs[1].tcp_dst == 29500 and specs[1].name == "t1->t2"
    assert specs[2].path[2] == "core1"


@pytest.mark.parametrize(
    "doc, field, words",
    [
        ([], "", "JSON object"),
        ({"flow": []}, "flow", "unknown field"),
        ({"flows": {}}, "flows", "list"),
        ({"flows": [42]}, "flows[0]", "object"),
        ({"flows": [flow(colour="red")]}, "flows[0].colour", "unknown field"),
        (
            {"flows": [{"src": "lab1", "dst": "srv1", "path": ["acc1"]}]},
            "flows[0].rate_mbps",
            "missing",
        ),
        ({"flows": [flow(src="nosuch")]}, "flows[0].src", "unknown compute node"),
        ({"flows": [flow(dst="10.9.9.9")]}, "flows[0].dst", "unknown compute node"),
        ({"flows": [flow(dst="lab1", path=["acc1"])]}, "flows[0]", "same node"),
        ({"flows": [flow(rate_mbps=0)]}, "flows[0].rate_mbps", "number from"),
        ({"flows": [flow(rate_mbps=-5)]}, "flows[0].rate_mbps", "number from"),
        ({"flows": [flow(rate_mbps="20")]}, "flows[0].rate_mbps", "number from"),
        ({"flows": [flow(rate_mbps=True)]}, "flows[0].rate_mbps", "number from"),
        ({"flows": [flow(rate_mbps=float("inf"))]}, "flows[0].rate_mbps", "number from"),
        ({"flows": [flow(tcp_dst=0)]}, "flows[0].tcp_dst", "TCP port"),
        ({"flows": [flow(tcp_src=70000)]}, "flows[0].tcp_src", "TCP port"),
        ({"flows": [flow(name=7)]}, "flows[0].name", "string"),
        ({"flows": [flow(symmetric="yes")]}, "flows[0].symmetric", "true or false"),
        ({"flows": [flow(name="x" * 1025)]}, "flows[0].name", "at most 1024"),
        ({"flows": [flow(path=[])]}, "flows[0].path", "non-empty list"),
        ({"flows": [flow(path="acc1")]}, "flows[0].path", "non-empty list"),
        ({"flows": [flow(path=["acc1", "nosuch", "acc4"])]}, "flows[0].path[1]", "unknown switch"),
        ({"flows": [flow(path=["acc1", "lab1", "acc4"])]}, "flows[0].path[1]", "compute node"),
        ({"flows": [flow(path=["acc1", 9999, "acc4"])]}, "flows[0].path[1]", "unknown switch"),
        ({"flows": [flow(path=["acc1", "acc4"])]}, "flows[0].path[1]", "not contiguous"),
        (
            {"flows": [flow(path=["acc1", "agg1", "acc1", "agg1", "acc4"])]},
            "flows[0].path",
            "twice",
        ),
        ({"flows": [flow(path=["agg1", "acc4"])]}, "flows[0].path[0]", "must start at 'acc1'"),
        ({"flows": [flow(path=["acc1", "agg1"])]}, "flows[0].path[1]", "must end at 'acc4'"),
        ({"flows": [flow(), flow(rate_mbps=5)]}, "flows[1]", "same src, dst and TCP ports"),
    ],
)
def test_parse_rejects_with_field_and_reason(campus, doc, field, words):
    with pytest.raises(RequestError) as e:
        parse_flows(doc, campus)
    assert e.value.status == 400
    assert e.value.field == field
    assert words in e.value.message


def test_flows_differing_only_in_tcp_ports_are_distinct(campus):
    specs = parse_flows({"flows": [flow(), flow(tcp_dst=1), flow(tcp_dst=2)]}, campus)
    assert len({s.key for s in specs}) == 3


@pytest.mark.parametrize(
    "text, ok",
    [
        ("job-1", True),
        ("a", True),
        ("J.7_x", True),
        ("", False),
        ("-x", False),
        ("a/b", False),
        ("x" * 65, False),
        ("a b", False),
    ],
)
def test_job_id(text, ok):
    if ok:
        assert parse_job_id(text) == text
    else:
        with pytest.raises(RequestError):
            parse_job_id(text)


@pytest.mark.parametrize(
    "value, dpid",
    [
        (5, 5),
        ("0x1f", 31),
        ("17", 17),
        ("00:00:00:00:00:00:01:01", 0x101),
        ("acc1", None),
        ("0xzz", None),
        (True, None),
        (None, None),
    ],
)
def test_parse_dpid(value, dpid):
    assert parse_dpid(value) == dpid


def _walk(topo: Topology, rules: list[Rule], start: str, fields: dict) -> list[str]:
    """Follow the highest-priority matching rule switch by switch, as the switches would."""
    by_port = {}
    for lk in topo.links:
        for end in (lk.a, lk.b):
            if end in {s.name for s in topo.switches}:
                by_port[(end, lk.port_of(end))] = lk.other(end)
    names = {s.dpid: s.name for s in topo.switches}
    here, visited = start, [start]
    while here in {s.name for s in topo.switches}:
        candidates = [
            r
            for r in rules
            if names[r.dpid] == here and all(fields.get(k) == v for k, v in r.match)
        ]
        best = max(candidates, key=lambda r: r.priority)
        here = by_port[(here, best.out_port)]
        visited.append(here)
        assert len(visited) <= len(topo.switches) + 2, f"forwarding loop: {visited}"
    return visited


@pytest.mark.parametrize("spec", ["campus", "fattree", "ring", "star", "gen:internet:40:3"])
def test_default_rules_deliver_everything_on_shortest_paths(spec):
    topo = load_topology(spec)
    rules = default_rules(topo)
    g = topo.graph().subgraph(s.name for s in topo.switches)
    assert {r.cookie for r in rules} == {COOKIE_DEFAULT}
    assert {r.priority for r in rules} == {PRIORITY_DEFAULT}
    for node in topo.nodes:
        access = topo.access_link(node.name).other(node.name)
        for sw in topo.switches:
            for eth, key in ((ETH_IPV4, "ipv4_dst"), (ETH_ARP, "arp_tpa")):
                hops = _walk(topo, rules, sw.name, {"eth_type": eth, key: node.ip})
                assert hops[-1] == node.name
                assert len(hops) - 2 == nx.shortest_path_length(g, sw.name, access)


def test_default_rules_prefer_the_wider_of_equal_hop_paths():
    topo = parse_topology(
        {
            "switches": [{"name": n} for n in ("a", "b", "c", "d")],
            "nodes": [
                {"name": "h1", "cpu": 1, "mem_mb": 64},
                {"name": "h2", "cpu": 1, "mem_mb": 64},
            ],
            "links": [
                {"ends": ["a", "b"], "bw_mbps": 10},
                {"ends": ["b", "d"], "bw_mbps": 10},
                {"ends": ["a", "c"], "bw_mbps": 100},
                {"ends": ["c", "d"], "bw_mbps": 100},
                {"ends": ["h1", "a"], "bw_mbps": 100},
                {"ends": ["h2", "d"], "bw_mbps": 100},
            ],
        },
        "test",
    )
    hops = _walk(topo, default_rules(topo), "a", {"eth_type": ETH_IPV4, "ipv4_dst": "10.0.0.2"})
    assert hops == ["a", "c", "d", "h2"]
    assert default_path(topo.graph(), "h1", "h2") == ["a", "c", "d"]


def test_flow_rules_follow_the_path_and_beat_the_defaults(campus):
    spec = parse_flows(
        {"flows": [flow(path=["acc1", "agg2", "core2", "agg3", "acc4"], tcp_dst=29500)]}, campus
    )[0]
    rules = flow_rules(spec, campus, job_cookie(3, 7), meter_id=4)
    assert [campus.switch_by_dpid(r.dpid).name for r in rules] == list(spec.path)
    assert [r.meter_id for r in rules] == [4, 0, 0, 0, 0]  # policed once, at the first switch
    assert {r.cookie for r in rules} == {job_cookie(3, 7)}
    fields = {
        "eth_type": ETH_IPV4,
        "ipv4_src": campus.node("lab1").ip,
        "ipv4_dst": campus.node("srv1").ip,
        "ip_proto": 6,
        "tcp_dst": 29500,
    }
    hops = _walk(campus, default_rules(campus) + rules, "acc1", fields)
    assert hops == list(spec.path) + ["srv1"]
    # other traffic between the same hosts keeps the default (shortest) path
    other = _walk(campus, default_rules(campus) + rules, "acc1", fields | {"tcp_dst": 80})
    assert other == ["acc1", "agg1", "acc4", "srv1"]


def test_a_symmetric_flow_takes_its_answers_back_along_its_path(campus):
    """Acknowledgements from srv1 to lab1 follow the flow's switches in reverse, unmetered,
    instead of the default route; a flow scheduled srv1 -> lab1 itself still wins."""
    path = ["acc1", "agg2", "core2", "agg3", "acc4"]
    spec = parse_flows({"flows": [flow(path=path, tcp_dst=29500, symmetric=True)]}, campus)[0]
    assert spec.to_json()["symmetric"] is True and spec.key == ("lab1", "srv1", None, 29500)
    back = return_rules(spec, campus, job_cookie(3, 7, COOKIE_RETURN))
    assert [campus.switch_by_dpid(r.dpid).name for r in back] == path[::-1]
    assert {r.meter_id for r in back} == {0} and {r.cookie for r in back} == {
        job_cookie(3, 7, COOKIE_RETURN)
    } != {job_cookie(3, 7)}
    answer = {
        "eth_type": ETH_IPV4,
        "ipv4_src": campus.node("srv1").ip,
        "ipv4_dst": campus.node("lab1").ip,
        "ip_proto": 6,
        "tcp_src": 29500,
    }
    fwd = flow_rules(spec, campus, job_cookie(3, 7), meter_id=4)
    assert _walk(campus, default_rules(campus) + fwd + back, "acc4", answer) == path[::-1] + [
        "lab1"
    ]
    assert _walk(campus, default_rules(campus) + fwd, "acc4", answer) == [
        "acc4",
        "agg1",
        "acc1",
        "lab1",
    ]  # without: the default route
    other = parse_flows(
        {"flows": [flow(src="srv1", dst="lab1", path=["acc4", "agg1", "acc1"], tcp_src=29500)]},
        campus,
    )[0]
    both = default_rules(campus) + fwd + back + flow_rules(other, campus, job_cookie(3, 8), 5)
    assert _walk(campus, both, "acc4", answer) == ["acc4", "agg1", "acc1", "lab1"]
    assert return_rules(parse_flows({"flows": [flow()]}, campus)[0], campus, 1) == []
    # below every scheduled flow, even a host-pair one the other way (its meter must hold)
    pair = parse_flows(
        {"flows": [flow(src="srv1", dst="lab1", path=["acc4", "agg1", "acc1"])]}, campus
    )[0]
    assert max(r.priority for r in back) < flow_priority(pair) == PRIORITY_FLOW
    assert _walk(
        campus, default_rules(campus) + fwd + back + flow_rules(pair, campus, 9, 6), "acc4", answer
    ) == ["acc4", "agg1", "acc1", "lab1"]
    # the way back is steered onto last, once its other entries are in
    assert job_rules(spec, campus, 3, 7, 4) == (fwd, back)
    plan = plan_change([], [], fwd + back, [])
    assert [r for r in plan.steer if r.cookie == back[0].cookie] == [back[0]]
    assert set(back[1:]) <= set(plan.prepare)


def test_narrower_flows_get_higher_priority(campus):
    a, b, c = parse_flows({"flows": [flow(), flow(tcp_dst=1), flow(tcp_src=2, tcp_dst=1)]}, campus)
    pa, pb, pc = (flow_rules(s, campus, 1, 1)[0].priority for s in (a, b, c))
    assert pa < pb < pc


@pytest.mark.parametrize(
    "rate, kbps, burst",
    [(20, 20_000, 10_000), (0.001, 1, 64), (100, 100_000, 50_000), (5.5, 5_500, 2_750)],
)
def test_meter_params(rate, kbps, burst):
    assert MeterPolicy().params(rate) == (kbps, burst)


def test_meter_burst_scales_with_policy():
    assert MeterPolicy(burst_s=1.0).params(20) == (20_000, 20_000)


def test_plan_orders_phases_and_changes_in_place():
    r = lambda dpid, port, meter=0, prio=100: Rule(
        dpid, prio, (("ipv4_dst", "10.0.0.2"),), port, meter, 1
    )
    old_rules = [r(1, 2, meter=1), r(2, 3), r(3, 4)]  # path 1 → 2 → 3
    new_rules = [r(1, 5, meter=1), r(4, 3), r(3, 4)]  # re-routed: 1 → 4 → 3
    old_m = [Meter(1, 1, 20_000, 10_000)]
    new_m = [Meter(1, 1, 10_000, 5_000)]
    plan = plan_change(old_rules, old_m, new_rules, new_m)
    assert plan.meters_modify == new_m and not plan.meters_add and not plan.meters_remove
    assert plan.prepare == [r(4, 3)]  # the unchanged s3 entry is not re-sent
    assert plan.steer == [r(1, 5, meter=1)]  # first switch last: traffic moves when all is ready
    assert plan.remove == [r(2, 3)]
    assert plan.dpids() == {1, 2, 4}
    assert plan_change(new_rules, new_m, new_rules, new_m).is_empty()
    gone = plan_change(new_rules, new_m, [], [])
    assert gone.remove == new_rules and gone.meters_remove == new_m


rule_st = st.builds(
    lambda dpid, dst, port, meter: Rule(
        dpid, 100, (("ipv4_dst", f"10.0.0.{dst}"),), port, meter, 1
    ),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(0, 2),
)
meter_st = st.builds(
    Meter, st.integers(1, 3), st.integers(1, 3), st.sampled_from([1000, 2000]), st.just(500)
)


def _unique(items, key):
    return list({key(x): x for x in items}.values())


@given(st.lists(rule_st), st.lists(meter_st), st.lists(rule_st), st.lists(meter_st))
def test_applying_a_plan_yields_exactly_the_new_state(old_r, old_m, new_r, new_m):
    """A switch model: ADD overwrites by (dpid, priority, match), DELETE_STRICT removes by it."""
    old_r, new_r = (_unique(r, lambda x: x.key) for r in (old_r, new_r))
    old_m, new_m = (_unique(m, lambda x: (x.dpid, x.meter_id)) for m in (old_m, new_m))
    table = {r.key: r for r in old_r}
    meters = {(m.dpid, m.meter_id): m for m in old_m}
    plan = plan_change(old_r, old_m, new_r, new_m)
    for m in plan.meters_add + plan.meters_modify:
        meters[(m.dpid, m.meter_id)] = m
    for r in plan.prepare + plan.steer:
        table[r.key] = r
    # make before break: before anything is removed, every new entry is already in place
    assert all(table[r.key] == r for r in new_r)
    for r in plan.remove:
        del table[r.key]
    for m in plan.meters_remove:
        del meters[(m.dpid, m.meter_id)]
    assert table == {r.key: r for r in new_r}
    assert meters == {(m.dpid, m.meter_id): m for m in new_m}
    assert all(not r.meter_id for r in plan.prepare) and all(r.meter_id for r in plan.steer)
