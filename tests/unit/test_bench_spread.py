"""bench_spread (issue 20's figures), smoke-sized: every variant of CES-PPO and every baseline
on one held-out network, and the decoding never slower than network-aware's placement with
CES's paths and rates (one of its candidates)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scheduler.baselines import NetworkAware
from scheduler.instances import make_instance
from scheduler.jobs import load_jobs
from scheduler.metrics import predicted_iteration_s
from scheduler.model import Cluster
from scheduler.ppo import CesPPO
from scheduler.trace import MACHINE_TABLE, load_machine_spec
from topologies import load_topology

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(REPO / "experiments" / "bench_spread.py")]
from experiments import bench_spread


def test_one_network_one_seed_gives_every_figure(tmp_path: Path):
    out = tmp_path / "spread.json"
    done = subprocess.run(
        BENCH
        + [
            "--seeds",
            "1",
            "--random-jobs",
            "1",
            "--reps",
            "0",
            "--topologies",
            "topozoo/Abilene",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    s = doc["all"]
    assert s["jobs"] == 4 and set(s["placed"]) >= {
        "ces-ppo",
        "ces-ppo:greedy",
        "ces-ppo:own",
        "network-aware/ces",
        "network-aware",
    }
    for ours in ("ces-ppo", "ces-ppo:greedy", "ces-ppo:own"):
        assert s[ours]["network-aware"]["jobs"] >= 1
    assert s["ces-ppo"]["network-aware/ces"]["worst"] <= 1 + 1e-9
    # the policy's own decoding has the greedy rollout among its candidates
    assert s["ces-ppo:own"]["ces-ppo:greedy"]["worst"] <= 1 + 1e-9
    assert "own decoding" in done.stdout and out.with_suffix(".png").is_file()
    assert set(s["tail"]) == {
        "jobs",
        "from_na_first_within",
        "best_first_below_1",
        "best_first_worst",
    }


def test_the_tail_diagnosis_rolls_out_from_the_policys_and_network_awares_first_nodes():
    """On a network of 11 compute nodes the 64 highest-rated first nodes are all of them: the
    best start is no slower than the policy's greedy rollout (its top-rated first node) nor than
    the start on network-aware's first node, which places the job."""
    cluster = make_instance(
        Cluster.from_topology(load_topology("topozoo/Abilene")),
        0,
        0.5,
        load_machine_spec(MACHINE_TABLE),
    )
    algo = CesPPO(decode_budget=0, compare=False)
    for job in load_jobs(bench_spread.JOBS):
        NetworkAware().positions(cluster, job)  # network-aware places it
        greedy = predicted_iteration_s(cluster, job, algo.place(cluster, job))
        found = bench_spread.first_nodes(algo.agent, cluster, job)
        assert found["from_na_first_s"] is not None
        assert found["best_first_s"] <= min(greedy, found["from_na_first_s"]) + 1e-12
