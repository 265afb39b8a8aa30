"""bench_multi's ablation of one policy (experiments/bench_multi.py --policies --set): the
policies asked for, with the knob changed, and one line with exit code 2 for a policy it does
not know or another TapFinger checkpoint that is not there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(REPO / "experiments" / "bench_multi.py")]


def test_a_knob_ablation_runs_only_the_policies_asked_for(tmp_path: Path):
    done = subprocess.run(
        BENCH
        + [
            "--seeds",
            "1",
            "--jobs",
            "30",
            "--topos",
            "campus",
            "--single",
            "network-aware",
            "--policies",
            "ces-multi",
            "--set",
            "delay_lookahead=2",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads((tmp_path / "campus.json").read_text())
    assert list(r["algorithms"]) == ["ces-multi"]
    assert r["ces_multi_config"]["delay_lookahead"] == 2
    assert r["algorithms"]["ces-multi"]["finished"]["mean"] == 30


def test_an_unknown_policy_is_one_line_and_exit_2(tmp_path: Path):
    done = subprocess.run(
        BENCH + ["--policies", "ces-multi,nope", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.strip().count("\n") == 0
        and "--policies" in done.stderr
        and "'nope'" in done.stderr
    )
    assert not list(tmp_path.iterdir())


def test_another_tapfinger_checkpoint_that_is_not_there_is_one_line_and_exit_2(tmp_path: Path):
    for item in ("nameless", f"gone={tmp_path / 'gone.pt'}"):
        done = subprocess.run(
            BENCH + ["--seed-systems", "--other-tapfinger", item, "--out", str(tmp_path / "out")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.strip().count("\n") == 0 and f"'{item}'" in done.stderr
        assert "--other-tapfinger" in done.stderr
    assert not (tmp_path / "out").exists()
