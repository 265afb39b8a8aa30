"""The CES-PPO environment: gymnasium API, masks that never let an infeasible choice through,
features read from the shortest-path trees as they would be computed afresh, the return by hand,
and the job's network part from CES's network decision."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import networkx as nx
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.baselines import make_algorithm
from scheduler.env import (
    FAILED,
    EnvConfig,
    PlacementEnv,
    PlacementEpisode,
    TrainingInstances,
    episode_return,
)
from scheduler.instances import JobDistribution, held_out, random_instance
from scheduler.jobs import ring_job, star_job
from scheduler.layout import shortest_tree
from scheduler.metrics import DEFAULT_MODEL, predicted_iteration_s
from scheduler.model import (
    EPS,
    CannotPlace,
    Cluster,
    Decision,
    FlowAssignment,
    Job,
    LogicalFlow,
    Resources,
    Task,
    check_decision,
)
from scheduler.paths import route_placement
from topologies import parse_topology

SMALL = EnvConfig(
    sites=(4, 12),
    real_share=0.0,
    episodes_per_topology=4,
    small_jobs=JobDistribution(max_workers=4),
)


def line_cluster(bw: float = 100.0, cpu: float = 1.0) -> Cluster:
    """a, c on switch s1; b on s2; s1-s2 is the only way between them."""
    doc = {
        "name": "line",
        "switches": [{"name": "s1"}, {"name": "s2"}],
        "nodes": [
            {"name": "a", "cpu": cpu, "mem_mb": 1024},
            {"name": "b", "cpu": cpu, "mem_mb": 1024},
            {"name": "c", "cpu": cpu, "mem_mb": 1024},
        ],
        "links": [
            {"ends": ["s1", "s2"], "bw_mbps": bw},
            {"ends": ["a", "s1"], "bw_mbps": 1000},
            {"ends": ["c", "s1"], "bw_mbps": 1000},
            {"ends": ["b", "s2"], "bw_mbps": 1000},
        ],
    }
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


def test_training_never_draws_a_held_out_network():
    draw = TrainingInstances(EnvConfig(real_share=1.0), seed=0)
    assert draw.networks and not any(held_out(k) for k in draw.networks)
    assert not any(k.startswith(("topozoo/Abilene", "sndlib/polska")) for k in draw.networks)


def test_ring_tasks_are_placed_in_ring_order():
    job = ring_job("r", 5, Resources(0.1, 64), 1e6, 10)
    ep = PlacementEpisode(line_cluster(), job)
    order = ep.order
    # Every task after the first has a logical neighbour placed before it.
    for i, t in enumerate(order[1:], 1):
        assert any({f.src, f.dst} & set(order[:i]) for f in job.flows if t in (f.src, f.dst))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_masks_never_let_an_infeasible_choice_through(seed):
    draw = TrainingInstances(SMALL, seed)
    rng = np.random.default_rng(seed)
    for _ in range(4):
        cluster, job = draw.next()
        ep = PlacementEpisode(cluster, job)
        while not ep.done:
            obs = ep.observe()
            demand = np.array(ep.tasks[ep.task].demand.as_tuple())
            free = ep.free - ep.job_used
            for v in np.flatnonzero(obs.mask):
                assert (demand <= free[v] + EPS).all(), "a node without room is unmasked"
                assert ep.compute[v] not in cluster.offline
            ep.step(int(rng.choice(np.flatnonzero(obs.mask))))
        if not ep.failed:
            decision = ep.decision()
            assert check_decision(cluster, job, decision) == []


def routes(cluster: Cluster, job: Job, placement: dict[str, str]) -> bool:
    try:
        route_placement(cluster, job, placement)
    except CannotPlace:
        return False
    return True


def test_the_mask_accepts_exactly_the_nodes_route_placement_can_route():
    """At a job's last step the mask accepts exactly the nodes with room for the task from which
    CES's network decision (`paths.route_placement`) routes the whole job, and every rollout the
    mask lets finish is routed: on training instances loaded up to 0.95 (saturated links among
    them) and on the exact reference's small random instances."""
    draw_cfg = replace(SMALL, sites=(3, 20), background=(0.5, 0.95), spread_share=0.7)
    saturated = checked = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        draw = TrainingInstances(draw_cfg, seed)
        for cluster, job in (draw.next(), draw.next(), random_instance(rng)):
            ep = PlacementEpisode(cluster, job)
            saturated += ep.saturated
            while not ep.done:
                mask = ep.observe().mask
                if ep.t == len(ep.order) - 1:
                    demand = np.array(ep.tasks[ep.task].demand.as_tuple())
                    room = (demand <= ep.free - ep.job_used + EPS).all(axis=1) & ep.online
                    for v in np.flatnonzero(room):
                        placement = ep.placement_names() | {ep.task: ep.compute[v]}
                        assert mask[v] == routes(cluster, job, placement), (job.name, placement)
                        checked += 1
                ep.step(int(rng.choice(np.flatnonzero(mask))))
            if not ep.failed:
                assert check_decision(cluster, job, ep.decision()) == []
    assert saturated >= 20 and checked >= 300  # the mask's network part had work to do


def test_step_features_read_from_the_trees_match_paths_computed_afresh():
    """Hops and bottleneck widths come from shortest-path trees kept per graph and filled level
    by level; each must be the hop count and smallest residual of a fewest-hop path through
    switches, as networkx finds it on the cluster as it is."""
    cluster, _ = TrainingInstances(EnvConfig(sites=(20, 40), real_share=0.0), 3).next()
    ep = PlacementEpisode(cluster, ring_job("r", 2, Resources(0.1, 64), 1e6, 10.0))
    g = cluster.graph
    for v in range(0, len(ep.compute), 5):
        src = ep.compute[v]
        view = nx.subgraph_view(
            g, filter_node=lambda x, src=src: x == src or g.nodes[x]["kind"] == "switch"
        )
        hops = nx.single_source_shortest_path_length(view, src)
        tree = shortest_tree(ep.layout, v)
        for inward in (False, True):
            width = ep._bottleneck(v, inward)
            for w, name in enumerate(ep.compute):
                if w == v:
                    continue
                sw = list(g.neighbors(name))  # a compute node's access switch(es)
                expect = min((hops[s] + 1 for s in sw if s in hops), default=math.inf)
                assert tree.hops[w] == expect
                if math.isinf(expect):
                    assert width[w] == 0
                    continue
                path, x = [w], w  # the tree's path, checked link by link
                while x != v:
                    x = int(tree.parent[x])
                    path.append(x)
                names = [ep.vertices[i] for i in reversed(path)]
                links = list(itertools.pairwise(names))
                if inward:
                    links = [(b, a) for a, b in links]
                assert width[w] == pytest.approx(max(min(cluster.residual(*lk) for lk in links), 0))


def test_the_guidance_is_network_aware_s_measure():
    """The guidance features rank the nodes as network-aware's key does: on instances of every
    kind, each node network-aware chooses is the smallest by (blocked, weighted hops) among the
    nodes the mask allows."""
    draw = TrainingInstances(replace(EnvConfig(sites=(10, 40)), background=(0.3, 0.6)), 5)
    steps = 0
    for _ in range(40):
        cluster, job = draw.next()
        try:
            chosen = make_algorithm("network-aware").place(cluster, job).placement
        except CannotPlace:
            continue
        ep = PlacementEpisode(cluster, job)
        while not ep.done:
            obs, v = ep.observe(), ep.compute.index(chosen[ep.task])
            if not obs.mask[v]:
                break
            key = obs.guide[:, 0] * 2 + obs.guide[:, 1]
            if ep.t > 0:
                assert key[v] <= key[obs.mask].min() + 1e-6
                steps += 1
            ep.step(v)
    assert steps > 100


def test_a_link_capacity_change_reaches_the_next_episode():
    """The layout is kept per graph; a link's new bandwidth (a simulator event) must still show."""
    cluster = line_cluster(bw=100.0)
    job = ring_job("r", 2, Resources(0.25, 128), 1e6, 10.0)
    before = PlacementEpisode(cluster, job)
    cluster.graph.edges["s1", "s2"]["bw_mbps"] = 10.0
    after = PlacementEpisode(cluster, job)
    assert after.layout is before.layout
    e = after.layout.edge_id[("s1", "s2")]
    assert (before.residual[e], after.residual[e]) == (100.0, 10.0)
    assert after.graph_input().edge_x[e, 0] < before.graph_input().edge_x[e, 0]


def test_a_masked_node_is_refused_and_the_env_ends_the_episode_with_the_penalty():
    cluster = line_cluster(cpu=0.5)
    job = ring_job("r", 2, Resources(0.5, 64), 1e6, 10)
    ep = PlacementEpisode(cluster, job)
    assert ep.observe().mask.tolist() == [True, True, True]
    ep.step(0)  # w0 on a: a is now full
    assert ep.observe().mask.tolist() == [False, True, True]
    with pytest.raises(ValueError, match="masked"):
        ep.step(0)
    env = PlacementEnv(SMALL)
    env.reset(options={"cluster": cluster, "job": job})
    env.step(0)
    _, reward, done, _, info = env.step(0)
    assert done and reward == FAILED and not info["placed"] and "masked" in info["reason"]


def test_a_task_that_fits_nowhere_is_masked_everywhere():
    job = ring_job("r", 2, Resources(4.0, 64), 1e6, 10)
    ep = PlacementEpisode(line_cluster(cpu=1.0), job)
    assert not ep.observe().mask.any()


def test_the_return_is_the_log_speed_up_over_network_aware_by_hand():
    """Two 0.5-cpu workers on 0.5-cpu nodes must split. a and c share s1 (1000 Mbit/s access
    links): both flows get the 400 Mbit/s they ask. b sits behind the 100 Mbit/s s1-s2 link:
    with the workers on a and b each flow gets 100. The returns, both against network-aware's
    decision, differ by the log of the two iteration times, which differ by the communication."""
    cluster = line_cluster(bw=100.0, cpu=0.5)
    job = ring_job("r", 2, Resources(0.5, 512), 4e6, 400.0, compute_s=0.1)
    returns, times = [], []
    for second in (2, 1):  # c, then b
        ep = PlacementEpisode(cluster, job)
        ep.step(0)
        ep.step(second)
        reward, info = episode_return(ep)
        ref = make_algorithm("network-aware").place(cluster, job)
        assert info["iteration_s"] == pytest.approx(
            predicted_iteration_s(cluster, job, ep.decision())
        )
        assert info["heuristic_iteration_s"] == pytest.approx(
            predicted_iteration_s(cluster, job, ref)
        )
        assert reward == pytest.approx(
            math.log(info["heuristic_iteration_s"] / info["iteration_s"])
        )
        assert {f.rate_mbps for f in ep.decision().flows} == {400.0 if second == 2 else 100.0}
        returns.append(reward)
        times.append(info["iteration_s"])
    flows = [(f.bytes_per_iter, 1.0) for f in job.flows]
    comm = {
        r: DEFAULT_MODEL.communication_s([(b, r) for b, _ in flows], steps=2)
        for r in (400.0, 100.0)
    }
    assert times[1] - times[0] == pytest.approx(comm[100.0] - comm[400.0])
    assert returns[0] - returns[1] == pytest.approx(math.log(times[1] / times[0]))


def test_the_network_part_is_ces_network_decision_for_the_placement():
    draw = TrainingInstances(replace(SMALL, spread_share=1.0), 11)
    rng = np.random.default_rng(0)
    spread = 0
    for _ in range(10):
        cluster, job = draw.next()
        ep = PlacementEpisode(cluster, job)
        while not ep.done:
            ep.step(int(rng.choice(np.flatnonzero(ep.observe().mask))))
        if ep.failed:
            continue
        placement = ep.placement_names()
        assert ep.decision().flows == route_placement(cluster, job, placement)
        spread += len(set(placement.values())) > 1
    assert spread >= 5  # jobs no node holds: their flows cross the network


def test_colocated_tasks_need_no_flow_and_cost_no_communication():
    cluster = line_cluster()
    job = star_job("s", 2, Resources(0.25, 128), 1e6, 50.0, compute_s=0.1)
    ep = PlacementEpisode(cluster, job)
    while not ep.done:
        ep.step(0)
    d = ep.decision()
    assert d.flows == [] and set(d.placement.values()) == {"a"}
    assert predicted_iteration_s(cluster, job, d) == pytest.approx(
        DEFAULT_MODEL.iteration_s([0.1 / 0.25] * 3, [])
    )


def test_a_saturated_link_masks_nodes_that_cannot_reach_the_peers():
    cluster = line_cluster(bw=100.0)
    bg = Job(
        "bg",
        [Task("x", Resources()), Task("y", Resources())],
        [LogicalFlow("x", "y", 100.0, 0.0)],
        collective="custom",
    )
    cluster.allocate(
        bg,
        Decision(
            "bg", {"x": "a", "y": "b"}, [FlowAssignment("x", "y", ("a", "s1", "s2", "b"), 100.0)]
        ),
    )
    job = ring_job("r", 2, Resources(0.25, 128), 1e6, 10.0)
    ep = PlacementEpisode(cluster, job)
    ep.step(0)  # w0 on a: w0→w1 cannot leave s1 towards s2
    assert ep.observe().mask.tolist() == [True, False, True]
