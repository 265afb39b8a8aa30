"""Counters → Mbit/s and ports → directed links (SDN app statistics, pure logic)."""

from __future__ import annotations

import pytest

from sdn_app.stats import DURATION_UNSUPPORTED, Rates, Sample, link_ends, rate_mbps, sample_time
from topologies import load_topology


def test_rate_from_two_samples():
    assert rate_mbps(Sample(0, 10.0), Sample(2_500_000, 12.0)) == pytest.approx(10.0)


@pytest.mark.parametrize(
    "prev, cur",
    [
        (Sample(100, 5.0), Sample(50, 6.0)),  # counter reset
        (Sample(100, 5.0), Sample(200, 5.0)),  # no time passed
        (Sample(100, 6.0), Sample(200, 5.0)),
    ],
)  # clock restarted
def test_rate_unknowable(prev, cur):
    assert rate_mbps(prev, cur) is None


def test_sample_time_prefers_the_switch_clock():
    assert sample_time(12, 500_000_000, received=99.0) == 12.5
    assert sample_time(DURATION_UNSUPPORTED, 0, received=99.0) == 99.0
    assert sample_time(0, 0, received=99.0) == 99.0


def test_rates_track_each_key_and_forget():
    r = Rates()
    r.update((1, 2, "tx"), Sample(0, 0.0))
    assert r.rate((1, 2, "tx")) is None  # one sample: no rate yet
    r.update((1, 2, "tx"), Sample(1_000_000, 1.0))
    r.update((2, 2, "tx"), Sample(0, 0.0))
    r.update((2, 2, "tx"), Sample(125_000, 0.5))
    assert r.rate((1, 2, "tx")) == pytest.approx(8.0)
    assert r.rate((2, 2, "tx")) == pytest.approx(2.0)
    assert r.value((1, 2, "tx")) == 1_000_000
    r.update((1, 2, "tx"), Sample(10, 2.0))  # port re-created: the stale rate must go
    assert r.rate((1, 2, "tx")) is None
    r.forget(lambda key: key[0] == 2)
    assert r.rate((2, 2, "tx")) is None and r.value((2, 2, "tx")) is None


def test_link_ends_count_each_direction_at_a_switch():
    topo = load_topology("campus")
    ends = {(e.src, e.dst): e for e in link_ends(topo)}
    assert len(ends) == 2 * len(topo.links)
    up = ends[("lab1", "acc1")]  # a host sends: the switch receives it on the host's port
    down = ends[("acc1", "lab1")]
    port = topo.access_link("lab1").port_of("acc1")
    assert (up.dpid, up.port, up.counter) == (topo.switch("acc1").dpid, port, "rx")
    assert (down.dpid, down.port, down.counter) == (topo.switch("acc1").dpid, port, "tx")
    core = ends[("core2", "agg2")]
    link = next(lk for lk in topo.links if {lk.a, lk.b} == {"core2", "agg2"})
    assert (core.dpid, core.port, core.counter, core.capacity_mbps) == (
        topo.switch("core2").dpid,
        link.port_of("core2"),
        "tx",
        200.0,
    )
