"""Faithful runs: time dilation's conversions, the CPU budget and the dilation it chooses, the
fidelity verdict of a run, and comparisons paired by seed with their intervals (pure logic,
hand-made data with known answers)."""

from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

import pytest
from rich.console import Console
from scipy import stats as scipy_stats

from edge import tc
from experiments import report, stats
from experiments.e2e import budget, fidelity
from experiments.e2e.scenario import ScenarioError
from protocol.dilation import NONE, Dilation
from sdn_app.flows import MeterPolicy
from testbed import hostcost
from testbed.hostcost import HostCost
from topologies import parse_topology

# --- dilation ------------------------------------------------------------------------------------


def test_a_dilation_converts_at_the_host_boundary_and_back():
    d = Dilation(2.5, origin=1000.0)
    assert d.host_mbps(100) == 40 and d.emulated_mbps(40) == 100
    assert d.host_cores(0.5) == pytest.approx(0.2) and d.emulated_cores(0.2) == pytest.approx(0.5)
    assert d.host_seconds(2) == 5 and d.emulated_seconds(5) == 2
    # instants: the origin is the same on both clocks; 10 host s later is 4 emulated s later
    assert d.emulated_instant(1000.0) == 1000.0 and d.emulated_instant(1010.0) == 1004.0
    assert abs(d.time() - d.emulated_instant(time.time())) < 0.5
    assert not NONE.on and d.on


def test_a_dilation_travels_as_text_and_bad_text_is_one_line():
    d = Dilation(2.0, 1764230000.25)
    assert Dilation.parse(d.spec()) == d
    assert Dilation.parse("") == NONE and Dilation.parse(None) == NONE
    assert Dilation.parse("3").factor == 3.0
    for bad in ("0.5", "x", "2@y", "nan", "inf"):
        with pytest.raises(ValueError, match=r"time dilation|dilation factor"):
            Dilation.parse(bad)


def test_a_dilated_class_runs_at_the_hosts_share_and_keeps_its_bytes():
    plain, dilated = tc._htb_args(100, NONE), tc._htb_args(100, Dilation(4.0, 0.0))
    assert "rate 100000kbit" in plain and "rate 25000kbit" in dilated
    # burst and quantum are bytes of the emulated rate: the same emulated milliseconds at any K
    assert plain.split("burst")[1] == dilated.split("burst")[1]


def test_a_dilated_meter_runs_at_the_hosts_share_with_the_same_burst_bits():
    assert MeterPolicy(burst_s=0.5).params(20) == (20_000, 10_000)
    assert MeterPolicy(burst_s=0.5, dilation=Dilation(2.0, 0.0)).params(20) == (10_000, 10_000)


# --- the budget ----------------------------------------------------------------------------------
# host CPU s per Gbit per switch at 10 and 100 Mbit/s a flow; idle cores
COST = HostCost("k", 2, "user", (10.0, 100.0), (1.0, 0.5), 0.05, "now")

LINE = parse_topology(
    {
        "name": "line",
        "switches": [{"name": "s1"}, {"name": "s2"}],
        "nodes": [{"name": n, "cpu": 1.0, "mem_mb": 1024} for n in ("a", "b", "c")],
        "links": [
            {"ends": ["a", "s1"], "bw_mbps": 100},
            {"ends": ["b", "s1"], "bw_mbps": 100},
            {"ends": ["s1", "s2"], "bw_mbps": 100},
            {"ends": ["c", "s2"], "bw_mbps": 100},
        ],
    },
    "line",
)


def test_switches_between_compute_nodes_are_averaged_over_every_pair():
    # a-b cross s1; a-c and b-c cross s1 and s2
    assert budget.mean_switches(LINE) == pytest.approx((1 + 2 + 2) / 3)


def test_a_flow_costs_the_switches_more_per_gbit_the_slower_it_runs():
    # 100 Mbit/s over 2 switches: 0.1 Gbit/s x 2 x 0.5; at 10: 0.01 x 2 x 1.0
    assert COST.switching_cores([100.0], 2) == pytest.approx(0.1)
    assert COST.switching_cores([10.0], 2) == pytest.approx(0.02)
    # between the rates measured, on the log of the rate; beyond them, held at the ends
    assert COST.switching_cores([1.0], 2) == pytest.approx(0.002)
    mid = COST.switching_cores([math.sqrt(10 * 100)], 1) / (math.sqrt(1000) / 1000)
    assert mid == pytest.approx(0.75)


def test_the_budget_picks_the_least_dilation_at_which_the_run_fits():
    b = budget.budget(LINE, [0.5, 0.5, 0.5, 0.5], [0.25, 0.25], [100.0] * 5, {"a", "b", "c"}, COST)
    assert b.workers == 2.0 and b.tenants == 0.5  # the nodes could run 3 cores of tasks
    assert b.switching(1) == pytest.approx(5 * COST.switching_cores([100.0], 5 / 3), rel=0.01)
    k = b.dilation()
    assert k is not None and k % budget.K_STEP == 0
    assert b.fits(k) and not b.fits(k - budget.K_STEP)
    # dilated, the switches cost more than their 1/K share: the flows run slower
    assert b.switching(k) > b.switching(1) / k
    assert f"at K = {k:g}" in b.line(k) and b.to_json(k)["need"] <= b.usable


def test_workers_never_count_more_than_the_nodes_can_run():
    b = budget.budget(LINE, [1.0] * 9, [], [], {"a", "b"}, COST)
    assert b.workers == 2.0  # a and b hold 2 cores; c is another tenant's


def test_the_host_is_busy_but_for_idle_iowait_and_with_it_niced_time(monkeypatch, tmp_path):
    # /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 40 20 500 30 5 3 2 7 1\ncpu0 1 2 3\n")
    monkeypatch.setattr(hostcost, "Path", lambda p: stat if p == "/proc/stat" else Path(p))
    tick = os.sysconf("SC_CLK_TCK")
    # guest time is inside user and nice already: not counted twice
    assert hostcost.busy_seconds() == pytest.approx((100 + 40 + 20 + 5 + 3 + 2) / tick)
    # a run's verdict leaves out what processes at a positive nice took: they yield it on demand
    assert hostcost.busy_seconds(niced=False) == pytest.approx((100 + 20 + 5 + 3 + 2) / tick)


def test_a_host_whose_fixed_costs_fill_it_fits_nothing():
    busy = HostCost("k", 2, "user", (10.0,), (0.5,), 1.7, "now")  # idle + fixed > 90 % of 2
    assert budget.budget(LINE, [0.1], [], [], {"a"}, busy).dilation() is None


@pytest.mark.parametrize("fixed, says", [(0.1, "it needs K >= "), (1.7, "it fits at no K up to 8")])
def test_a_given_dilation_the_run_does_not_fit_is_refused_in_one_line(fixed, says):
    cost = HostCost("k", 2, "user", (10.0,), (0.5,), fixed, "now")
    need = budget.budget(LINE, [0.5] * 4, [], [100.0] * 5, {"a", "b", "c"}, cost)
    with pytest.raises(ScenarioError) as e:
        budget.chosen_dilation(need, cost, 1.0, False, Console(quiet=True), "this host", "unfit")
    assert says in str(e.value) and "--over-budget" in str(e.value) and "\n" not in str(e.value)
    k, record = budget.chosen_dilation(need, cost, 1.0, True, Console(quiet=True), "here", "")
    assert k.factor == 1.0 and record["chosen"] == "given"


# --- the verdict ---------------------------------------------------------------------------------
def flow(ratio: float, grant: float = 10.0) -> dict:
    return {
        "rate_mbps": grant,
        "wire_mbps": grant * ratio,
        "wire_ratio": ratio,
        "judged_busy_s": 5.0,
        "pair_shared": False,
    }


def run(
    switch=0.02, saturated=0.01, ratios=(0.95, 1.0), drops=(0, 10_000), collective="ring"
) -> dict:
    return {
        "cpu_stalled_share": 0.8,  # reported, not judged: throttled quotas count as waiting
        "switch_wait_share": switch,
        "host_busy": {"mean": 0.5, "max": 0.95, "saturated_share": saturated},
        "switch_drops": {"rx_dropped": drops[0], "rx_packets": drops[1]},
        "jobs": [
            {
                "job": "heavy",
                "collective": collective,
                "flows": [flow(r) for r in ratios],
                "workers": [{"task": "t0", "starved_share": 0.6}],  # reported, not judged
            }
        ],
    }


def test_a_run_that_holds_every_invariant_is_faithful():
    v = fidelity.verdict(run())
    assert v["faithful"] and v["reasons"] == []
    assert v["binding_flows"] == 2 and v["binding_in_band"] == 2


@pytest.mark.parametrize(
    ("broken", "says"),
    [
        (dict(switch=0.30), "forwarding thread waited for a core 30%"),
        (dict(saturated=0.4), "90% busy or more in 40% of the run's seconds"),
        (dict(ratios=(0.95, 0.6)), "1 of 2 binding flows outside"),
        (dict(ratios=(1.2,)), "outside"),
        (dict(drops=(50, 10_000)), "dropped 50 of 10000"),
    ],
)
def test_each_broken_invariant_makes_the_run_unfaithful_and_says_why(broken, says):
    v = fidelity.verdict(run(**broken))
    assert not v["faithful"] and len(v["reasons"]) == 1 and says in v["reasons"][0]


def ring_row(gradient_bytes: int | None, calls: int | None, ratios: tuple, rate: float) -> dict:
    return {
        "job": "light",
        "collective": "ring",
        "gradient_bytes": gradient_bytes,
        "comm_calls": calls,
        "placement": {"w0": "a", "w1": "b", "w2": "c"},
        "flows": [flow(r, rate) | {"rate_max_mbps": rate} for r in ratios],
    }


CNN, MLP_LARGE = 406_504, 8_966_184  # the workers' gradient bytes (workloads.models)


def test_a_ring_that_moves_little_per_exchange_may_read_above_the_band_by_its_burst():
    """A ring's sender idles before each exchange and its first B bytes go out at line rate on
    a full token bucket: over an iteration of P bytes and n exchanges it reads up to
    P / (P − n B) × its rate while busy. The CNN at 160 Mbit/s (an 80 KB burst, one bucket) may
    read 1.05 × 1.17; mlp-large's two buckets at the same rate only 1.05 × 1.014."""
    assert tc.burst_bytes(160) == 80_000
    small, large = ring_row(CNN, 1, (1.11, 1.0), 160), ring_row(MLP_LARGE, 2, (1.11, 1.0), 160)
    per_iter = 4 / 3 * CNN
    assert fidelity.wire_top(small, small["flows"][0]) == pytest.approx(
        1.05 * per_iter / (per_iter - 80_000)
    )
    assert fidelity.wire_top(large, large["flows"][0]) == pytest.approx(1.05 * 1.01356, abs=1e-4)
    v = fidelity.verdict({"jobs": [small]})
    assert v["faithful"] and v["binding_in_band"] == 2
    v = fidelity.verdict({"jobs": [large]})
    assert not v["faithful"] and "1 of 2 binding flows outside" in v["reasons"][0]
    assert fidelity.RAISED in v["reasons"][0]
    # more than the bursts allow is more than the shaper lets through
    assert not fidelity.verdict({"jobs": [ring_row(CNN, 1, (1.6, 1.0), 160)]})["faithful"]
    # below the band is the host's doing whatever the exchanges: the burst only adds
    assert not fidelity.verdict({"jobs": [ring_row(CNN, 1, (0.85, 1.0), 160)]})["faithful"]
    # an iteration that the bursts can carry whole has no top to hold it to
    tiny = ring_row(50_000, 1, (3.0, 1.0), 160)
    assert fidelity.wire_top(tiny, tiny["flows"][0]) == math.inf
    assert fidelity.verdict({"jobs": [tiny]})["faithful"]
    # a row recorded before rows held these counts is judged by the plain band, as it was
    for old in (ring_row(None, None, (1.11, 1.0), 160), ring_row(CNN, None, (1.11, 1.0), 160)):
        assert fidelity.wire_top(old, old["flows"][0]) == fidelity.WIRE_BAND[1]
        v = fidelity.verdict({"jobs": [old]})
        assert not v["faithful"] and fidelity.RAISED not in v["reasons"][0]
    assert fidelity.over_grant(small) == [] and len(fidelity.over_grant(large)) == 1


@pytest.mark.parametrize("collective", ["ps", "star", "tree", "all-to-all", "custom"])
def test_message_flows_are_not_judged_on_the_wire(collective):
    """A collective that sends one message per flow and round reads far on both sides of the
    band on an idle host (fidelity.STREAMING): its flows neither break the verdict nor count as
    judged; the same flows of a ring do."""
    v = fidelity.verdict(run(ratios=(0.6, 1.3), collective=collective))
    assert v["faithful"] and v["binding_flows"] == 0 and v["wire_ratio_median"] is None
    assert not fidelity.verdict(run(ratios=(0.6, 1.3)))["faithful"]
    rows = run(collective=collective)["jobs"]
    assert fidelity.binding_flows(rows[0]) == [] and fidelity.rate_ratios(rows[0]) == []


def test_what_could_not_be_measured_is_not_held_against_a_run():
    assert fidelity.verdict({"jobs": []})["faithful"]


def test_tcp_timeouts_are_reported_not_judged():
    """A flow's retransmission timeouts stall its ring in the emulated network (a queue that
    dropped what was resent), not on the host: the run stays faithful and says where its time
    went; a kernel that does not count them leaves the figure out."""
    stalled = run()
    stalled["jobs"][0]["flows"][0] |= {"tcp_rto": 7, "tcp_rto_s": 9.3}
    stalled["jobs"][0]["flows"][1] |= {"tcp_rto": 0, "tcp_rto_s": 0.0}
    v = fidelity.verdict(stalled)
    assert v["faithful"] and v["tcp_timeouts"] == 7 and v["tcp_rto_s_max"] == 9.3
    v = fidelity.verdict(run())
    assert v["tcp_timeouts"] is None and v["tcp_rto_s_max"] is None


def test_a_workers_wait_counts_only_beyond_what_its_quota_held_it_back():
    # a busy loop at --cpus 0.2 on an idle host: waited 5.10 s, throttled 5.15 s, used 1.3 s
    idle_host = {"main_used_s": 1.3, "main_wait_s": 5.10, "throttled_s": 5.15}
    assert fidelity.starved_share(idle_host) == 0
    # three at 0.8 on 2 cores: used 3.2, waited 7.5, never throttled
    busy_host = {"main_used_s": 3.2, "main_wait_s": 7.5, "throttled_s": 0.0}
    assert fidelity.starved_share(busy_host) == pytest.approx(7.5 / 10.7, abs=1e-3)
    assert fidelity.starved_share({**busy_host, "throttled_s": None}) is None


# --- comparisons with confidence ------------------------------------------------------------------
def test_a_paired_ratio_is_a_geometric_mean_with_a_t_interval():
    r = stats.paired_ratio([1.0, 2.0, 4.0], [2.0, 4.0, 8.0])  # 0.5 every seed
    assert r.ratio == 0.5 and r.low == r.high == 0.5 and r.n == 3
    r = stats.paired_ratio([0.5, 0.8], [1.0, 1.0])
    assert r.ratio == pytest.approx(math.sqrt(0.4), abs=1e-4)
    assert r.low < r.ratio < r.high
    assert stats.paired_ratio([1.0], [2.0]).low is None


def test_a_verdict_needs_the_whole_interval_on_one_side_of_the_target():
    assert stats.Ratio(0.6, 0.55, 0.7, 5).judge(0.75) == "met"
    assert stats.Ratio(0.8, 0.76, 0.85, 5).judge(0.75) == "missed"
    assert stats.Ratio(0.74, 0.6, 0.9, 5).judge(0.75) == "inconclusive"
    assert stats.Ratio(0.5, None, None, 1).judge(0.75) == "inconclusive"


def test_the_seeds_an_inconclusive_verdict_needs():
    # log ratios with sd s over n seeds: the interval is t(n-1) s / sqrt(n) wide either side
    logs = [math.log(x) for x in (0.78, 0.84, 0.93)]
    r = stats.paired_ratio([math.exp(v) for v in logs], [1.0] * 3)
    assert r.judge(0.90) == "inconclusive"
    m = r.seeds_for_verdict(0.90)
    assert m is not None and m > 3
    # as many seeds again with the same spread and ratio give a verdict; one fewer does not
    sd = statistics.stdev(logs)
    for n, settled in ((m, True), (m - 1, False)):
        half = scipy_stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
        assert bool(half < abs(math.log(0.90 / r.ratio))) == settled
    assert stats.Ratio(0.5, None, None, 1).seeds_for_verdict(0.9) is None
    assert stats.Ratio(0.9, 0.8, 1.0, 3).seeds_for_verdict(0.9) is None  # at the target


def results_of(tta: dict[tuple[str, int], float], unfaithful: set = frozenset()) -> dict:
    runs = []
    for (scheduler, seed), t in tta.items():
        runs.append(
            {
                "scheduler": scheduler,
                "seed": seed,
                "fidelity": {"faithful": (scheduler, seed) not in unfaithful},
                "jobs": [{"tta_s": t, "reached_target": True, "jct_s": t + 10}],
            }
        )
    return {"scenario": {"timeout_s": 100}, "runs": runs}


def test_ces_ppo_is_compared_paired_by_seed_over_faithful_runs_only():
    tta = {("ces-ppo", s): 10.0 + s for s in range(4)}
    tta |= {("k8s-spread", s): 20.0 + 2 * s for s in range(4)}
    tta |= {("first-fit", s): 30.0 for s in range(4)}
    tta |= {("network-aware/ces", s): (10.0 + s) * (1.05 + 0.01 * s) for s in range(4)}
    tta[("network-aware/ces", 3)] = 1.0  # unfaithful: left out, or the interval would be wide
    out = report.comparisons(results_of(tta, {("network-aware/ces", 3)}), 100)
    by = {c["other"]: c for c in out}
    assert set(by) == {"k8s-spread", "network-aware/ces"}  # the best blind one, and the parts
    assert by["k8s-spread"]["tta"].ratio == pytest.approx(0.5) and by["k8s-spread"]["tta"].n == 4
    assert by["k8s-spread"]["verdict"] == "met" and by["k8s-spread"]["target"] == 0.75
    parts = by["network-aware/ces"]
    assert parts["tta"].n == 3 and parts["tta"].ratio == pytest.approx(1 / 1.06, abs=0.01)
    assert parts["verdict"] == "missed"  # 0.94-0.95 every faithful seed: above 0.90
