"""MAPPO for TapFinger, readable top to bottom: roll out episodes, per-agent GAE, clipped PPO.

Each agent has its own reward and value (`net.TapFingerNet`'s critic, weights shared); the policy
loss covers the agents whose action counted (`Step.active`: not the losers of a conflict), the
value loss every agent. Two settings: TapFinger's own (`paper.PaperEnv`, episodes of its
synthetic trace) and CES's simulator (`policy.TapFinger` on small generated scenarios, topologies
that are not the benchmark's). Training is not monotone (the average JCT of a greedy policy
swings between 7 and 22 slots from one update to the next in the paper setting), so every
`validate_every` episodes the policy is scored on held-out episodes — seeds no training episode
and no benchmark uses — and the best is kept, as the authors keep their best actor. A training
of many hours runs in pieces: `Training.state()` is saved every `checkpoint_every` episodes and
when a piece stops, and a training restored from it goes on exactly as if it had not stopped.
"""

from __future__ import annotations

import copy
import functools
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

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
    """One setting's training. The defaults are the CES setting's (session 22);
    `DEFAULTS["paper"]` has TapFinger's own setting's."""

    seed: int = 0  # the actions sampled, the minibatches and the initial weights
    hidden: int = 32  # units of every hidden layer
    layers: int = 2  # heterogeneous graph attention (HAN) layers
    agent_ids: bool = False  # servers carry their index (one-hot): a fixed set of agents only
    separate_critic: bool = False  # the critic has its own graph encoder (the original's own net)
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
    episodes: int = 160  # training episodes (seeds 0, 1, ...)
    paper_tasks: int = 192  # tasks per training episode in TapFinger's setting
    # CES: small bursty scenarios on tidal nodes, placed by `ces_single`
    ces_topologies: tuple[str, ...] = ("ring", "star", "gen:internet:8:1", "gen:internet:12:2")
    ces_arrivals: str = "bursty:n=40,load=0.8,tidal=1"
    ces_single: str = "network-aware"
    validate_every: int = 20  # episodes
    validation_episodes: int = 2  # per setting (CES: per training topology)
    checkpoint_every: int = 16  # episodes between saves of the training state (--resume)


# TapFinger's setting at the original's scale as far as one CPU core goes (issue 52): its
# learning rate and discount (1e-4, γ = 1: the return is minus the tasks' summed completion
# times), 16 episodes of 384 tasks (the evaluation's size) per update, agent ids.
DEFAULTS = {
    "paper": Hyper(
        agent_ids=True,
        lr=1e-4,
        gamma=1.0,
        episodes_per_update=16,
        episodes=1024,
        paper_tasks=384,
        validate_every=16,
        validation_episodes=4,
    ),
    "ces": Hyper(),
}


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
            parts = ppo_loss(
                net, [rows[i] for i in order[start : start + hp.minibatch]], mean, std, hp
            )
            loss = parts["policy"] - hp.entropy * parts["entropy"] + hp.value_coef * parts["value"]
            opt.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(net.parameters(), hp.max_grad)
            opt.step()
            stats.append(
                {"loss": loss.item(), "grad_norm": norm.item()}
                | {k: v.item() for k, v in parts.items()}
            )
    if not stats:
        return {"loss": 0.0}
    returns = np.concatenate([r for *_, r in rows])
    values = np.concatenate([s.value for _, s, *_ in rows])
    # how much of the returns' spread the critic explained before the update (1: all, 0: none)
    explained = 1 - np.var(returns - values) / max(np.var(returns), 1e-12)
    return {k: float(np.mean([x[k] for x in stats])) for k in stats[0]} | {
        "explained_variance": float(explained)
    }


def ppo_loss(
    net: TapFingerNet,
    batch: list[tuple[Obs, Step, np.ndarray, np.ndarray]],
    mean: float,
    std: float,
    hp: Hyper,
) -> dict[str, torch.Tensor]:
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
    return {
        "policy": (pg * active).sum() / n,
        "entropy": (entropy * active).sum() / n,
        "value": ((value - ret) ** 2).mean(),
    }


def episode_rng(hp: Hyper, seed: int) -> np.random.Generator:
    """The sampled actions' generator of training episode `seed`: its own, so that an episode
    is the same whichever worker rolls it out and whatever ran before it."""
    return np.random.default_rng((hp.seed, seed))


def paper_episode(net: TapFingerNet, hp: Hyper, seed: int) -> Episode:
    """Episode `seed` of TapFinger's own setting, sampled actions."""
    steps: list[tuple[Obs, Step]] = []
    rewards: list[np.ndarray] = []

    def record(obs: Obs, step: Step) -> None:
        steps.append((obs, step))
        rewards.append(np.zeros(len(obs.servers)))

    env = paper.PaperEnv(paper.PaperSetting(tasks=hp.paper_tasks), seed)
    schedule = paper.tapfinger(net, greedy=False, rng=episode_rng(hp, seed), record=record)
    while not env.done:
        schedule(env)
        r = env.advance()
        if rewards:  # the slot's reward goes to the agents' last step
            rewards[-1] += r
    return steps, rewards


@functools.cache
def training_clusters(topologies: tuple[str, ...]) -> tuple[Cluster, ...]:
    """The CES training topologies' clusters, built once for the episodes and every validation
    (never changed: each run simulates on a copy)."""
    return tuple(Cluster.from_topology(load_topology(t)) for t in topologies)


def ces_episode(net: TapFingerNet, hp: Hyper, seed: int) -> Episode:
    """Episode `seed` in CES's simulator (the training topologies in turn), sampled actions."""
    clusters = training_clusters(hp.ces_topologies)
    cluster = clusters[seed % len(clusters)]
    scenario = make_scenario(parse_arrivals(hp.ces_arrivals), cluster, seed)
    recorder = policy.Recorder()
    agent = policy.TapFinger(
        make_algorithm(hp.ces_single, seed=seed),
        net,
        greedy=False,
        seed=int(episode_rng(hp, seed).integers(2**31)),
        recorder=recorder,
    )
    result = Simulator(cluster.copy(), agent).run(scenario.jobs, scenario.events)
    recorder.accrue(result.end_time)
    return recorder.steps, recorder.rewards


Each = Callable[[Callable, TapFingerNet, Sequence[tuple]], list]


def serially(job: Callable, net: TapFingerNet, args: Sequence[tuple]) -> list:
    """`job(net, *a)` for every `a`, here (`Training.each` does it in its workers)."""
    return [job(net, *a) for a in args]


def paper_validation_episode(net: TapFingerNet, hp: Hyper, seed: int) -> float:
    setting = paper.PaperSetting(tasks=hp.paper_tasks)
    return paper.run(paper.PaperEnv(setting, seed), paper.tapfinger(net))


def paper_validation(net: TapFingerNet, hp: Hyper, each: Each = serially) -> float:
    """Average JCT (slots) of the greedy policy on held-out episodes of the paper setting."""
    seeds = [(hp, VALIDATION_SEED + s) for s in range(hp.validation_episodes)]
    return float(np.mean(each(paper_validation_episode, net, seeds)))


def ces_validation_episode(net: TapFingerNet, hp: Hyper, topology: int, s: int) -> float:
    cluster = training_clusters(hp.ces_topologies)[topology]
    scenario = make_scenario(parse_arrivals(hp.ces_arrivals), cluster, VALIDATION_SEED + s)
    agent = policy.TapFinger(make_algorithm(hp.ces_single, seed=s), net, seed=s)
    result = Simulator(cluster.copy(), agent).run(scenario.jobs, scenario.events)
    return result.summary()["avg_wait_s"]


def ces_validation(net: TapFingerNet, hp: Hyper, each: Each = serially) -> float:
    """Average wait (s; a job still queued at the end counts with its wait so far) of the
    policy, sampled and seeded as it is evaluated, on held-out scenarios of every training
    topology."""
    runs = [
        (hp, t, s) for t in range(len(hp.ces_topologies)) for s in range(hp.validation_episodes)
    ]
    return float(np.mean(each(ces_validation_episode, net, runs)))


Validation = Callable[[TapFingerNet, Hyper, Each], float]
Setting = tuple[dict[str, int], int, Callable[..., Episode], Validation]
SETTINGS: dict[str, Setting] = {  # dims, grid, episode, validation
    "paper": (paper.DIMS, paper.GRID, paper_episode, paper_validation),
    "ces": (policy.DIMS, policy.GRID, ces_episode, ces_validation),
}


def build(dims: dict[str, int], grid: int, hp: Hyper, agents: int = 0) -> TapFingerNet:
    torch.manual_seed(hp.seed)
    return TapFingerNet(
        dims,
        grid,
        hidden=hp.hidden,
        layers=hp.layers,
        agents=agents,
        separate_critic=hp.separate_critic,
    )


def agent_count(hp: Hyper) -> int:
    """Agents the network tells apart by id (0: none, one network for any number)."""
    return len(paper.PaperSetting().capacities) if hp.agent_ids else 0


_worker: dict = {}  # a rollout worker's own network, built once by `_start_worker`


def _start_worker(setting: str, hp: Hyper) -> None:
    torch.set_num_threads(1)
    dims, grid, *_ = SETTINGS[setting]
    _worker["net"] = build(dims, grid, hp, agent_count(hp))


def _in_worker(job: Callable, weights: dict, training: bool, *args) -> tuple[object, float]:
    """`job` on the worker's network with the trainer's weights; its result and CPU seconds."""
    cpu = time.process_time()
    net = _worker["net"]
    net.load_state_dict(weights)
    net.train(training)
    return job(net, *args), time.process_time() - cpu


class Training:
    """One setting's training, resumable: `state()` holds all it needs to go on — the weights,
    Adam's moments, the minibatches' random generator, the episodes done (episode i is seed i,
    its actions drawn from `episode_rng`), the history and the best weights so far — so a training stopped at an update and resumed from
    its state goes on exactly as one that never stopped.

    `workers` > 1 rolls an update's episodes and the validation's out in as many processes,
    with the same result (each episode draws its actions from its own generator,
    `episode_rng`); `cpu_s` counts theirs."""

    def __init__(
        self,
        setting: str,
        hp: Hyper,
        validate: Validation | None = None,
        workers: int = 1,
    ):
        dims, grid, self.episode, default_validation = SETTINGS[setting]
        self.setting, self.hp, self.workers = setting, hp, workers
        self.validate = validate or default_validation
        self.net = build(dims, grid, hp, agent_count(hp))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=hp.lr)
        self.update_rng = np.random.default_rng(hp.seed)  # minibatches
        self.done = 0  # episodes trained
        self.history: list[dict] = []
        self.best: tuple[float, int, dict] | None = None  # score, after episodes, weights
        self.cpu_s = self.wall_s = 0.0
        self._pool: ProcessPoolExecutor | None = None
        self._worker_cpu = 0.0

    def state(self) -> dict:
        return {
            "setting": self.setting,
            "hyper": asdict(self.hp),
            "net": self.net.state_dict(),
            "opt": self.opt.state_dict(),
            "update_rng": self.update_rng.bit_generator.state,
            "done": self.done,
            "history": self.history,
            "best": self.best,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
        }

    def restore(self, state: dict) -> None:
        """Go on from `state()`; the hyper-parameters must be the saved ones but for the number
        of episodes (a training can be extended)."""
        saved = {k: v for k, v in state["hyper"].items() if k != "episodes"}
        mine = {k: v for k, v in asdict(self.hp).items() if k != "episodes"}
        changed = [k for k in mine if saved.get(k) != mine[k]]
        if state["setting"] != self.setting or changed:
            what = changed[0] if changed else "setting"
            raise ValueError(
                f"the saved training has other settings ({what}: "
                f"{state['hyper'].get(what, state['setting'])!r}, here {mine.get(what, self.setting)!r})"
            )
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.update_rng.bit_generator.state = state["update_rng"]
        self.done, self.history, self.best = state["done"], state["history"], state["best"]
        self.cpu_s, self.wall_s = state["cpu_s"], state["wall_s"]

    def each(self, job: Callable, net: TapFingerNet, args: Sequence[tuple]) -> list:
        """`job(net, *a)` for every `a`, in the workers if there are any (in order)."""
        if self._pool is None:
            return serially(job, net, args)
        weights = net.state_dict()
        futures = [self._pool.submit(_in_worker, job, weights, net.training, *a) for a in args]
        results = []
        for f in futures:
            result, cpu = f.result()
            self._worker_cpu += cpu
            results.append(result)
        return results

    def _score(self) -> float:
        score = self.validate(self.net.eval(), self.hp, self.each)
        self.net.train()
        if self.best is None or score < self.best[0]:
            self.best = (score, self.done, copy.deepcopy(self.net.state_dict()))
        return score

    def run(
        self,
        log: Callable[[str], None],
        stop_after_s: float = math.inf,
        save: Callable[[Training], None] = lambda t: None,
    ) -> bool:
        """PPO updates on batches of episodes until `hp.episodes` are done (True) or, at the
        first update after `stop_after_s` seconds, stop (False); `save(self)` every
        `checkpoint_every` episodes and at the end. The best weights (lowest validation score)
        are in `best`; the first score is of the initial weights."""
        if self.workers > 1:  # spawned, not forked: a fork of a process using torch may hang
            context = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.workers, context, _start_worker, (self.setting, self.hp)
            )
        try:
            return self._run(log, stop_after_s, save)
        finally:
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
                self._pool = None

    def _run(
        self, log: Callable[[str], None], stop_after_s: float, save: Callable[[Training], None]
    ) -> bool:
        hp, wall, cpu = self.hp, time.perf_counter(), time.process_time()

        def clock() -> None:
            nonlocal wall, cpu
            self.wall_s += time.perf_counter() - wall
            self.cpu_s += time.process_time() - cpu + self._worker_cpu
            wall, cpu, self._worker_cpu = time.perf_counter(), time.process_time(), 0.0

        if self.best is None:
            self._score()
        started, saved = time.perf_counter(), -1
        while self.done < hp.episodes:
            k = min(hp.episodes_per_update, hp.episodes - self.done)
            batch = self.each(self.episode, self.net, [(hp, self.done + i) for i in range(k)])
            before, self.done = self.done, self.done + k
            ret = float(np.mean([sum(r.sum() for r in rw) for _, rw in batch]))
            stats = update(self.net, self.opt, batch, hp, self.update_rng)
            row = {"episodes": self.done, "return": ret, **stats}
            if self.done // hp.validate_every > before // hp.validate_every or (
                self.done >= hp.episodes
            ):
                row["validation"] = self._score()
            self.history.append(row)
            clock()
            log(
                f"episodes {self.done}: return {ret:.1f}, loss {stats['loss']:.3f}"
                + (f", validation {row['validation']:.2f}" if "validation" in row else "")
                + f" ({self.cpu_s:.0f} s of CPU in all)"
            )
            stop = time.perf_counter() - started >= stop_after_s
            if stop or self.done // hp.checkpoint_every > before // hp.checkpoint_every:
                save(self)
                saved = self.done
            if stop and self.done < hp.episodes:
                return False
        if saved != self.done:
            save(self)
        return True

    def summary(self) -> dict:
        assert self.best is not None
        return {
            "episodes": self.done,
            "of": self.hp.episodes,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "validation": self.best[0],
            "kept_after_episodes": self.best[1],
        }

    def best_net(self) -> TapFingerNet:
        """The network with the best weights so far, in evaluation mode."""
        net = copy.deepcopy(self.net)
        net.load_state_dict(self.best[2])
        return net.eval()


def write_checkpoint(path: Path, training: Training) -> None:
    """Put the training's best weights so far into the checkpoint's part of its setting (the
    other part kept): what `net.load` reads, with the hyper-parameters, the summary (episodes
    done of the planned) and the history."""
    data = torch.load(path, weights_only=True) if Path(path).exists() else {}
    legacy = data.pop("hyper", None)  # session 22's file: one record for both parts
    data.pop("wall_s", None)
    for part in data.values():
        part.setdefault("hyper", legacy)
    hp = training.hp
    data[training.setting] = {
        "state": training.best_net().state_dict(),
        "shape": {
            "hidden": hp.hidden,
            "layers": hp.layers,
            "agents": training.net.agents,
            "separate_critic": hp.separate_critic,
        },
        "hyper": asdict(hp),
        "training": training.summary(),
        "history": training.history,
    }
    torch.save(data, path)
