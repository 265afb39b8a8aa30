"""The Network Controller's view and its per-node-pair enforcement (pure logic, no SDN app and
no agents: what it would send is read from `desired()`)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from master.compute import ComputeController
from master.network import NetworkController
from scheduler.jobs import ring_job
from scheduler.model import Cluster, Decision, FlowAssignment, Resources, check_decision
from topologies import parse_topology

TOPO = {
    "name": "twopaths",
    "switches": [{"name": "s1"}, {"name": "s2"}, {"name": "s3"}],
    "nodes": [{"name": "a", "cpu": 2, "mem_mb": 2048}, {"name": "b", "cpu": 2, "mem_mb": 2048}],
    "links": [
        {"ends": ["a", "s1"], "bw_mbps": 1000},
        {"ends": ["b", "s2"], "bw_mbps": 1000},
        {"ends": ["s1", "s2"], "bw_mbps": 100},
        {"ends": ["s1", "s3"], "bw_mbps": 500},
        {"ends": ["s3", "s2"], "bw_mbps": 500},
    ],
}
DIRECT = ("a", "s1", "s2", "b")
AROUND = ("a", "s1", "s3", "s2", "b")
# what grants may take of s1-s2 (100 Mbit/s): the rest is room for acknowledgements and the queue
G = NetworkController.GRANTABLE * 100


@pytest.fixture
def nc() -> NetworkController:
    """Rates capped at the grants (no spare), so what is installed is what was granted."""
    topo = parse_topology(TOPO, "twopaths.yaml")
    return NetworkController(topo, Cluster.from_topology(topo), ComputeController(), spare=False)


def install(nc: NetworkController, job, decision: Decision) -> None:
    """What the Master does for a job it launches: allocate, add the flows, push."""
    nc.cluster.allocate(job, decision)
    nc.add(job, decision)
    nc.push(nc.desired())


def remove(nc: NetworkController, name: str) -> None:
    nc.cluster.release(name)
    nc.forget(name)
    nc.push(nc.desired())


def two_task_job(name: str, mbps: float = 40):
    return ring_job(name, 2, Resources(0.5, 256), 4e5, mbps, iterations=10)


def place(job, path_ab, path_ba, rate: float) -> Decision:
    return Decision(
        job.name,
        {"w0": "a", "w1": "b"},
        [FlowAssignment("w0", "w1", path_ab, rate), FlowAssignment("w1", "w0", path_ba, rate)],
    )


def test_install_aggregates_per_node_pair_and_remove_undoes(nc):
    j1, j2 = two_task_job("j1"), two_task_job("j2")
    install(nc, j1, place(j1, DIRECT, DIRECT[::-1], 40))
    pinned = nc.pin(place(j2, AROUND, AROUND[::-1], 30))
    assert all(f.path in (DIRECT, DIRECT[::-1]) for f in pinned.flows)  # follows j1's path
    assert check_decision(nc.cluster, j2, pinned) == []
    install(nc, j2, pinned)
    flows = {(f["src"], f["dst"]): f for f in nc.desired().sdn_flows}
    assert flows[("a", "b")] == {
        "src": "a",
        "dst": "b",
        "path": ["s1", "s2"],
        "rate_mbps": 70.0,
        "symmetric": True,
        "name": "j1,j2",
    }
    assert nc.cluster.residual("s1", "s2") == pytest.approx(30.0)
    shaping = nc.desired().shaping
    assert [(r.dst_ip, r.rate_mbps) for r in shaping["a"]] == [("10.0.0.2", 70.0)]
    remove(nc, "j1")
    assert [f["rate_mbps"] for f in nc.desired().sdn_flows] == [30.0, 30.0]
    remove(nc, "j2")
    assert nc.desired().sdn_flows == () and nc.desired().shaping == {}
    assert nc.cluster.residual("s1", "s2") == pytest.approx(100.0)
    # agents were not registered: their shaping waits for them
    assert nc.dirty_shaping == {"a", "b"}


def test_pin_makes_a_decision_infeasible_when_the_shared_path_is_full(nc):
    j1, j2 = two_task_job("j1"), two_task_job("j2")
    install(nc, j1, place(j1, DIRECT, DIRECT[::-1], 80))
    pinned = nc.pin(place(j2, AROUND, AROUND[::-1], 30))
    problems = check_decision(nc.cluster, j2, pinned)
    assert problems and "over capacity" in problems[0]


def test_pin_within_one_decision():
    """Two flows of one job between the same node pair share the first one's path."""
    topo = parse_topology(TOPO, "twopaths.yaml")
    nc = NetworkController(topo, Cluster.from_topology(topo), ComputeController())
    d = Decision(
        "r4",
        {"w0": "a", "w1": "b", "w2": "a", "w3": "b"},
        [
            FlowAssignment("w0", "w1", DIRECT, 10),
            FlowAssignment("w1", "w2", DIRECT[::-1], 10),
            FlowAssignment("w2", "w3", AROUND, 10),
            FlowAssignment("w3", "w0", AROUND[::-1], 10),
        ],
    )
    pinned = nc.pin(d)
    assert [f.path for f in pinned.flows] == [DIRECT, DIRECT[::-1], DIRECT, DIRECT[::-1]]


def test_view_reserves_measured_background_and_marks_unschedulable(nc):
    j1 = two_task_job("j1")
    install(nc, j1, place(j1, DIRECT, DIRECT[::-1], 40))
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    nc.observe(
        [
            link("s1", "s2", 75.0),  # 40 ours + 35 unscheduled
            link("s2", "s1", 20.0),  # below our grant: no background
            link("s1", "s3", 0.5),  # noise
            link("s3", "s1", 9.0),  # noise too: under 2 % of its 500 Mbit/s
            link("s3", "s2", None),
        ],
        [],
    )  # not measured yet
    assert nc.unscheduled() == {("s1", "s2"): pytest.approx(35.0)}
    view = nc.view({"b"})
    assert view.offline == {"b"}
    assert view.residual("s1", "s2") == pytest.approx(G - 40 - 35)
    assert view.residual("s2", "s1") == pytest.approx(G - 40)
    assert nc.cluster.residual("s1", "s2") == pytest.approx(60.0)  # the real one is untouched
    report = {(r["src"], r["dst"]): r for r in nc.report()}
    assert report[("s1", "s2")]["granted_mbps"] == 40 and report[("s1", "s2")][
        "unscheduled_mbps"
    ] == pytest.approx(35.0)


def test_a_pairs_acknowledgements_on_its_way_back_are_not_another_tenant(nc):
    """a -> b's way back (s2 -> s1) carries its acknowledgements: what its entries count there, up
    to what acknowledges the data, is the Master's own traffic, not background."""
    j1 = two_task_job("j1")
    install(nc, j1, place(j1, DIRECT, AROUND[::-1], 40))
    assert all(f["symmetric"] for f in nc.desired().sdn_flows)
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    counted = [{"src": "a", "dst": "b", "hops": [{"mbps": 40.0}], "return_hops": [{"mbps": 1.5}]}]
    nc.observe([link("s2", "s1", 1.5), link("s1", "s2", 40.0)], counted)
    assert nc.unscheduled() == {}
    nc.observe([link("s2", "s1", 3.0), link("s1", "s2", 40.0)], [])  # not counted: a tenant
    assert nc.unscheduled() == {("s2", "s1"): pytest.approx(3.0)}
    # beyond what acknowledges 40 Mbit/s, what the way back carries is somebody else's
    counted[0]["return_hops"] = [{"mbps": 9.0}]
    nc.observe([link("s2", "s1", 9.0), link("s1", "s2", 40.0)], counted)
    assert nc.unscheduled() == {("s2", "s1"): pytest.approx(9.0 - 40.0 * 66 / 1514)}


def test_a_job_that_just_ended_is_not_taken_for_another_tenant(nc):
    """Its last traffic stays in the readings sampled before its end: the next job would go
    round a link it finds full. Two readings later, what is still there is somebody else's."""
    j1 = two_task_job("j1")
    install(nc, j1, place(j1, DIRECT, DIRECT[::-1], 40))
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    busy = [link("s1", "s2", 40.0), link("s2", "s1", 40.0)]
    nc.observe(busy, counters({("a", "b"): 40.0, ("b", "a"): 40.0}))
    remove(nc, "j1")
    assert nc.unscheduled() == {}
    assert nc.view(set()).residual("s1", "s2") == pytest.approx(G)
    asked_before_the_end = time.monotonic() - 1
    nc.observe(busy, [], asked_before_the_end)  # counts for nothing
    nc.observe(busy, [])  # asked for after the end, maybe sampled before it
    assert nc.unscheduled() == {}
    nc.observe(busy, [])
    assert nc.unscheduled() == {
        ("s1", "s2"): pytest.approx(40.0),
        ("s2", "s1"): pytest.approx(40.0),
    }


def test_a_pair_scheduled_again_is_counted_once(nc):
    """The next job on the same node pair: its counters count what the links carry of it, and a
    tenant beside it shows at once (the ended job is not subtracted a second time)."""
    j1, j2 = two_task_job("j1"), two_task_job("j2")
    install(nc, j1, place(j1, DIRECT, DIRECT[::-1], 40))
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    ours = counters({("a", "b"): 40.0, ("b", "a"): 40.0})
    readings = [link("s1", "s2", 70.0), link("s2", "s1", 40.0)]  # a tenant's 30 on s1 -> s2
    nc.observe(readings, ours)
    remove(nc, "j1")
    install(nc, j2, place(j2, DIRECT, DIRECT[::-1], 40))
    assert nc.unscheduled() == {("s1", "s2"): pytest.approx(30.0)}
    nc.observe(readings, ours)
    assert nc.unscheduled() == {("s1", "s2"): pytest.approx(30.0)}


def test_contended_links_are_those_whose_grants_no_longer_fit(nc):
    j1 = two_task_job("j1")
    install(nc, j1, place(j1, DIRECT, DIRECT[::-1], 40))
    link = lambda s, d, mbps, up=True: SimpleNamespace(src=s, dst=d, mbps=mbps, up=up)
    nc.observe([link("s1", "s2", 60.0)], [])  # 40 ours + 20 unscheduled on 100: room enough
    assert nc.contended() == set()
    nc.observe([link("s1", "s2", 99.0)], [])  # 59 unscheduled: 40 + 59 > 95 % of the link
    assert nc.contended() == {("s1", "s2")}
    nc.observe([link("s2", "s1", 0.0, up=False)], [])  # the link is down
    assert nc.contended() == {("s2", "s1")}
    assert nc.view(set()).residual("s2", "s1") == pytest.approx(0.0)
    nc.observe([], [])
    nc.set_capacity("s1", "s2", 30.0)  # below the grants
    assert nc.contended() == {("s1", "s2"), ("s2", "s1")}


def test_contended_flows_name_each_job_flow_on_a_contended_link(nc):
    j1, j2 = two_task_job("j1"), two_task_job("j2")
    install(nc, j1, place(j1, DIRECT, AROUND[::-1], 40))
    install(nc, j2, nc.pin(place(j2, DIRECT, AROUND[::-1], 20)))  # shares j1's node pairs
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    nc.observe([link("s1", "s2", 60.0)], [])
    assert nc.contended_flows() == {}
    nc.observe([link("s1", "s2", 99.0)], [])  # a tenant on a -> b's link only
    assert nc.contended_flows() == {"j1": ["w0>w1"], "j2": ["w0>w1"]}


# --- work-conserving rates: the spare capacity ---------------------------------------------------
def with_c(spare: bool = True) -> NetworkController:
    """TOPO and a third node c on s1, so that a->b and c->b share s1->s2."""
    spec = {
        **TOPO,
        "nodes": TOPO["nodes"] + [{"name": "c", "cpu": 2, "mem_mb": 2048}],
        "links": TOPO["links"] + [{"ends": ["c", "s1"], "bw_mbps": 1000}],
    }
    topo = parse_topology(spec, "twopaths.yaml")
    return NetworkController(topo, Cluster.from_topology(topo), ComputeController(), spare=spare)


def one_way(job, src: str, rate: float) -> Decision:
    """The job's w0 on `src`, w1 on b, both flows on the direct path."""
    there = (src, "s1", "s2", "b")
    return Decision(
        job.name,
        {"w0": src, "w1": "b"},
        [FlowAssignment("w0", "w1", there, rate), FlowAssignment("w1", "w0", there[::-1], rate)],
    )


def installed(nc: NetworkController) -> dict[tuple[str, str], float]:
    return {(f["src"], f["dst"]): f["rate_mbps"] for f in nc.desired().sdn_flows}


def counters(carried: dict[tuple[str, str], float]) -> list[dict]:
    """The SDN app's view of the scheduled pairs: what each one's last hop counts."""
    return [
        {"src": s, "dst": d, "hops": [{"mbps": 1.0}, {"mbps": mbps}]}
        for (s, d), mbps in carried.items()
    ]


def test_the_spare_capacity_is_shared_in_proportion_to_the_grants():
    nc = with_c()
    j1, j2 = two_task_job("j1"), two_task_job("j2")
    install(nc, j1, one_way(j1, "a", 40))
    assert installed(nc)[("a", "b")] == pytest.approx(
        G, abs=1e-3
    )  # alone: up to the grantable share
    install(nc, j2, one_way(j2, "c", 20))
    rates = installed(nc)
    # s1->s2: G - 60 granted spare, split 2:1 like the grants
    assert rates[("a", "b")] == pytest.approx(40 + (G - 60) * 2 / 3, abs=1e-3)
    assert rates[("c", "b")] == pytest.approx(20 + (G - 60) / 3, abs=1e-3)
    # the way back, b->s2->s1, is shared too; the senders' tc follows the installed rate
    assert rates[("b", "a")] + rates[("b", "c")] == pytest.approx(G, abs=1e-3)
    assert [r.rate_mbps for r in nc.desired().shaping["c"]] == [
        pytest.approx(rates[("c", "b")], abs=1e-3)
    ]
    # a job's flows get its spare in its grants' ratio; the view still reserves the grants only
    assert nc.installed()["j2"] == {
        "w0>w1": round(rates[("c", "b")], 3),
        "w1>w0": round(rates[("b", "c")], 3),
    }
    assert nc.cluster.residual("s1", "s2") == pytest.approx(40.0)
    remove(nc, "j1")  # j2 takes what j1 left
    assert installed(nc)[("c", "b")] == pytest.approx(G, abs=1e-3)


def test_unscheduled_traffic_takes_back_the_spare_but_never_the_grants():
    nc = with_c()
    j1 = two_task_job("j1")
    install(nc, j1, one_way(j1, "a", 40))
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    # the entries count 60 of our traffic; 30 more on s1->s2 belongs to another tenant
    assert nc.observe([link("s1", "s2", 90.0)], counters({("a", "b"): 60.0})) is True
    assert nc.unscheduled() == {("s1", "s2"): pytest.approx(30.0)}
    assert installed(nc)[("a", "b")] == pytest.approx(G - 30, abs=1e-3)
    # a move smaller than SPARE_STEP is not worth re-programming a meter
    assert nc.observe([link("s1", "s2", 93.0)], counters({("a", "b"): 60.0})) is False
    assert installed(nc)[("a", "b")] == pytest.approx(G - 30, abs=1e-3)
    # a tenant taking the whole link leaves the grant, and the link contended
    assert nc.observe([link("s1", "s2", 100.0)], counters({("a", "b"): 40.0})) is True
    assert installed(nc)[("a", "b")] == pytest.approx(40.0)
    assert nc.contended() == {("s1", "s2")}


def test_a_grant_left_unused_does_not_hide_another_tenant():
    """Unscheduled traffic is what the link carries less what our entries count, not our grant."""
    nc = with_c(spare=False)
    j1 = two_task_job("j1")
    install(nc, j1, one_way(j1, "a", 40))
    link = lambda s, d, mbps: SimpleNamespace(src=s, dst=d, mbps=mbps, up=True)
    nc.observe([link("s1", "s2", 65.0)], counters({("a", "b"): 5.0}))  # ours idles at 5
    assert nc.unscheduled() == {("s1", "s2"): pytest.approx(60.0)}
    assert nc.contended() == {("s1", "s2")}  # 40 granted + 60 > 95
    assert installed(nc)[("a", "b")] == 40.0  # no spare: the grant is the cap


def test_a_down_link_has_no_spare():
    nc = with_c()
    j1 = two_task_job("j1")
    install(nc, j1, one_way(j1, "a", 40))
    nc.observe([SimpleNamespace(src="s1", dst="s2", mbps=0.0, up=False)], [])
    assert installed(nc)[("a", "b")] == pytest.approx(40.0)
