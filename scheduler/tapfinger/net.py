"""TapFinger's network and its decision rules, for any setting that fills an `Obs`.

  encoder    a heterogeneous graph attention network (torch_geometric's HANConv) over four node
             types: servers (one per agent), pending tasks, running tasks and a central node;
             edges server–pending (the task waits in one of the agent's slots), server–running
             (the task runs there) and server–central, both ways;
  pointer    per agent, additive attention of the agent's embedding over its K pending slots:
             which task it takes (slots that are empty or have no allowed allocation masked);
  allocation per agent, logits over the allocation grid for the chosen task (cell 0: wait, the
             other cells the resource levels), masked by `allocation_mask`;
  critic     one value per agent, from its embedding and the central node's (MAPPO: each agent
             has its own value and its own reward; the weights are shared, so one network
             serves any number of agents).
Conflicts — several agents claiming one task — are settled by `arbitrate` (Bayes' rule); the
losers' log-probabilities are left out of the loss (`Step.active`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical
from torch_geometric.nn import HANConv

NODE_TYPES = ("server", "task", "running", "central")
EDGE_TYPES = (
    ("server", "offers", "task"),
    ("task", "waits_at", "server"),
    ("server", "hosts", "running"),
    ("running", "runs_on", "server"),
    ("server", "reports", "central"),
    ("central", "informs", "server"),
)


@dataclass
class Obs:
    """What the agents see at one decision step.

    servers (A, FS), tasks (T, FT) — every pending task once —, running (R, FR) features;
    hosts (2, E): (server, running task) pairs; slots (A, K): the task in each of an agent's K
    pending slots, -1 if empty; masks (A, K, G): the allowed allocation cells (cell 0: wait);
    ratio (A, K): the agent's available / required resources for the slot's task (the arbiter's
    prior)."""

    servers: np.ndarray
    tasks: np.ndarray
    running: np.ndarray
    hosts: np.ndarray
    slots: np.ndarray
    masks: np.ndarray
    ratio: np.ndarray


def allocation_mask(levels: list[np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The grid cells (flattened, cell 0 = wait, then the product of `levels` in C order) whose
    level of every resource d lies in [lo[d], hi[d]]: at least the task's minimum demand, at
    most what the agent has left."""
    inside = [(lv >= lo[d] - 1e-9) & (lv <= hi[d] + 1e-9) for d, lv in enumerate(levels)]
    grid = inside[0]
    for m in inside[1:]:
        grid = np.logical_and.outer(grid, m)
    return np.concatenate([[True], grid.ravel()])


def posterior(ratio: np.ndarray, prob: np.ndarray) -> np.ndarray:
    """The arbiter's posterior over the agents claiming one task: prior ∝ each agent's available
    / required resources (`ratio`), likelihood its probability of picking the task (`prob`)."""
    ratio = np.asarray(ratio, float)
    prior = ratio / ratio.sum() if ratio.sum() > 0 else np.full(len(ratio), 1 / len(ratio))
    post = prior * np.asarray(prob, float)
    return post / post.sum() if post.sum() > 0 else prior


def arbitrate(claims: dict[int, list[int]], ratio: np.ndarray, prob: np.ndarray) -> dict[int, int]:
    """Settle conflicts: `claims` maps a task to the agents that picked it; the winner has the
    largest `posterior` (ties: the lowest agent). Returns task -> winning agent."""
    return {
        task: agents[int(np.argmax(posterior(ratio[agents], prob[agents])))]
        for task, agents in claims.items()
    }


class TapFingerNet(nn.Module):
    def __init__(
        self,
        dims: dict[str, int],
        grid: int,
        hidden: int = 32,
        layers: int = 2,
        heads: int = 4,
        agents: int = 0,
        separate_critic: bool = False,
    ):
        """`agents` > 0: every server's features get its index as a one-hot of that length (a
        fixed set of agents, as in TapFinger's setting, where the shared weights then act as
        per-agent policies); 0: none (CES: any number of nodes). `separate_critic`: the critic
        has a graph encoder of its own, as the original's actors and critics are networks of
        their own; otherwise it reads the actor's embeddings (the value loss then trains the
        actor's encoder too)."""
        super().__init__()
        self.dims, self.grid, self.agents = dims, grid, agents
        self.inp, self.convs = self._encoder(hidden, layers, heads)
        self.empty = nn.Parameter(torch.zeros(hidden))  # an empty slot's embedding
        self.w_slot = nn.Linear(hidden, hidden, bias=False)
        self.w_query = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Parameter(torch.randn(hidden) / hidden**0.5)
        self.alloc = nn.Sequential(
            nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, grid)
        )
        self.critic = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.critic_inp, self.critic_convs = (
            self._encoder(hidden, layers, heads) if separate_critic else (None, None)
        )

    def _encoder(self, hidden: int, layers: int, heads: int) -> tuple[nn.ModuleDict, nn.ModuleList]:
        """Input layers per node type and the HAN layers over them."""
        width = dict(self.dims, server=self.dims["server"] + self.agents)
        meta = (list(NODE_TYPES), list(EDGE_TYPES))
        return (
            nn.ModuleDict({t: nn.Linear(width[t], hidden) for t in NODE_TYPES}),
            nn.ModuleList(HANConv(hidden, hidden, meta, heads=heads) for _ in range(layers)),
        )

    def graph(self, batch: list[Obs]) -> tuple[dict, dict, np.ndarray, np.ndarray]:
        """The batch's graphs joined into one: node features per type, edges per type, each
        agent's slots as global task indices (-1: empty) and each agent's central node."""
        x = {t: [] for t in NODE_TYPES}
        edges = {e: [] for e in EDGE_TYPES}
        slot_index, central_of = [], []
        n = dict.fromkeys(NODE_TYPES, 0)
        for b, o in enumerate(batch):
            a = len(o.servers)
            x["server"].append(
                np.hstack([o.servers, np.eye(a, self.agents, dtype=np.float32)])
                if self.agents
                else o.servers
            )
            x["task"].append(o.tasks)
            x["running"].append(o.running)
            x["central"].append(np.zeros((1, self.dims["central"]), np.float32))
            agents, ks = np.nonzero(o.slots >= 0)
            pairs = (
                np.unique(np.stack([agents, o.slots[agents, ks]]), axis=1)
                if len(agents)
                else np.zeros((2, 0), int)
            )
            off = np.array([[n["server"]], [n["task"]]])
            edges[EDGE_TYPES[0]].append(pairs + off)
            edges[EDGE_TYPES[1]].append(pairs[::-1] + off[::-1])
            off = np.array([[n["server"]], [n["running"]]])
            edges[EDGE_TYPES[2]].append(o.hosts + off)
            edges[EDGE_TYPES[3]].append(o.hosts[::-1] + off[::-1])
            servers = np.arange(a) + n["server"]
            edges[EDGE_TYPES[4]].append(np.stack([servers, np.full(a, b)]))
            edges[EDGE_TYPES[5]].append(np.stack([np.full(a, b), servers]))
            slot_index.append(np.where(o.slots >= 0, o.slots + n["task"], -1))
            central_of.append(np.full(a, b))
            n["server"] += a
            n["task"] += len(o.tasks)
            n["running"] += len(o.running)
        xs = {t: np.concatenate(v) for t, v in x.items()}
        es = {
            e: torch.as_tensor(np.concatenate(v, axis=1), dtype=torch.long)
            for e, v in edges.items()
        }
        return xs, es, np.concatenate(slot_index), np.concatenate(central_of)

    @staticmethod
    def embed(
        inp: nn.ModuleDict, convs: nn.ModuleList, x: dict, es: dict
    ) -> dict[str, torch.Tensor]:
        """Node embeddings per type: the input layers, then the HAN layers (residual)."""
        xs = {
            t: inp[t](torch.as_tensor(x[t], dtype=torch.float32).reshape(-1, inp[t].in_features))
            for t in NODE_TYPES
        }
        for conv in convs:
            out = conv(xs, es)
            xs = {
                t: torch.relu(out[t]) + xs[t] if out.get(t) is not None else xs[t]
                for t in NODE_TYPES
            }
        return xs

    def _actor_view(self, xs: dict, slot_index: np.ndarray, central_of: np.ndarray):
        """Servers (ΣA, H), each agent's slots (ΣA, K, H) and the central node per agent (ΣA, H)."""
        tasks = torch.cat([xs["task"], self.empty[None]])  # index -1: the empty embedding
        return xs["server"], tasks[torch.as_tensor(slot_index)], xs["central"][central_of]

    def forward(self, batch: list[Obs]):
        """Per agent of the batch: pointer logits (ΣA, K), allocation logits (ΣA, K, G), values
        (ΣA,), all masked; and the agents that have any task to take (ΣA,)."""
        x, es, slot_index, central_of = self.graph(batch)
        server, slots, central = self._actor_view(
            self.embed(self.inp, self.convs, x, es), slot_index, central_of
        )
        if self.critic_convs is None:
            seen = torch.cat([server, central], -1)
        else:
            own = self.embed(self.critic_inp, self.critic_convs, x, es)
            seen = torch.cat([own["server"], own["central"][central_of]], -1)
        masks = torch.as_tensor(np.concatenate([o.masks for o in batch]))
        pickable = masks[..., 1:].any(-1)
        score = torch.tanh(self.w_slot(slots) + self.w_query(server)[:, None]) @ self.v
        pointer = score.masked_fill(~pickable, -1e9)
        pair = torch.cat([server[:, None].expand_as(slots), slots], -1)
        alloc = self.alloc(pair).masked_fill(~masks, -1e9)
        value = self.critic(seen).squeeze(-1)
        return pointer, alloc, value, pickable.any(-1)


@dataclass
class Step:
    """The agents' joint action at one step: slot and cell per agent (-1: no action), the
    log-probability of each, the values, and `active`: agents whose action enters the loss
    (they had a task to take and did not lose a conflict)."""

    slot: np.ndarray
    cell: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    active: np.ndarray
    winners: dict[int, int]  # task index -> agent that takes it (cell > 0)


@torch.no_grad()
def act(
    net: TapFingerNet, obs: Obs, greedy: bool = False, rng: np.random.Generator | None = None
) -> Step:
    """Every agent picks a slot (pointer) and a cell (allocation head); conflicts go to the
    arbiter. Greedy: the most likely slot and cell."""
    pointer, alloc, value, can = net([obs])
    a = len(obs.servers)
    slot = np.full(a, -1)
    cell = np.full(a, -1)
    logp = np.zeros(a, np.float32)
    p_slot = torch.softmax(pointer, -1).numpy()
    for i in np.flatnonzero(can.numpy()):
        k = (
            int(np.argmax(p_slot[i]))
            if greedy
            else int(rng.choice(len(p_slot[i]), p=p_slot[i] / p_slot[i].sum()))
        )
        p_cell = torch.softmax(alloc[i, k], -1).numpy()
        g = (
            int(np.argmax(p_cell))
            if greedy
            else int(rng.choice(len(p_cell), p=p_cell / p_cell.sum()))
        )
        slot[i], cell[i] = k, g
        logp[i] = np.log(p_slot[i, k] + 1e-12) + np.log(p_cell[g] + 1e-12)
    claims: dict[int, list[int]] = {}
    for i in np.flatnonzero(cell > 0):
        claims.setdefault(int(obs.slots[i, slot[i]]), []).append(int(i))
    ratio = np.array([obs.ratio[i, slot[i]] if slot[i] >= 0 else 0.0 for i in range(a)])
    prob = np.array([p_slot[i, slot[i]] if slot[i] >= 0 else 0.0 for i in range(a)])
    winners = arbitrate(claims, ratio, prob)
    active = slot >= 0
    for task, agents in claims.items():
        for i in agents:
            active[i] &= i == winners[task]
    return Step(slot, cell, logp, value.numpy(), active, winners)


def evaluate_actions(net: TapFingerNet, batch: list[Obs], slot: torch.Tensor, cell: torch.Tensor):
    """Log-probabilities and entropies of the taken actions (ΣA,) and the values (ΣA,), for the
    PPO update; agents without an action get 0."""
    pointer, alloc, value, _ = net(batch)
    k = slot.clamp(min=0)
    d_slot = Categorical(logits=pointer)
    chosen = alloc[torch.arange(len(k)), k]
    d_cell = Categorical(logits=chosen)
    logp = d_slot.log_prob(k) + d_cell.log_prob(cell.clamp(min=0))
    entropy = d_slot.entropy() + d_cell.entropy()
    return logp, entropy, value


def load(path: Path, setting: str, dims: dict[str, int], grid: int) -> TapFingerNet:
    """The network trained for `setting` ("paper" or "ces") from a checkpoint of
    `python -m scheduler.train_tapfinger`, in evaluation mode."""
    if not Path(path).exists():
        raise FileNotFoundError(
            f"{path}: no TapFinger checkpoint; create it with python -m scheduler.train_tapfinger"
        )
    saved = torch.load(path, weights_only=True)[setting]
    net = TapFingerNet(dims, grid, **saved["shape"])
    net.load_state_dict(saved["state"])
    return net.eval()
