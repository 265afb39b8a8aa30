"""The load benchmark's smoke run (experiments/bench_load.py): a real Master process with its
state file, simulated agents whose workers write metric lines, a burst of valid and invalid jobs —
every one answered, none lost or run twice, every line held once. The latency figures belong to
the full benchmark, not to this test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from experiments.bench_load import work_s


def test_a_burst_of_jobs_is_answered_and_drained_without_loss(tmp_path: Path):
    out = tmp_path / "load.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "experiments" / "bench_load.py"),
            "--seed",
            "3",
            "--nodes",
            "12",
            "--jobs",
            "60",
            "--work-s",
            "0.3",
            "--max-s",
            "60",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    r = json.loads(out.read_text())
    assert done.returncode == 0 and r["failed"] == [], done.stdout + done.stderr[-2000:]
    s = r["submissions"]
    assert s["accepted"] + s["refused"] == 60 and s["refused"] > 0  # the seed draws invalid ones
    assert all(
        (e.startswith("4") and "field" in e) or "fits on no node" in e
        for e in s["refusal_examples"]
    ), s["refusal_examples"]
    assert r["jobs_by_state"] == {"finished": s["accepted"]}
    assert r["heartbeats"]["count"] > 0
    assert r["state"] and r["lines"] > 0 and r["lines_held"] == r["lines"]


def test_each_job_runs_its_own_time_the_same_in_every_agent_process():
    times = {f"load{i}": work_s(0, f"load{i}", 2.0, 0.5) for i in range(200)}
    assert all(1.0 <= t <= 3.0 for t in times.values())
    assert max(times.values()) - min(times.values()) > 1.5  # spread, not all alike
    assert times == {j: work_s(0, j, 2.0, 0.5) for j in times}  # a job's workers end together
    assert work_s(1, "load0", 2.0, 0.5) != times["load0"]  # drawn from the seed
    assert {work_s(0, j, 2.0, 0.0) for j in times} == {2.0}
