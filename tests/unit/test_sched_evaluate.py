"""`python -m scheduler.evaluate`: the instances it builds, its stable JSON, its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from scheduler.evaluate import evaluate, main
from scheduler.instances import background_load, make_instance
from scheduler.jobs import ring_job
from scheduler.model import Cluster, Resources
from scheduler.trace import load_machine_spec
from topologies import load_topology

ROOT = Path(__file__).resolve().parents[2]
STABLE = (
    "iteration_time_s",
    "bw_satisfaction",
    "balance_std",
    "network_cost",
    "decision_ms",
    "placed_fraction",
)


def test_background_load_is_feasible_and_differs_per_seed():
    base = Cluster.from_topology(load_topology("campus"))
    a = make_instance(base, 0, 0.5)
    b = make_instance(base, 1, 0.5)
    assert base.jobs == {} and a.used != b.used and a.reserved != b.reserved
    for c in (a, b):
        for n in c.compute_nodes():
            cap, used = c.capacity(n), c.used[n]
            assert 0 <= used.cpu <= 0.5 * cap.cpu and 0 <= used.mem_mb <= 0.5 * cap.mem_mb
        busy = {lk: r for lk, r in c.reserved.items() if r > 0}
        assert busy and all(r <= c.link_capacity(*lk) + 1e-9 for lk, r in busy.items())
        flows = [d.flows[0] for name, (_, d) in c.jobs.items() if name.startswith("bg-flow")]
        assert len(flows) >= 5 and all(
            f.rate_mbps <= 0.5 * c.link_capacity(*f.path[:2]) + 1e-9 for f in flows
        )
    assert make_instance(base, 0, 0.5).used == a.used  # reproducible
    assert background_load(base, np.random.default_rng(0), 0.0).jobs == {}


def test_machine_table_instances(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("a,CPU,96,512,0\nb,T4,64,256,2\n")
    base = Cluster.from_topology(load_topology("campus"))
    c = make_instance(base, 3, 0.0, load_machine_spec(path))
    assert {c.capacity(n).gpu for n in c.compute_nodes()} <= {0, 2}
    assert [c.capacity(n) for n in c.compute_nodes()] != [
        base.capacity(n) for n in base.compute_nodes()
    ]


def write_jobs(tmp_path: Path) -> Path:
    folder = tmp_path / "jobs"
    folder.mkdir()
    for name in ("ring-cnn.yaml", "ps-star.yaml", "custom-cycle.yaml"):
        (folder / name).write_text((ROOT / "workloads" / "jobs" / name).read_text())
    return folder


def test_cli_writes_the_stable_json(tmp_path, capsys):
    out = tmp_path / "r" / "eval.json"
    code = main(
        [
            "--topo",
            "campus",
            "--jobs",
            str(write_jobs(tmp_path)),
            "--seeds",
            "2",
            "--algos",
            "first-fit,k8s-spread,network-aware,exact,random:ksplit",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    algos = doc["algorithms"]
    assert list(algos) == ["first-fit", "k8s-spread", "network-aware", "exact", "random:ksplit"]
    for row in algos.values():
        for key in STABLE:
            assert set(row[key]) == {"mean", "std"}
        assert 0 <= row["placed_fraction"]["mean"] <= 1
    placed = algos["exact"]["placed_fraction"]["mean"]
    if placed == algos["first-fit"]["placed_fraction"]["mean"] == 1.0:
        assert (
            algos["exact"]["iteration_time_s"]["mean"]
            <= algos["first-fit"]["iteration_time_s"]["mean"] + 1e-9
        )
    assert doc["instance"]["seeds"] == 2 and doc["machine"]["cores"] >= 1
    assert "network-aware" in capsys.readouterr().out


def test_all_skips_what_does_not_apply():
    job = ring_job("r", 3, Resources(0.5, 256), 1e6, 50, compute_s=0.01, iterations=10)
    doc = evaluate("gen:internet:20", [job], ["first-fit", "exact"], seeds=1)
    assert list(doc["algorithms"]) == ["first-fit"]
    assert "too large" in doc["skipped"]["exact"]
    assert doc["algorithms"]["first-fit"]["placed_fraction"]["mean"] == 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--topo", "nowhere"], "nowhere: no such topology"),
        (["--algos", "first-fit,magic"], "unknown algorithm 'magic'"),
        (["--algos", "first-fit:teleport"], "unknown path rule 'teleport'"),
        (["--seeds", "0"], "--seeds: expected an integer ≥ 1, got 0"),
        (["--background", "1.5"], "--background: expected a number in [0, 1), got 1.5"),
        (["--topo", "gen:internet:20", "--algos", "exact"], "exact: the instance is too large"),
        (["--jobs", "missing-folder"], "missing-folder: no such job file or folder"),
        (["--machines", "missing.csv"], "missing.csv: cannot read"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path, capsys, args, message):
    job = tmp_path / "j.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "j",
                "collective": "ring",
                "workers": 2,
                "task": {"cpu": 0.25},
                "model_params": 1000,
                "demand_mbps": 10,
                "iterations": 5,
            }
        )
    )
    base = {"--topo": "campus", "--jobs": str(job), "--algos": "first-fit", "--seeds": "1"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    argv = [x for kv in base.items() for x in kv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_run_sequence_counts_placements_and_correct_rejections():
    from test_sched_baselines import cluster_of

    from scheduler.baselines import make_algorithm
    from scheduler.evaluate import run_sequence

    cluster = cluster_of(("a", 1, 1000), ("b", 1, 1000))
    jobs = [ring_job(f"r{i}", 2, Resources(0.5, 100), 1e6, 10, iterations=10) for i in range(3)]
    row = run_sequence(cluster, jobs, make_algorithm("first-fit"))
    # two 2-task jobs fill both nodes; the third cannot fit anywhere: a correct rejection
    assert row["placed_fraction"] == pytest.approx(2 / 3)
    assert row["deployed_count"] == 4 + 2
    assert row["fragmentation"] == pytest.approx(0.8)  # cpu full, memory 80 % free on both
    assert cluster.jobs == {}  # the instance itself is untouched
