"""Local search over a placement (scheduler/improve.py) and CES-PPO's decoding, whose last stage
it is."""

from __future__ import annotations

import numpy as np

from scheduler.baselines import make_algorithm
from scheduler.env import PlacementEpisode
from scheduler.improve import improve, moves
from scheduler.instances import random_instance
from scheduler.jobs import ring_job
from scheduler.metrics import Rank, predicted_iteration_s, spare_iteration_s
from scheduler.model import CannotPlace, Cluster, Decision, Resources, check_decision
from scheduler.paths import route_placement
from topologies import parse_topology


def _cluster(nodes: list[dict], links: list[dict]) -> Cluster:
    switches = sorted({e for lk in links for e in lk["ends"] if e.startswith("s")})
    return Cluster.from_topology(
        parse_topology(
            {
                "name": "t",
                "switches": [{"name": s} for s in switches],
                "nodes": nodes,
                "links": links,
            },
            "test",
        )
    )


def _decision(cluster: Cluster, job, placement: dict[str, str]) -> Decision:
    return Decision(job.name, placement, route_placement(cluster, job, placement))


# a and b, two 2-core nodes behind a 100 Mbit/s link: a 4-task ring of 1-core tasks fills both
PAIR = dict(
    nodes=[{"name": "a", "cpu": 2, "mem_mb": 4096}, {"name": "b", "cpu": 2, "mem_mb": 4096}],
    links=[
        {"ends": ["a", "s1"], "bw_mbps": 1000},
        {"ends": ["b", "s2"], "bw_mbps": 1000},
        {"ends": ["s1", "s2"], "bw_mbps": 100},
    ],
)
RING = ring_job(
    "ring", 4, Resources(cpu=1, mem_mb=512), model_bytes=20e6, demand_mbps=100, compute_s=0.1
)


def _crossing(job, placement: dict[str, str]) -> int:
    return sum(placement[f.src] != placement[f.dst] for f in job.flows)


def test_an_exchange_regroups_a_ring_split_across_a_thin_link():
    cluster = _cluster(**PAIR)
    split = _decision(cluster, RING, {"w0": "a", "w1": "b", "w2": "a", "w3": "b"})
    assert _crossing(RING, split.placement) == 4  # every ring neighbour across the link
    better = improve(cluster, RING, split, evaluations=100)
    assert _crossing(RING, better.placement) == 2
    assert predicted_iteration_s(cluster, RING, better) < 0.75 * predicted_iteration_s(
        cluster, RING, split
    )
    assert check_decision(cluster, RING, better) == []


def test_no_evaluation_and_no_better_move_leave_the_decision_as_it_is():
    cluster = _cluster(**PAIR)
    split = _decision(cluster, RING, {"w0": "a", "w1": "b", "w2": "a", "w3": "b"})
    assert improve(cluster, RING, split, evaluations=0) is split
    grouped = _decision(cluster, RING, {"w0": "a", "w1": "a", "w2": "b", "w3": "b"})
    assert improve(cluster, RING, grouped, evaluations=100) is grouped


# three 1-core nodes, each holding one task of a 2-task ring granted 100 Mbit/s wherever it goes:
# a and b meet over a link of just that, b and c over one of twice that (the ring scenario's
# heavy job, docs/e2e.md: the model, counting grants, rates both pairs the same)
TIGHT_AND_ROOMY = dict(
    nodes=[{"name": n, "cpu": 1, "mem_mb": 4096} for n in "abc"],
    links=[{"ends": [n, f"s{n}"], "bw_mbps": 1000} for n in "abc"]
    + [{"ends": ["sa", "sb"], "bw_mbps": 100}, {"ends": ["sb", "sc"], "bw_mbps": 200}],
)
PAIR_RING = ring_job(
    "pair", 2, Resources(cpu=1, mem_mb=512), model_bytes=20e6, demand_mbps=100, compute_s=0.1
)


def test_between_placements_the_model_rates_the_same_the_one_with_room_to_spare_wins():
    cluster = _cluster(**TIGHT_AND_ROOMY)
    tight = _decision(cluster, PAIR_RING, {"w0": "a", "w1": "b"})
    roomy = _decision(cluster, PAIR_RING, {"w0": "c", "w1": "b"})
    assert predicted_iteration_s(cluster, PAIR_RING, tight) == predicted_iteration_s(
        cluster, PAIR_RING, roomy
    )
    assert Rank(cluster, PAIR_RING, roomy) < Rank(cluster, PAIR_RING, tight)
    assert not Rank(cluster, PAIR_RING, tight) < Rank(cluster, PAIR_RING, roomy)
    better = improve(cluster, PAIR_RING, tight, evaluations=100)
    assert better.placement == roomy.placement
    assert spare_iteration_s(cluster, PAIR_RING, better) < 0.6 * spare_iteration_s(
        cluster, PAIR_RING, tight
    )
    # a faster prediction still wins over any spare: b-c's link mostly taken by another tenant
    cluster.reserved[("sb", "sc")] = cluster.reserved[("sc", "sb")] = 150
    assert improve(cluster, PAIR_RING, tight, evaluations=100).placement == tight.placement
    assert Rank(cluster, PAIR_RING, tight) < Rank(
        cluster, PAIR_RING, _decision(cluster, PAIR_RING, roomy.placement)
    )


def test_moves_fit_what_the_cluster_leaves_and_change_one_or_two_tasks():
    cluster = _cluster(**PAIR)
    full = {"w0": "a", "w1": "b", "w2": "a", "w3": "b"}
    free = {n: cluster.free(n) for n in cluster.compute_nodes()}
    found = list(moves(RING, full, free))
    # both nodes full: no task can move, only exchanges across the nodes (2 × 2 of them)
    assert len(found) == 4 and all(sorted(p.values()) == ["a", "a", "b", "b"] for p in found)
    rng = np.random.default_rng(5)
    checked = 0
    while checked < 15:
        c, job = random_instance(rng, max_switches=4, max_nodes=5, max_workers=4)
        nodes = c.compute_nodes()
        placement = {t.name: nodes[i % len(nodes)] for i, t in enumerate(job.tasks)}
        free = {n: c.free(n) + Resources(cpu=9, mem_mb=9e3) for n in c.compute_nodes()}
        for p in moves(job, placement, free):
            assert 1 <= sum(p[t] != placement[t] for t in p) <= 2
            for node in set(p.values()):
                need = sum((job.task(t).demand for t in p if p[t] == node), Resources())
                assert need.fits_in(free[node])
        checked += 1


def test_a_task_on_a_node_gone_offline_may_leave_it_and_none_goes_there():
    cluster = _cluster(
        nodes=PAIR["nodes"] + [{"name": "c", "cpu": 2, "mem_mb": 4096}],
        links=PAIR["links"] + [{"ends": ["c", "s2"], "bw_mbps": 1000}],
    )
    split = {"w0": "a", "w1": "b", "w2": "a", "w3": "b"}
    cluster.offline.add("b")
    free = {n: cluster.free(n) for n in cluster.compute_nodes(online_only=True)}
    found = list(moves(RING, split, free))
    assert any(p[t] == "c" for p in found for t in ("w1", "w3"))
    assert all(p[t] != "b" for p in found for t in ("w0", "w2"))
    better = improve(cluster, RING, _decision(cluster, RING, split), evaluations=50)
    assert all(better.placement[t] != "b" for t in ("w0", "w2"))


def test_local_search_is_never_slower_and_stays_feasible_on_random_instances():
    rng = np.random.default_rng(11)
    improved = tried = 0
    while tried < 25:
        cluster, job = random_instance(rng, max_switches=5, max_nodes=6, max_workers=5)
        ep = PlacementEpisode(cluster, job)
        if ep.done:
            continue
        # a plain start: each task, in order, on the first node with room for it
        while not ep.done:
            ep.step(int(np.flatnonzero(ep.observe().mask)[0]))
        try:
            start = ep.decision()
        except CannotPlace:
            continue
        tried += 1
        better = improve(cluster, job, start, evaluations=200)
        assert check_decision(cluster, job, better) == []
        before, after = (predicted_iteration_s(cluster, job, d) for d in (start, better))
        assert after <= before
        improved += after < before * (1 - 1e-6)
    assert improved >= 5


def test_local_search_starts_from_the_fastest_candidate(monkeypatch):
    import scheduler.ppo as ppo

    started: list = []
    considered: list[float] = []
    real_improve, real_consider = ppo.improve, ppo._Decoding._consider
    monkeypatch.setattr(
        ppo,
        "improve",
        lambda c, j, d, evaluations: (
            started.append(predicted_iteration_s(c, j, d)) or real_improve(c, j, d, evaluations)
        ),
    )

    def consider(self, placement):
        real_consider(self, placement)
        considered.append(
            predicted_iteration_s(
                self.cluster, self.job, _decision(self.cluster, self.job, placement)
            )
        )

    monkeypatch.setattr(ppo._Decoding, "_consider", consider)
    rng = np.random.default_rng(3)
    algo = make_algorithm("ces-ppo")
    checked = 0
    while checked < 10:
        cluster, job = random_instance(rng, max_switches=4, max_nodes=6, max_workers=4)
        started.clear()
        considered.clear()
        try:
            algo.place(cluster, job)
        except CannotPlace:
            continue
        if len(considered) >= 2 and started:
            assert started == [min(considered)]
            checked += 1


def test_local_search_gets_what_the_rollouts_leave_of_the_budget(monkeypatch):
    import scheduler.ppo as ppo

    calls: list[int] = []
    real = ppo.improve
    monkeypatch.setattr(
        ppo,
        "improve",
        lambda c, j, d, evaluations: calls.append(evaluations) or real(c, j, d, evaluations),
    )
    cluster = _cluster(**PAIR)
    work = 2 * len(RING.tasks)  # one rollout: 2 nodes × 4 tasks
    # greedy, network-aware and the other first node take 3 rollouts' worth; each evaluation
    # of the search costs one more
    for budget, compare, searched in (
        (work, True, None),
        (2 * work, False, None),
        (11 * work - 1, True, 7),
        (11 * work, False, 9),
    ):
        calls.clear()
        make_algorithm("ces-ppo", decode_budget=budget, compare=compare).place(cluster, RING)
        assert calls == ([] if searched is None else [searched]), budget
