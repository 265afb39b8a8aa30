"""`eade-ddpg`: EADE-DDPG's ideas in CES's own problem, a single-job placement algorithm.

    python -m scheduler.eade.ces --episodes 4000 --seed 0     # → checkpoints/eade/ces_eade_ddpg.pt
    make_algorithm("eade-ddpg").place(cluster, job)           # a Decision, or CannotPlace

The MDP is CES-PPO's (`scheduler.env.PlacementEpisode`: one step places one task on a feasible
compute node; at the end CES's network decision routes the placement, `paths.route_placement`)
with its return (`env.episode_return`: log of network-aware's iteration time over this one's,
`env.FAILED` when the job could not be placed), on CES-PPO's kind of training instances
(`env.TrainingInstances`, restricted to small generated networks: `CesEadeConfig.instances`).
What EADE brings:
  attention  the compute nodes are the tokens of a self-attention layer (each node's graph and
             step features beside the job's), in the actor and in the critic — EADE's attention
             over clusters;
  DDPG       a deterministic actor, a critic Q(s, a), target networks with soft updates, replay,
             Gaussian exploration noise on the action, actor and critic learning rates 1e-4 and
             1e-3 (Table 4);
  experts    a dual replay buffer: before training, the transitions of the best network-aware
             heuristic (`network-aware`) fill an expert buffer; every batch takes β = 10 % from it.
The action, as in EADE a continuous vector the environment turns into a discrete choice, is a
score in [-1, 1] per compute node: the task goes on the feasible node with the highest score. The
critic weighs per-node values by softmax(score / temperature) over the feasible nodes, the weights
also entering its attention tokens, so Q is smooth in the scores and the deterministic policy
gradient raises the scores of the nodes it values. Inference is one greedy pass over the tasks.
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..baselines import NetworkAware, register
from ..config import add_options, from_args
from ..env import (
    JOB_FEATURES,
    NODE_FEATURES,
    STEP_FEATURES,
    EnvConfig,
    GraphInput,
    PlacementEpisode,
    StepObservation,
    TrainingInstances,
    episode_return,
)
from ..model import CannotPlace, Cluster, Decision, Job
from ..ppo import _plain, mlp, threads

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "eade" / "ces_eade_ddpg.pt"
FEATURES = NODE_FEATURES + STEP_FEATURES + JOB_FEATURES  # per node token


@dataclass
class CesEadeConfig:
    seed: int = 0
    episodes: int = 4000  # jobs placed while learning (one episode = one job)
    expert_episodes: int = 800  # network-aware's jobs in the expert buffer
    expert_share: float = 0.1  # β
    batch: int = 64
    actor_lr: float = 1e-4
    critic_lr: float = 1e-3
    gamma: float = 0.99
    tau: float = 0.005  # soft target updates
    noise: float = 0.2  # σ of the Gaussian added to the node scores while learning
    temperature: float = 0.1  # of the critic's softmax over the scores
    hidden: int = 64
    buffer: int = 50_000  # online transitions kept
    learning_starts: int = 500  # online transitions before the first update
    # CES-PPO's instances without topohub's networks of up to 200 nodes: the attention costs
    # N² per node set and one update runs per step, so networks of at most 30 nodes.
    instances: EnvConfig = EnvConfig(sites=(2, 30), real_share=0.0, background=(0.0, 0.5))
    threads: int = 1


# --- observations as tensors ---------------------------------------------------------------------
@dataclass
class State:
    """What the networks see of one step: per compute node its graph features (the episode's
    start), its step features and the job's."""

    x: np.ndarray  # (n, FEATURES) float32
    mask: np.ndarray  # (n,) bool: feasible

    @classmethod
    def of(cls, graph: GraphInput, obs: StepObservation) -> State:
        n = graph.n_compute
        x = np.concatenate(
            [graph.node_x[:n], obs.x, np.repeat(graph.job_x[None, :], n, axis=0)], axis=1
        )
        return cls(x.astype(np.float32), obs.mask.copy())


def collate(states: list[State]) -> tuple[Tensor, Tensor, Tensor]:
    """(B, N, F) features, (B, N) feasible, (B, N) real (not padding)."""
    n = max(len(s.mask) for s in states)
    x = np.zeros((len(states), n, states[0].x.shape[1]), np.float32)
    mask = np.zeros((len(states), n), bool)
    real = np.zeros((len(states), n), bool)
    for i, s in enumerate(states):
        x[i, : len(s.mask)] = s.x
        mask[i, : len(s.mask)] = s.mask
        real[i, : len(s.mask)] = True
    return torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(real)


# --- networks -------------------------------------------------------------------------------------
class NodeAttention(nn.Module):
    """Node tokens → one scaled dot-product self-attention layer (padding masked out), residual
    and layer norm; (B, N, H)."""

    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(features, hidden), nn.ReLU())
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.mix = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.scale = hidden**-0.5

    def forward(self, x: Tensor, real: Tensor) -> Tensor:
        h = self.embed(x)
        q, k, v = self.qkv(h).chunk(3, dim=2)
        logits = (q @ k.transpose(1, 2) * self.scale).masked_fill(~real[:, None, :], -1e9)
        return self.norm(h + self.mix(torch.softmax(logits, dim=2) @ v))


def _pool(h: Tensor, real: Tensor) -> Tensor:
    """Mean over the real nodes, broadcast back to every node: (B, N, H)."""
    r = real[:, :, None].float()
    return ((h * r).sum(1) / r.sum(1).clamp(min=1))[:, None, :].expand_as(h)


class Actor(nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.encoder = NodeAttention(features, hidden)
        self.head = mlp(2 * hidden, hidden, 1)

    def forward(self, x: Tensor, real: Tensor) -> Tensor:
        """(B, N) scores in [-1, 1]."""
        h = self.encoder(x, real)
        return torch.tanh(self.head(torch.cat([h, _pool(h, real)], dim=2)).squeeze(2))


class Critic(nn.Module):
    """Q(s, a) = Σ_i w_i q_i, w = softmax(a / temperature) over the feasible nodes; w_i is also
    part of node i's attention token."""

    def __init__(self, features: int, hidden: int, temperature: float):
        super().__init__()
        self.temperature = temperature
        self.encoder = NodeAttention(features + 1, hidden)
        self.head = mlp(2 * hidden, hidden, 1)

    def forward(self, x: Tensor, mask: Tensor, real: Tensor, action: Tensor) -> Tensor:
        w = torch.softmax((action / self.temperature).masked_fill(~mask, -1e9), dim=1)
        h = self.encoder(torch.cat([x, w[:, :, None]], dim=2), real)
        q = self.head(torch.cat([h, _pool(h, real)], dim=2)).squeeze(2)
        return (w * q).sum(1)


# --- acting in the MDP ----------------------------------------------------------------------------
def best_node(scores: np.ndarray, mask: np.ndarray) -> int:
    return int(np.argmax(np.where(mask, scores, -np.inf)))


@torch.inference_mode()
def scores_of(actor: Actor, state: State) -> np.ndarray:
    x, _, real = collate([state])
    return actor(x, real)[0].numpy()


@dataclass
class Transition:
    state: State
    action: np.ndarray  # (n,) the scores acted on
    reward: float
    next_state: State | None  # None at the end of the episode


class DualReplay:
    """The online buffer and the expert buffer; `sample` takes round(share × batch) from the
    expert buffer (none while it is empty), the rest online."""

    def __init__(self, size: int, share: float, rng: random.Random):
        self.online: deque[Transition] = deque(maxlen=size)
        self.expert: list[Transition] = []
        self.share, self.rng = share, rng

    def expert_count(self, batch: int) -> int:
        return round(self.share * batch) if self.expert else 0

    def sample(self, batch: int) -> list[Transition]:
        k = self.expert_count(batch)
        return self.rng.choices(self.expert, k=k) + self.rng.choices(self.online, k=batch - k)


# --- training -------------------------------------------------------------------------------------
def play(
    ep: PlacementEpisode, choose: Callable[[State], tuple[int, np.ndarray]]
) -> tuple[list[Transition], dict]:
    """One episode from its first step; `choose(state)` → (node, action scores). The transitions
    (reward 0 until the last, then `episode_return`) and the end info."""
    out: list[Transition] = []
    graph = ep.graph_input()
    state = State.of(graph, ep.observe())
    while True:
        node, action = choose(state)
        ep.step(node)
        if ep.done:
            reward, info = episode_return(ep)
            out.append(Transition(state, action, reward, None))
            return out, info
        nxt = State.of(graph, ep.observe())
        out.append(Transition(state, action, 0.0, nxt))
        state = nxt


def expert_episode(cluster: Cluster, job: Job) -> list[Transition]:
    """network-aware's placement replayed in the MDP (its node as score +1, the others -1);
    empty when it cannot place the job, when one of its choices is masked in the MDP (the mask
    looks ahead, network-aware does not) or when the placement has no paths."""
    try:
        placement = NetworkAware().positions(cluster, job)
    except CannotPlace:
        return []
    ep = PlacementEpisode(cluster, job)
    if ep.done:
        return []
    index = {v: i for i, v in enumerate(ep.compute)}
    choices = iter([index[placement[t]] for t in ep.order])

    def choose(state: State) -> tuple[int, np.ndarray]:
        node = next(choices)
        action = -np.ones(len(state.mask), np.float32)
        action[node] = 1.0
        return node, action

    try:
        steps, info = play(ep, choose)
    except ValueError:  # a masked choice
        return []
    return steps if info["placed"] else []


@dataclass
class Agent:
    actor: Actor
    critic: Critic
    actor_target: Actor = field(init=False)
    critic_target: Critic = field(init=False)

    def __post_init__(self) -> None:
        self.actor_target = _copy(self.actor)
        self.critic_target = _copy(self.critic)


def _copy(net: nn.Module) -> nn.Module:
    out = copy.deepcopy(net)
    out.requires_grad_(False)
    return out


def update(
    agent: Agent,
    batch: list[Transition],
    cfg: CesEadeConfig,
    optims: tuple[torch.optim.Optimizer, torch.optim.Optimizer],
) -> tuple[float, float]:
    """One DDPG update (Algorithm 1, lines 12–17); (critic loss, actor loss)."""
    x, mask, real = collate([t.state for t in batch])
    a = torch.zeros(mask.shape)
    for i, t in enumerate(batch):
        a[i, : len(t.action)] = torch.from_numpy(t.action)
    r = torch.tensor([t.reward for t in batch], dtype=torch.float32)
    live = [i for i, t in enumerate(batch) if t.next_state is not None]
    y = r.clone()
    if live:
        with torch.no_grad():
            nx, nmask, nreal = collate([batch[i].next_state for i in live])
            q_next = agent.critic_target(nx, nmask, nreal, agent.actor_target(nx, nreal))
            y[live] += cfg.gamma * q_next
    critic_loss = nn.functional.mse_loss(agent.critic(x, mask, real, a), y)
    optims[1].zero_grad()
    critic_loss.backward()
    optims[1].step()
    actor_loss = -agent.critic(x, mask, real, agent.actor(x, real)).mean()
    optims[0].zero_grad()
    actor_loss.backward()
    optims[0].step()
    with torch.no_grad():
        for net, target in ((agent.actor, agent.actor_target), (agent.critic, agent.critic_target)):
            for p, tp in zip(net.parameters(), target.parameters()):
                tp.mul_(1 - cfg.tau).add_(cfg.tau * p)
    return critic_loss.item(), actor_loss.item()


def train(cfg: CesEadeConfig, log: Callable[[dict], None] = lambda row: None) -> Agent:
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    agent = Agent(Actor(FEATURES, cfg.hidden), Critic(FEATURES, cfg.hidden, cfg.temperature))
    optims = (
        torch.optim.Adam(agent.actor.parameters(), lr=cfg.actor_lr),
        torch.optim.Adam(agent.critic.parameters(), lr=cfg.critic_lr),
    )
    replay = DualReplay(cfg.buffer, cfg.expert_share, random.Random(cfg.seed))
    source = TrainingInstances(cfg.instances, cfg.seed)
    expert_jobs = 0
    while expert_jobs < cfg.expert_episodes:  # the expert buffer, before training
        steps = expert_episode(*source.next())
        expert_jobs += bool(steps)
        replay.expert += steps
    window: deque[dict] = deque(maxlen=100)
    episode = 0
    while episode < cfg.episodes:
        ep = PlacementEpisode(*source.next())
        if ep.done:  # the job fits nowhere: nothing to decide, no episode
            continue
        episode += 1

        def explore(state: State) -> tuple[int, np.ndarray]:
            a = np.clip(
                scores_of(agent.actor, state) + rng.normal(0, cfg.noise, len(state.mask)), -1, 1
            ).astype(np.float32)
            return best_node(a, state.mask), a

        steps, info = play(ep, explore)
        replay.online.extend(steps)
        losses = [
            update(agent, replay.sample(cfg.batch), cfg, optims)
            for _ in steps
            if len(replay.online) >= cfg.learning_starts
        ]
        window.append({"return": sum(t.reward for t in steps), "placed": float(info["placed"])})
        if episode % 50 == 0 or episode == cfg.episodes:
            log(
                {
                    "episode": episode,
                    "return": float(np.mean([w["return"] for w in window])),
                    "placed": float(np.mean([w["placed"] for w in window])),
                    "critic_loss": float(np.mean([c for c, _ in losses])) if losses else math.nan,
                    "actor_loss": float(np.mean([a for _, a in losses])) if losses else math.nan,
                }
            )
    return agent


def save(agent: Agent, cfg: CesEadeConfig, path: str | Path, meta: dict) -> None:
    torch.save(
        {
            "config": _plain(asdict(cfg)),
            "features": FEATURES,
            "actor": agent.actor.state_dict(),
            "meta": meta,
        },
        path,
    )


def load(path: str | Path = CHECKPOINT) -> tuple[Actor, dict]:
    """The trained actor and the checkpoint's meta (its config is kept as a record)."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if data["features"] != FEATURES:
        raise ValueError(
            f"{path}: trained on {data['features']} features per node, "
            f"scheduler/env.py now gives {FEATURES}: retrain "
            "(python -m scheduler.eade.ces)"
        )
    actor = Actor(FEATURES, data["config"]["hidden"])
    actor.load_state_dict(data["actor"])
    actor.eval()
    return actor, data["meta"]


# --- the registered algorithm ---------------------------------------------------------------------
@register("eade-ddpg")
@dataclass
class EadeDDPG:
    """Greedy inference of the trained actor: each task on its feasible node with the highest
    score; the network part by CES's network decision (`PlacementEpisode.decision`)."""

    name: str = "eade-ddpg"
    seed: int = 0  # unused: inference draws nothing
    checkpoint: str | Path = CHECKPOINT
    actor: Actor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not Path(self.checkpoint).exists():
            raise FileNotFoundError(
                f"{self.checkpoint}: no eade-ddpg checkpoint (train one: "
                "python -m scheduler.eade.ces)"
            )
        self.actor, _ = load(self.checkpoint)

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        with threads(1):
            ep = PlacementEpisode(cluster, job)
            graph = ep.graph_input()
            while not ep.done:
                state = State.of(graph, ep.observe())
                ep.step(best_node(scores_of(self.actor, state), state.mask))
            decision = ep.decision()  # CannotPlace when a step found no feasible node
        decision.decision_s = time.perf_counter() - start
        return decision


# --- the train command ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scheduler.eade.ces",
        usage="%(prog)s [options]",
        description="Train the eade-ddpg placement algorithm of CES.",
    )
    ap.add_argument("--out", type=Path, default=CHECKPOINT)
    add_options(ap, CesEadeConfig())
    args = ap.parse_args(argv)
    cfg = from_args(args, CesEadeConfig())
    if cfg.episodes < 1 or cfg.expert_episodes < 0:
        ap.error("--episodes must be ≥ 1 and --expert-episodes ≥ 0")
    if args.out.parent.exists() and not args.out.parent.is_dir():
        ap.error(f"--out: {args.out.parent} is not a directory")
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from ..evaluate import machine_info

    rows: list[dict] = []
    wall, cpu = time.perf_counter(), time.process_time()
    with Progress(
        TextColumn("[bold]eade-ddpg[/] seed {task.fields[seed]}"),
        BarColumn(),
        TextColumn("{task.completed:>5.0f}/{task.total:.0f} jobs"),
        TextColumn("return {task.fields[ret]:>6.2f} placed {task.fields[placed]:>4.0%}"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task("train", total=cfg.episodes, seed=cfg.seed, ret=0.0, placed=0.0)

        def log(row: dict) -> None:
            rows.append(row)
            bar.update(task, completed=row["episode"], ret=row["return"], placed=row["placed"])

        agent = train(cfg, log)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save(
        agent,
        cfg,
        args.out,
        {
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            "curve": rows,
            "machine": machine_info(),
        },
    )
    print(f"checkpoint {args.out} ({time.perf_counter() - wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
