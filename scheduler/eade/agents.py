"""EADE-DDPG as stable-baselines3 customisations, and the RL baselines DDPG, TD3, SAC, PPO.

EADE-DDPG (§3.2, Algorithm 1, Table 5) is SB3's DDPG with three parts swapped in:
  `ClusterAttention`  the self-attention input layer of the actor (16×4+4 → 128) and the critic
                      (16×4+4+1 → 128): one token per cluster (its remaining resources beside the
                      task's request) plus, in the critic, one for the action; a learned position
                      per token; one scaled dot-product self-attention layer with a residual and
                      layer norm; flattened with the task's request into 128 ReLU features.
                      Hidden layers 128-64 (ReLU) follow, as in the paper.
  `AttentionCritic`   SB3's critic concatenates the action *after* its features extractor; the
                      paper's critic attends over state and action together, so this critic feeds
                      [state, action] to its own `ClusterAttention`.
  `DualReplayBuffer`  the online buffer plus an expert buffer filled before training
                      (`fill_expert`, an expert of `heuristics`); every batch takes
                      round(β·batch) transitions from the expert buffer and the rest online.
and the paper's two learning rates (actor 1e-4, critic 1e-3; SB3 has one for both: `TwoRates`).
DDPG is the same without attention (SB3's MLP [128, 64] on the raw 68 inputs) and with one
buffer (§4.3: "DDPG differs from EADE-DDPG only in the network and the buffer"). TD3 is SB3's
TD3 with the same networks and rates; SAC and PPO are SB3's with the same hidden layers and their
default learning rate (3e-4: the paper gives none), PPO updating every 10 episodes.

Action: all four act through the same scalar in [-1, 1] (`MultiClusterEnv.action_index`: C + 1
equal bins, C clusters then wait) — the paper's critic input 16×4+4+1 says the action is one
number; DDPG's deterministic actor outputs it, exploration noise moves it across neighbouring bins.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import DDPG, PPO, SAC, TD3
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.policies import BaseModel
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, create_mlp
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.utils import update_learning_rate
from stable_baselines3.td3.policies import TD3Policy
from torch import nn

from .env import Layout, MultiClusterEnv, Setting
from .heuristics import EXPERTS

ALGORITHMS = ("EADE-DDPG", "DDPG", "TD3", "SAC", "PPO")


@dataclass
class AgentConfig:
    """Every hyper-parameter of the RL agents (Table 5 where the paper gives one)."""

    episodes: int = 1000  # training episodes of `Setting.tasks` steps (Table 5)
    batch: int = 256  # Table 5 / Table 2
    actor_lr: float = 1e-4  # Table 4
    critic_lr: float = 1e-3
    hidden: tuple[int, ...] = (128, 64)  # Table 3
    features: int = 128  # the attention layer's output (Table 5: "16×4+4, 128")
    embed: int = 8  # per-token width inside the attention (our choice: one head)
    expert_share: float = 0.1  # β (Table 1)
    expert_episodes: int = 50  # expert episodes in the expert buffer before training (our choice)
    gamma: float = 0.9  # ε of eq. (21), not given by the paper (docs/eade.md)
    tau: float = 0.005  # φ of eqs. (24)–(25), not given (SB3's default)
    noise: float = 0.1  # σ of the Gaussian n_0 of eq. (18), not given
    buffer: int = 220_000  # online transitions kept: all of 1000 episodes
    learning_starts: int = 256  # the "minimum sample size" of §3.2: one batch
    sb3_lr: float = 3e-4  # SAC and PPO (SB3's default)
    threads: int = 1  # torch threads (the machine is shared)

    def as_dict(self) -> dict:
        return asdict(self)


# --- the attention layer --------------------------------------------------------------------------
class ClusterAttention(BaseFeaturesExtractor):
    """Self-attention over the clusters at a network's input. Input: C·R cluster values, the
    task's R values, then `action_dim` action values (critic only)."""

    def __init__(
        self,
        observation_space: spaces.Box,
        clusters: int = 16,
        embed: int = 8,
        features_dim: int = 128,
        action_dim: int = 0,
    ):
        super().__init__(observation_space, features_dim)
        width = int(np.prod(observation_space.shape))
        self.clusters, self.resources = clusters, width // (clusters + 1)
        if self.resources * (clusters + 1) != width:
            raise ValueError(f"observation of {width} values is not {clusters} clusters + a task")
        tokens = clusters + action_dim
        self.cluster_in = nn.Linear(2 * self.resources, embed)  # [cluster free, task request]
        self.action_in = nn.Linear(1, embed) if action_dim else None
        self.position = nn.Parameter(th.randn(tokens, embed) * 0.1)
        # One scaled dot-product self-attention head (torch's MultiheadAttention does the same
        # maths at twice the cost on these small tensors; the machine is shared).
        self.qkv = nn.Linear(embed, 3 * embed)
        self.mix = nn.Linear(embed, embed)
        self.scale = embed**-0.5
        self.norm = nn.LayerNorm(embed)
        self.out = nn.Sequential(
            nn.Linear(tokens * embed + self.resources, features_dim), nn.ReLU()
        )

    def forward(self, x: th.Tensor) -> th.Tensor:
        c, r = self.clusters, self.resources
        free = x[:, : c * r].reshape(-1, c, r)
        task = x[:, c * r : (c + 1) * r]
        tokens = self.cluster_in(th.cat([free, task[:, None, :].expand(-1, c, -1)], dim=2))
        if self.action_in is not None:
            action = x[:, (c + 1) * r :]
            tokens = th.cat([tokens, self.action_in(action[:, :, None])], dim=1)
        tokens = tokens + self.position
        q, k, v = self.qkv(tokens).chunk(3, dim=2)
        weights = th.softmax(q @ k.transpose(1, 2) * self.scale, dim=2)  # (B, tokens, tokens)
        h = self.norm(tokens + self.mix(weights @ v))
        return self.out(th.cat([h.flatten(1), task], dim=1))


class AttentionCritic(BaseModel):
    """Q(s, a) with the action as one more attention token; the interface of SB3's
    `ContinuousCritic` (forward → a tuple of Q estimates, q1_forward)."""

    def __init__(
        self,
        observation_space: spaces.Box,
        action_space: spaces.Box,
        net_arch: list[int],
        features_extractor: ClusterAttention,
        features_dim: int,
        activation_fn: type[nn.Module] = nn.ReLU,
        normalize_images: bool = True,
        n_critics: int = 1,
        share_features_extractor: bool = False,
    ):
        super().__init__(
            observation_space,
            action_space,
            features_extractor=features_extractor,
            normalize_images=normalize_images,
        )
        self.share_features_extractor = share_features_extractor
        self.q_networks = nn.ModuleList(
            nn.Sequential(*create_mlp(features_dim, 1, net_arch, activation_fn))
            for _ in range(n_critics)
        )

    def _features(self, obs: th.Tensor, actions: th.Tensor) -> th.Tensor:
        x = preprocess_obs(obs, self.observation_space, normalize_images=self.normalize_images)
        return self.features_extractor(th.cat([x, actions], dim=1))

    def forward(self, obs: th.Tensor, actions: th.Tensor) -> tuple[th.Tensor, ...]:
        h = self._features(obs, actions)
        return tuple(q(h) for q in self.q_networks)

    def q1_forward(self, obs: th.Tensor, actions: th.Tensor) -> th.Tensor:
        # The actor's gradient reaches the action through the attention: no no_grad here.
        return self.q_networks[0](self._features(obs, actions))


class EadePolicy(TD3Policy):
    """TD3Policy (DDPG's) whose actor uses `ClusterAttention` and whose critic is an
    `AttentionCritic`."""

    def make_critic(self, features_extractor=None) -> AttentionCritic:
        extractor = ClusterAttention(
            self.observation_space,
            action_dim=int(np.prod(self.action_space.shape)),
            **self.features_extractor_kwargs,
        )
        kwargs = dict(
            self.critic_kwargs, features_extractor=extractor, features_dim=extractor.features_dim
        )
        return AttentionCritic(**kwargs).to(self.device)


# --- the dual replay buffer -----------------------------------------------------------------------
class DualReplayBuffer(ReplayBuffer):
    """The online buffer (this one) and an expert buffer (`expert`); `sample` mixes them:
    round(expert_share × batch) expert transitions (none while the expert buffer is empty),
    the rest online."""

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        expert_share: float = 0.1,
        expert_size: int = 20_000,
    ):
        super().__init__(
            buffer_size,
            observation_space,
            action_space,
            device,
            n_envs,
            optimize_memory_usage,
            handle_timeout_termination,
        )
        if not 0 <= expert_share <= 1:
            raise ValueError(f"expert_share must be in [0, 1], got {expert_share}")
        self.expert_share = expert_share
        self.expert = ReplayBuffer(
            expert_size,
            observation_space,
            action_space,
            device,
            1,
            handle_timeout_termination=False,
        )

    def add_expert(
        self, obs: np.ndarray, next_obs: np.ndarray, action: np.ndarray, reward: float, done: bool
    ) -> None:
        self.expert.add(
            obs[None], next_obs[None], action[None], np.array([reward]), np.array([done]), [{}]
        )

    def expert_count(self, batch_size: int) -> int:
        return round(self.expert_share * batch_size) if self.expert.size() else 0

    def sample(self, batch_size: int, env=None) -> ReplayBufferSamples:
        k = self.expert_count(batch_size)
        online = super().sample(batch_size - k, env)
        if k == 0:
            return online
        demo = self.expert.sample(k, env)
        return ReplayBufferSamples(
            *(None if a is None else th.cat([a, b]) for a, b in zip(online, demo))
        )


def fill_expert(
    buffer: DualReplayBuffer,
    layout: Layout,
    setting: Setting,
    episodes: int,
    seed: int,
    stream: np.ndarray | None = None,
) -> None:
    """The expert's (`setting.expert`) transitions on `episodes` task streams of their own
    (seeded) — or on `stream`, the fixed-stream mode's one —, its discrete choice stored as the
    centre of its action bin."""
    env = MultiClusterEnv(layout, setting, stream)
    rng = np.random.default_rng(seed)
    rule = EXPERTS[setting.expert]
    for e in range(episodes):
        obs, _ = env.reset(seed=seed * 100_003 + e)
        done = False
        while not done:
            index = rule(env, rng)
            nxt, reward, done, _, _ = env.choose(index)
            buffer.add_expert(obs, nxt, env.action_of(index), reward, done)
            obs = nxt


# --- the algorithms -------------------------------------------------------------------------------
class TwoRates:
    """Actor and critic learning rates of their own (SB3 sets one rate on both optimizers)."""

    actor_lr: float
    critic_lr: float

    def _update_learning_rate(self, optimizers) -> None:
        self.logger.record("train/learning_rate", self.critic_lr)
        update_learning_rate(self.actor.optimizer, self.actor_lr)
        update_learning_rate(self.critic.optimizer, self.critic_lr)


class PaperDDPG(TwoRates, DDPG):
    def __init__(self, *args, actor_lr: float = 1e-4, critic_lr: float = 1e-3, **kwargs):
        self.actor_lr, self.critic_lr = actor_lr, critic_lr
        super().__init__(*args, learning_rate=critic_lr, **kwargs)


class PaperTD3(TwoRates, TD3):
    def __init__(self, *args, actor_lr: float = 1e-4, critic_lr: float = 1e-3, **kwargs):
        self.actor_lr, self.critic_lr = actor_lr, critic_lr
        super().__init__(*args, learning_rate=critic_lr, **kwargs)


def build(name: str, env, cfg: AgentConfig, seed: int, buffer: int | None = None):
    """The SB3 model of algorithm `name` on `env` (a MultiClusterEnv or a VecEnv of them);
    `buffer` overrides the replay size (a model built only to act needs none)."""
    model = _model(name, env, cfg, seed, buffer)
    # A logger of our own: SB3's default one leaves an empty folder in /tmp at every learn().
    # The learning curve is the experiment's Curve callback.
    model.set_logger(Logger(folder=None, output_formats=[]))
    return model


def _model(name: str, env, cfg: AgentConfig, seed: int, buffer: int | None):
    th.set_num_threads(cfg.threads)
    hidden = list(cfg.hidden)
    size = cfg.buffer if buffer is None else buffer
    noise = NormalActionNoise(np.zeros(1), np.full(1, cfg.noise))
    off_policy = dict(
        buffer_size=size,
        batch_size=cfg.batch,
        gamma=cfg.gamma,
        tau=cfg.tau,
        learning_starts=cfg.learning_starts,
        seed=seed,
        device="cpu",
    )
    if name == "EADE-DDPG":
        extractor = dict(clusters=_clusters(env), embed=cfg.embed, features_dim=cfg.features)
        return PaperDDPG(
            EadePolicy,
            env,
            actor_lr=cfg.actor_lr,
            critic_lr=cfg.critic_lr,
            action_noise=noise,
            replay_buffer_class=DualReplayBuffer,
            replay_buffer_kwargs=dict(
                expert_share=cfg.expert_share, expert_size=max(1, cfg.expert_episodes) * _tasks(env)
            ),
            policy_kwargs=dict(
                net_arch=hidden,
                features_extractor_kwargs=extractor,
                features_extractor_class=ClusterAttention,
            ),
            **off_policy,
        )
    if name == "DDPG":
        return PaperDDPG(
            "MlpPolicy",
            env,
            actor_lr=cfg.actor_lr,
            critic_lr=cfg.critic_lr,
            action_noise=noise,
            policy_kwargs=dict(net_arch=hidden),
            **off_policy,
        )
    if name == "TD3":
        return PaperTD3(
            "MlpPolicy",
            env,
            actor_lr=cfg.actor_lr,
            critic_lr=cfg.critic_lr,
            action_noise=noise,
            policy_kwargs=dict(net_arch=hidden),
            **off_policy,
        )
    if name == "SAC":
        return SAC(
            "MlpPolicy",
            env,
            learning_rate=cfg.sb3_lr,
            policy_kwargs=dict(net_arch=hidden),
            **off_policy,
        )
    if name == "PPO":  # rollouts of 10 episodes, minibatches of one episode's length
        tasks = _tasks(env)
        return PPO(
            "MlpPolicy",
            env,
            learning_rate=cfg.sb3_lr,
            gamma=cfg.gamma,
            n_steps=10 * tasks,
            batch_size=tasks,
            seed=seed,
            device="cpu",
            policy_kwargs=dict(net_arch=dict(pi=hidden, vf=hidden)),
        )
    raise ValueError(f"unknown algorithm '{name}' (expected one of {', '.join(ALGORITHMS)})")


def _base(env) -> MultiClusterEnv:
    return env.unwrapped if hasattr(env, "unwrapped") else env.envs[0].unwrapped


def _clusters(env) -> int:
    return _base(env).setting.clusters


def _tasks(env) -> int:
    return _base(env).setting.tasks


# --- checkpoints: the acting part only -----------------------------------------------------------
def acting_state(model) -> dict[str, th.Tensor]:
    """The weights `predict` needs (the actor; PPO's policy without its value head): a few
    hundred kB instead of the whole model with critics, targets and optimizers."""
    state = model.policy.state_dict()
    if isinstance(model, PPO):
        return {k: v for k, v in state.items() if "value" not in k}
    return {k: v for k, v in state.items() if k.startswith("actor.")}


def save_acting(model, name: str, cfg: AgentConfig, path: str | Path, meta: dict) -> None:
    th.save(
        {"algorithm": name, "config": cfg.as_dict(), "state": acting_state(model), "meta": meta},
        path,
    )


def load_acting(path: str | Path, env) -> tuple[str, object, dict]:
    """(algorithm, a model that acts like the saved one, meta)."""
    data = th.load(path, map_location="cpu", weights_only=True)
    cfg = AgentConfig(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()}
    )
    model = build(data["algorithm"], env, cfg, seed=0, buffer=1)
    missing = model.policy.load_state_dict(data["state"], strict=False).missing_keys
    if any(k in acting_state(model) for k in missing):
        raise ValueError(f"{path}: checkpoint lacks {missing[0]}")
    model.policy.set_training_mode(False)
    return data["algorithm"], model, data["meta"]
