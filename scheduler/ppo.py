"""CES-PPO: the dual-branch actor-critic of DESIGN §3, trained with PPO (CleanRL style).

Read top to bottom: the hyper-parameters (one dataclass), batching of steps whose graphs differ
in size, the network (a shared encoder over G and the job, a placement branch, a bandwidth branch,
one critic), acting, the PPO update (clipped objective, GAE, entropy bonus, and an imitation term
toward a heuristic teacher that is annealed away), the training loop, checkpoints, and `CesPPO`,
the `ces-ppo` algorithm of the registry (greedy inference from the committed checkpoint).

Shapes: B steps in a batch; V vertices and E directed links over all their graphs; N the most
compute nodes of one graph in the batch; F the most new flows of one step; K candidate paths per
flow; L rate levels; H hidden units.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical

from .baselines import register
from .env import (EDGE_FEATURES, FLOW_FEATURES, JOB_FEATURES, NODE_FEATURES, PATH_FEATURES,
                  EnvConfig, FlowOptions, Observation, PlacementEnv, PlacementEpisode,
                  RewardConfig)
from .instances import JobDistribution
from .metrics import predicted_iteration_s
from .model import CannotPlace, Cluster, Decision, Job

Categorical.set_default_validate_args(False)  # masks make the checks pure overhead
CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "ces_ppo.pt"


@dataclass
class PPOConfig:
    seed: int = 0
    total_steps: int = 120_000  # environment steps (task placements)
    rollout_steps: int = 1024  # per update (whole episodes: a rollout ends with one)
    epochs: int = 4
    minibatch: int = 256
    lr: float = 5e-4
    gamma: float = 1.0  # episodes are a few steps long and end for sure
    gae_lambda: float = 0.95
    clip: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    guide_coef: float = 1.0  # weight of the imitation term toward the teacher at the start ...
    guide_until: float = 0.2  # ... annealed linearly to 0 at this fraction of training
    encoder: str = "gnn"  # "gnn": message passing over G; "mlp": per-vertex MLP only
    layers: int = 3  # message-passing rounds of the gnn encoder
    hidden: int = 64
    threads: int = 1  # torch threads (the machine is shared)


# --- batching -------------------------------------------------------------------------------------
@dataclass
class Batch:
    node_x: Tensor  # (V, NODE_FEATURES)
    edge_index: Tensor  # (2, E) global vertex indices
    edge_x: Tensor  # (E, EDGE_FEATURES)
    graph: Tensor  # (V,) which step each vertex belongs to
    job_x: Tensor  # (B, JOB_FEATURES)
    compute: Tensor  # (B, N) global vertex index of each compute node (0 where padded)
    real: Tensor  # (B, N) bool: a compute node (not padding)
    node_mask: Tensor  # (B, N) bool: feasible for this step's task


@dataclass
class FlowBatch:
    chosen: Tensor  # (B,) global vertex index of the chosen node
    peer: Tensor  # (B, F) global vertex index of each flow's peer node
    flow_x: Tensor  # (B, F, FLOW_FEATURES)
    path_x: Tensor  # (B, F, K, PATH_FEATURES)
    path_mask: Tensor  # (B, F, K) bool (padded flows: first path only)
    flow_mask: Tensor  # (B, F) bool: a real flow


def collate(obs: list[Observation]) -> Batch:
    sizes = [o.node_x.shape[0] for o in obs]
    offset = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    n = max(o.n_compute for o in obs)
    compute = np.zeros((len(obs), n), np.int64)
    real = np.zeros((len(obs), n), bool)
    mask = np.zeros((len(obs), n), bool)
    for b, (o, off) in enumerate(zip(obs, offset)):
        compute[b, :o.n_compute] = off + np.arange(o.n_compute)
        real[b, :o.n_compute] = True
        mask[b, :o.n_compute] = o.node_mask
    return Batch(
        node_x=torch.from_numpy(np.concatenate([o.node_x for o in obs])),
        edge_index=torch.from_numpy(np.concatenate([o.edge_index + off
                                                    for o, off in zip(obs, offset)], axis=1)),
        edge_x=torch.from_numpy(np.concatenate([o.edge_x for o in obs])),
        graph=torch.from_numpy(np.repeat(np.arange(len(obs)), sizes)),
        job_x=torch.from_numpy(np.stack([o.job_x for o in obs])),
        compute=torch.from_numpy(compute), real=torch.from_numpy(real),
        node_mask=torch.from_numpy(mask))


def collate_flows(opts: list[FlowOptions], nodes: list[int], batch: Batch, k: int) -> FlowBatch:
    f = max([1] + [len(o.flows) for o in opts])
    b = len(opts)
    peer = np.zeros((b, f), np.int64)
    flow_x = np.zeros((b, f, FLOW_FEATURES), np.float32)
    path_x = np.zeros((b, f, k, PATH_FEATURES), np.float32)
    path_mask = np.zeros((b, f, k), bool)
    path_mask[:, :, 0] = True  # padded flows get a well-defined (ignored) distribution
    flow_mask = np.zeros((b, f), bool)
    compute = batch.compute.numpy()
    offset = compute[:, 0]  # compute nodes come first in each graph
    for i, o in enumerate(opts):
        m = len(o.flows)
        peer[i, :m] = offset[i] + o.peer
        flow_x[i, :m] = o.flow_x
        path_x[i, :m] = o.path_x
        path_mask[i, :m] = o.path_mask
        flow_mask[i, :m] = True
    chosen = compute[np.arange(b), np.array(nodes)]
    return FlowBatch(torch.from_numpy(chosen), torch.from_numpy(peer), torch.from_numpy(flow_x),
                     torch.from_numpy(path_x), torch.from_numpy(path_mask),
                     torch.from_numpy(flow_mask))


# --- the network ----------------------------------------------------------------------------------
def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Agent(nn.Module):
    """Shared encoder → placement branch, bandwidth branch (path, rate), critic."""

    def __init__(self, cfg: PPOConfig, k_paths: int, rate_levels: int):
        super().__init__()
        h = cfg.hidden
        self.k = k_paths
        self.embed = mlp(NODE_FEATURES + JOB_FEATURES, h, h)
        rounds = cfg.layers if cfg.encoder == "gnn" else 0
        # A round: message from each in-neighbour (its state and the link's features), mean
        # over in-links, then a residual update of the vertex state.
        self.message = nn.ModuleList(mlp(h + EDGE_FEATURES, h) for _ in range(rounds))
        self.update = nn.ModuleList(mlp(2 * h, h, h) for _ in range(rounds))
        self.norm = nn.ModuleList(nn.LayerNorm(h) for _ in range(rounds))
        self.place = mlp(3 * h, h, 1)  # [vertex, graph context] → logit
        self.path = mlp(2 * h + FLOW_FEATURES + PATH_FEATURES, h, 1)
        self.rate = mlp(2 * h + FLOW_FEATURES + PATH_FEATURES, h, rate_levels)
        self.critic = mlp(2 * h + JOB_FEATURES, h, h, 1)

    def encode(self, b: Batch) -> tuple[Tensor, Tensor]:
        """Vertex states (V, H) and per-step context (B, 2H): mean and max over compute nodes."""
        h = self.embed(torch.cat([b.node_x, b.job_x[b.graph]], dim=1))  # (V, H)
        src, dst = b.edge_index
        deg = torch.zeros(h.shape[0]).index_add_(0, dst, torch.ones(dst.shape[0])).clamp(min=1)
        n = h.shape[1]
        for message, update, norm in zip(self.message, self.update, self.norm):
            # message(cat[h_src, edge]) with the vertex part applied before the gather: the same
            # linear map, on V rows instead of E (the costly product at inference).
            lin = message[0]
            m = (h @ lin.weight[:, :n].T)[src] + b.edge_x @ lin.weight[:, n:].T + lin.bias  # (E, H)
            agg = torch.zeros_like(h).index_add_(0, dst, m) / deg[:, None]  # (V, H)
            h = norm(h + update(torch.cat([h, agg], dim=1)))
        hc = h[b.compute]  # (B, N, H)
        real = b.real[:, :, None]
        mean = (hc * real).sum(1) / real.sum(1).clamp(min=1)
        top = hc.masked_fill(~real, -1e9).max(1).values
        return h, torch.cat([mean, top], dim=1)

    def placement_logits(self, h: Tensor, ctx: Tensor, b: Batch) -> Tensor:
        hc = h[b.compute]  # (B, N, H)
        x = torch.cat([hc, ctx[:, None, :].expand(-1, hc.shape[1], -1)], dim=2)
        return self.place(x).squeeze(2).masked_fill(~b.node_mask, -1e9)  # (B, N)

    def _flow_input(self, h: Tensor, fb: FlowBatch) -> Tensor:
        f = fb.peer.shape[1]
        here = h[fb.chosen][:, None, :].expand(-1, f, -1)  # (B, F, H)
        return torch.cat([here, h[fb.peer], fb.flow_x], dim=2)  # (B, F, 2H + FLOW_FEATURES)

    def path_logits(self, h: Tensor, fb: FlowBatch) -> Tensor:
        x = self._flow_input(h, fb)[:, :, None, :].expand(-1, -1, self.k, -1)
        logits = self.path(torch.cat([x, fb.path_x], dim=3)).squeeze(3)  # (B, F, K)
        return logits.masked_fill(~fb.path_mask, -1e9)

    def rate_logits(self, h: Tensor, fb: FlowBatch, path: Tensor) -> Tensor:
        picked = fb.path_x.gather(2, path[:, :, None, None].expand(-1, -1, 1, PATH_FEATURES))
        return self.rate(torch.cat([self._flow_input(h, fb), picked.squeeze(2)], dim=2))

    def value(self, ctx: Tensor, b: Batch) -> Tensor:
        return self.critic(torch.cat([ctx, b.job_x], dim=1)).squeeze(1)  # (B,)


def forward(agent: Agent, obs: list[Observation]) -> tuple[Batch, Tensor, Tensor, Tensor]:
    """The batch of `obs`, the encoder's vertex states (V, H) and context (B, 2H), and the
    masked placement logits (B, N)."""
    b = collate(obs)
    h, ctx = agent.encode(b)
    return b, h, ctx, agent.placement_logits(h, ctx, b)


@dataclass
class Step:
    """One placement as the agent took it (what PPO stores and replays)."""
    obs: Observation
    opts: FlowOptions
    node: int
    paths: np.ndarray  # (F,)
    rates: np.ndarray  # (F,)
    logp: float
    value: float
    guide: int = -1  # the teacher's node, -1 if none
    reward: float = 0.0


@torch.inference_mode()
def act(agent: Agent, ep: PlacementEpisode, greedy: bool, node: int | None = None) -> Step:
    """Choose this step's node, then each new flow's path and rate level: sampled (training;
    with log-probability and value) or greedy (inference: argmax only, nothing else computed).
    `node` forces the node (a start of multi-start decoding); paths and rates are still chosen."""
    obs = ep.observe()
    b, h, ctx, node_logits = forward(agent, [obs])  # node_logits: (1, N)
    if node is not None:
        node = torch.tensor([node])
    else:
        node = node_logits.argmax(1) if greedy else Categorical(logits=node_logits).sample()
    opts = ep.options(int(node))
    m = len(opts.flows)
    if greedy and m == 0:
        return Step(obs, opts, int(node), np.zeros(0, np.int64), np.zeros(0, np.int64), 0.0, 0.0)
    fb = collate_flows([opts], [int(node)], b, agent.k)
    path_logits = agent.path_logits(h, fb)  # (1, F, K)
    path = path_logits.argmax(2) if greedy else Categorical(logits=path_logits).sample()
    rate_logits = agent.rate_logits(h, fb, path)  # (1, F, L)
    rate = rate_logits.argmax(2) if greedy else Categorical(logits=rate_logits).sample()
    logp = value = 0.0
    if not greedy:
        logp = float(Categorical(logits=node_logits).log_prob(node) +
                     ((Categorical(logits=path_logits).log_prob(path) +
                       Categorical(logits=rate_logits).log_prob(rate)) * fb.flow_mask).sum(1))
        value = float(agent.value(ctx, b))
    return Step(obs, opts, int(node), path[0, :m].numpy(), rate[0, :m].numpy(), logp, value)


@torch.inference_mode()
def first_nodes(agent: Agent, ep: PlacementEpisode, m: int) -> list[int]:
    """The m feasible nodes the policy rates highest for the episode's first task, best first."""
    b, _, _, logits = forward(agent, [ep.observe()])
    feasible = int(b.node_mask.sum())
    return [int(i) for i in torch.argsort(logits[0], descending=True)[:min(m, feasible)]]


def evaluate(agent: Agent, steps: list[Step]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                                       Tensor]:
    """Log-probability, entropy and value of stored steps under the current weights, and for
    the imitation term the placement logits (B, N), rate logits (B, F, L) and flow mask (B, F)."""
    b, h, ctx, logits = forward(agent, [s.obs for s in steps])
    node_dist = Categorical(logits=logits)
    nodes = torch.tensor([s.node for s in steps])
    fb = collate_flows([s.opts for s in steps], [s.node for s in steps], b, agent.k)
    f = fb.flow_mask.shape[1]
    path = torch.zeros((len(steps), f), dtype=torch.long)
    rate = torch.zeros((len(steps), f), dtype=torch.long)
    for i, s in enumerate(steps):
        path[i, :len(s.paths)] = torch.from_numpy(s.paths)
        rate[i, :len(s.rates)] = torch.from_numpy(s.rates)
    path_dist = Categorical(logits=agent.path_logits(h, fb))
    rate_logits = agent.rate_logits(h, fb, path)
    rate_dist = Categorical(logits=rate_logits)
    mask = fb.flow_mask.float()
    logp = node_dist.log_prob(nodes) + ((path_dist.log_prob(path) + rate_dist.log_prob(rate))
                                        * mask).sum(1)
    flows = mask.sum(1).clamp(min=1)
    entropy = node_dist.entropy() + ((path_dist.entropy() + rate_dist.entropy()) * mask).sum(1) \
        / flows
    return logp, entropy, agent.value(ctx, b), logits, rate_logits, fb.flow_mask


# --- training -------------------------------------------------------------------------------------
def advantages(episode: list[Step], gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """GAE over one finished episode (no bootstrap: it ended)."""
    adv = np.zeros(len(episode))
    last = 0.0
    for t in reversed(range(len(episode))):
        next_value = episode[t + 1].value if t + 1 < len(episode) else 0.0
        delta = episode[t].reward + gamma * next_value - episode[t].value
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, adv + np.array([s.value for s in episode])


def train(cfg: PPOConfig, env_cfg: EnvConfig = EnvConfig(),
          log: Callable[[dict], None] = lambda row: None) -> Agent:
    """Train from scratch; `log` gets one row of statistics per update."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    env = PlacementEnv(env_cfg)
    env.reset(seed=cfg.seed)
    agent = Agent(cfg, env_cfg.k_paths, len(env_cfg.rate_levels))
    optim = torch.optim.Adam(agent.parameters(), lr=cfg.lr, eps=1e-5)
    done_steps, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while done_steps < cfg.total_steps:
        progress = done_steps / cfg.total_steps
        for group in optim.param_groups:
            group["lr"] = cfg.lr * (1 - progress)
        guide = cfg.guide_coef * max(0.0, 1 - progress / cfg.guide_until) \
            if cfg.guide_until > 0 else 0.0

        # Rollout: whole episodes. While guiding, the teacher is the best of the heuristics;
        # after, only the first runs (the learning curve's yardstick).
        env.compare = guide > 0
        batch: list[Step] = []
        adv_all, ret_all = [], []
        returns, placed, ratio = [], [], []
        while len(batch) < min(cfg.rollout_steps, cfg.total_steps - done_steps):
            env.reset()
            ep, episode, total = env.episode, [], 0.0
            while True:
                teacher = env.teacher_node()
                step = act(agent, ep, greedy=False)
                step.guide = teacher
                action = {"node": step.node, "paths": _pad(step.paths, env_cfg.max_flows),
                          "rates": _pad(step.rates, env_cfg.max_flows)}
                _, step.reward, done, _, info = env.step(action)
                total += step.reward
                episode.append(step)
                if done:
                    break
            adv, ret = advantages(episode, cfg.gamma, cfg.gae_lambda)
            batch += episode
            adv_all.append(adv)
            ret_all.append(ret)
            returns.append(total)
            placed.append(info["placed"])
            if info["placed"] and "heuristic_iteration_s" in info:
                ratio.append(info["iteration_s"] / info["heuristic_iteration_s"])
        done_steps += len(batch)
        adv_t = torch.tensor(np.concatenate(adv_all), dtype=torch.float32)
        ret_t = torch.tensor(np.concatenate(ret_all), dtype=torch.float32)
        old_logp = torch.tensor([s.logp for s in batch])
        guides = torch.tensor([s.guide for s in batch])

        # PPO update.
        stats: dict[str, list[float]] = {"pg_loss": [], "v_loss": [], "entropy": [],
                                         "guide_loss": [], "clip_frac": []}
        for _ in range(cfg.epochs):
            for idx in np.array_split(rng.permutation(len(batch)),
                                      max(1, len(batch) // cfg.minibatch)):
                logp, entropy, value, logits, rate_logits, flows = \
                    evaluate(agent, [batch[i] for i in idx])
                ix = torch.from_numpy(idx)
                a = adv_t[ix]
                a = (a - a.mean()) / (a.std() + 1e-8)
                ratio_t = (logp - old_logp[ix]).exp()
                pg = -torch.min(ratio_t * a, ratio_t.clamp(1 - cfg.clip, 1 + cfg.clip) * a).mean()
                v_loss = 0.5 * (value - ret_t[ix]).pow(2).mean()
                # Imitation: the teacher's node, and the full rate it asks for every flow.
                g = guides[ix]
                has = g >= 0
                guide_loss = torch.zeros(())
                if guide > 0 and has.any():
                    guide_loss = nn.functional.cross_entropy(logits[has], g[has])
                if guide > 0 and flows.any():
                    full = torch.full((int(flows.sum()),), rate_logits.shape[2] - 1)
                    guide_loss = guide_loss + nn.functional.cross_entropy(rate_logits[flows],
                                                                          full)
                loss = pg + cfg.vf_coef * v_loss - cfg.ent_coef * entropy.mean() + \
                    guide * guide_loss
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
                optim.step()
                stats["pg_loss"].append(pg.item())
                stats["v_loss"].append(v_loss.item())
                stats["entropy"].append(entropy.mean().item())
                stats["guide_loss"].append(guide_loss.item())
                stats["clip_frac"].append(float(((ratio_t - 1).abs() > cfg.clip).float().mean()))
        log({"steps": done_steps, "episodes": len(returns), "seconds": time.perf_counter() - start,
             "cpu_seconds": time.process_time() - cpu_start,
             "return": float(np.mean(returns)), "placed": float(np.mean(placed)),
             "iter_vs_heuristic": float(np.exp(np.mean(np.log(ratio)))) if ratio else math.nan,
             "guide": guide, **{k: float(np.mean(v)) for k, v in stats.items()}})
    return agent


def greedy_eval(agent: Agent, env_cfg: EnvConfig, seed: int, episodes: int) -> dict[str, float]:
    """Greedy play on `episodes` random instances drawn from `seed`: mean return, placed share,
    and the geometric mean of iteration time over the first heuristic's (network-aware), on
    the jobs both placed."""
    env = PlacementEnv(env_cfg)
    env.compare = False
    env.reset(seed=seed)
    returns, placed, ratio = [], [], []
    for _ in range(episodes):
        env.reset()
        total, info = 0.0, {}
        while not env.episode.done:
            s = act(agent, env.episode, greedy=True)
            _, r, _, _, info = env.step({"node": s.node,
                                         "paths": _pad(s.paths, env_cfg.max_flows),
                                         "rates": _pad(s.rates, env_cfg.max_flows)})
            total += r
        returns.append(total)
        placed.append(info["placed"])
        if info["placed"] and "heuristic_iteration_s" in info:
            ratio.append(info["iteration_s"] / info["heuristic_iteration_s"])
    return {"return": float(np.mean(returns)), "placed": float(np.mean(placed)),
            "iter_vs_heuristic": float(np.exp(np.mean(np.log(ratio)))) if ratio else math.nan}


def _pad(a: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n, np.int64)
    out[:len(a)] = a
    return out


# --- checkpoints ----------------------------------------------------------------------------------
def save(agent: Agent, cfg: PPOConfig, env_cfg: EnvConfig, path: str | Path,
         meta: dict | None = None) -> None:
    env = asdict(env_cfg)
    env["jobs"] = asdict(env_cfg.jobs)
    env["reward"] = asdict(env_cfg.reward)
    torch.save({"ppo": asdict(cfg), "env": env, "state_dict": agent.state_dict(),
                "meta": meta or {}}, path)


def load(path: str | Path = CHECKPOINT) -> tuple[Agent, PPOConfig, EnvConfig]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    cfg = PPOConfig(**data["ppo"])
    env = dict(data["env"])
    env["jobs"] = JobDistribution(**{k: tuple(v) if isinstance(v, list) else v
                                     for k, v in env["jobs"].items()})
    env["reward"] = RewardConfig(**env["reward"])
    env = {k: tuple(v) if isinstance(v, list) else v for k, v in env.items()
           if k in {f.name for f in fields(EnvConfig)}}
    env_cfg = EnvConfig(**env)
    agent = Agent(cfg, env_cfg.k_paths, len(env_cfg.rate_levels))
    agent.load_state_dict(data["state_dict"])
    agent.eval()
    return agent, cfg, env_cfg


# --- the registered algorithm ---------------------------------------------------------------------
@register("ces-ppo")
@dataclass
class CesPPO:
    """Deterministic inference of a trained checkpoint, multi-start greedy decoding: rollouts
    that begin with the first task on each of the `starts` nodes the policy rates highest and
    then follow the greedy policy; the decision is the rollout with the shortest predicted
    iteration time (the quantity the reward scores; ties keep the plain greedy rollout). A
    start costs one forward pass per task over all compute nodes, so `starts` =
    decode_budget // (compute nodes × tasks), at least 1: small instances get several starts,
    an 8-task job on 100 nodes plain greedy decoding (the decision-latency target)."""
    name: str = "ces-ppo"
    seed: int = 0  # unused: decoding draws nothing
    checkpoint: str | Path = CHECKPOINT
    decode_budget: int = 200  # node-steps per decision (chosen in docs/ppo.md, "Decoding")
    agent: Agent = field(init=False, repr=False)
    env_cfg: EnvConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not Path(self.checkpoint).exists():
            raise FileNotFoundError(f"{self.checkpoint}: no CES-PPO checkpoint (train one: "
                                    "python -m scheduler.train_ppo --seed 0)")
        if self.decode_budget < 0:
            raise ValueError(f"decode_budget: expected ≥ 0 node-steps, got {self.decode_budget}")
        self.agent, _, self.env_cfg = load(self.checkpoint)

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        starts = self.decode_budget // max(1, len(cluster.compute_nodes()) * len(job.tasks))
        decisions, reason = [], ""
        with _threads(1):
            firsts: list[int | None] = [None]  # plain greedy
            if starts > 1:  # (no start when nothing fits the first task: greedy says why)
                ep = PlacementEpisode(cluster, job, self.env_cfg, shaping=False)
                firsts = first_nodes(self.agent, ep, starts) or firsts
            for first in firsts:
                try:
                    decisions.append(self._rollout(cluster, job, first))
                except CannotPlace as e:
                    reason = reason or str(e)
        if not decisions:
            raise CannotPlace(reason)
        # min keeps the earliest start on a tie: the plain greedy rollout unless one is faster.
        best = min(decisions, key=lambda d: predicted_iteration_s(cluster, job, d))
        best.decision_s = time.perf_counter() - start
        return best

    def _rollout(self, cluster: Cluster, job: Job, first: int | None) -> Decision:
        """Greedy decoding, the first task on compute node index `first` if given."""
        ep = PlacementEpisode(cluster, job, self.env_cfg, shaping=False)
        while not ep.done:
            if not ep.observe().node_mask.any():
                raise CannotPlace(f"job {job.name}: task {ep.task} fits on no node that "
                                  "can still reach its peers")
            s = act(self.agent, ep, greedy=True, node=first if ep.t == 0 else None)
            _, done, info = ep.step(s.node, s.paths, s.rates)
            if done and not info["placed"]:
                raise CannotPlace(f"job {job.name}: {info['reason']}")
        return ep.decision()


class _threads:
    """Run torch on n threads inside the block (inference is latency-bound, not throughput)."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self) -> None:
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.before)
