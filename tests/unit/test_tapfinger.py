"""TapFinger (seed 002): allocation masks checked by hand (its own grid and CES's), the Bayes
arbiter's posterior on a tiny case, losers left out of the loss, its own setting and baselines,
the CES policy in the simulator (every job it admits passes the masks on an idle cluster, where
the agents start one), the paper's Tiresias by hand, the training command (smoke), resuming a
stopped training and the checkpoint."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest
import torch

from scheduler import train_tapfinger
from scheduler.arrivals import make_scenario, parse_arrivals
from scheduler.baselines import make_algorithm
from scheduler.jobs import custom_job, ring_job
from scheduler.metrics import packable
from scheduler.model import CannotPlace, Cluster, Resources, Task
from scheduler.rounds import JobState, Round
from scheduler.simulator import Simulator
from scheduler.tapfinger import mappo, paper, policy
from scheduler.tapfinger.net import Obs, act, allocation_mask, arbitrate, load, posterior
from topologies import load_topology, parse_topology


def test_allocation_mask_keeps_the_cells_between_the_minimum_and_what_is_free():
    # cpu levels 0..3, gpu levels 0..2; minimum (2, 1); free (3, 1)
    mask = allocation_mask([np.arange(4), np.arange(3)], np.array([2, 1]), np.array([3, 1]))
    # cell 0 waits; cell 1 + 3c + g is (c, g): allowed (2, 1) → 8 and (3, 1) → 11
    assert np.flatnonzero(mask).tolist() == [0, 8, 11]


def test_the_paper_setting_masks_a_servers_grid_by_minimum_and_free_resources():
    env = paper.PaperEnv(paper.PaperSetting(tasks=40), seed=0)
    obs, tasks = env.obs()
    i = 0  # capacity (4, 4): c in 2..4, g in 1..4
    s = int(np.flatnonzero(obs.slots[i] >= 0)[0])
    cells = {tuple(paper.cell_alloc(c)) for c in np.flatnonzero(obs.masks[i, s][1:]) + 1}
    assert cells == {(c, g) for c in range(2, 5) for g in range(1, 5)}
    assert obs.ratio[i, s] == pytest.approx(2.0)  # min(4/2, 4/1): the arbiter's prior
    env.start(i, tasks[obs.slots[i, s]], np.array([3, 2]))  # leaves (1, 2): below the minimum
    obs, _ = env.obs()
    assert not obs.masks[i, :, 1:].any() and obs.masks[i, :, 0].all()
    assert set(obs.ratio[i][obs.slots[i] >= 0]) <= {0.5}  # min(1/2, 2/1)


def test_the_arbiter_weighs_the_selection_probability_by_available_over_required():
    # prior ∝ (2, 6) = (0.25, 0.75); likelihood (0.6, 0.3); posterior ∝ (0.15, 0.225)
    assert posterior(np.array([2.0, 6.0]), np.array([0.6, 0.3])) == pytest.approx([0.4, 0.6])
    ratio, prob = np.array([2.0, 6.0, 1.0]), np.array([0.6, 0.3, 0.9])
    assert arbitrate({7: [0, 1], 8: [2]}, ratio, prob) == {7: 1, 8: 2}
    assert arbitrate({7: [0, 1]}, np.array([1.0, 1.0]), np.array([0.5, 0.5])) == {7: 0}


def two_agents_one_task() -> Obs:
    masks = np.zeros((2, 1, 3), bool)
    masks[..., :2] = True  # wait or cell 1
    return Obs(
        np.ones((2, 2), np.float32),
        np.ones((1, 2), np.float32),
        np.zeros((0, 2), np.float32),
        np.zeros((2, 0), int),
        np.zeros((2, 1), int),
        masks,
        np.array([[1.0], [3.0]]),
    )


def test_a_conflict_has_one_winner_and_the_losers_log_probabilities_leave_the_loss():
    torch.manual_seed(0)
    net = mappo.build({"server": 2, "task": 2, "running": 2, "central": 1}, 3, mappo.Hyper())
    with torch.no_grad():
        net.alloc[-1].bias[1] = 20.0  # both agents claim the task
    obs = two_agents_one_task()
    step = act(net, obs, greedy=True)
    assert step.cell.tolist() == [1, 1] and step.winners == {0: 1}  # agent 1 has 3× the room
    assert step.active.tolist() == [False, True]
    hp = mappo.Hyper()
    adv = np.array([1.0, -2.0])

    def policy_loss(adv: np.ndarray) -> float:
        return mappo.ppo_loss(net, [(obs, step, adv, np.zeros(2))], 0.0, 1.0, hp)["policy"].item()

    base = policy_loss(adv)
    assert base == pytest.approx(policy_loss(np.array([50.0, -2.0])))  # the loser's does not count
    assert base != pytest.approx(policy_loss(np.array([1.0, 5.0])))  # the winner's does


TINY_PAPER = replace(
    mappo.DEFAULTS["paper"],
    paper_tasks=12,
    validate_every=1,
    validation_episodes=1,
    episodes_per_update=1,
    epochs=1,
    episodes=2,
    checkpoint_every=1,
)


def test_training_keeps_the_weights_that_validated_best():
    scores, seen = iter([5.0, 3.0, 9.0]), []  # before training, after episode 1, after 2

    def validate(n, _hp, _each):
        assert not n.training  # scored as it is used: evaluation mode
        seen.append({k: v.clone() for k, v in n.state_dict().items()})
        return next(scores)

    training = mappo.Training("paper", TINY_PAPER, validate)
    assert training.run(lambda _: None)
    summary = training.summary()
    assert summary["kept_after_episodes"] == 1 and summary["validation"] == 3.0
    final = training.best_net().state_dict()
    assert all(torch.equal(final[k], seen[1][k]) for k in final)
    assert any(not torch.equal(seen[1][k], seen[2][k]) for k in final)  # episode 2 did train


def test_a_training_stopped_and_resumed_goes_on_as_if_it_had_not_stopped():
    hp = replace(TINY_PAPER, episodes=3, validate_every=2, checkpoint_every=2)
    whole = mappo.Training("paper", hp)
    saves = []
    assert whole.run(lambda _: None, save=lambda t: saves.append(t.done))
    assert saves == [2, 3]  # every checkpoint_every episodes, and at the end
    first = mappo.Training("paper", hp)
    states = []
    assert not first.run(lambda _: None, stop_after_s=0.0, save=lambda t: states.append(t.state()))
    assert first.done == 1 and len(states) == 1
    again = mappo.Training("paper", hp)
    again.restore(pickle.loads(pickle.dumps(states[-1])))  # as torch.save/load would
    assert again.run(lambda _: None)
    for a, b in ((whole.net, again.net), (whole.best_net(), again.best_net())):
        assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert whole.history == again.history and whole.best[:2] == again.best[:2]
    with pytest.raises(ValueError, match="lr"):
        mappo.Training("paper", replace(hp, lr=1e-3)).restore(states[-1])
    longer = mappo.Training("paper", replace(hp, episodes=4))
    longer.restore(states[-1])  # more episodes than planned: allowed
    assert longer.run(lambda _: None) and longer.done == 4


def test_workers_roll_the_episodes_out_to_the_same_training():
    hp = replace(TINY_PAPER, episodes=4, episodes_per_update=2, validate_every=2)
    alone, shared = mappo.Training("paper", hp), mappo.Training("paper", hp, workers=2)
    assert alone.run(lambda _: None) and shared.run(lambda _: None)
    for a, b in ((alone.net, shared.net), (alone.best_net(), shared.best_net())):
        assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert alone.history == shared.history and alone.best[:2] == shared.best[:2]
    assert {"policy", "value", "entropy", "explained_variance"} <= alone.history[-1].keys()
    assert shared.cpu_s > 0 and shared._pool is None  # the workers' time counted, pool gone


def test_a_separate_critic_keeps_the_value_loss_out_of_the_actors_encoder():
    obs = two_agents_one_task()
    dims = {"server": 2, "task": 2, "running": 2, "central": 1}
    for separate in (False, True):
        torch.manual_seed(0)
        net = mappo.TapFingerNet(dims, 3, separate_critic=separate)
        value = net([obs])[2]
        value.sum().backward()
        actor = [p.grad for p in net.convs.parameters()]
        assert any(g is not None and g.abs().sum() > 0 for g in actor) != separate
        if separate:
            assert any(p.grad.abs().sum() > 0 for p in net.critic_convs.parameters())
            assert {k.split(".")[0] for k in net.state_dict()} >= {"critic_inp", "critic_convs"}


def test_agent_ids_tell_identical_servers_apart():
    obs = two_agents_one_task()
    dims = {"server": 2, "task": 2, "running": 2, "central": 1}
    for agents, differ in ((0, False), (6, True)):
        torch.manual_seed(0)
        net = mappo.TapFingerNet(dims, 3, agents=agents)
        assert net.inp["server"].in_features == 2 + agents
        _, alloc, value, _ = net([obs])
        assert (not torch.allclose(alloc[0], alloc[1])) == differ
        assert (not torch.allclose(value[0], value[1])) == differ


def test_the_allocations_of_each_kind_count_every_task_of_that_kind_once():
    setting = paper.PaperSetting(tasks=30)
    net = mappo.build(paper.DIMS, paper.GRID, TINY_PAPER, mappo.agent_count(TINY_PAPER)).eval()
    given = paper.allocations(net, 3, setting)
    kinds = [t.kind for t in paper.PaperEnv(setting, 3).schedule]
    for k, kind in enumerate(paper.KINDS):
        assert sum(given[kind].values()) == kinds.count(k) > 0
        for cell in given[kind]:
            c, g = map(int, cell.split(","))
            assert c >= paper.MINIMUM[0] and g >= paper.MINIMUM[1]


def test_speed_functions_and_the_baselines_in_the_paper_setting():
    assert paper.speed(0, np.array([1, 4]), 0.0) == 0.0  # below the minimum
    assert paper.speed(0, np.array([2, 1]), 0.5) == 0.25
    assert paper.speed(1, np.array([2, 16]), 0.2) == pytest.approx(np.tanh(1.0))
    theta = paper.optimus_fit()
    assert 1 / (theta[0] @ [1, 1, 0.5, 1, 2]) == pytest.approx(0.25, rel=1e-6)  # vision: exact
    setting = paper.PaperSetting(tasks=30)
    for make in paper.BASELINES.values():
        env = paper.PaperEnv(setting, seed=1)
        schedule = make(0)
        jct = paper.run(env, schedule)
        assert env.done and len(env.jct) == 30 and jct >= 1.0
        assert (env.free == env.cap).all()


def test_the_papers_tiresias_starts_from_nothing_and_serves_the_least_attained_first():
    env = paper.PaperEnv(paper.PaperSetting(capacities=((8, 20),), tasks=0), seed=0)
    old, new, young = (paper.Task(i, 1, 0, (0,)) for i in range(3))
    env.waiting[0] += [old, new, young]
    env.start(0, old, np.array([2, 4]))
    env.start(0, new, np.array([2, 4]))
    old.attained, new.attained, old.start, new.start = 40.0, 0.0, 0, 3  # young: pending
    paper.tiresias_paper_policy()(env)
    # median attained 0: the old task (40) gets nothing; the earliest-started of the others
    # (the running `new`, then the pending `young`) takes GPUs up to 16, the next the rest; the
    # 8 cores go to the GPU holders in turn
    assert old.alloc.tolist() == [0, 0] and new.alloc.tolist() == [4, 16]
    assert young.agent == 0 and young.alloc.tolist() == [4, 4]
    assert paper.speed(old.kind, old.alloc, 0.0) == 0.0  # starves this slot
    assert (env.free == 0).all()


def test_tapfinger_is_evaluated_greedy_and_sampled_beside_every_baseline():
    torch.manual_seed(0)
    net = mappo.build(paper.DIMS, paper.GRID, mappo.Hyper())
    jct = paper.compare(net, 2, paper.PaperSetting(tasks=20), others={"old": net})
    assert set(jct) == {
        "tapfinger",
        "tapfinger-sampled",
        "tapfinger@old",
        "tapfinger@old-sampled",
        *paper.BASELINES,
    }
    assert "tiresias-paper" in jct and all(len(v) == 2 for v in jct.values())
    assert jct["tapfinger@old-sampled"] == jct["tapfinger-sampled"]  # seeded by the episode
    assert jct["tapfinger"] == paper.compare(net, 2, paper.PaperSetting(tasks=20))["tapfinger"]


def cluster_of(cpus: list[float], mem_mb: int = 1024, bw: float = 100.0) -> Cluster:
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [{"name": f"n{i}", "cpu": c, "mem_mb": mem_mb} for i, c in enumerate(cpus)],
        "links": [{"ends": [f"n{i}", "s"], "bw_mbps": bw} for i in range(len(cpus))],
    }
    return Cluster.from_topology(parse_topology(doc, "test"))


def test_the_ces_masks_by_share_bandwidth_memory_and_online_nodes():
    cluster = cluster_of([1.0, 0.5, 4.0, 4.0], mem_mb=1024)
    cluster.offline.add("n3")
    ring = ring_job("r", 2, Resources(0.25, 100), 1e6, 40.0, compute_s=0.25, iterations=10)
    solo = custom_job("s", [Task("w0", Resources(0.25, 2000))], [], compute_s=0.25, iterations=10)
    rnd = Round(
        0.0,
        cluster,
        make_algorithm("first-fit"),
        [JobState(ring, 0, "queued"), JobState(solo, 1, "queued")],
        [],
    )
    obs, _jobs = policy.observe(rnd, cluster.compute_nodes())
    shares = lambda i, s: {policy.cell_share(c) for c in np.flatnonzero(obs.masks[i, s][1:]) + 1}
    # ring: a task's flows leave at 40 Mbit/s; every bandwidth level fits a 100 Mbit/s link
    assert shares(0, 0) == {(c, b) for c in (1.0, 1.5, 2.0, 3.0) for b in policy.BW_LEVELS}
    assert shares(1, 0) == {(c, b) for c in (1.0, 1.5, 2.0) for b in policy.BW_LEVELS}
    assert not obs.masks[3, :, 1:].any()  # offline
    assert not obs.masks[:, 1, 1:].any()  # 2000 MB fit no node: only waiting
    assert obs.ratio[1, 0] == pytest.approx(2.0)  # 0.5 free cpu / 0.25 asked


def test_the_ces_policy_runs_in_the_simulator_and_grants_what_it_chose():
    torch.manual_seed(0)
    net = mappo.build(policy.DIMS, policy.GRID, mappo.Hyper())
    agent = policy.TapFinger(
        make_algorithm("first-fit"), net, greedy=False, seed=1, recorder=policy.Recorder()
    )
    jobs = [
        custom_job(
            f"j{i}",
            [Task("w0", Resources(0.25, 100))],
            [],
            compute_s=0.25,
            iterations=50,
            submit_time=10.0 * i,
        )
        for i in range(6)
    ]
    result = Simulator(cluster_of([1.0, 1.0]), agent).run(jobs)
    assert all(js.state == "finished" for js in result.jobs)
    for js in result.jobs:  # a job at share s runs an iteration in 1 / s seconds
        share = js.allocated_job.tasks[0].demand.cpu / 0.25
        assert js.finish - js.submit >= 50 / share - 1e-6
    assert len(agent.recorder.rewards) == len(agent.recorder.steps) > 0
    assert sum(r.sum() for r in agent.recorder.rewards) < 0


def test_the_training_command_writes_a_checkpoint_the_policy_loads(tmp_path, capsys):
    out, state = tmp_path / "tf.pt", tmp_path / "ces.state.pt"
    argv = ["--smoke", "--out", str(out), "--state", str(state)]
    assert train_tapfinger.main(["ces", *argv]) == 0
    loaded = policy.TapFinger.load(make_algorithm("first-fit"), out)
    assert isinstance(loaded.net, torch.nn.Module) and not loaded.greedy
    ces = torch.load(out, weights_only=True)["ces"]["state"]
    paper_argv = ["--smoke", "--out", str(out), "--state", str(tmp_path / "paper.state.pt")]
    assert train_tapfinger.main(["paper", *paper_argv, "--stop-after-s", "0"]) == 0
    saved = torch.load(out, weights_only=True)
    assert saved["paper"]["training"]["episodes"] == 1 < saved["paper"]["training"]["of"]
    assert saved["paper"]["shape"]["agents"] == 6 and saved["paper"]["hyper"]["gamma"] == 1.0
    assert all(torch.equal(ces[k], saved["ces"]["state"][k]) for k in ces)  # the other part kept
    assert train_tapfinger.main(["paper", *paper_argv, "--resume"]) == 0
    assert torch.load(out, weights_only=True)["paper"]["training"]["episodes"] == 2
    load(out, "paper", paper.DIMS, paper.GRID)  # the benchmark's loader takes the agent ids
    capsys.readouterr()
    for argv, message in (
        (["ces", "--out", str(tmp_path / "no" / "tf.pt")], "error: --out"),
        (["ces", "--resume", "--state", str(tmp_path / "none.pt")], "error: --resume: no"),
        (["paper", *paper_argv, "--resume", "--lr", "0.5"], "error: --resume: the saved"),
    ):
        assert train_tapfinger.main(argv) == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith(message)
    with pytest.raises(FileNotFoundError, match="train_tapfinger"):
        policy.TapFinger.load(make_algorithm("first-fit"), tmp_path / "none.pt")


def biased_net(cells: dict[int, float]) -> torch.nn.Module:
    """An untrained CES network whose allocation head prefers `cells` (cell -> logit bias)."""
    torch.manual_seed(0)
    net = mappo.build(policy.DIMS, policy.GRID, mappo.Hyper())
    with torch.no_grad():
        for cell, bias in cells.items():
            net.alloc[-1].bias[cell] = bias
    return net


def test_a_job_asking_more_than_every_access_link_carries_still_starts():
    # 1000 Mbit/s flows on 100 Mbit/s links: CES grants what the links carry, so the jobs are
    # feasible; masked until their lowest bandwidth level fitted a link, they stayed queued
    cluster = cluster_of([1.0, 1.0], bw=100.0)
    fat = ring_job("fat", 2, Resources(0.75, 100), 1e8, 1000.0, compute_s=0.25, iterations=20)
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [JobState(fat, 0, "queued")], [])
    obs, _ = policy.observe(rnd, cluster.compute_nodes())
    assert obs.masks[:, 0, 1:].any(-1).all()  # on idle links every bandwidth level fits
    jobs = [
        ring_job(
            f"j{i}",
            2,
            Resources(0.75, 100),
            1e8,
            1000.0,
            compute_s=0.25,
            iterations=20,
            submit_time=5.0 * i,
        )
        for i in range(3)
    ]
    agent = policy.TapFinger(make_algorithm("first-fit"), biased_net({}), seed=1)
    result = Simulator(cluster, agent).run(jobs)
    assert [js.state for js in result.jobs] == ["finished"] * 3


def refusing_more_cpu_than_asked(asked: float):
    """first-fit, except that it cannot place a job granted more cpu per task than `asked`."""
    first_fit = make_algorithm("first-fit")

    class Refusing:
        name = "refusing"

        def place(self, cluster, job):
            if job.tasks[0].demand.cpu > asked + 1e-9:
                raise CannotPlace("more cpu than asked")
            return first_fit.place(cluster, job)

    return Refusing()


@pytest.mark.parametrize(
    "cells",
    [
        {0: 20.0},  # the agents would wait whenever allowed
        {10: 20.0, 11: 20.0, 12: 20.0},
    ],
)  # try share 3, which fails
def test_an_idle_cluster_with_a_feasible_job_always_starts_one(cells):
    # Each job arrives on an idle cluster: a round that ends there without a start leaves it
    # queued until some later event, and after the last arrival there is none.
    jobs = [
        custom_job(
            f"j{i}",
            [Task("w0", Resources(0.25, 100))],
            [],
            compute_s=0.25,
            iterations=20,
            submit_time=1000.0 * i,
        )
        for i in range(3)
    ]
    agent = policy.TapFinger(refusing_more_cpu_than_asked(0.25), biased_net(cells), seed=1)
    result = Simulator(cluster_of([1.0, 1.0]), agent).run(jobs)
    assert [js.state for js in result.jobs] == ["finished"] * 3


def test_every_job_the_simulator_admits_passes_the_masks_on_the_idle_cluster():
    # fattree's access links carry 200 Mbit/s; the mix asks up to 1000 Mbit/s per flow
    cluster = Cluster.from_topology(load_topology("fattree"))
    scenario = make_scenario(parse_arrivals("bursty:n=150,load=0.7"), cluster, 0)
    admitted = [
        JobState(job, i, "queued")
        for i, job in enumerate(scenario.jobs)
        if packable(cluster, job, budget=20_000) is not False
    ]
    assert admitted
    for js in admitted:
        obs, _ = policy.observe(Round(0.0, cluster, None, [js], []), cluster.compute_nodes())
        assert obs.masks[:, 0, 1:].any(), js.name
