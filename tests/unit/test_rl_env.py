"""The CES-PPO environment: gymnasium API, masks that never let an infeasible choice through,
the heuristic reward computed by hand, and clear failures on masked choices."""
from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.env import EnvConfig, PlacementEnv, PlacementEpisode, RewardConfig
from scheduler.jobs import ring_job, star_job
from scheduler.metrics import DEFAULT_MODEL, load_balance, predicted_iteration_s
from scheduler.model import EPS, Cluster, Job, Resources, check_decision
from topologies import parse_topology

SMALL = EnvConfig(sites=(4, 12), episodes_per_topology=4)


def line_cluster(bw: float = 100.0, cpu: float = 1.0) -> Cluster:
    """a, c on switch s1; b on s2; s1-s2 is the only way between them."""
    doc = {"name": "line", "switches": [{"name": "s1"}, {"name": "s2"}],
           "nodes": [{"name": "a", "cpu": cpu, "mem_mb": 1024},
                     {"name": "b", "cpu": cpu, "mem_mb": 1024},
                     {"name": "c", "cpu": cpu, "mem_mb": 1024}],
           "links": [{"ends": ["s1", "s2"], "bw_mbps": bw},
                     {"ends": ["a", "s1"], "bw_mbps": 1000},
                     {"ends": ["c", "s1"], "bw_mbps": 1000},
                     {"ends": ["b", "s2"], "bw_mbps": 1000}]}
    return Cluster.from_topology(parse_topology(doc, "<test>"))


def test_follows_the_gymnasium_api():
    check_env(PlacementEnv(SMALL), skip_render_check=True)


def test_reset_with_a_seed_is_reproducible_and_the_mask_is_in_info():
    env = PlacementEnv(SMALL)
    obs1, info1 = env.reset(seed=7)
    obs2, info2 = env.reset(seed=7)
    assert np.array_equal(obs1["graph"].nodes, obs2["graph"].nodes)
    assert np.array_equal(info1["node_mask"], info2["node_mask"])
    n = info1["n_compute"]
    assert info1["node_mask"][:n].any() and not info1["node_mask"][n:].any()
    assert obs1["graph"].nodes[:n, 0].all() and not obs1["graph"].nodes[n:, 0].any()


def test_ring_tasks_are_placed_in_ring_order():
    job = ring_job("r", 5, Resources(0.1, 64), 1e6, 10)
    ep = PlacementEpisode(line_cluster(), job)
    order = ep.order
    # Every task after the first has a logical neighbour placed before it.
    for i, t in enumerate(order[1:], 1):
        assert any({f.src, f.dst} & set(order[:i]) for f in job.flows if t in (f.src, f.dst))


def _random_feasible_action(ep: PlacementEpisode, rng: np.random.Generator):
    node = int(rng.choice(np.flatnonzero(ep.observe().node_mask)))
    opts = ep.options(node)
    paths = [int(rng.choice(np.flatnonzero(m))) for m in opts.path_mask]
    rates = [int(rng.integers(len(ep.cfg.rate_levels))) for _ in opts.flows]
    return node, paths, rates


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_masks_never_let_an_infeasible_choice_through(seed):
    env = PlacementEnv(SMALL)
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(4):  # several jobs on the same, filling network
        env.reset()
        ep = env.episode
        while not ep.done:
            obs = ep.observe()
            demand = np.array(ep.tasks[ep.task].demand.as_tuple())
            free = ep.free - ep.job_used
            for v in np.flatnonzero(obs.node_mask):
                assert (demand <= free[v] + EPS).all(), "a node without room is unmasked"
                assert ep.compute[v] not in ep.cluster.offline
                opts = ep.options(int(v))
                for paths, mask in zip(opts.paths, opts.path_mask):
                    assert mask.any(), "an unmasked node has a flow with no usable path"
                    for p, ok in zip(paths, mask):
                        if ok:
                            assert ep.cluster.path_residual(p) > EPS
            node, paths, rates = _random_feasible_action(ep, rng)
            _, done, info = ep.step(node, paths, rates)
        if info["placed"]:
            assert check_decision(ep.cluster, ep.job, ep.decision()) == []


def test_remembered_path_widths_follow_the_jobs_own_requests():
    """The widths an episode remembers between steps (its node features) equal the ones
    computed afresh, also after this job's flows took bandwidth."""
    routed = 0
    for seed in range(8):
        env = PlacementEnv(SMALL)
        env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        for _ in range(3):
            env.reset()
            ep = env.episode
            while not ep.done:
                obs = ep.observe()
                ep._obs, ep._width_memo = None, {}
                fresh = ep.observe()
                assert np.array_equal(obs.node_x, fresh.node_x)
                assert np.array_equal(obs.edge_x, fresh.edge_x)
                node, paths, rates = _random_feasible_action(ep, rng)
                routed += len(paths)
                ep.step(node, paths, rates)
    assert routed > 0  # the case the memo must get right happened


def test_a_link_capacity_change_reaches_the_next_episode():
    """The layout is kept per graph; a link's new bandwidth (a simulator event) must still show."""
    cluster = line_cluster(bw=100.0)
    job = ring_job("r", 2, Resources(0.25, 128), 1e6, 10.0)
    before = PlacementEpisode(cluster, job)
    cluster.graph.edges["s1", "s2"]["bw_mbps"] = 10.0
    after = PlacementEpisode(cluster, job)
    assert after.layout is before.layout
    e = after.edge_id[("s1", "s2")]
    assert (before.cap[e], after.cap[e]) == (100.0, 10.0)
    assert after.observe().edge_x[e, 2] < before.observe().edge_x[e, 2]


def test_a_masked_node_or_path_is_penalised_and_ends_the_episode():
    cluster = line_cluster(cpu=0.5)
    job = ring_job("r", 2, Resources(0.5, 64), 1e6, 10)
    ep = PlacementEpisode(cluster, job)
    assert ep.observe().node_mask.tolist() == [True, True, True]
    ep.step(0, [], [])  # w0 on a: a is now full
    assert ep.observe().node_mask.tolist() == [False, True, True]
    reward, done, info = ep.step(0, [0], [0])
    assert done and not info["placed"] and "masked" in info["reason"]
    assert reward == -ep.cfg.reward.infeasible

    ep = PlacementEpisode(cluster, job)
    ep.step(0, [], [])
    reward, done, info = ep.step(1, [3], [0])  # there is one path only
    assert done and not info["placed"] and "path" in info["reason"]


def test_a_task_that_fits_nowhere_is_masked_everywhere():
    job = ring_job("r", 2, Resources(4.0, 64), 1e6, 10)
    ep = PlacementEpisode(line_cluster(cpu=1.0), job)
    assert not ep.observe().node_mask.any()


def test_the_reward_is_the_heuristic_of_design_3_by_hand():
    cfg = EnvConfig(reward=RewardConfig(balance=1.0, bandwidth=0.5, hops=0.05, iteration=1.0))
    cluster = line_cluster(bw=100.0)
    job = ring_job("r", 2, Resources(0.5, 512), 4e6, 80.0, compute_s=0.1)
    ep = PlacementEpisode(cluster, job, cfg)
    # Step 1: w0 on a. Ū_a = (0.5 + 0.5) / 2 = 0.5, the others 0: std 0.2357.
    r1, done, _ = ep.step(0, [], [])
    assert not done
    u = [0.5, 0.0, 0.0]
    assert r1 == pytest.approx(-(np.std(u) - 0.0))
    # Step 2: w1 on b, both flows at full demand: 80 each way on s1-s2 (100 free): all granted.
    r2, done, info = ep.step(1, [0, 0], [3, 3])
    assert done and info["placed"]
    decision = ep.decision()
    assert {f.rate_mbps for f in decision.flows} == {80.0}
    hops = 2 * 3 / 10 * 80 / 160  # two flows of three hops, each half the job's demand
    balance = np.std([0.5, 0.5, 0.0]) - np.std(u)
    pred = predicted_iteration_s(cluster, job, decision)
    assert info["iteration_s"] == pytest.approx(pred)
    # Same speed, no delay, every flow at its demand: the reference is exactly the prediction.
    assert ep.reference_s == pytest.approx(pred)
    assert r2 == pytest.approx(-balance - 0.05 * hops + 1.0 * math.log(ep.reference_s / pred))
    assert load_balance(_allocated(cluster, job, decision))[0] == pytest.approx(np.std([0.5, 0.5,
                                                                                       0.0]))


def _allocated(cluster: Cluster, job: Job, decision) -> Cluster:
    c = cluster.copy()
    c.allocate(job, decision)
    return c


def test_rate_levels_and_the_rate_split_set_the_granted_rates():
    cluster = line_cluster(bw=100.0)
    job = ring_job("r", 2, Resources(0.5, 512), 4e6, 80.0)
    ep = PlacementEpisode(cluster, job)
    ep.step(0, [], [])
    r, done, info = ep.step(1, [0, 0], [0, 3])  # w0→w1 asks 25 % (20), w1→w0 asks all (80)
    rates = {(f.src, f.dst): f.rate_mbps for f in ep.decision().flows}
    assert rates == {("w0", "w1"): pytest.approx(20.0), ("w1", "w0"): pytest.approx(80.0)}
    # 20 of 80 granted on one flow: satisfaction (20 + 80) / 160, weighted in the reward.
    assert ep.satisfaction == pytest.approx((20 - 80) / 160)


def test_colocated_tasks_need_no_flow_and_cost_no_communication():
    cluster = line_cluster()
    job = star_job("s", 2, Resources(0.25, 128), 1e6, 50.0, compute_s=0.1)
    ep = PlacementEpisode(cluster, job)
    while not ep.done:
        assert ep.options(0).flows == []
        ep.step(0, [], [])
    d = ep.decision()
    assert d.flows == [] and set(d.placement.values()) == {"a"}
    assert predicted_iteration_s(cluster, job, d) == pytest.approx(
        DEFAULT_MODEL.iteration_s([0.1 / 0.25] * 3, []))


def test_a_saturated_link_masks_nodes_that_cannot_reach_the_peers():
    cluster = line_cluster(bw=100.0)
    # Fill s1→s2 completely with a background flow a→b.
    from scheduler.model import Decision, FlowAssignment, LogicalFlow, Task
    bg = Job("bg", [Task("x", Resources()), Task("y", Resources())],
             [LogicalFlow("x", "y", 100.0, 0.0)], collective="custom")
    cluster.allocate(bg, Decision("bg", {"x": "a", "y": "b"},
                                  [FlowAssignment("x", "y", ("a", "s1", "s2", "b"), 100.0)]))
    job = ring_job("r", 2, Resources(0.25, 128), 1e6, 10.0)
    ep = PlacementEpisode(cluster, job)
    ep.step(0, [], [])  # w0 on a: w0→w1 cannot leave s1 towards s2
    assert ep.observe().node_mask.tolist() == [True, False, True]
