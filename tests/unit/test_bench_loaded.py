"""experiments/bench_loaded.py's comparison of CES-PPO and network-aware with CES's network in one
draw's results and over draws (pure logic; the runs themselves are run.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from experiments import bench_loaded


def _job(
    scheduler: str,
    job: str,
    tta: float | None,
    jct: float | None,
    predicted: float,
    nodes: list[str],
) -> dict:
    return {
        "scheduler": scheduler,
        "job": job,
        "state": "finished" if jct else "timeout",
        "tta_s": tta,
        "reached_target": tta is not None,
        "jct_s": jct,
        "median_iter_s": 0.1,
        "predicted_iter_s": predicted,
        "placement": {f"w{i}": n for i, n in enumerate(nodes)},
    }


def _results(ours: list[dict], apart: list[dict]) -> dict:
    return {
        "scenario": {"timeout_s": 100.0},
        "runs": [
            {"scheduler": "ces-ppo", "seed": 0, "jobs": ours},
            {"scheduler": "network-aware/ces", "seed": 0, "jobs": apart},
        ],
    }


def test_a_draw_compares_mean_tta_and_jct_with_unfinished_jobs_at_the_timeout():
    r = bench_loaded.compare(
        _results(
            [
                _job("ces-ppo", "heavy", 10.0, 20.0, 1.0, ["a", "a", "b"]),
                _job("ces-ppo", "light", 4.0, 10.0, 0.5, ["c", "d", "d"]),
            ],
            [
                _job("network-aware/ces", "heavy", 30.0, 40.0, 2.0, ["a", "b", "b"]),
                _job("network-aware/ces", "light", None, None, 0.5, ["d", "c", "d"]),
            ],
        )
    )
    assert r["mean_tta"]["ratio"] == pytest.approx((10 + 4) / (30 + 100))
    assert r["mean_jct"]["ratio"] == pytest.approx((20 + 10) / (40 + 100))
    assert r["predicted_ratio"] == pytest.approx((0.5 * 1.0) ** 0.5)
    assert r["measured_over_predicted"]["ces-ppo"] == pytest.approx((0.1 / 1.0 * 0.1 / 0.5) ** 0.5)
    assert not r["same_placements"]  # heavy: two tasks on a, not on b
    same = bench_loaded.compare(
        _results(
            [_job("ces-ppo", "light", 4.0, 10.0, 0.5, ["c", "d", "d"])],
            [_job("network-aware/ces", "light", 5.0, 11.0, 0.5, ["d", "d", "c"])],
        )
    )
    assert same["same_placements"]  # the same nodes, whichever worker is where


def test_the_summary_counts_wins_and_keeps_draws_that_did_not_run_apart():
    def ran(tta: float, jct: float, predicted: float, same: bool, topo: str = "ring") -> dict:
        return {
            "topology": topo,
            "status": "ran",
            "same_placements": same,
            "predicted_ratio": predicted,
            "mean_tta": {"ratio": tta, "ces-ppo": 10 * tta, "network-aware/ces": 10.0},
            "mean_jct": {"ratio": jct, "ces-ppo": 10 * jct, "network-aware/ces": 10.0},
            "measured_over_predicted": {"ces-ppo": 0.5, "network-aware/ces": 0.8},
        }

    records = [
        ran(0.5, 0.8, 0.6, False),
        ran(1.0, 1.02, 1.0, True),
        ran(1.2, 1.1, 0.9, False),
        ran(0.8, 0.9, 0.7, False, "star"),
        {"topology": "star", "status": "refused", "reason": "x"},
    ]
    s = bench_loaded.summarize(records)
    assert (s["draws"], s["ran"], s["same_placements"]) == (5, 4, 1)
    assert s["mean_tta"]["wins"] == 2 and s["mean_tta"]["worst"] == 1.2
    assert s["mean_jct_where_placements_differ"]["draws"] == 3
    assert s["mean_jct_where_placements_differ"]["geomean"] == pytest.approx(
        (0.8 * 1.1 * 0.9) ** (1 / 3)
    )
    assert s["spearman_predicted_jct"] == pytest.approx(1.0)  # ranks agree: 0.6<0.7<0.9
    assert s["same_placements_tta"] == [1.0]
    assert s["by_topology"]["ring"]["draws"] == 3 and s["by_topology"]["ring"]["tta_wins"] == 1
    assert s["by_topology"]["star"]["mean_tta"] == pytest.approx(0.8)
    assert s["measured_over_predicted"] == {
        "ces-ppo": pytest.approx(0.5),
        "network-aware/ces": pytest.approx(0.8),
        "network-aware": None,  # not run beside them here
    }
    # paired by draw: the geometric mean of 0.5, 1.0, 1.2, 0.8 with a t interval over 4 draws
    tta = s["paired"]["mean_tta vs network-aware/ces"]
    assert tta["ratio"] == pytest.approx((0.5 * 1.0 * 1.2 * 0.8) ** 0.25, abs=1e-3)
    assert tta["low"] < tta["ratio"] < tta["high"] and tta["verdict"] == "inconclusive"


def test_report_summarizes_what_is_there_and_runs_nothing(tmp_path: Path, monkeypatch):
    def no_run(*args, **kwargs):
        raise AssertionError("--report must not start an emulation")

    monkeypatch.setattr(bench_loaded.subprocess, "run", no_run)
    assert (
        bench_loaded.main(
            ["--report", "--topologies", "ring", "--draws", "2", "--out", str(tmp_path)]
        )
        == 0
    )
    summary = (tmp_path / "summary.md").read_text()
    assert "| ring | 0 | not run: no results.json |" in summary
    assert "Draws run: 0 of 2" in summary
