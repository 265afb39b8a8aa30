"""Seed 004 (EADE-DDPG): the environment's fit checks, reward and metrics by hand on tiny
instances, the cluster-level heuristics, the dual buffer's expert share, the attention critic's
action gradient, a smoke training of every RL algorithm through the experiment, the CLI's
errors; and the `eade-ddpg` placement algorithm of CES."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from scheduler.baselines import make_algorithm
from scheduler.eade import ces
from scheduler.eade.__main__ import main as cli
from scheduler.eade.agents import (
    ALGORITHMS,
    AgentConfig,
    AttentionCritic,
    ClusterAttention,
    DualReplayBuffer,
    build,
    fill_expert,
    load_acting,
    save_acting,
)
from scheduler.eade.env import (
    SETTINGS,
    Layout,
    MultiCluster,
    MultiClusterEnv,
    Setting,
    TaskShapes,
    build_layout,
    deployment_reward,
    fragmentation,
    gpu_load_variance,
    load_variance,
)
from scheduler.eade.experiment import (
    REFERENCES,
    ExperimentConfig,
    agent_chooser,
    checkpoint_path,
    curves_of,
    episodes_trained,
    evaluate_all,
    table,
    train_all,
)
from scheduler.eade.heuristics import (
    aggregate_expert,
    bestfit,
    expert,
    greedy,
    random_choice,
    run_episode,
    utilization,
    worstfit_gpu,
)
from scheduler.instances import random_instance
from scheduler.model import CannotPlace, check_decision
from scheduler.trace import Machine

ROOT = Path(__file__).resolve().parents[2]
TINY = Setting(clusters=3, hosts=2, tasks=40)


def layout(
    clusters: int = 3, hosts: int = 2, cards: int = 2, cpu: float = 64, mem: float = 512
) -> Layout:
    """clusters × hosts identical hosts with `cards` P4-like cards each."""
    h = clusters * hosts
    card_cap = np.zeros((h, cards, 2))
    card_cap[:, :, :] = (8.0, 100.0)
    return Layout(hosts, np.tile([cpu, mem], (h, 1)).astype(float), card_cap)


def env_with(tasks: list, lay: Layout | None = None, setting: Setting = TINY) -> MultiClusterEnv:
    env = MultiClusterEnv(lay or layout(setting.clusters, setting.hosts), setting)
    env.reset(options={"tasks": np.array(tasks, float)})
    return env


# --- task shapes and layouts ----------------------------------------------------------------------
def test_task_shapes_follow_the_published_buckets_and_fit_one_card():
    shapes = TaskShapes()
    t = shapes.sample(np.random.default_rng(1), 40_000, 8.0)
    share = t[:, 3]
    assert abs((share < 25).mean() - 15 / 98) < 0.01
    assert abs((share == 25).mean() - 27 / 98) < 0.01
    assert abs((share == 50).mean() - 13 / 98) < 0.01
    assert abs((share == 100).mean() - 43 / 98) < 0.01
    assert abs((t[:, 0] == 6).mean() - 52 / 92) < 0.01  # the 6-core step of the CPU CDF
    assert abs((np.isclose(t[:, 1], 29.3)).mean() - 73 / 93) < 0.01
    assert (t[share == 100, 2] == 8.0).all() and (t[:, 2] <= 8.0).all() and (t[:, 2] > 0).all()
    assert t[:, 0].max() <= 60 and t[:, 1].max() <= 300
    again = shapes.sample(np.random.default_rng(1), 40_000, 8.0)
    assert np.array_equal(t, again)


def test_layout_takes_only_the_chosen_gpu_types_and_sums_clusters():
    machines = (
        [Machine(f"p{i}", "P100", 64, 512, 2) for i in range(5)]
        + [Machine(f"t{i}", "T4", 96, 512, 2) for i in range(5)]
        + [Machine(f"v{i}", "V100", 96, 512, 8) for i in range(50)]
    )
    setting = Setting(clusters=2, hosts=4)
    lay = build_layout(machines, np.random.default_rng(0), setting)
    assert all(m[0] in "pt" for m in lay.machines) and len(set(lay.machines)) == 8
    cap = lay.cluster_capacity()
    assert cap.shape == (2, 4) and (cap[:, 2] == 4 * 2 * 8.0).all() and (cap[:, 3] == 800).all()
    assert cap[:, 0].sum() == sum(m.cpu for m in machines if m.name in lay.machines)
    with pytest.raises(ValueError, match="needs 12"):
        build_layout(machines, np.random.default_rng(0), Setting(clusters=3, hosts=4))


# --- fit checks, the member cluster's placement ---------------------------------------------------
def test_a_cluster_whose_aggregate_fits_can_still_fail_the_task():
    c = MultiCluster(layout(clusters=2, hosts=2))
    # Cluster 0: every card holds 5 GB: 12 GB free in aggregate, 3 GB on each card.
    c.card_used[0:2, :, 0] = 5.0
    task = np.array([4.0, 30.0, 4.0, 25.0])
    assert c.aggregate_fit(task).tolist() == [True, True]
    assert c.true_fit(task).tolist() == [False, True]
    assert c.deploy(0, task) is None and c.card_used[0:2, :, 0].sum() == 20.0
    assert c.deploy(1, task) is not None


def test_the_member_cluster_packs_hosts_and_cards():
    c = MultiCluster(layout(clusters=1, hosts=2))
    c.card_used[1, 0] = (5.0, 50.0)  # host 1 card 0: 3 GB, 50 core free
    host, card = c.deploy(0, np.array([1.0, 1.0, 2.0, 20.0]))
    assert (host, card) == (1, 0)  # the fuller host, its fuller card
    assert c.card_used[1, 0].tolist() == [7.0, 70.0] and c.host_used[1].tolist() == [1.0, 1.0]
    # No card has 9 GB: a vGPU never spans cards.
    assert c.deploy(0, np.array([1.0, 1.0, 9.0, 10.0])) is None


# --- reward and metrics by hand -------------------------------------------------------------------
def test_reward_is_the_min_max_normalised_score_times_tau():
    util = np.array([[0.2] * 4, [0.5] * 4, [0.8] * 4])
    assert deployment_reward(util, 1, 10.0) == pytest.approx(-5.0)  # (0.5-0.2)/0.6 = 0.5
    assert deployment_reward(util, 2, 10.0) == pytest.approx(0.0)
    assert deployment_reward(util, 0, 10.0) == pytest.approx(-10.0)
    assert deployment_reward(np.full((3, 4), 0.4), 0, 10.0) == 0.0


def test_fragmentation_and_load_variances_by_hand():
    util = np.array([[0.5, 0.5, 1.0, 1.0], [0.0, 0.2, 0.4, 0.6]])
    assert fragmentation(util) == pytest.approx(((0.5 + 0.5) + (1 + 0.8 + 0.6 + 0.4)) / 2)
    # Ū = 0.75, 0.3 → variance 0.225²; GPU means 1.0, 0.5 → 0.25²
    assert load_variance(util) == pytest.approx(0.225**2)
    assert gpu_load_variance(util) == pytest.approx(0.25**2)


def test_step_outcomes_rewards_and_the_deployed_count():
    big = [1.0, 10.0, 8.0, 100.0]  # a whole card; 3 clusters × 2 hosts × 2 cards = 12 cards
    env = env_with([big] * 13 + [[1.0, 1.0, 1.0, 5.0]] * 2)
    rewards = [env.choose(n)[1] for n in (0, 0, 1)]
    # Cluster 0 is the most used after each of its deployments (Score 1 → 0); cluster 1 then has
    # half of cluster 0's utilisation and cluster 2 none: Score 0.5 → -5.
    assert rewards == [0.0, 0.0, pytest.approx(-5.0)]
    for n in (0, 0, 1, 1, 1, 2, 2, 2, 2):
        assert env.choose(n)[3:] == (False, {"outcome": "deployed"})
    _, r, _, _, info = env.choose(0)  # no card left anywhere: the deployment fails
    assert (r, info["outcome"]) == (-50.0, "failed")
    _, r, _, _, info = env.choose(TINY.wait)  # nothing fits: a correct wait
    assert (r, info["outcome"]) == (0.0, "waited_ok")
    _, _, done, _, info = env.choose(TINY.wait)
    m = info["metrics"]
    assert done and (m["deployed"], m["failed"], m["waited_ok"], m["N"]) == (12, 1, 2, 14)
    assert m["util_gpu_mem_gb_mean"] == 1.0 and m["gpu_load_var"] == 0.0


def test_waiting_while_a_cluster_fits_is_penalised_and_n_counts_correct_waits():
    env = env_with([[1.0, 1.0, 1.0, 5.0], [1.0, 1.0, 9.0, 5.0]])  # the second fits no card
    _, r, _, _, info = env.choose(env.setting.wait)
    assert (r, info["outcome"]) == (-50.0, "waited_wrong")
    _, r, done, _, info = env.choose(env.setting.wait)
    assert (r, info["outcome"], done) == (0.0, "waited_ok", True)
    assert info["metrics"]["N"] == 1 and info["metrics"]["waited_wrong"] == 1
    with pytest.raises(RuntimeError):
        env.choose(0)


def test_the_continuous_action_maps_to_equal_bins_with_wait_last():
    env = env_with([[1, 1, 1, 1]])
    bins = TINY.clusters + 1
    assert env.action_index([-1.0]) == 0 and env.action_index([1.0]) == TINY.wait
    assert env.action_index([-1.0 + 2 / bins - 1e-6]) == 0
    assert env.action_index([-1.0 + 2 / bins + 1e-6]) == 1
    assert [env.action_index(env.action_of(i)) for i in range(bins)] == list(range(bins))
    assert env.observation_space.contains(env.observe())


# --- heuristics ------------------------------------------------------------------------------------
def test_heuristics_choose_among_aggregate_fits_by_their_rule_and_wait_otherwise():
    env = env_with([[2.0, 20.0, 2.0, 20.0], [500.0, 1.0, 1.0, 1.0]])
    c = env.cluster
    c.card_used[0:2, :, :] = (7.0, 90.0)  # cluster 0: 1 GB and 10 core on each of 4 cards
    c.card_used[2:4, :, :] = (4.0, 40.0)  # cluster 1: half used
    rng = np.random.default_rng(0)
    # Cluster 0's aggregate (4 GB, 40 core) covers the task, no card of it does.
    assert c.aggregate_fit(env.task).tolist() == [True, True, True]
    assert c.true_fit(env.task).tolist() == [False, True, True]
    assert greedy(env, rng) == 0 and bestfit(env, rng) == 0  # both fooled by the aggregate
    assert utilization(env, rng) == 2  # free shares most proportional to the request
    assert {random_choice(env, np.random.default_rng(s)) for s in range(40)} == {0, 1, 2}
    assert expert(env, rng) == 1  # asks the clusters; the fuller one that can host
    assert aggregate_expert(env, rng) == 0  # the paper's: judges by the aggregate, fooled too
    assert worstfit_gpu(env, rng) == 2  # the most free GPU memory and cores
    assert env.choose(greedy(env, rng))[4]["outcome"] == "failed"
    assert (env.tally.failed_fragmented, env.tally.failed_aggregate) == (1, 0)
    for rule in (greedy, bestfit, utilization, random_choice, expert, aggregate_expert):
        assert rule(env, rng) == TINY.wait  # 500 cores fit nowhere
    env.choose(1)  # its aggregate does not cover 500 cores: the view showed it infeasible
    assert (env.tally.failed_fragmented, env.tally.failed_aggregate, env.tally.failed) == (1, 1, 2)


def test_utilization_prefers_free_resources_in_the_task_proportions():
    env = env_with([[60.0, 10.0, 1.0, 10.0]])  # cpu-heavy
    env.cluster.host_used[0:2, 0] = 60.0  # cluster 0 has little cpu left, lots of GPU
    env.cluster.card_used[2:4, :, 0] = 6.0  # cluster 1 has cpu but little GPU memory
    assert utilization(env, np.random.default_rng(0)) == 1


def test_the_expert_deploys_on_the_best_scoring_cluster_that_can_host_and_never_fails():
    env = env_with([[1.0, 1.0, 2.0, 10.0]])
    env.cluster.card_used[0:2, :, :] = (7.5, 50.0)  # fullest but fragmented: cannot host
    env.cluster.card_used[2:4, 0, :] = (4.0, 40.0)  # cluster 1: fuller than cluster 2
    assert expert(env, np.random.default_rng(0)) == 1
    lay = layout()
    m = run_episode(
        MultiClusterEnv(lay, TINY),
        lambda e: expert(e, None),
        TINY.shapes.sample(np.random.default_rng(3), TINY.tasks, 8.0),
    )
    assert m["failed"] == 0 and m["waited_wrong"] == 0 and m["N"] == TINY.tasks


def test_the_member_expert_is_the_policy_that_greedily_maximises_the_reward():
    import copy

    env = MultiClusterEnv(layout(), TINY)
    env.reset(options={"tasks": TINY.shapes.sample(np.random.default_rng(4), TINY.tasks, 8.0)})
    rng, done = np.random.default_rng(0), False
    while not done:
        rewards = [copy.deepcopy(env).choose(a)[1] for a in range(TINY.wait + 1)]
        choice = expert(env, rng)
        assert rewards[choice] == max(rewards)
        _, _, done, _, _ = env.choose(choice)


# --- settings -------------------------------------------------------------------------------------
def test_the_faithful_setting_mixes_card_counts_and_keeps_the_trace_tails():
    machines = [Machine(f"p{i}", "P100", 64, 512, 2) for i in range(40)] + [
        Machine(f"v{i}", "V100", 96, 384, 8) for i in range(40)
    ]
    faithful = SETTINGS["faithful"]
    setting = replace(faithful, clusters=4, hosts=4, eight_card_share=0.25)
    lay = build_layout(machines, np.random.default_rng(0), setting)
    cards = (lay.card_cap[:, :, 1] > 0).sum(axis=1)
    assert sorted(cards.tolist()) == [2] * 12 + [8] * 4
    assert lay.card_cap.shape[1] == 8 and cards[:4].tolist() != [8] * 4  # placed at random
    ours = build_layout(machines, np.random.default_rng(0), replace(setting, eight_card_share=0))
    assert (ours.card_cap[:, :, 1] > 0).sum() == 32  # ours: the 2-card rows only
    t = faithful.shapes.sample(np.random.default_rng(1), 40_000, 8.0)
    assert abs((t[:, 0] > 60).mean() - 8 / 100) < 0.01 and t[:, 0].max() <= 96
    assert abs((t[:, 1] > 300).mean() - 7 / 100) < 0.01 and t[:, 1].max() <= 512
    assert faithful.expert == "aggregate" and SETTINGS["ours"].expert == "member"


def test_a_fixed_stream_is_deployed_at_every_reset():
    stream = TINY.shapes.sample(np.random.default_rng(2), TINY.tasks, 8.0)
    env = MultiClusterEnv(layout(), TINY, stream)
    for seed in (0, 1):
        env.reset(seed=seed)
        assert np.array_equal(env.tasks, stream)
    fresh = MultiClusterEnv(layout(), TINY)
    fresh.reset(seed=0)
    assert not np.array_equal(fresh.tasks, stream)
    names = {
        (s, f): ExperimentConfig(setting=s, fixed_stream=f).variant
        for s in ("ours", "faithful")
        for f in (False, True)
    }
    assert names == {
        ("ours", False): "",
        ("ours", True): "fixed",
        ("faithful", True): "faithful",
        ("faithful", False): "faithful-streams",
    }


# --- EADE's parts ---------------------------------------------------------------------------------
def test_the_dual_buffer_takes_the_expert_share_of_every_batch():
    obs = spaces.Box(0, 1, (8,), np.float32)
    act = spaces.Box(-1, 1, (1,), np.float32)
    buf = DualReplayBuffer(1000, obs, act, "cpu", expert_share=0.1, expert_size=100)
    for _ in range(300):
        buf.add(
            np.zeros((1, 8)),
            np.zeros((1, 8)),
            np.zeros((1, 1)),
            np.array([0.0]),
            np.array([False]),
            [{}],
        )
    assert (buf.sample(256).rewards == 0).all()  # no expert data yet: all online
    for _ in range(50):
        buf.add_expert(np.ones(8), np.ones(8), np.ones(1), -999.0, False)
    for batch in (256, 64, 10):
        s = buf.sample(batch)
        assert len(s.rewards) == batch
        assert int((s.rewards == -999).sum()) == round(0.1 * batch)
        assert ((s.observations[:, 0] == 1) == (s.rewards[:, 0] == -999)).all()
    with pytest.raises(ValueError):
        DualReplayBuffer(10, obs, act, "cpu", expert_share=1.5)


def test_the_attention_critic_sees_the_action_and_passes_its_gradient():
    obs = spaces.Box(0, 1, (3 * 4 + 4,), np.float32)
    act = spaces.Box(-1, 1, (1,), np.float32)
    critic = AttentionCritic(
        obs, act, [16, 8], ClusterAttention(obs, clusters=3, action_dim=1, features_dim=16), 16
    )
    x = torch.rand(5, 16)
    a = torch.zeros(5, 1, requires_grad=True)
    q = critic.q1_forward(x, a)
    q.sum().backward()
    assert q.shape == (5, 1) and a.grad.abs().sum() > 0  # the actor's gradient exists
    assert not torch.allclose(critic(x, torch.ones(5, 1))[0], critic(x, -torch.ones(5, 1))[0])
    with pytest.raises(ValueError, match="not 4 clusters"):
        ClusterAttention(obs, clusters=4)


def test_eade_uses_the_paper_rates_attention_and_expert_buffer():
    env = MultiClusterEnv(layout(), TINY)
    cfg = AgentConfig(batch=16, learning_starts=20, expert_episodes=1, buffer=500)
    model = build("EADE-DDPG", env, cfg, seed=0)
    assert isinstance(model.actor.features_extractor, ClusterAttention)
    assert isinstance(model.critic, AttentionCritic) and len(model.critic.q_networks) == 1
    fill_expert(model.replay_buffer, layout(), TINY, 1, seed=0)
    assert model.replay_buffer.expert.size() == TINY.tasks
    model.learn(60)
    assert model.actor.optimizer.param_groups[0]["lr"] == 1e-4
    assert model.critic.optimizer.param_groups[0]["lr"] == 1e-3
    plain = build("DDPG", env, cfg, seed=0)
    assert not isinstance(plain.actor.features_extractor, ClusterAttention)


def test_checkpoints_round_trip_to_the_same_actions(tmp_path):
    env = MultiClusterEnv(layout(), TINY)
    obs = np.random.default_rng(0).random((20, 3 * 4 + 4)).astype(np.float32)
    for name in ALGORITHMS:
        model = build(name, env, AgentConfig(batch=8, buffer=100), seed=1)
        save_acting(model, name, AgentConfig(batch=8, buffer=100), tmp_path / "m.pt", {"x": 1})
        loaded_name, loaded, meta = load_acting(tmp_path / "m.pt", env)
        assert loaded_name == name and meta == {"x": 1}
        assert np.array_equal(
            model.predict(obs, deterministic=True)[0], loaded.predict(obs, deterministic=True)[0]
        ), name


def test_smoke_experiment_trains_saves_and_evaluates_every_algorithm(tmp_path, monkeypatch):
    import scheduler.eade.experiment as experiment

    small = AgentConfig(batch=16, learning_starts=20, expert_episodes=1, buffer=1000)
    monkeypatch.setattr(experiment, "AgentConfig", lambda: small)
    cfg = ExperimentConfig(seeds=1, episodes=1, eval_episodes=1, curve_every=1, curve_streams=1)
    assert train_all(cfg, small, lambda s: layout(), TINY, tmp_path)
    curves = curves_of(cfg, tmp_path)
    assert set(curves) == set(ALGORITHMS)
    assert all(rows[0][0]["episode"] == 1 and "val_N" in rows[0][0] for rows in curves.values())
    doc = evaluate_all(cfg, lambda s: layout(), TINY, tmp_path)
    assert set(doc["algorithms"]) == set(cfg.algorithms) | set(REFERENCES)
    assert doc["algorithms"]["Expert"]["N"]["mean"] == TINY.tasks
    assert all(0 < r["N"]["mean"] <= TINY.tasks for r in doc["algorithms"].values())
    assert doc["training"]["EADE-DDPG"]["cpu_s"]["mean"] > 0
    # The evaluation is a pure function of the checkpoints and the seed.
    again = evaluate_all(cfg, lambda s: layout(), TINY, tmp_path)
    assert again["per_seed"] == doc["per_seed"]
    model = load_acting(tmp_path / "ddpg_seed0.pt", MultiClusterEnv(layout(), TINY))[1]
    assert 0 <= agent_chooser(model)(env_with([[1, 1, 1, 1]])) <= TINY.wait


@pytest.mark.parametrize("name", ["EADE-DDPG", "PPO"])
def test_a_stopped_training_resumes_from_its_state_and_the_fixed_stream_is_evaluated(
    tmp_path, name
):
    small = AgentConfig(batch=16, learning_starts=20, expert_episodes=1, buffer=1000)
    cfg = ExperimentConfig(
        seeds=1,
        episodes=3,
        eval_episodes=1,
        curve_every=1,
        algorithms=(name, "Random"),
        fixed_stream=True,
        checkpoint_every=1,
    )
    args = (cfg, small, lambda s: layout(), TINY, tmp_path / "ck", lambda w, u: None)
    states = tmp_path / "states"
    assert not train_all(*args, states, False, 0.0)  # stops after its first episode
    meta = torch.load(checkpoint_path(tmp_path / "ck", name, 0), weights_only=True)["meta"]
    assert (meta["episodes"], meta["planned"]) == (1, 3)
    assert train_all(*args, states, True)
    meta = torch.load(checkpoint_path(tmp_path / "ck", name, 0), weights_only=True)["meta"]
    assert meta["episodes"] == 3 and [r["episode"] for r in meta["curve"]] == [1, 2, 3]
    assert all(len(r) > 3 for r in meta["curve"])  # validated every episode, resumed or not
    assert train_all(*args, states, True)  # done: kept as it is
    doc = evaluate_all(cfg, lambda s: layout(), TINY, tmp_path / "ck")
    assert set(doc["held_out"]) == set(doc["algorithms"])
    assert doc["training"][name]["episodes"] == 3
    assert "N held-out" in table(doc) and "3 training episodes" in table(doc)
    rows = [line for line in table(doc).splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in rows}) == 1  # the separator too: a markdown table


def test_episodes_trained_says_where_seeds_stopped_apart():
    """A training stopped by --stop-after-s leaves its seeds at different episodes: the table
    gives the range, not seed 0's count."""
    assert episodes_trained({"episodes": 100, "episodes_per_seed": [100, 100, 100]}) == "100"
    assert episodes_trained({"episodes": 712, "episodes_per_seed": [712, 690, 731]}) == "690–731"
    assert episodes_trained({"episodes": 100}) == "100"  # results made before per-seed counts


def test_seeds_train_apart_as_they_train_together(tmp_path):
    """--only-seed: two processes, one seed each, leave the checkpoints one process leaves."""
    small = AgentConfig(batch=16, learning_starts=20, buffer=1000)
    cfg = ExperimentConfig(seeds=2, episodes=2, curve_every=1, algorithms=("DDPG",))
    both, apart = tmp_path / "both", tmp_path / "apart"
    assert train_all(cfg, small, lambda s: layout(), TINY, both)
    for seed in (1, 0):
        assert train_all(cfg, small, lambda s: layout(), TINY, apart, only_seed=seed)
    for seed in (0, 1):
        a, b = (
            torch.load(checkpoint_path(d, "DDPG", seed), weights_only=True) for d in (both, apart)
        )
        assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])


def test_diagnostics_run_every_rule_on_every_setting(monkeypatch):
    import scheduler.eade.experiment as experiment

    monkeypatch.setattr(
        experiment, "DIAGNOSED", {"tiny": TINY, "tiny, fewer": replace(TINY, tasks=10)}
    )
    doc = experiment.diagnose(1, 1, lambda setting, seed: layout())
    assert set(doc["settings"]) == {"tiny", "tiny, fewer"}
    rows = doc["settings"]["tiny"]["algorithms"]
    assert set(rows) == {*experiment.HEURISTICS, *REFERENCES}
    assert rows["Expert"]["N"]["mean"] == TINY.tasks
    assert "failed_aggregate" in rows["Greedy"] and doc["paper_table6"]["Random"]


def test_cli_rejects_bad_input_with_one_line_and_status_2(tmp_path, capsys):
    for argv, message in (
        (["train", "--seeds", "0"], "--seeds: expected an integer ≥ 1"),
        (["train", "--algorithms", "EADE", "Greedy"], "--algorithms: unknown algorithm"),
        (["all", "--machines", str(tmp_path / "no.csv")], "no such file"),
        (["evaluate", "--checkpoints", str(tmp_path)], "no checkpoint"),
        (["train", "--seeds", "2", "--only-seed", "2"], "--only-seed: expected a seed in 0..1"),
        (["evaluate", "--only-seed", "0"], "with the train command"),
    ):
        assert cli(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    with pytest.raises(SystemExit) as e:
        cli(["fly"])
    assert e.value.code == 2
    run = subprocess.run(
        [sys.executable, "-m", "scheduler.eade", "train", "--episodes", "-1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().count("\n") == 0 and "--episodes" in run.stderr


# --- eade-ddpg in CES --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ces_checkpoint(tmp_path_factory) -> Path:
    small = replace(ces.CesEadeConfig().instances, sites=(2, 6), episodes_per_topology=4)
    cfg = ces.CesEadeConfig(
        episodes=30, expert_episodes=5, learning_starts=20, batch=16, instances=small
    )
    agent = ces.train(cfg)
    path = tmp_path_factory.mktemp("ces") / "ces.pt"
    ces.save(agent, cfg, path, {})
    return path


def test_eade_ddpg_is_registered_and_gives_feasible_decisions(ces_checkpoint):
    algo = make_algorithm("eade-ddpg", checkpoint=ces_checkpoint)
    rng = np.random.default_rng(5)
    placed = 0
    for _ in range(15):
        cluster, job = random_instance(rng)
        try:
            d = algo.place(cluster, job)
        except CannotPlace:
            continue
        assert check_decision(cluster, job, d) == []
        placed += 1
    assert placed >= 8
    with pytest.raises(FileNotFoundError, match=r"python -m scheduler.eade.ces"):
        make_algorithm("eade-ddpg", checkpoint=ces_checkpoint.with_name("none.pt"))


def test_ces_critic_weighs_feasible_nodes_only_and_scores_get_a_gradient():
    critic = ces.Critic(5, 8, temperature=0.1)
    x = torch.rand(2, 4, 5)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    real = torch.tensor([[True, True, True, False], [True, True, True, True]])
    a = torch.zeros(2, 4, requires_grad=True)
    critic(x, mask, real, a).sum().backward()
    assert (a.grad[0, 2:] == 0).all() and a.grad[0, :2].abs().sum() > 0
    assert a.grad[1].abs().sum() > 0


def test_ces_dual_replay_share_and_the_expert_replays_network_aware():
    import random

    replay = ces.DualReplay(100, 0.1, random.Random(0))
    dummy = ces.Transition(
        ces.State(np.zeros((1, 2), np.float32), np.ones(1, bool)),
        np.zeros(1, np.float32),
        0.0,
        None,
    )
    replay.online.extend([dummy] * 50)
    assert replay.expert_count(64) == 0
    marked = replace(dummy, reward=-1.0)
    replay.expert = [marked] * 10
    batch = replay.sample(64)
    assert sum(t.reward == -1.0 for t in batch) == 6 and len(batch) == 64
    rng = np.random.default_rng(2)
    for _ in range(10):
        cluster, job = random_instance(rng)
        steps = ces.expert_episode(cluster, job)
        if steps:
            nodes = cluster.compute_nodes()
            want = make_algorithm("network-aware").place(cluster, job).placement
            from scheduler.baselines import placement_order

            chosen = [nodes[int(np.argmax(t.action))] for t in steps]
            assert chosen == [want[t.name] for t in placement_order(job)]
            assert steps[-1].next_state is None
            return
    pytest.fail("network-aware placed none of 10 random instances")
