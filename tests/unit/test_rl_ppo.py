"""CES-PPO: a short fixed-seed training run beats the untrained policy, checkpoints round-trip
to identical decisions, multi-start decoding never predicts slower than greedy decoding, the
registered `ces-ppo` algorithm gives feasible decisions, the CLI."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scheduler.baselines import make_algorithm
from scheduler.env import EnvConfig, PlacementEnv, PlacementEpisode
from scheduler.instances import JobDistribution, random_job
from scheduler.jobs import load_jobs
from scheduler.metrics import predicted_iteration_s
from scheduler.model import CannotPlace, Cluster, check_decision
from scheduler.ppo import CHECKPOINT, Agent, PPOConfig, act, greedy_eval, load, save, train
from topologies import load_topology

ROOT = Path(__file__).resolve().parents[2]
FAST = EnvConfig(sites=(4, 8), jobs=JobDistribution(max_workers=4), episodes_per_topology=8)


def test_a_short_training_run_improves_the_reward_over_the_untrained_policy():
    cfg = PPOConfig(seed=0, total_steps=2000, rollout_steps=500, minibatch=128, hidden=32,
                    layers=2, guide_until=0.5)
    torch.manual_seed(cfg.seed)  # train() starts from exactly these weights
    untrained = Agent(cfg, FAST.k_paths, len(FAST.rate_levels))
    before = greedy_eval(untrained, FAST, seed=99, episodes=40)
    rows: list[dict] = []
    agent = train(cfg, FAST, rows.append)
    after = greedy_eval(agent, FAST, seed=99, episodes=40)
    assert rows and rows[-1]["steps"] >= cfg.total_steps
    assert after["return"] > before["return"] + 0.3, (before, after)
    assert after["iter_vs_heuristic"] < before["iter_vs_heuristic"], (before, after)


def _greedy_decision(agent: Agent, cluster: Cluster, job, cfg: EnvConfig):
    ep = PlacementEpisode(cluster, job, cfg)
    while not ep.done:
        s = act(agent, ep, greedy=True)
        ep.step(s.node, s.paths, s.rates)
    return ep.decision()


def _untrained(tmp_path: Path) -> tuple[Agent, PPOConfig, Path]:
    """A small untrained agent, saved (an untrained policy leaves decoding room to improve)."""
    cfg = PPOConfig(seed=3, hidden=32, layers=2)
    torch.manual_seed(3)
    agent = Agent(cfg, FAST.k_paths, len(FAST.rate_levels)).eval()
    path = tmp_path / "agent.pt"
    save(agent, cfg, FAST, path)
    return agent, cfg, path


def _placed(algo, seed: int, episodes: int):
    """(cluster, job, decision) for each of `episodes` random instances that `algo` places."""
    env = PlacementEnv(FAST)
    env.reset(seed=seed)
    for _ in range(episodes):
        env.reset()
        cluster, job = env.episode.cluster, env.episode.job
        try:
            decision = algo.place(cluster, job)
        except CannotPlace:
            continue
        yield cluster, job, decision


def test_a_checkpoint_round_trips_with_identical_decisions(tmp_path):
    agent, cfg, path = _untrained(tmp_path)
    loaded, cfg2, env2 = load(path)
    assert cfg2 == cfg and env2 == FAST
    algo = make_algorithm("ces-ppo", checkpoint=path, decode_budget=0)  # plain greedy
    compared = 0
    for cluster, job, via_algo in _placed(algo, seed=5, episodes=15):
        direct = _greedy_decision(agent, cluster, job, FAST)
        assert via_algo.placement == direct.placement
        assert via_algo.flows == direct.flows
        assert _greedy_decision(loaded, cluster, job, env2).placement == direct.placement
        compared += 1
    assert compared >= 10


def test_multi_start_decoding_is_never_slower_than_greedy_and_is_deterministic(tmp_path):
    _, _, path = _untrained(tmp_path)
    greedy = make_algorithm("ces-ppo", checkpoint=path, decode_budget=0)
    multi = make_algorithm("ces-ppo", checkpoint=path, decode_budget=10_000)
    better = compared = 0
    for cluster, job, g in _placed(greedy, seed=7, episodes=30):
        m = multi.place(cluster, job)
        assert check_decision(cluster, job, m) == []
        assert multi.place(cluster, job).placement == m.placement
        slow_g, slow_m = (predicted_iteration_s(cluster, job, d) for d in (g, m))
        assert slow_m <= slow_g
        better += slow_m < slow_g
        compared += 1
    assert compared >= 15 and better >= 1


def test_the_decode_budget_bounds_the_starts_and_a_bad_budget_is_named(tmp_path, monkeypatch):
    import scheduler.ppo as ppo
    _, _, path = _untrained(tmp_path)
    asked: list[int] = []
    real = ppo.first_nodes
    monkeypatch.setattr(ppo, "first_nodes", lambda a, ep, m: asked.append(m) or real(a, ep, m))
    env = PlacementEnv(FAST)
    env.reset(seed=7)
    cluster, job = env.episode.cluster, env.episode.job
    work = len(cluster.compute_nodes()) * len(job.tasks)
    for budget, starts in ((work - 1, None), (2 * work, 2), (5 * work + 1, 5)):
        asked.clear()
        try:
            make_algorithm("ces-ppo", checkpoint=path, decode_budget=budget).place(cluster, job)
        except CannotPlace:
            pass
        assert asked == ([] if starts is None else [starts])
    with pytest.raises(ValueError, match="decode_budget"):
        make_algorithm("ces-ppo", checkpoint=path, decode_budget=-1)


def test_the_committed_checkpoint_places_feasibly_on_unseen_topologies():
    assert CHECKPOINT.exists(), "scheduler/checkpoints/ces_ppo.pt must be committed"
    import numpy as np
    algo = make_algorithm("ces-ppo")
    rng = np.random.default_rng(0)
    for topo in ("campus", "topozoo/Abilene"):
        cluster = Cluster.from_topology(load_topology(topo))
        jobs = load_jobs(ROOT / "workloads" / "jobs") + [random_job(rng, f"r{i}")
                                                          for i in range(6)]
        placed = 0
        for job in jobs:
            try:
                d = algo.place(cluster, job)
            except CannotPlace:
                continue
            assert check_decision(cluster, job, d) == []
            cluster.allocate(job, d)
            placed += 1
        assert placed >= len(jobs) // 2


def test_cli_trains_writes_curve_and_checkpoint_and_rejects_bad_input(tmp_path):
    out, csv_path, png = tmp_path / "c.pt", tmp_path / "curve.csv", tmp_path / "curve.png"
    cmd = [sys.executable, "-m", "scheduler.train_ppo", "--seed", "1", "--steps", "300",
           "--out", str(out), "--csv", str(csv_path), "--png", str(png)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert out.exists() and png.stat().st_size > 0
    rows = list(csv.DictReader(csv_path.open()))
    assert rows and float(rows[-1]["steps"]) >= 300
    bad = subprocess.run([sys.executable, "-m", "scheduler.train_ppo", "--steps", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--steps must be" in bad.stderr
    assert "Traceback" not in bad.stderr
