"""What the benchmark scripts share (experiments/common.py): percentiles on one scale, the
stopwatch behind every decision-latency figure, the root check, and no script keeping its own
idea of where the repository and its results are."""

from __future__ import annotations

import ast

import numpy as np
import pytest

from experiments import common


def test_percentiles_are_on_the_percent_scale_and_none_without_values():
    xs = [5.0, 1.0, 4.0, 2.0]
    assert common.percentile(xs, 50) == 3.0  # interpolated between 2 and 4
    assert common.percentile(xs, 99) == pytest.approx(float(np.percentile(xs, 99)))
    assert common.percentile([], 50) is None


def test_the_stopwatch_times_every_block_even_one_that_raises():
    watch = common.Stopwatch()
    with watch:
        sum(range(10_000))
    with pytest.raises(KeyError), watch:
        raise KeyError("a decision that failed still took its time")
    assert len(watch.wall_ms) == len(watch.cpu_ms) == 2
    assert all(t >= 0 for t in watch.wall_ms + watch.cpu_ms)
    figures = watch.latency("cold_")
    assert list(figures) == ["cold_p50_ms", "cold_p99_ms", "cold_cpu_p50_ms", "cold_cpu_p99_ms"]
    assert figures["cold_p50_ms"] == common.percentile(watch.wall_ms, 50)


def test_a_testbed_benchmark_refuses_to_start_without_root(monkeypatch, capsys):
    monkeypatch.setattr(common.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as e:
        common.require_root("bridges")
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: run as root (sudo): bridges\n"
    monkeypatch.setattr(common.os, "geteuid", lambda: 0)
    common.require_root("bridges")


@pytest.mark.parametrize(
    "script",
    sorted(common.REPO.glob("experiments/bench_*.py"))
    + [common.REPO / "experiments/calibrate_perfmodel.py"],
    ids=lambda p: p.name,
)
def test_no_script_finds_the_repository_or_writes_results_on_its_own(script):
    """The repository and results/ are common.REPO and common.RESULTS: a default output written
    relative to the working directory lands wherever the script was started."""
    source = script.read_text()
    strings = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert "Path(__file__)" not in source
    assert not [s for s in strings if s.startswith("results/")]
    assert "geteuid" not in source  # common.require_root
