"""CES-PPO: the inference path scores exactly as the training path, a short fixed-seed training
run beats the untrained policy, checkpoints round-trip to identical decisions, decoding is never
slower than its own greedy rollout (nor, with `compare`, than network-aware's placement) and
stays within its budget, the committed checkpoint decides feasibly on unseen topologies, the
CLI."""

from __future__ import annotations

import csv
import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import scheduler.ppo as ppo
from scheduler.baselines import NetworkAware, make_algorithm
from scheduler.env import EnvConfig, PlacementEpisode, TrainingInstances
from scheduler.instances import (
    GPU_CLUSTER_JOBS,
    JobDistribution,
    make_instance,
    random_job,
    random_spread_jobs,
)
from scheduler.jobs import load_jobs
from scheduler.metrics import predicted_iteration_s
from scheduler.model import CannotPlace, Cluster, Decision, check_decision
from scheduler.paths import route_placement
from scheduler.ppo import (
    CHECKPOINT,
    Agent,
    Episode,
    Policy,
    PPOConfig,
    collate_graphs,
    collate_steps,
    first_node_lesson,
    first_node_losses,
    iteration_s,
    load,
    rollout,
    save,
    segment_log_softmax,
    teacher,
    train,
    validate,
)
from scheduler.trace import MACHINE_TABLE, load_machine_spec
from topologies import load_topology

ROOT = Path(__file__).resolve().parents[2]
FAST = EnvConfig(
    sites=(4, 10),
    real_share=0.0,
    episodes_per_topology=4,
    small_jobs=JobDistribution(max_workers=4),
)


def instances(seed: int, n: int, spread: float = 0.5) -> list:
    draw = TrainingInstances(replace(FAST, spread_share=spread), seed)
    return [draw.next() for _ in range(n)]


def _untrained(tmp_path: Path, seed: int = 3) -> tuple[Agent, Path]:
    cfg = PPOConfig(seed=seed)
    torch.manual_seed(seed)
    agent = Agent(cfg).eval()
    path = tmp_path / "agent.pt"
    save(agent, cfg, FAST, path)
    return agent, path


def test_segment_log_softmax_is_a_log_softmax_per_step_with_its_entropy():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0, 0.0])
    seg = torch.tensor([0, 0, 0, 1, 1, 2])
    logp, entropy = segment_log_softmax(logits, seg, 3)
    for s, rows in ((0, [0, 1, 2]), (1, [3, 4]), (2, [5])):
        ref = torch.log_softmax(logits[rows], 0)
        assert torch.allclose(logp[rows], ref)
        assert entropy[s] == pytest.approx(float(-(ref.exp() * ref).sum()), abs=1e-6)


def test_the_numpy_inference_scores_every_feasible_node_as_the_training_path():
    torch.manual_seed(0)
    agent = Agent(PPOConfig()).eval()
    for cluster, job in instances(5, 4, spread=1.0):
        ep = PlacementEpisode(cluster, job)
        record = Episode(ep.graph_input())
        policy = Policy(agent, record.graph)
        rollout(policy, ep, greedy=True, record=record)
        gb = collate_graphs([record.graph])
        with torch.no_grad():
            h, ctx = agent.encode(gb)
            rows = agent.row_logits(h, ctx, collate_steps([record], gb)).numpy()
        at = 0
        for obs in record.steps:
            mine = policy.logits(obs)
            feasible = np.flatnonzero(obs.mask)
            assert np.isneginf(mine[~obs.mask]).all()
            assert np.allclose(mine[feasible], rows[at : at + len(feasible)], atol=1e-5)
            at += len(feasible)


def test_the_teacher_is_never_slower_than_network_aware_with_ces_paths_and_rates():
    for cluster, job in instances(6, 12, spread=1.0):
        try:
            na = NetworkAware().positions(cluster, job)
            ref = predicted_iteration_s(
                cluster, job, Decision(job.name, na, route_placement(cluster, job, na))
            )
        except CannotPlace:
            continue
        placement, t = teacher(cluster, job, starts=4)
        assert t <= ref * (1 + 1e-9)
        assert (
            check_decision(
                cluster,
                job,
                Decision(job.name, placement, route_placement(cluster, job, placement)),
            )
            == []
        )


def test_a_first_node_lesson_ranks_the_first_nodes_by_their_own_rollouts():
    cfg = PPOConfig(first_rollouts=4)
    torch.manual_seed(0)
    agent = Agent(cfg).eval()
    rng = np.random.default_rng(0)
    taught = drawn = 0
    for cluster, job in instances(8, 40, spread=1.0):
        lesson = first_node_lesson(agent, cluster, job, cfg, rng)
        if lesson is None:
            continue
        taught += 1
        ep0 = PlacementEpisode(cluster, job)
        first = ep0.observe()
        nodes = list(lesson.nodes)
        assert first.mask[nodes].all() and len(set(nodes)) == len(nodes)
        # the policy's two highest-rated first nodes, then two drawn from the rest, then
        # network-aware's when it is not among them
        policy = Policy(agent, ep0.graph_input())
        logits = policy.logits(first)
        ranked = list(np.argsort(-logits, kind="stable")[: int(first.mask.sum())])
        k = min(cfg.first_rollouts, len(ranked))
        assert nodes[:2] == ranked[:2] and set(nodes[:k]) <= set(ranked)
        drawn += len(ranked) > k
        try:
            own = ep0.compute.index(NetworkAware().positions(cluster, job)[ep0.task])
        except CannotPlace:
            own = None
        assert len(nodes) == k + (own is not None and own not in nodes[:k])
        if own is not None:
            assert own in nodes
        # the loss reads the first step's logits of exactly these nodes
        gb = collate_graphs([lesson.first.graph])
        with torch.no_grad():
            h, ctx = agent.encode(gb)
            rows = agent.row_logits(h, ctx, collate_steps([lesson.first], gb)).numpy()
        at = np.searchsorted(np.flatnonzero(first.mask), lesson.nodes)
        assert np.allclose(rows[at], logits[lesson.nodes], atol=1e-5)
        # each node's weight falls with its rollout's time; the lesson's action is the fastest
        times = []
        for node in nodes:
            ep = ep0.restart()
            rollout(policy, ep, greedy=True, first=int(node))
            times.append(iteration_s(ep) or math.inf)
        assert lesson.target.sum() == pytest.approx(1.0)
        assert lesson.first.actions == [nodes[int(np.argmin(times))]]
        order = np.argsort(times, kind="stable")
        assert np.all(np.diff(lesson.target[order]) <= 1e-12)
        assert len(lesson.later.steps) == len(job.tasks) - 1
    assert taught >= 5 and drawn >= 3, (taught, drawn)


def test_first_node_lessons_teach_the_fastest_first_node_and_keep_the_later_steps():
    cfg = PPOConfig(first_rollouts=8)
    torch.manual_seed(0)
    agent = Agent(cfg)
    rng = np.random.default_rng(1)
    lessons = [
        x
        for x in (
            first_node_lesson(agent, c, j, cfg, rng) for c, j in instances(21, 24, spread=1.0)
        )
        if x is not None
    ]

    def picked() -> float:  # lessons where the policy rates a fastest node highest of those tried
        hits = 0
        for lesson in lessons:
            logits = Policy(agent, lesson.first.graph).logits(lesson.first.steps[0])
            # nodes whose rollouts tie for fastest weigh the same in the target: any is right
            hits += lesson.target[np.argmax(logits[lesson.nodes])] == lesson.target.max()
        return hits / len(lessons)

    def kept() -> float:  # later steps where the policy still makes the fastest rollout's choice
        same = [
            int(np.argmax(Policy(agent, e.graph).logits(obs))) == action
            for e in (lesson.later for lesson in lessons)
            for obs, action in zip(e.steps, e.actions)
        ]
        return float(np.mean(same))

    before = picked()
    assert kept() == 1.0  # the untrained policy's own greedy choices
    optim = torch.optim.Adam(agent.parameters(), lr=3e-3)
    for _ in range(60):
        ce, anchor = first_node_losses(agent, lessons)
        optim.zero_grad()
        (ce + 0.5 * anchor).backward()
        optim.step()
    # measured (one thread, conftest.py): 0.14 before, 1.0 after, and 1.0 from 20 to 120 steps on
    # one or two threads. In 3 of the 7 lessons two or three first nodes tie for fastest; counting
    # only the lesson's own of them (the first) gave 0.71-1.0 from 20 to 120 steps, 0.71 at 60 on
    # one thread: the failure of a fresh machine
    assert picked() >= max(0.8, before + 0.2), (before, picked())
    # the anchor holds the later choices (measured: 0.92 of 24 steps; 0.83 without it, 0.62
    # with its sign turned)
    assert kept() >= 0.85


def test_a_short_training_run_beats_the_untrained_policy():
    cfg = PPOConfig(
        seed=0,
        imitation=96,
        ppo=32,
        batch=16,
        teacher_starts=4,
        first_nodes=16,
        first_rollouts=4,
        first_batch=8,
    )
    held = instances(99, 20, spread=1.0)
    torch.manual_seed(cfg.seed)  # train() starts from exactly these weights
    before = validate(Agent(cfg), held)
    rows: list[dict] = []
    agent = train(cfg, FAST, log=rows.append, validation=held)
    after = validate(agent, held)
    assert next(r["phase"] for r in rows) == "imitation" and rows[-1]["phase"] == "first node"
    assert "ppo" in {r["phase"] for r in rows}
    assert rows[-1]["instances"] == cfg.imitation + cfg.ppo + cfg.first_nodes
    # the weights returned are those of the best validation figure
    assert min(r["vs_network_aware"] for r in rows if "vs_network_aware" in r) == pytest.approx(
        after
    )
    # the untrained policy already follows network-aware after its first task (the prior on
    # the guidance): what 128 instances teach is mostly the first node
    assert after < before * 0.95, (before, after)


def test_a_checkpoint_round_trips_with_identical_decisions(tmp_path):
    agent, path = _untrained(tmp_path)
    loaded, cfg, _ = load(path)
    assert cfg == PPOConfig(seed=3)
    policy_alone = make_algorithm("ces-ppo", checkpoint=path, decode_budget=0, compare=False)
    compared = 0
    for cluster, job in instances(5, 15):
        ep = PlacementEpisode(cluster, job)
        if ep.done:
            continue
        rollout(Policy(agent, ep.graph_input()), ep, greedy=True)
        again = PlacementEpisode(cluster, job)
        rollout(Policy(loaded, again.graph_input()), again, greedy=True)
        assert again.placement == ep.placement
        try:
            d = policy_alone.place(cluster, job)
        except CannotPlace:
            if not ep.failed:
                with pytest.raises(CannotPlace):
                    ep.decision()
            continue
        assert d.placement == ep.placement_names() and d.flows == ep.decision().flows
        compared += 1
    assert compared >= 8


def test_a_checkpoint_of_another_network_is_refused_with_its_path(tmp_path):
    _agent, path = _untrained(tmp_path)
    data = torch.load(path, weights_only=True)
    del data["state_dict"]["prior"]  # as a checkpoint from before the guidance
    torch.save(data, path)
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a checkpoint of this CES-PPO")):
        make_algorithm("ces-ppo", checkpoint=path)


def test_decoding_is_never_slower_than_its_greedy_rollout_nor_network_aware(tmp_path):
    _, path = _untrained(tmp_path)
    greedy = make_algorithm("ces-ppo", checkpoint=path, decode_budget=0, compare=False)
    wide = make_algorithm("ces-ppo", checkpoint=path, decode_budget=10_000)
    # a budget short of one rollout (1000 nodes): the greedy rollout, and network-aware's
    narrow = make_algorithm("ces-ppo", checkpoint=path, decode_budget=1)
    better = compared = 0
    for cluster, job in instances(7, 25, spread=1.0):
        try:
            g = greedy.place(cluster, job)
        except CannotPlace:
            continue
        m, n = wide.place(cluster, job), narrow.place(cluster, job)
        assert check_decision(cluster, job, m) == [] and check_decision(cluster, job, n) == []
        assert wide.place(cluster, job).placement == m.placement  # deterministic
        slow_g, slow_m, slow_n = (predicted_iteration_s(cluster, job, d) for d in (g, m, n))
        assert slow_m <= slow_g and slow_n <= slow_g
        na = NetworkAware().positions(cluster, job)
        try:
            na_flows = route_placement(cluster, job, na)
        except CannotPlace:
            na_flows = None  # network-aware's placement has no paths with bandwidth
        if na_flows is not None:
            slow_na = predicted_iteration_s(cluster, job, Decision(job.name, na, na_flows))
            assert slow_m <= slow_na * (1 + 1e-9) and slow_n <= slow_na * (1 + 1e-9)
        better += slow_m < slow_g
        compared += 1
    assert compared >= 10 and better >= 1


def test_the_decode_budget_bounds_the_rollouts_and_a_bad_budget_is_named(tmp_path, monkeypatch):
    _, path = _untrained(tmp_path)
    calls: list[int] = []
    real = ppo.rollout
    monkeypatch.setattr(ppo, "rollout", lambda *a, **k: calls.append(1) or real(*a, **k))
    greedy = make_algorithm("ces-ppo", checkpoint=path, decode_budget=0, compare=False)

    def placeable(c, j):
        try:
            return greedy.place(c, j) is not None
        except CannotPlace:
            return False

    cluster, job = next(
        (c, j)
        for c, j in instances(8, 20, spread=1.0)
        if PlacementEpisode(c, j).observe().mask.sum() >= 5 and placeable(c, j)
    )
    work = len(cluster.compute_nodes()) * len(job.tasks)
    for budget, compare, rollouts in (
        (work - 1, True, 1),
        (2 * work, False, 2),
        (2 * work, True, 1),
        (5 * work + 1, True, 4),
    ):
        calls.clear()
        make_algorithm("ces-ppo", checkpoint=path, decode_budget=budget, compare=compare).place(
            cluster, job
        )
        assert len(calls) == rollouts, (budget, compare)
    with pytest.raises(ValueError, match="decode_budget"):
        make_algorithm("ces-ppo", checkpoint=path, decode_budget=-1)


def test_the_committed_checkpoint_places_feasibly_on_unseen_topologies():
    assert CHECKPOINT.exists(), "scheduler/checkpoints/ces_ppo.pt must be committed"
    algo = make_algorithm("ces-ppo")
    rng = np.random.default_rng(0)
    for topo in ("campus", "topozoo/Abilene"):
        cluster = Cluster.from_topology(load_topology(topo))
        jobs = load_jobs(ROOT / "workloads" / "jobs") + [random_job(rng, f"r{i}") for i in range(6)]
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
    # jobs that no node holds, on a GPU cluster from the Alibaba machine table
    gpus = make_instance(
        Cluster.from_topology(load_topology("topozoo/Abilene")),
        0,
        0.5,
        load_machine_spec(MACHINE_TABLE),
    )
    for job in random_spread_jobs(np.random.default_rng(1), gpus, 4, GPU_CLUSTER_JOBS):
        d = algo.place(gpus, job)
        assert check_decision(gpus, job, d) == [] and len(set(d.placement.values())) > 1
        assert math.isfinite(predicted_iteration_s(gpus, job, d))


def test_cli_trains_writes_curve_and_checkpoint_and_rejects_bad_input(tmp_path):
    out, csv_path, png = tmp_path / "c.pt", tmp_path / "curve.csv", tmp_path / "curve.png"
    cmd = [
        sys.executable,
        "-m",
        "scheduler.train_ppo",
        "--seed",
        "1",
        "--imitation",
        "24",
        "--ppo",
        "8",
        "--first-nodes",
        "4",
        "--validation",
        "4",
        "--out",
        str(out),
        "--csv",
        str(csv_path),
        "--png",
        str(png),
    ]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert out.exists() and png.stat().st_size > 0
    rows = list(csv.DictReader(csv_path.open()))
    assert rows and int(rows[-1]["instances"]) == 36 and rows[-1]["vs_network_aware"]
    assert load(out)[2]["command"].startswith("python -m scheduler.train_ppo --seed 1")
    for args, says in (
        (["--imitation", "0", "--ppo", "0", "--first-nodes", "0"], "nothing to train"),
        (["--first-nodes", "-1"], "--first-nodes must be"),
        (["--hidden", "2"], "--hidden must be"),
        (["--machines", str(tmp_path / "none.csv")], "--machines"),
    ):
        bad = subprocess.run(
            [sys.executable, "-m", "scheduler.train_ppo", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr
