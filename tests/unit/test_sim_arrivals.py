"""Workload generation: arrival processes, the job mix, tidal availability, scenario specs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from scheduler.arrivals import (
    ArrivalError,
    ArrivalSpec,
    JobMix,
    background_traffic,
    bursty_times,
    make_scenario,
    parse_arrivals,
    poisson_times,
    tidal_availability,
)
from scheduler.model import Cluster
from scheduler.rounds import estimated_iteration_s
from scheduler.simulator import NodeJoin, NodeLeave
from topologies import load_topology


@pytest.fixture(scope="module")
def campus() -> Cluster:
    return Cluster.from_topology(load_topology("campus"))


def counts(times: list[float], width: float) -> np.ndarray:
    return np.bincount((np.asarray(times) // width).astype(int))


def test_poisson_has_the_rate_and_poisson_counts():
    times = poisson_times(np.random.default_rng(0), 20000, rate=0.5)
    assert np.all(np.diff(times) > 0)
    assert np.mean(np.diff(times)) == pytest.approx(2.0, rel=0.03)
    c = counts(times, 100.0)[:-1]
    assert np.var(c) / np.mean(c) == pytest.approx(1.0, abs=0.15)  # index of dispersion


def test_bursty_keeps_the_mean_rate_but_clusters_arrivals():
    times = bursty_times(
        np.random.default_rng(0), 20000, rate=0.5, burst=8, burst_frac=0.1, cycle_s=3600
    )
    assert np.all(np.diff(times) > 0)
    assert len(times) / times[-1] == pytest.approx(0.5, rel=0.15)
    c = counts(times, 100.0)[:-1]
    assert np.var(c) / np.mean(c) > 3.0


def test_tidal_nodes_leave_for_their_busy_share_of_each_day():
    nodes = [f"h{i}" for i in range(40)]
    day, busy = 1000.0, 0.4
    events = tidal_availability(
        np.random.default_rng(1), nodes, 10 * day, busy=busy, always_on=0.25, day_s=day
    )
    assert all(a.time <= b.time for a, b in itertools.pairwise(events))
    per_node: dict[str, list] = {}
    for e in events:
        per_node.setdefault(e.node, []).append(e)
    assert 20 <= len(per_node) <= 38  # about 75 % of the nodes are tidal
    for _node, evs in per_node.items():
        kinds = [type(e) for e in evs]
        assert kinds == [NodeLeave, NodeJoin] * (len(evs) // 2)  # alternate, start by leaving
        for leave, join in zip(evs[::2], evs[1::2]):
            if leave.time > 0:
                assert join.time - leave.time == pytest.approx(busy * day)
        assert 9 <= len(evs) // 2 <= 11  # one busy spell a day


def test_tidal_peaks_are_afternoon_or_evening():
    day = 24.0
    events = tidal_availability(
        np.random.default_rng(2),
        [f"h{i}" for i in range(200)],
        3 * day,
        busy=0.25,
        always_on=0.0,
        day_s=day,
    )
    mids = [(e.time + 0.125 * day) % day for e in events if isinstance(e, NodeLeave) and e.time > 0]
    hours_off = [min(abs((m - peak + 12) % 24 - 12) for peak in (14.0, 21.0)) for m in mids]
    assert max(hours_off) <= 4.5  # peaks at 14:00 or 21:00, ±1 h normal noise
    assert np.mean(np.asarray(hours_off) <= 1.0) > 0.5


def test_background_flows_are_between_distinct_nodes_within_the_horizon():
    flows = background_traffic(np.random.default_rng(0), ["a", "b", "c"], 36000.0, per_hour=60)
    assert 500 <= len(flows) <= 700
    assert all(f.src != f.dst and 0 <= f.time < 36000 and 1 <= f.demand_mbps <= 100 for f in flows)


def test_job_mix_is_reproducible_and_shaped_as_documented(campus):
    mix = JobMix()
    a = [mix.sample(np.random.default_rng(5), campus, "j")]
    b = [mix.sample(np.random.default_rng(5), campus, "j")]
    assert a[0] == b[0]
    rng = np.random.default_rng(0)
    jobs = [mix.sample(rng, campus, f"j{i}") for i in range(3000)]
    single = np.mean([len(j.tasks) == 1 for j in jobs])
    assert 0.3 <= single <= 0.5  # "many small jobs" (1 worker: 35 %, more after halving)
    total_cpu = sum(campus.capacity(n).cpu for n in campus.compute_nodes())
    assert all(j.total_demand().cpu <= 0.25 * total_cpu + 1e-9 for j in jobs)
    assert all(j.iterations >= 1 and bool(j.flows) == (len(j.tasks) > 1) for j in jobs)
    nominal = [j.iterations * estimated_iteration_s(j) for j in jobs]
    assert np.median(nominal) == pytest.approx(900, rel=0.2)
    assert np.mean([j.deadline is not None for j in jobs]) == pytest.approx(0.3, abs=0.04)
    assert {j.collective for j in jobs} == {"ring", "star", "tree", "all-to-all"}


def test_parse_arrivals_reads_keys_and_rejects_bad_specs():
    spec = parse_arrivals("bursty:n=600,load=0.9,tidal=1,background=20")
    assert spec == ArrivalSpec(process="bursty", n=600, load=0.9, tidal=1, background=20.0)
    assert parse_arrivals("poisson") == ArrivalSpec()
    for bad, words in [
        ("uniform:n=3", "unknown process"),
        ("poisson:n=abc", "n must be an integer"),
        ("poisson:speed=3", "not KEY=VALUE"),
        ("poisson:n", "not KEY=VALUE"),
        ("poisson:load=-1", "≥ 0"),
        ("poisson:n=0", "n must be ≥ 1"),
        ("bursty:burst_frac=1", "in (0, 1)"),
        ("poisson:load=0", "load > 0"),
        ("poisson:load=nan", "≥ 0"),
    ]:
        with pytest.raises(ArrivalError, match=words.replace("(", r"\(").replace(")", r"\)")):
            parse_arrivals(bad)


def test_scenario_is_reproducible_and_offers_the_asked_load(campus):
    spec = parse_arrivals("poisson:n=400,load=0.6")
    a, b = make_scenario(spec, campus, 3), make_scenario(spec, campus, 3)
    assert [(j.name, j.submit_time, j.iterations) for j in a.jobs] == [
        (j.name, j.submit_time, j.iterations) for j in b.jobs
    ]
    assert make_scenario(spec, campus, 4).jobs[0].submit_time != a.jobs[0].submit_time
    work = sum(
        sum(t.demand.cpu for t in j.tasks) * j.iterations * estimated_iteration_s(j) for j in a.jobs
    )
    cores = sum(campus.capacity(n).cpu for n in campus.compute_nodes())
    assert work / a.jobs[-1].submit_time / cores == pytest.approx(0.6, rel=0.35)
    assert a.events == []
    tidal = make_scenario(parse_arrivals("poisson:n=50,tidal=1,background=10"), campus, 3)
    assert any(isinstance(e, NodeLeave) for e in tidal.events)
