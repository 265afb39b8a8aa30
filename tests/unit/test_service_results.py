"""From the Master's view of a job to results rows, and from results.json to summary.md,
results.csv and the figures (hand-made data with known answers)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from experiments import (
    plots,
    report,
)
from experiments.e2e import fidelity, rows


def it(i: int, payload: int, comm_s: float) -> dict:
    return {
        "type": "iter",
        "iter": i,
        "iter_s": comm_s + 0.01,
        "comm_s": comm_s,
        "payload_tx_bytes": payload,
    }


def test_measured_mbps_is_the_median_collective_goodput_per_outgoing_flow():
    recs = [it(i, 1_000_000, 0.8) for i in range(2)] + [
        it(i, 1_000_000, t) for i, t in enumerate([0.1, 0.2, 0.4, 0.2, 0.2], start=2)
    ]
    # warm-up dropped; median of 8 Mbit over {0.1, 0.2, 0.4, 0.2, 0.2} s = 40 Mbit/s
    assert rows.measured_mbps(recs, 1) == pytest.approx(40.0)
    assert rows.measured_mbps(recs, 2) == pytest.approx(20.0)
    assert rows.measured_mbps([{"type": "eval"}], 1) is None


def view(reached: bool) -> dict:
    r0 = [
        {"type": "start"},
        it(1, 800_000, 0.1),
        it(2, 800_000, 0.1),
        it(3, 800_000, 0.1),
        {"type": "eval", "iter": 3, "elapsed_s": 1.5, "accuracy": 0.5},
        {"type": "eval", "iter": 6, "elapsed_s": 3.0, "accuracy": 0.92 if reached else 0.6},
        {
            "type": "end",
            "reached_target": reached,
            "tta_s": 3.0 if reached else None,
            "iters": 6,
            "startup_s": 9.0,
            "tcp": {
                "address": "10.0.0.1",
                "peers": {
                    "10.0.0.2": {
                        "bytes_acked": 10_000_000,
                        "busy_us": 1_000_000,
                        "bytes_retrans": 10_000,
                        "rwnd_limited_us": 100_000,
                        "rto_count": 3,
                        "rto_ms": 2_500,
                        "bytes_sent": 10_010_000,
                        "segs_out": 6_000,
                        "options": 1,
                    }
                },
            },
        },
    ]
    r1 = [
        it(1, 400_000, 0.1),
        it(2, 400_000, 0.1),
        it(3, 400_000, 0.1),
        # stopped before its end: its last evaluation has the counters
        {
            "type": "eval",
            "iter": 3,
            "elapsed_s": 1.5,
            "accuracy": 0.5,
            "tcp": {
                "address": "10.0.0.2",
                "peers": {
                    "10.0.0.1": {
                        "bytes_acked": 9_600_000,
                        "busy_us": 2_000_000,
                        "bytes_sent": 9_600_000,
                        "segs_out": 10_000,
                        "options": 0,
                    },
                    "10.0.0.9": {"bytes_acked": 1, "busy_us": 1},
                },
            },
        },
    ]
    return {
        "name": "heavy.r0",
        "state": "finished",
        "reason": "",
        "collective": "ring",
        "tasks": ["w0", "w1"],
        "workload": {"model": "mlp-large"},
        "jct_s": 20.0,
        "events": [],
        "records": {"heavy.r0-w0-a1": r0, "heavy.r0-w1-a1": r1},
        "attempts": [
            {
                "number": 1,
                "placement": {"w0": "a", "w1": "b"},
                "workers": {"w0": "heavy.r0-w0-a1", "w1": "heavy.r0-w1-a1"},
                "predicted_iteration_s": 0.1,
                "decision_s": 0.002,
                "flows": [
                    {
                        "src": "w0",
                        "dst": "w1",
                        "src_node": "a",
                        "dst_node": "b",
                        "path": ["a", "s1", "b"],
                        "rate_mbps": 80.0,
                    },
                    {
                        "src": "w1",
                        "dst": "w0",
                        "src_node": "b",
                        "dst_node": "a",
                        "path": ["b", "s1", "a"],
                        "rate_mbps": 40.0,
                    },
                ],
            }
        ],
    }


def test_job_row():
    row = rows.job_row("k8s-spread", 2, "heavy", view(True), timed_out=False)
    assert row["job"] == "heavy" and row["seed"] == 2 and row["state"] == "finished"
    assert row["reached_target"] and row["tta_s"] == 3.0 and row["final_accuracy"] == 0.92
    assert row["placement"] == {"w0": "a", "w1": "b"} and row["jct_s"] == 20.0
    assert [f["measured_mbps"] for f in row["flows"]] == [pytest.approx(64.0), pytest.approx(32.0)]
    # the kernel's counters of the connection to the receiver's address
    w0_w1, w1_w0 = row["flows"]
    assert w0_w1["tcp_mbps"] == pytest.approx(80.0) and w1_w0["tcp_mbps"] == pytest.approx(38.4)
    # on the wire: bytes sent + 66 (timestamps) or 54 bytes of headers a segment
    assert w0_w1["wire_mbps"] == pytest.approx((10_010_000 + 66 * 6_000) * 8 / 1e6)
    assert w1_w0["wire_mbps"] == pytest.approx((9_600_000 + 54 * 10_000) * 8 / 2e6)
    assert w0_w1["tcp_retrans_share"] == pytest.approx(0.001)
    assert w0_w1["tcp_rwnd_limited_share"] == pytest.approx(0.1)
    assert w0_w1["tcp_rto"] == 3 and w0_w1["tcp_rto_s"] == 2.5
    assert w1_w0["tcp_rto"] is None and w1_w0["tcp_rto_s"] is None  # a kernel without them
    assert row["curve"] == [[1.5, 0.5], [3.0, 0.92]]
    assert row["decision_ms"] == 2.0 and row["median_iter_s"] == pytest.approx(0.11)
    late = rows.job_row("k8s-spread", 2, "heavy", view(False), timed_out=True)
    assert late["state"] == "timeout" and not late["reached_target"]
    assert late["tta_s"] is None and late["jct_s"] is None


def results() -> dict:
    def run_(scheduler: str, seed: int, tta: float | None) -> dict:
        row = rows.job_row(scheduler, seed, "heavy", view(tta is not None), timed_out=False)
        row["tta_s"] = tta
        row["jct_s"] = None if tta is None else tta + 5.0  # queued 5 s; unfinished: the timeout
        light = {
            **row,
            "job": "light",
            "flows": [],
            "tta_s": 1.0,
            "reached_target": True,
            "jct_s": 10.0,
        }
        return {
            "scheduler": scheduler,
            "seed": seed,
            "wall_s": 30.0,
            "jobs": [row, light],
            "links": {
                "t": [0.0, 2.0, 4.0],
                "mbps": {"a>s1": [0.0, 60.0, None], "lab3>acc1": [40.0, None, 50.0]},
                "capacity_mbps": {"a>s1": 100.0, "lab3>acc1": 100.0},
            },
        }

    return {
        "version": 1,
        "topology": "campus",
        "schedulers": ["ces-ppo", "k8s-spread"],
        "seeds": 2,
        "machine": {"cores": 2, "loadavg": [0.5, 0.5, 0.5]},
        "scenario": {
            "name": "t",
            "timeout_s": 100.0,
            "description": "",
            "jobs": [
                {"name": "heavy", "model_params": 2_000_000},
                {"name": "light", "model_params": 100_000, "target_accuracy": 0.9},
            ],
        },
        "background": [{"src": "lab3", "dst": "srv3", "mbps": 50, "path": ["acc1"]}],
        "wall_s": 123.0,
        "bringup_s": 10.0,
        "teardown_s": 3.0,
        "runs": [
            run_("ces-ppo", 0, 30.0),
            run_("ces-ppo", 1, 50.0),
            run_("k8s-spread", 0, 80.0),
            run_("k8s-spread", 1, None),
        ],
    }


def test_summary_and_csv(tmp_path: Path):
    res = results()
    text = report.summary(res)
    assert "| ces-ppo | 2/2 | 40.0 ± 14.1 |" in text
    assert "| k8s-spread | 1/2 | 80.0 ± 0.0 | 90.0 ± 14.1 |" in text  # unreached = 100 s
    # the mean over a run's jobs (heavy, light at 1 s), then over seeds; JCT from submission
    # (heavy 35 and 55 s, light 10 s), the makespan the last job's
    assert "| ces-ppo | enforced | 20.5 ± 7.1 | 27.5 ± 7.1 | 45.0 ± 14.1 | 4/4 |" in text
    # paired by seed: mean TTA 15.5/40.5 and 25.5/50.5 (geometric mean 0.440); JCT: k8s-spread's
    # heavy 85 s and unfinished (the 100 s timeout), light 10 s; two seeds: a wide interval
    assert (
        "| `k8s-spread` (best network-blind, best-effort) | < 0.75 | 0.440 [0.076, 2.557], 2 "
        "seeds | **inconclusive** (3 seeds would settle it) | 0.529 [0.130, 2.156], 2 seeds |"
        in text
    )
    # only the ring's flow at its smallest grant (40 of 80/40) is held back by the network
    assert "on the 4 flows their grant holds back" in text
    assert "median 1.01 × granted (min 1.01, max 1.01); 4 of 4 (100%) within 0.9…1.05" in text
    assert "median 0.96 × granted (min 0.96, max 0.96); 4 of 4 (100%) within 0.9…1.05" in text
    assert (
        f"Above the band's top (1.05; {fidelity.RAISED}) × their grant on the wire: 0 of 8 "
        "measured flows" in text
    )
    assert "median 1.20 × granted (min 0.80, max 1.60); 0 of 8 (0%)" in text
    assert "k8s-spread seed 1 `heavy`" in text
    assert "lab3→srv3 50 Mbit/s via acc1 (measured 45.0 Mbit/s on average)" in text
    csv_path, md = report.write(res, tmp_path)
    got = list(csv.DictReader(csv_path.open()))
    assert len(got) == 8 and got[0]["placement"] == "w0=a;w1=b" and got[0]["flows"] == "2"
    assert md.read_text() == text
    assert "CPU during the runs" not in text  # no pressure stall information recorded
    for run, share in zip(res["runs"], (0.1, 0.4, 0.3, None)):
        run["cpu_stalled_share"] = share
    assert "waited for a core 10–40 % of the time (median 30 %" in report.summary(res)


def test_best_effort_flows_have_no_grant_and_adjustments_are_timed():
    be = view(True)
    be["attempts"][0]["network"] = "best-effort"
    row = rows.job_row("k8s-spread", 0, "heavy", be, timed_out=False)
    assert row["network"] == "best-effort" and [f["rate_mbps"] for f in row["flows"]] == [None] * 2
    assert fidelity.rate_ratios(row) == [] and fidelity.binding_flows(row) == []
    adjusted = view(True)
    adjusted["attempts"][0]["adjustments"] = [{"at": 1003.5, "links": ["s1>s2"], "flows": ""}]
    run = {
        "scheduler": "ces-ppo",
        "seed": 0,
        "background_started_at": {"lab3->srv3": 1001.0},
        "jobs": [rows.job_row("ces-ppo", 0, "heavy", adjusted, timed_out=False)],
    }
    assert report.reaction_times({"runs": [run]}) == {"ces-ppo": [pytest.approx(2.5)]}
    unfaithful = {**run, "fidelity": {"faithful": False}}  # re-run: its figures do not count
    assert report.reaction_times({"runs": [run, unfaithful]}) == {"ces-ppo": [pytest.approx(2.5)]}
    assert report.network_blind_best_effort("k8s-spread")
    assert not report.network_blind_best_effort("k8s-spread/ces")
    assert not report.network_blind_best_effort("ces-multi")


def test_figures_are_made_from_the_json(tmp_path: Path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results()))
    done = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "plots.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for name in plots.FIGURES:
        png = tmp_path / f"{name}.png"
        assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "plots.py"), str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "missing.json" in bad.stderr


def test_a_flows_rate_is_the_time_weighted_mean_of_what_was_installed():
    """Grant 40 for the first 10 s, then 40 + spare = 100 for 30 s, until the attempt ended."""
    history = [[100.0, {"w0>w1": 40.0, "w1>w0": 40.0}], [110.0, {"w0>w1": 100.0, "w1>w0": 40.0}]]
    assert rows.installed_mbps(history, "w0>w1", 100.0, 140.0) == (pytest.approx(85.0), 100.0)
    assert rows.installed_mbps(history, "w1>w0", 100.0, 140.0) == (pytest.approx(40.0), 40.0)
    assert rows.installed_mbps(history, "w0>w1", 105.0, 115.0) == (pytest.approx(70.0), 100.0)
    assert rows.installed_mbps(history, "w0>w1", 100.0, None) == (pytest.approx(40.0), 100.0)
    assert rows.installed_mbps([], "w0>w1", 100.0, 140.0) is None
    v = view(True)
    att = v["attempts"][-1]
    att.update(started_at=0.0, ended_at=10.0, installed=[[0.0, {"w0>w1": 160.0, "w1>w0": 40.0}]])
    w0_w1, w1_w0 = rows.job_row("ces-ppo", 0, "heavy", v, timed_out=False)["flows"]
    assert (w0_w1["granted_mbps"], w0_w1["rate_mbps"], w0_w1["rate_max_mbps"]) == (
        80.0,
        160.0,
        160.0,
    )
    assert (w1_w0["granted_mbps"], w1_w0["rate_mbps"]) == (40.0, 40.0)


def test_an_interval_is_judged_against_the_rate_installed_during_it():
    history = [[100.0, {"f": 40.0}], [103.0, {"f": 60.0}], [110.0, {"f": 100.0}]]
    # a change after the interval's end does not count in it
    assert rows.installed_mbps(history, "f", 100.0, 105.0) == (pytest.approx(48.0), 100.0)


def snapshot(kind: str, at: float, busy_s: float, mbit: float) -> dict:
    c = {"busy_us": busy_s * 1e6, "bytes_sent": mbit * 1e6 / 8, "segs_out": 0, "options": 0}
    when = {"elapsed_s": at} if kind == "eval" else {"train_s": at}
    return {"type": kind, **when, "tcp": {"address": "10.0.0.1", "peers": {"10.0.0.2": c}}}


def test_wire_ratio_weighs_each_interval_by_the_time_its_socket_was_busy():
    """Installed 40 for 10 s, then 80. Busy 2 s at 36 Mbit/s, then 8 s at 80: 712 Mbit on the
    wire where 2 × 40 + 8 × 80 = 720 were let through (0.989). Against the whole run's mean (60)
    the 71.2 Mbit/s it sent while busy would read 1.19."""
    history = [[100.0, {"f": 40.0}], [110.0, {"f": 80.0}]]
    sender = [
        {"type": "data", "clock_start": 100.0},
        snapshot("eval", 10.0, 2.0, 72.0),
        snapshot("end", 20.0, 10.0, 712.0),
    ]
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f") == (
        pytest.approx(712 / 720, abs=1e-4),
        10.0,
    )
    # an interval whose counters went back (another connection took over) is left out
    reset = [sender[0], sender[1], snapshot("eval", 15.0, 1.0, 10.0), sender[2]]
    assert rows.wire_ratio(reset, "10.0.0.2", history, "f")[0] == pytest.approx(
        (72 + 702) / (2 * 40 + 9 * 80), abs=1e-4
    )
    assert rows.wire_ratio(sender[1:], "10.0.0.2", history, "f") == (None, None)  # no clock
    assert rows.wire_ratio(sender, "10.0.0.9", history, "f") == (None, None)  # not its peer
    # no interval long enough to judge: no figure by interval (the whole run's stands)
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f", least_busy_s=20) == (None, None)


def test_an_interval_in_which_the_rate_changed_is_not_judged():
    """Installed 20 for 100-105, 190 from 105 on: busy all of 100-105 at 20 and 0.5 s at 190 in
    105-110 (the iteration's data went faster), the interval 100-110 has no one rate to judge
    it by (its mean, 105, would read 195 / 577.5 = 0.34); 110-120, all at 190, is judged."""
    history = [[100.0, {"f": 20.0}], [105.0, {"f": 190.0}], [105.0, {"g": 5.0}]]
    assert rows.installed_steady(history, "f", 100.0, 105.0) == pytest.approx(20.0)
    assert rows.installed_steady(history, "f", 100.0, 110.0) is None
    assert rows.installed_steady(history, "f", 106.0, 110.0) == pytest.approx(190.0)
    assert rows.installed_steady([[100.0, {"f": 20.0}], [103.0, {"f": 20.1}]], "f", 100, 110)
    assert rows.installed_steady(history, "h", 100.0, 110.0) is None  # never installed
    sender = [
        {"type": "data", "clock_start": 100.0},
        snapshot("eval", 10.0, 5.5, 195.0),
        snapshot("end", 20.0, 6.5, 385.0),
    ]
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f") == (pytest.approx(1.0), 1.0)
    v = view(True)
    att = v["attempts"][-1]
    att.update(started_at=0.0, ended_at=10.0, installed=[[0.0, {"w0>w1": 160.0}], [4.0, {}]])
    att.update(contended=[[1.0, 2.0, ["w1>w0"]]])
    w0_w1, w1_w0 = rows.job_row("ces-ppo", 0, "heavy", v, timed_out=False)["flows"]
    # what each flow was judged by is in the row, to judge it again
    assert w0_w1["installed"] == [[0.0, 160.0]] and w1_w0["installed"] == []
    assert w0_w1["contended_spans"] == [] and w1_w0["contended_spans"] == [[1.0, 10.0]]


def test_seconds_on_a_contended_link_are_not_judged_against_the_grant():
    """The Master noted w0>w1 contended between its readings at 104-106 until the one at 108: the
    interval 100-110 is left out, 110-120 judged; w1>w0 from 118 on."""
    notes = [[104.0, 106.0, ["w0>w1"]], [106.0, 108.0, []], [118.0, 120.0, ["w1>w0"]]]
    assert rows.contended_periods(notes, "w0>w1", 130.0) == [(104.0, 108.0)]
    assert rows.contended_periods(notes, "w1>w0", 130.0) == [(118.0, 130.0)]
    assert rows.contended_periods(notes, "w1>w0", None) == [(118.0, float("inf"))]
    history = [[100.0, {"f": 40.0}], [110.0, {"f": 80.0}]]
    sender = [
        {"type": "data", "clock_start": 100.0},
        snapshot("eval", 10.0, 2.0, 20.0),
        snapshot("end", 20.0, 10.0, 660.0),
    ]
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f", [(104.0, 108.0)]) == (
        pytest.approx(640 / 640, abs=1e-4),
        8.0,
    )
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f", [(95.0, 125.0)]) == (None, 0.0)
    # a flow whose every judged second was contended is no figure at all, not a whole-run one
    v = view(True)
    att = v["attempts"][-1]
    att.update(started_at=0.0, ended_at=10.0, contended=[[0.0, 1.0, ["w0>w1", "w1>w0"]]])
    row = rows.job_row("ces-ppo", 0, "heavy", v, timed_out=False)
    assert [f["contended_s"] for f in row["flows"]] == [10.0, 10.0]
    assert (
        fidelity.binding_flows(row)
        and fidelity.rate_ratios(row) == []
        and fidelity.rate_ratios(row, "tcp_mbps") == []
    )
    assert "1 of the binding flows crossed a contended link" in report.summary(
        {
            "scenario": {"name": "x", "timeout_s": 60},
            "topology": "t",
            "schedulers": ["ces-ppo"],
            "runs": [{"scheduler": "ces-ppo", "seed": 0, "jobs": [row]}],
        }
    )


def test_flows_sharing_a_node_pair_are_not_held_to_their_own_grant():
    """The Network Controller enforces per node pair: a -> b carries two jobs' flows."""
    one, two = view(True), view(True)
    two["name"] = "light.r0"
    run = [
        rows.job_row("ces-ppo", 0, "heavy", one, timed_out=False),
        rows.job_row("ces-ppo", 0, "light", two, timed_out=False),
        rows.job_row(
            "k8s-spread",
            0,
            "heavy",
            {**view(True), "attempts": [{**view(True)["attempts"][0], "network": "best-effort"}]},
            timed_out=False,
        ),
    ]
    rows.mark_shared_pairs(run)
    assert all(f["pair_shared"] for r in run[:2] for f in r["flows"])
    assert not any(f["pair_shared"] for f in run[2]["flows"])  # best-effort: no grant
    assert fidelity.binding_flows(run[0]) == [] and fidelity.rate_ratios(run[0]) == []
    alone = [rows.job_row("ces-ppo", 0, "heavy", view(True), timed_out=False)]
    rows.mark_shared_pairs(alone)
    assert fidelity.binding_flows(alone[0]) and not any(f["pair_shared"] for f in alone[0]["flows"])
    # one after the other on the same pair: each had the pair's class to itself
    first, then = view(True), view(True)
    first["attempts"][0].update(started_at=0.0, ended_at=10.0)
    then["attempts"][0].update(started_at=10.0, ended_at=20.0)
    apart = [
        rows.job_row("ces-ppo", 0, "a", first, timed_out=False),
        rows.job_row("ces-ppo", 0, "b", then, timed_out=False),
    ]
    rows.mark_shared_pairs(apart)
    assert not any(f["pair_shared"] for r in apart for f in r["flows"])


def test_a_ring_flow_is_judged_only_while_its_own_grant_paces_the_ring():
    """Installed 40 for 10 s while the ring's other flow had 60, then 80 against its 50: the ring
    ran at 50 then, and this flow waited for data — only the first interval is judged."""
    history = [[100.0, {"f": 40.0, "g": 60.0}], [110.0, {"f": 80.0, "g": 50.0}]]
    sender = [
        {"type": "data", "clock_start": 100.0},
        snapshot("eval", 10.0, 2.0, 76.0),
        snapshot("end", 20.0, 10.0, 476.0),
    ]
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f", ring=("g",)) == (
        pytest.approx(76 / 80, abs=1e-4),
        2.0,
    )
    assert rows.wire_ratio(sender, "10.0.0.2", history, "f")[0] == pytest.approx(
        476 / 720, abs=1e-4
    )  # as one flow alone, the trickle would count
    # the same counters as the other flow's: judged only where its own 50 paced the ring
    assert rows.wire_ratio(sender, "10.0.0.2", history, "g", ring=("f",)) == (
        pytest.approx(400 / 400, abs=1e-4),
        8.0,
    )


def test_results_from_before_the_network_field_are_summarised():
    """A results.json of an older run (jobs without `network`) is summarised, not a KeyError."""
    res = results()
    for run in res["runs"]:
        for job in run["jobs"]:
            job.pop("network", None)
    assert "| ces-ppo | – | 20.5 ± 7.1 | 27.5 ± 7.1 | 45.0 ± 14.1 | 4/4 |" in report.summary(res)


def test_a_set_is_judged_again_by_todays_rules(tmp_path: Path):
    """report.py --rejudge: every run's verdict is today's `fidelity.verdict` of it and the
    comparisons are made again from the runs now faithful; a set with re-run attempts is refused
    in one line and left as it was."""
    mixed = tmp_path / "mixed" / "results.json"
    mixed.parent.mkdir()
    at_run = json.loads((REPO / "results/e2e/mixed-ring/results.json").read_text())
    for run in at_run["runs"]:  # as judged when it ran: the cycle's flows out of band
        run["fidelity"] = run.pop("fidelity_at_run", run["fidelity"])
    mixed.write_text(json.dumps(at_run))
    assert report.main([str(mixed), "--rejudge"]) == 0
    again = json.loads(mixed.read_text())
    assert all(run["fidelity"] == fidelity.verdict(run) for run in again["runs"])
    changed = [run for run in again["runs"] if "fidelity_at_run" in run]
    assert again["rejudged"]["changed"] == len(changed) > 0
    assert all(not run["fidelity_at_run"]["faithful"] for run in changed)
    faithful = {(r["scheduler"], r["seed"]) for r in again["runs"] if r["fidelity"]["faithful"]}
    for c in again["comparisons"]:  # paired over the seeds both ran faithfully
        both = {s for (name, s) in faithful if name == "ces-ppo"} & {
            s for (name, s) in faithful if name == c["other"]
        }
        assert c["tta"]["n"] == len(both) >= 2
    assert (mixed.parent / "summary.md").exists()

    rerun = tmp_path / "rerun" / "results.json"
    rerun.parent.mkdir()
    ring = json.loads((REPO / "results/e2e/contention-ring/results.json").read_text())
    first = dict(ring["runs"][0], fidelity={**ring["runs"][0]["fidelity"], "faithful": False})
    ring["runs"][0]["attempt"] = 2  # ran again after `first` was judged unfaithful
    ring["runs"].insert(0, first)
    before = json.dumps(ring)
    rerun.write_text(before)
    assert report.main([str(rerun), "--rejudge"]) == 2
    assert rerun.read_text() == before and not (rerun.parent / "summary.md").exists()


def test_runs_go_seed_by_seed_each_led_by_another_scheduler():
    from experiments.run import run_order

    order = run_order(["a", "b", "c"], 3)
    assert sorted(order) == [(s, n) for s in "abc" for n in range(3)]  # every run, once
    assert [n for _, n in order] == [0, 0, 0, 1, 1, 1, 2, 2, 2]  # a seed's pair minutes apart
    assert [order[3 * n][0] for n in range(3)] == ["a", "b", "c"]  # a new first each seed
    assert run_order(["a"], 2) == [("a", 0), ("a", 1)]


def test_a_run_waits_until_the_host_is_quiet(monkeypatch):
    from experiments import machine

    busy = iter([0.0, 1.8, 3.6, 3.7, 3.8, 3.9, 4.0])  # core-seconds: busy, then quiet (2 cores)
    monkeypatch.setattr(machine, "busy_seconds", lambda niced: next(busy))
    monkeypatch.setattr(machine.os, "sched_getaffinity", lambda pid: {0, 1})
    now = [0.0]
    monkeypatch.setattr(machine.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(machine.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    got = machine.wait_quiet(busy_max=0.15, seconds=3, timeout_s=60)
    assert got == {"quiet": True, "waited_s": 5.0, "busy": [0.9, 0.9, 0.05, 0.05, 0.05]}
    busy = iter([1.8 * i for i in range(100)])  # never quiet: it gives up, and says so
    now[0] = 0.0
    got = machine.wait_quiet(busy_max=0.15, seconds=3, timeout_s=5)
    assert not got["quiet"] and got["waited_s"] == 5 and got["busy"] == [0.9] * 5


def test_the_fidelity_table_lists_runs_by_scheduler_with_their_place_and_wait():
    res = results()
    res["runs"] = [res["runs"][i] for i in (0, 2, 1, 3)]  # seed by seed, as run.py runs them
    for i, run in enumerate(res["runs"]):
        run["fidelity"] = fidelity.verdict(run)
        run["host_before"] = {"quiet": i != 3, "waited_s": 3.0 + i, "busy": []}
    table = [line for line in report.summary(res).splitlines() if line.startswith("| ces-ppo |")]
    table += [line for line in report.summary(res).splitlines() if line.startswith("| k8s-")]
    fid = [line.split(" | ")[:5] for line in table if line.count("|") > 14]
    assert fid == [
        ["| ces-ppo", "0", "1", "1", "3 s"],
        ["| ces-ppo", "1", "1", "3", "5 s"],
        ["| k8s-spread", "0", "1", "2", "4 s"],
        ["| k8s-spread", "1", "1", "4", "6 s, busy"],
    ]
