"""MAPPO for TapFinger, readable top to bottom: roll out episodes, per-agent GAE, clipped PPO.

Each agent has its own reward and value (`net.TapFingerNet`'s critic, weights shared); the policy
loss covers the agents whose action counted (`Step.active`: not the losers of a conflict), the
value loss every agent. Two settings: TapFinger's own (`paper.PaperEnv`, episodes of its
synthetic trace) and CES's simulator (`policy.TapFinger` on small generated scenarios, topologies
that are not the benchmark's). Training is not monotone (the average JCT of a greedy policy
swings between 7 and 22 slots from one update to the next in the paper setting), so every
`validate_every` episodes the policy is scored on held-out episodes — seeds no training episode
and no benchmark uses — and the best is kept, as the authors keep their best actor.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import numpy as np
import torch

from topologies import load_topology

from ..arrivals import make_scenario, parse_arrivals
from ..baselines import make_algorithm
from ..model import Cluster
from ..simulator import Simulator
from . import paper, policy
from .net import Obs, Step, TapFingerNet, evaluate_actions


@dataclass(frozen=True)
class Hyper:
    seed: int = 0  # the episodes drawn and the initial weights
    hidden: int = 32  # units of every hidden layer
    layers: int = 2  # heterogeneous graph attention (HAN) layers
    lr: float = 3e-4  # Adam's learning rate
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE's lambda
    clip: float = 0.2  # PPO's clip of the probability ratio
    epochs: int = 4  # passes over each update's steps
    minibatch: int = 64  # steps
    entropy: float = 0.01  # weight of the entropy bonus
    value_coef: float = 0.5  # weight of the value loss
    max_grad: float = 0.5  # gradient clipping (L2 norm)
    episodes_per_update: int = 2
    reward_scale: float = 0.01  # rewards are multiplied by this
    # TapFinger's own setting (episodes of `paper_tasks` tasks, seeds 0, 1, ...)
    paper_episodes: int = 320
    paper_tasks: int = 192
    # CES: small bursty scenarios on tidal nodes, placed by `ces_single`
    ces_episodes: int = 160
    ces_topologies: tuple[str, ...] = ("ring", "star", "gen:internet:8:1", "gen:internet:12:2")
    ces_arrivals: str = "bursty:n=40,load=0.8,tidal=1"
    ces_single: str = "network-aware"
    validate_every: int = 20  # episodes
    validation_episodes: int = 2  # per setting (CES: per training topology)


VALIDATION_SEED = 500  # training episodes use seeds 0, 1, ...; benchmarks 1000 and up


Episode = tuple[list[tuple[Obs, Step]], list[np.ndarray]]  # steps, per-step agent rewards


def advantages(
    values: list[np.ndarray], rewards: list[np.ndarray], hp: Hyper
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-agent GAE over one episode (it ends after the last step)."""
    adv, returns, gae = [None] * len(values), [None] * len(values), 0.0
    for t in reversed(range(len(values))):
        nxt = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] * hp.reward_scale + hp.gamma * nxt - values[t]
        gae = delta + hp.gamma * hp.gae_lambda * gae
        adv[t], returns[t] = gae, gae + values[t]
    return adv, returns


def update(
    net: TapFingerNet,
    opt: torch.optim.Optimizer,
    episodes: list[Episode],
    hp: Hyper,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Clipped PPO epochs over the steps of `episodes`."""
    rows = []  # (obs, step, advantage, return)
    for steps, rewards in episodes:
        adv, ret = advantages([s.value for _, s in steps], rewards, hp)
        rows += [(o, s, a, r) for (o, s), a, r in zip(steps, adv, ret)]
    act_adv = np.concatenate([a[s.active] for _, s, a, _ in rows]) if rows else np.zeros(1)
    mean, std = act_adv.mean(), act_adv.std() + 1e-8
    stats = []
    for _ in range(hp.epochs):
        order = rng.permutation(len(rows))
        for start in range(0, len(rows), hp.minibatch):
            loss = ppo_loss(
                net, [rows[i] for i in order[start : start + hp.minibatch]], mean, std, hp
            )
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), hp.max_grad)
            opt.step()
            stats.append(loss.item())
    return {"loss": float(np.mean(stats)) if stats else 0.0}


def ppo_loss(
    net: TapFingerNet,
    batch: list[tuple[Obs, Step, np.ndarray, np.ndarray]],
    mean: float,
    std: float,
    hp: Hyper,
) -> torch.Tensor:
    """Clipped policy loss and entropy over the active agents (losers of a conflict and agents
    without a task left out), value loss over every agent; advantages normalised by mean, std."""

    def cat(f, dtype=torch.float32):
        return torch.as_tensor(np.concatenate([f(b) for b in batch]), dtype=dtype)

    slot, cell = cat(lambda b: b[1].slot, torch.long), cat(lambda b: b[1].cell, torch.long)
    old, active = cat(lambda b: b[1].logp), cat(lambda b: b[1].active, torch.bool)
    adv, ret = (cat(lambda b: b[2]) - mean) / std, cat(lambda b: b[3])
    logp, entropy, value = evaluate_actions(net, [b[0] for b in batch], slot, cell)
    ratio = torch.exp(logp - old)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - hp.clip, 1 + hp.clip) * adv)
    n = active.sum().clamp(min=1)
    return (
        (pg * active).sum() / n
        - hp.entropy * (entropy * active).sum() / n
        + hp.value_coef * ((value - ret) ** 2).mean()
    )


def paper_episodes(net: TapFingerNet, hp: Hyper, rng: np.random.Generator) -> Iterator[Episode]:
    """Episodes of TapFinger's own setting (seeds 0, 1, ...), sampled actions."""
    setting = paper.PaperSetting(tasks=hp.paper_tasks)
    seed = 0
    while True:
        steps: list[tuple[Obs, Step]] = []
        rewards: list[np.ndarray] = []

        def record(obs: Obs, step: Step, steps: list = steps, rewards: list = rewards) -> None:
            steps.append((obs, step))
            rewards.append(np.zeros(len(obs.servers)))

        env = paper.PaperEnv(setting, seed)
        schedule = paper.tapfinger(net, greedy=False, rng=rng, record=record)
        while not env.done:
            schedule(env)
            r = env.advance()
            if rewards:  # the slot's reward goes to the agents' last step
                rewards[-1] += r
        seed += 1
        yield steps, rewards


@functools.cache
def training_clusters(topologies: tuple[str, ...]) -> tuple[Cluster, ...]:
    """The CES training topologies' clusters, built once for the episodes and every validation
    (never changed: each run simulates on a copy)."""
    return tuple(Cluster.from_topology(load_topology(t)) for t in topologies)


def ces_episodes(net: TapFingerNet, hp: Hyper, rng: np.random.Generator) -> Iterator[Episode]:
    """Episodes in CES's simulator on the training topologies, sampled actions."""
    clusters = training_clusters(hp.ces_topologies)
    spec = parse_arrivals(hp.ces_arrivals)
    seed = 0
    while True:
        cluster = clusters[seed % len(clusters)]
        scenario = make_scenario(spec, cluster, seed)
        recorder = policy.Recorder()
        agent = policy.TapFinger(
            make_algorithm(hp.ces_single, seed=seed),
            net,
            greedy=False,
            seed=int(rng.integers(2**31)),
            recorder=recorder,
        )
        result = Simulator(cluster.copy(), agent).run(scenario.jobs, scenario.events)
        recorder.accrue(result.end_time)
        seed += 1
        yield recorder.steps, recorder.rewards


def paper_validation(net: TapFingerNet, hp: Hyper) -> float:
    """Average JCT (slots) of the greedy policy on held-out episodes of the paper setting."""
    setting = paper.PaperSetting(tasks=hp.paper_tasks)
    return float(
        np.mean(
            [
                paper.run(paper.PaperEnv(setting, VALIDATION_SEED + s), paper.tapfinger(net))
                for s in range(hp.validation_episodes)
            ]
        )
    )


def ces_validation(net: TapFingerNet, hp: Hyper) -> float:
    """Average wait (s; a job still queued at the end counts with its wait so far) of the
    policy, sampled and seeded as it is evaluated, on held-out scenarios of every training
    topology."""
    spec = parse_arrivals(hp.ces_arrivals)
    waits = []
    for cluster in training_clusters(hp.ces_topologies):
        for s in range(hp.validation_episodes):
            scenario = make_scenario(spec, cluster, VALIDATION_SEED + s)
            agent = policy.TapFinger(make_algorithm(hp.ces_single, seed=s), net, seed=s)
            result = Simulator(cluster.copy(), agent).run(scenario.jobs, scenario.events)
            waits.append(result.summary()["avg_wait_s"])
    return float(np.mean(waits))


def train(
    net: TapFingerNet,
    episodes: Iterator[Episode],
    total: int,
    hp: Hyper,
    log: Callable[[str], None],
    validate: Callable[[TapFingerNet, Hyper], float],
) -> dict:
    """PPO updates on batches of `episodes`, `total` episodes in all; `net` ends with the weights
    that scored best (lowest) by `validate`."""
    opt = torch.optim.Adam(net.parameters(), lr=hp.lr)
    rng = np.random.default_rng(hp.seed)
    start, history, n, next_check = time.perf_counter(), [], 0, hp.validate_every
    best = (validate(net.eval(), hp), 0, copy.deepcopy(net.state_dict()))
    net.train()
    while n < total:
        batch = [next(episodes) for _ in range(hp.episodes_per_update)]
        n += len(batch)
        ret = float(np.mean([sum(r.sum() for r in rw) for _, rw in batch]))
        stats = update(net, opt, batch, hp, rng)
        history.append({"episodes": n, "return": ret, **stats})
        line = f"episodes {n}: return {ret:.1f}, loss {stats['loss']:.3f}"
        if n >= next_check or n >= total:
            next_check += hp.validate_every
            score = validate(net.eval(), hp)
            net.train()
            history[-1]["validation"] = score
            line += f", validation {score:.2f}"
            if score < best[0]:
                best = (score, n, copy.deepcopy(net.state_dict()))
        log(f"{line} ({time.perf_counter() - start:.0f} s)")
    net.load_state_dict(best[2])
    net.eval()
    return {
        "episodes": n,
        "wall_s": time.perf_counter() - start,
        "history": history,
        "validation": best[0],
        "kept_after_episodes": best[1],
    }


def build(dims: dict[str, int], grid: int, hp: Hyper) -> TapFingerNet:
    torch.manual_seed(hp.seed)
    return TapFingerNet(dims, grid, hidden=hp.hidden, layers=hp.layers)


def train_all(hp: Hyper, log: Callable[[str], None]) -> dict:
    """Both networks, as the checkpoint stores them."""
    rng = np.random.default_rng(hp.seed)
    out = {"hyper": asdict(hp)}
    for name, dims, grid, episodes, total, validate in (
        ("paper", paper.DIMS, paper.GRID, paper_episodes, hp.paper_episodes, paper_validation),
        ("ces", policy.DIMS, policy.GRID, ces_episodes, hp.ces_episodes, ces_validation),
    ):
        net = build(dims, grid, hp)
        log(f"training TapFinger in the {name} setting: {total} episodes")
        summary = train(net, episodes(net, hp, rng), total, hp, log, validate)
        out[name] = {
            "state": net.state_dict(),
            "shape": {"hidden": hp.hidden, "layers": hp.layers},
            "training": {k: v for k, v in summary.items() if k != "history"},
            "history": summary["history"],
        }
    return out
