"""CES-PPO: the placement policy of DESIGN §3 and how it learns (CleanRL style).

Read top to bottom: the hyper-parameters (one dataclass); batching; the network (a graph encoder
run once per decision, and a scorer of every compute node at each step); acting; the teacher (a
search that gives guidance early); training — imitation of the teacher, then PPO with the mean
return of a group of rollouts of the same instance as the baseline, then the first node learned
from rollouts begun on many of them; checkpoints; and `CesPPO`,
the `ces-ppo` algorithm of the registry: multi-start greedy decoding from the committed
checkpoint, the network part from CES's network decision (`paths.route_placement`, through
`env.PlacementEpisode.decision`).

Shapes: V vertices and E directed links (of all graphs in a batch); B graphs (episodes); N the
compute nodes of one graph; R scored rows (a compute node at a step); S steps; H hidden units;
F = STEP_FEATURES + GUIDE_FEATURES.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Callable
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from threadpoolctl import ThreadpoolController
from torch import Tensor, nn

from .baselines import NetworkAware, make_algorithm, register
from .env import (
    EDGE_FEATURES,
    GUIDE_FEATURES,
    JOB_FEATURES,
    NODE_FEATURES,
    STEP_FEATURES,
    EnvConfig,
    GraphInput,
    PlacementEpisode,
    StepObservation,
    TrainingInstances,
)
from .improve import improve
from .metrics import Rank, predicted_iteration_s
from .model import CannotPlace, Cluster, Decision, Job, placement_key
from .paths import route_placement
from .trace import Machine

CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "ces_ppo.pt"


@dataclass
class PPOConfig:
    """The network and its training: every setting, each a flag of `python -m
    scheduler.train_ppo` (`config.add_options`)."""

    seed: int = 0  # the training instances, initial weights and samples
    imitation: int = 9600  # instances of phase 1: imitation of the teacher
    ppo: int = 800  # instances of phase 2: PPO
    group: int = 4  # sampled rollouts per instance in phase 2 (their mean return: the baseline)
    teacher_starts: int = 8  # first nodes the teacher's search tries
    first_nodes: int = 4800  # instances of phase 3: the first node, from rollouts begun on many
    first_rollouts: int = 32  # first nodes rolled out per instance in phase 3
    first_tau: float = 0.1  # phase 3's target over them: softmax(-log(iteration time) / tau)
    first_anchor: float = 0.5  # phase 3's weight on the fastest rollout's later steps
    first_batch: int = 16  # instances per update in phase 3
    batch: int = 32  # episodes per update
    epochs: int = 2  # passes over each batch
    lr: float = 1e-3  # learning rate of phase 1
    lr_ppo: float = 2e-4  # learning rate of phase 2
    lr_first: float = 2e-4  # learning rate of phase 3
    clip: float = 0.2  # PPO's clip of the probability ratio
    ent_coef: float = 0.003  # PPO's entropy bonus
    max_grad_norm: float = 1.0  # gradient clipping (L2 norm), every phase
    encoder: Literal["gnn", "mlp"] = "gnn"  # gnn: message passing over G; mlp: per-vertex only
    layers: int = 3  # message-passing rounds of the gnn encoder
    hidden: int = 32  # units of every hidden layer
    threads: int = 1  # torch and BLAS threads (the machine is shared)
    validate_every: int = 10  # updates between validation figures
    validation: int = 160  # instances of the validation figure (0: none)
    # the guidance prior's starting logits per unit of its features (env.GUIDE_FEATURES): a
    # blocked flow costs 20, a hop of the demand 5 (the hops feature is hops / 10)
    guide_prior: tuple[float, float] = (-20.0, -50.0)
    failed_penalty: float = 1.0  # phase 2: a rollout that places nothing, below its group's worst


# --- batching -------------------------------------------------------------------------------------
@dataclass
class GraphBatch:
    node_x: Tensor  # (V, NODE_FEATURES)
    edge_index: Tensor  # (2, E) global vertex indices
    edge_x: Tensor  # (E, EDGE_FEATURES)
    graph: Tensor  # (V,) which graph each vertex belongs to
    job_x: Tensor  # (B, JOB_FEATURES)
    offset: list[int]  # first global vertex of each graph
    n_compute: list[int]


def collate_graphs(graphs: list[GraphInput]) -> GraphBatch:
    sizes = [len(g.node_x) for g in graphs]
    offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    return GraphBatch(
        node_x=torch.from_numpy(np.concatenate([g.node_x for g in graphs])),
        edge_index=torch.from_numpy(
            np.concatenate([g.edge_index + o for g, o in zip(graphs, offset)], axis=1)
        ),
        edge_x=torch.from_numpy(np.concatenate([g.edge_x for g in graphs])),
        graph=torch.from_numpy(np.repeat(np.arange(len(graphs)), sizes)),
        job_x=torch.from_numpy(np.stack([g.job_x for g in graphs])),
        offset=offset.tolist(),
        n_compute=[g.n_compute for g in graphs],
    )


@dataclass
class Episode:
    """One placement as it was taken: its graph, and per step what was seen and chosen."""

    graph: GraphInput
    steps: list[StepObservation] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    logp: float = 0.0  # of the actions, when sampled (phase 2)
    ret: float = 0.0
    advantage: float = 0.0


@dataclass
class StepBatch:
    rows: Tensor  # (R,) global vertex of the row's compute node
    graph: Tensor  # (R,) its graph
    x: Tensor  # (R, F)
    seg: Tensor  # (R,) its step
    chosen: Tensor  # (S,) the row of the action taken at each step
    step_graph: Tensor  # (S,) the graph of each step


def collate_steps(episodes: list[Episode], batch: GraphBatch) -> StepBatch:
    """The scored rows of every step: its feasible compute nodes only (the others take no part
    in its softmax)."""
    rows, graph, xs, seg, chosen, step_graph = [], [], [], [], [], []
    r = s = 0
    for b, ep in enumerate(episodes):
        for obs, action in zip(ep.steps, ep.actions):
            feasible = np.flatnonzero(obs.mask)
            rows.append(batch.offset[b] + feasible)
            graph.append(np.full(len(feasible), b))
            xs.append(obs.features()[feasible])
            seg.append(np.full(len(feasible), s))
            chosen.append(r + int(np.searchsorted(feasible, action)))
            step_graph.append(b)
            r, s = r + len(feasible), s + 1
    cat = [torch.from_numpy(np.concatenate(x)) for x in (rows, graph, xs, seg)]
    return StepBatch(*cat, torch.tensor(chosen), torch.tensor(step_graph))


# --- the network ----------------------------------------------------------------------------------
def mlp(*sizes: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class Agent(nn.Module):
    """Graph encoder → per-vertex states and a graph context; a scorer of each compute node for
    the step's task from its state, the context and the step's features."""

    def __init__(self, cfg: PPOConfig):
        super().__init__()
        h = cfg.hidden
        self.embed = mlp(NODE_FEATURES + JOB_FEATURES, h, h)
        rounds = cfg.layers if cfg.encoder == "gnn" else 0
        # A round: message from each in-neighbour (its state and the link's features), mean
        # over in-links, then a residual update of the vertex state.
        self.message = nn.ModuleList(mlp(h + EDGE_FEATURES, h) for _ in range(rounds))
        self.update = nn.ModuleList(mlp(2 * h, h, h) for _ in range(rounds))
        self.norm = nn.ModuleList(nn.LayerNorm(h) for _ in range(rounds))
        self.score = mlp(3 * h + STEP_FEATURES + GUIDE_FEATURES, h, h, 1)
        # network-aware's measure as a prior on the logits, learned from there: the untrained
        # policy follows the heuristic after the first task, and learning moves it where that
        # is wrong
        self.prior = nn.Parameter(torch.tensor(cfg.guide_prior))

    def encode(self, b: GraphBatch) -> tuple[Tensor, Tensor]:
        """Vertex states (V, H) and per-graph context (B, 2H): mean and max over its compute
        nodes."""
        h = self.embed(torch.cat([b.node_x, b.job_x[b.graph]], dim=1))
        src, dst = b.edge_index
        deg = torch.zeros(h.shape[0]).index_add_(0, dst, torch.ones(dst.shape[0])).clamp(min=1)
        n = h.shape[1]
        for message, update, norm in zip(self.message, self.update, self.norm):
            # message(cat[h_src, edge]) with the vertex part applied before the gather: the same
            # linear map, on V rows instead of E.
            lin = message[0]
            m = (h @ lin.weight[:, :n].T)[src] + b.edge_x @ lin.weight[:, n:].T + lin.bias
            agg = torch.zeros_like(h).index_add_(0, dst, m) / deg[:, None]
            h = norm(h + update(torch.cat([h, agg], dim=1)))
        ctx = []
        for o, c in zip(b.offset, b.n_compute):
            hc = h[o : o + c]
            ctx.append(torch.cat([hc.mean(0), hc.max(0).values]))
        return h, torch.stack(ctx)

    def row_logits(self, h: Tensor, ctx: Tensor, s: StepBatch) -> Tensor:
        """(R,) logits of every scored row."""
        x = torch.cat([h[s.rows], ctx[s.graph], s.x], dim=1)
        return self.score(x).squeeze(1) + s.x[:, STEP_FEATURES:] @ self.prior


def segment_log_softmax(logits: Tensor, seg: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Per row log-probability within its step, and per step the entropy."""
    top = torch.full((steps,), -1e9).scatter_reduce(0, seg, logits, "amax")
    shifted = logits - top[seg]
    lse = top + torch.zeros(steps).index_add_(0, seg, shifted.exp()).log()
    logp = logits - lse[seg]
    p = logp.exp()
    entropy = -torch.zeros(steps).index_add_(0, seg, torch.where(p > 0, p * logp, 0.0))
    return logp, entropy


class Policy:
    """The agent at inference on one episode's graph, in numpy (a step scores a hundred rows;
    torch's per-call overhead would be most of it): the graph encoded once, and the scorer's
    first layer split into its graph part, computed once, and the step features' part."""

    @torch.inference_mode()
    def __init__(self, agent: Agent, graph: GraphInput):
        h, ctx = agent.encode(collate_graphs([graph]))
        lin = agent.score[0]
        k, n = h.shape[1], graph.n_compute
        base = h[:n] @ lin.weight[:, :k].T + ctx[0] @ lin.weight[:, k : 3 * k].T + lin.bias
        self.base, self.w_step = base.numpy(), lin.weight[:, 3 * k :].T.numpy()
        self.layers = [
            (m.weight.T.numpy(), m.bias.numpy()) if isinstance(m, nn.Linear) else None
            for m in agent.score[1:]
        ]  # None: a ReLU
        self.prior = agent.prior.detach().numpy()

    def logits(self, obs: StepObservation) -> np.ndarray:
        """(N,) logits, -inf where the mask forbids (those rows are not scored)."""
        feasible = np.flatnonzero(obs.mask)
        z = self.base[feasible] + obs.features()[feasible] @ self.w_step
        for layer in self.layers:
            z = np.maximum(z, 0.0) if layer is None else z @ layer[0] + layer[1]
        out = np.full(len(obs.mask), -np.inf, np.float32)
        out[feasible] = z[:, 0] + obs.guide[feasible] @ self.prior
        return out

    def ranked(self, obs: StepObservation) -> np.ndarray:
        """The feasible nodes, the highest-rated first (on a tie, the lower index first)."""
        logits = self.logits(obs)
        return np.argsort(-logits, kind="stable")[: int(obs.mask.sum())]


# --- acting ---------------------------------------------------------------------------------------
def rollout(
    policy: Policy,
    ep: PlacementEpisode,
    greedy: bool,
    first: int | None = None,
    rng: np.random.Generator | None = None,
    record: Episode | None = None,
) -> float:
    """Place the episode's tasks: greedy (argmax) or sampled; `first` forces the first node.
    Records the steps into `record` when given; returns the log-probability of the actions."""
    logp = 0.0
    while not ep.done:
        obs = ep.observe()
        z = policy.logits(obs).astype(float)
        z -= z.max()
        p = np.exp(z)
        p /= p.sum()
        if first is not None and ep.t == 0:
            action = first
        elif greedy:
            action = int(z.argmax())
        else:
            action = int(rng.choice(len(p), p=p))
        logp += math.log(max(p[action], 1e-300))
        if record is not None:
            record.steps.append(obs)
            record.actions.append(action)
        ep.step(action)
    return logp


def greedy_from(
    policy: Policy, ep0: PlacementEpisode, first: int, record: Episode | None = None
) -> float | None:
    """The iteration time of the policy's greedy rollout begun on compute node `first` (None: it
    placed nothing); its steps into `record` when given."""
    ep = ep0.restart()
    rollout(policy, ep, greedy=True, first=first, record=record)
    return iteration_s(ep)


def network_aware_first(ep0: PlacementEpisode) -> int | None:
    """Network-aware's first node for the episode's job (a compute node's index); None where it
    cannot place the job or the episode's mask forbids that node."""
    try:
        node = ep0.compute.index(NetworkAware().positions(ep0.cluster, ep0.job)[ep0.task])
    except CannotPlace:
        return None
    return node if ep0.observe().mask[node] else None


def iteration_s(ep: PlacementEpisode) -> float | None:
    """The predicted iteration time of a finished episode's decision (None: no decision)."""
    try:
        return predicted_iteration_s(ep.cluster, ep.job, ep.decision())
    except CannotPlace:
        return None


# --- the teacher ----------------------------------------------------------------------------------
def teacher(cluster: Cluster, job: Job, starts: int) -> tuple[dict[str, str], float] | None:
    """Guidance: network-aware's greedy placement begun from each of the `starts` nodes that
    hold the most copies of the job's largest task (and from network-aware's own first choice),
    each with CES's paths and rates; the fastest by the iteration-time model."""
    nodes = cluster.compute_nodes(online_only=True)
    big = max((t.demand for t in job.tasks), key=lambda d: d.as_tuple())

    def copies(n: str) -> float:
        free = cluster.free(n)
        return min(
            (f / d for f, d in zip(free.as_tuple(), big.as_tuple()) if d > 0), default=math.inf
        )

    ranked = sorted(nodes, key=lambda n: (-copies(n), -cluster.free(n).cpu))[:starts]
    best: tuple[dict[str, str], float] | None = None
    for first in [""] + ranked:
        try:
            placement = NetworkAware(first=first).positions(cluster, job)
            d = Decision(job.name, placement, route_placement(cluster, job, placement))
        except CannotPlace:
            continue
        t = predicted_iteration_s(cluster, job, d)
        if best is None or t < best[1]:
            best = (placement, t)
    return best


def imitate(cluster: Cluster, job: Job, starts: int) -> Episode | None:
    """The teacher's placement as an episode to imitate, up to its first step the episode's mask
    does not allow (the teacher knows nothing of the masks' look-ahead)."""
    found = teacher(cluster, job, starts)
    if found is None:
        return None
    ep = PlacementEpisode(cluster, job)
    out = Episode(ep.graph_input())
    index = {v: i for i, v in enumerate(ep.compute)}
    while not ep.done:
        obs = ep.observe()
        action = index[found[0][ep.task]]
        if not obs.mask[action]:
            break
        out.steps.append(obs)
        out.actions.append(action)
        ep.step(action)
    return out if out.steps else None


# --- training -------------------------------------------------------------------------------------
def losses(agent: Agent, episodes: list[Episode]) -> tuple[Tensor, Tensor, Tensor]:
    """Per episode: the summed log-probability of its actions and the mean entropy of its steps;
    and the mean log-probability per step (the imitation loss's)."""
    gb = collate_graphs([e.graph for e in episodes])
    h, ctx = agent.encode(gb)
    sb = collate_steps(episodes, gb)
    logp_rows, entropy = segment_log_softmax(agent.row_logits(h, ctx, sb), sb.seg, len(sb.chosen))
    logp_steps = logp_rows[sb.chosen]
    b = len(episodes)
    per_ep = torch.zeros(b).index_add_(0, sb.step_graph, logp_steps)
    steps = torch.zeros(b).index_add_(0, sb.step_graph, torch.ones(len(sb.chosen)))
    ent = torch.zeros(b).index_add_(0, sb.step_graph, entropy) / steps.clamp(min=1)
    return per_ep, ent, logp_steps.mean()


def train(
    cfg: PPOConfig,
    env_cfg: EnvConfig = EnvConfig(),
    machines: list[Machine] | None = None,
    log: Callable[[dict], None] = lambda row: None,
    validation: list[tuple[Cluster, Job]] | None = None,
) -> Agent:
    """Phase 1: imitation of the teacher; phase 2: PPO; phase 3: the first node from rollouts
    begun on many (`first_node_lesson`). `log` gets a row per update (and the
    validation figure, when `validation` instances are given, every `cfg.validate_every`
    updates and at the end of each phase). With validation instances, the weights returned are
    those of the best validation figure."""
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    instances = TrainingInstances(env_cfg, cfg.seed, machines)
    agent = Agent(cfg)
    optim = torch.optim.Adam(agent.parameters(), lr=cfg.lr)
    start, cpu_start, done, updates = time.perf_counter(), time.process_time(), 0, 0
    best: list = [math.inf, None]  # the best validation figure so far and its weights

    def step(loss: Tensor) -> None:
        optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(agent.parameters(), cfg.max_grad_norm)
        optim.step()

    def report(phase: str, last: bool, **stats: float) -> None:
        nonlocal updates
        updates += 1
        row = {
            "phase": phase,
            "instances": done,
            "seconds": time.perf_counter() - start,
            "cpu_seconds": time.process_time() - cpu_start,
            **stats,
        }
        if validation and (updates % cfg.validate_every == 0 or last):
            row["vs_network_aware"] = validate(agent, validation)
            if row["vs_network_aware"] < best[0]:
                best[:] = [row["vs_network_aware"], copy.deepcopy(agent.state_dict())]
        log(row)

    with threads(cfg.threads):
        while done < cfg.imitation:  # phase 1
            batch = []
            while len(batch) < cfg.batch and done < cfg.imitation:
                done += 1
                ep = imitate(*instances.next(), cfg.teacher_starts)
                if ep is not None:
                    batch.append(ep)
            for _ in range(cfg.epochs if batch else 0):
                _, _, logp = losses(agent, batch)
                step(-logp)
            if batch:
                report("imitation", done >= cfg.imitation, loss=-logp.item())
        for group in optim.param_groups:
            group["lr"] = cfg.lr_ppo
        end = cfg.imitation + cfg.ppo
        while done < end:  # phase 2
            batch = []
            while len(batch) < cfg.batch and done < end:
                done += 1
                batch += sample_group(agent, *instances.next(), cfg, rng)
            if not batch:
                continue
            adv = torch.tensor([e.advantage for e in batch])
            # on the scale of the clip and the entropy bonus (returns are log-times: their spread
            # within a group is often 1e-2, and the bonus alone would then flatten the policy)
            adv = adv / (adv.std() + 1e-8) if len(adv) > 1 else adv
            old = torch.tensor([e.logp for e in batch])
            for _ in range(cfg.epochs):
                logp, entropy, _ = losses(agent, batch)
                ratio = (logp - old).exp()
                pg = -torch.min(ratio * adv, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv).mean()
                step(pg - cfg.ent_coef * entropy.mean())
            report(
                "ppo",
                done >= end,
                loss=pg.item(),
                entropy=entropy.mean().item(),
                ret=float(np.mean([e.ret for e in batch])),
            )
        for group in optim.param_groups:
            group["lr"] = cfg.lr_first
        end += cfg.first_nodes
        while done < end:  # phase 3
            lessons = []
            while len(lessons) < cfg.first_batch and done < end:
                done += 1
                lesson = first_node_lesson(agent, *instances.next(), cfg, rng)
                if lesson is not None:
                    lessons.append(lesson)
            if not lessons:
                continue
            for _ in range(cfg.epochs):
                ce, anchor = first_node_losses(agent, lessons)
                step(ce + cfg.first_anchor * anchor)
            report("first node", done >= end, loss=ce.item(), anchor=anchor.item())
    if best[1] is not None:  # model selection on the validation instances, never the benchmarks
        agent.load_state_dict(best[1])
    return agent


def sample_group(
    agent: Agent, cluster: Cluster, job: Job, cfg: PPOConfig, rng: np.random.Generator
) -> list[Episode]:
    """`cfg.group` sampled rollouts of one instance; return = −log(iteration time), advantage =
    the return minus the group's mean (the instance's own baseline: no critic needed)."""
    ep0 = PlacementEpisode(cluster, job)
    if ep0.done:
        return []
    graph = ep0.graph_input()
    policy = Policy(agent, graph)
    group = []
    for _ in range(cfg.group):
        ep = ep0.restart()
        record = Episode(graph)
        record.logp = rollout(policy, ep, greedy=False, rng=rng, record=record)
        t = iteration_s(ep)
        record.ret = -math.log(t) if t else math.nan
        group.append(record)
    done = [e.ret for e in group if not math.isnan(e.ret)]
    if not done:
        return []
    for e in group:
        if math.isnan(e.ret):
            e.ret = min(done) - cfg.failed_penalty
    mean = float(np.mean([e.ret for e in group]))
    for e in group:
        e.advantage = e.ret - mean
    return group


@dataclass
class FirstNodeLesson:
    """Phase 3's lesson on one instance: greedy rollouts begun on several first nodes."""

    first: Episode  # the first step, its action the fastest rollout's first node
    nodes: np.ndarray  # the first nodes rolled out (indices of compute nodes)
    target: np.ndarray  # softmax(-log(iteration time) / tau) over them
    later: Episode  # the fastest rollout's steps after the first


def first_node_lesson(
    agent: Agent, cluster: Cluster, job: Job, cfg: PPOConfig, rng: np.random.Generator
) -> FirstNodeLesson | None:
    """Greedy rollouts from `cfg.first_rollouts` first nodes — half the policy's highest-rated,
    half drawn from the rest — and from network-aware's: how fast each first node makes the
    policy's own placement is known only by rolling out from it (what a first node leads to
    depends on the capacity and links of nodes several hops away, which no feature shows)."""
    ep0 = PlacementEpisode(cluster, job)
    if ep0.done:
        return None
    graph = ep0.graph_input()
    policy = Policy(agent, graph)
    obs = ep0.observe()
    ranked = policy.ranked(obs)
    top, rest = ranked[: cfg.first_rollouts // 2], ranked[cfg.first_rollouts // 2 :]
    nodes = list(top) + list(
        rng.choice(rest, min(len(rest), cfg.first_rollouts - len(top)), replace=False)
    )
    own = network_aware_first(ep0)
    if own is not None and own not in nodes:
        nodes.append(own)
    if len(nodes) < 2:
        return None
    times, runs = [], []
    for node in nodes:
        run = Episode(graph)
        times.append(greedy_from(policy, ep0, int(node), run) or math.inf)
        runs.append(run)
    t = np.array(times)
    if not np.isfinite(t).any():
        return None
    # a rollout that placed nothing: as bad as twice the slowest that did (the target needs a
    # finite time; at tau 0.1 such a node's weight is e^-7 of the slowest's)
    log_t = np.log(np.where(np.isfinite(t), t, 2 * t[np.isfinite(t)].max()))
    target = np.exp(-(log_t - log_t.min()) / cfg.first_tau)
    best = runs[int(log_t.argmin())]
    return FirstNodeLesson(
        Episode(graph, best.steps[:1], best.actions[:1]),
        np.array(nodes),
        target / target.sum(),
        Episode(graph, best.steps[1:], best.actions[1:]),
    )


def first_node_losses(agent: Agent, lessons: list[FirstNodeLesson]) -> tuple[Tensor, Tensor]:
    """Cross-entropy of the first step's softmax over the nodes rolled out against the target;
    and −log p per step of the fastest rollout's later steps — the policy's own greedy choices:
    an anchor that keeps the shared encoder's change for the first step from moving them (it
    also makes them more certain)."""
    firsts = [lesson.first for lesson in lessons]
    gb = collate_graphs([e.graph for e in firsts])
    h, ctx = agent.encode(gb)
    sb = collate_steps(firsts, gb)
    logits = agent.row_logits(h, ctx, sb)
    ce, row = torch.tensor(0.0), 0
    for lesson in lessons:
        feasible = np.flatnonzero(lesson.first.steps[0].mask)
        z = logits[torch.from_numpy(row + np.searchsorted(feasible, lesson.nodes))]
        ce = ce - (torch.from_numpy(lesson.target).float() * torch.log_softmax(z, 0)).sum()
        row += len(feasible)
    later = [lesson.later for lesson in lessons if lesson.later.steps]
    anchor = -losses(agent, later)[2] if later else torch.tensor(0.0)
    return ce / len(lessons), anchor


def validate(agent: Agent, instances: list[tuple[Cluster, Job]]) -> float:
    """Geometric mean over `instances` of the greedy policy's iteration time over
    network-aware's (failures count as 2×)."""
    ratios = []
    for cluster, job in instances:
        try:
            ref = predicted_iteration_s(
                cluster, job, make_algorithm("network-aware").place(cluster, job)
            )
        except CannotPlace:
            continue
        ep = PlacementEpisode(cluster, job)
        if not ep.done:
            rollout(Policy(agent, ep.graph_input()), ep, greedy=True)
        t = iteration_s(ep)
        ratios.append(t / ref if t else 2.0)
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else math.nan


# --- checkpoints ----------------------------------------------------------------------------------
def save(
    agent: Agent, cfg: PPOConfig, env_cfg: EnvConfig, path: str | Path, meta: dict | None = None
) -> None:
    torch.save(
        {
            "ppo": asdict(cfg),
            "env": _plain(asdict(env_cfg)),
            "state_dict": agent.state_dict(),
            "meta": meta or {},
        },
        path,
    )


def _plain(x):
    """JSON-like values only (tuples as lists), as torch's safe loader wants."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def load(path: str | Path = CHECKPOINT) -> tuple[Agent, PPOConfig, dict]:
    data = torch.load(path, map_location="cpu", weights_only=True)
    known = {f.name for f in fields(PPOConfig)}
    cfg = PPOConfig(**{k: v for k, v in data["ppo"].items() if k in known})
    agent = Agent(cfg)
    try:
        agent.load_state_dict(data["state_dict"])
    except RuntimeError as e:  # missing or misshapen weights: another version's observation
        raise ValueError(
            f"{path}: not a checkpoint of this CES-PPO (its weights do not fit the "
            "network; train one: python -m scheduler.train_ppo --seed 0)"
        ) from e
    agent.eval()
    return agent, cfg, data.get("meta", {})


# --- the registered algorithm ---------------------------------------------------------------------
@register("ces-ppo")
@dataclass
class CesPPO:
    """The committed checkpoint's policy, decoded within a budget of node-steps (a rollout of a
    job of T tasks on N compute nodes costs N×T; docs/ppo.md, "Decoding"), in this order while
    the budget lasts:
      - the greedy rollout, whose first task goes where the policy rates highest;
      - network-aware's placement when `compare` (counted as one rollout, and made even when
        the budget affords only the first: it costs less than one);
      - greedy rollouts whose first task goes on the next-rated nodes;
      - local search from the best placement so far (`improve.improve`: task moves and
        exchanges), an evaluation of a placement counted as one rollout.
    Each placement is taken with CES's paths and rates (`paths.route_placement`); the decision
    is the candidate with the shortest predicted iteration time; between candidates it rates
    the same, one on no more nodes whose flows have more room to spare (`metrics.Rank`), else
    the earliest. The policy alone: `compare=False` and a budget below 2×N×T."""

    name: str = "ces-ppo"
    seed: int = 0  # unused: decoding draws nothing
    checkpoint: str | Path = CHECKPOINT
    decode_budget: int = 4000  # node-steps per decision
    compare: bool = True
    agent: Agent = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not Path(self.checkpoint).exists():
            raise FileNotFoundError(
                f"{self.checkpoint}: no CES-PPO checkpoint (train one: "
                "python -m scheduler.train_ppo --seed 0)"
            )
        if self.decode_budget < 0:
            raise ValueError(f"decode_budget: expected ≥ 0 node-steps, got {self.decode_budget}")
        self.agent, _, _ = load(self.checkpoint)

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        with threads(1):
            ep0 = PlacementEpisode(cluster, job)
            if ep0.done:
                raise CannotPlace(f"job {job.name}: {ep0.failed}")
            decoding = _Decoding(
                cluster, job, ep0, Policy(self.agent, ep0.graph_input()), self.decode_budget
            )
            decoding.greedy(0)
            if self.compare:
                decoding.network_aware()
            decoding.other_first_nodes()
            best = decoding.improved()
        best.decision_s = time.perf_counter() - start
        return best


class _Decoding:
    """The candidates of one decision and the budget left (`CesPPO`)."""

    def __init__(
        self, cluster: Cluster, job: Job, ep0: PlacementEpisode, policy: Policy, budget: int
    ):
        self.cluster, self.job, self.ep0, self.policy = cluster, job, ep0, policy
        self.rollout_cost = len(ep0.compute) * len(job.tasks)
        self.budget = budget
        self.best: Rank | None = None
        self.seen: set[tuple] = set()
        self.reason = ""
        # the first nodes by the policy's rating, the highest first (the greedy rollout's)
        self.ranked = policy.ranked(ep0.observe())

    def _spend(self, always: bool) -> bool:
        if not always and self.budget < self.rollout_cost:
            return False
        self.budget -= self.rollout_cost
        return True

    def _consider(self, placement: dict[str, str]) -> None:
        key = placement_key(placement)
        if key in self.seen:
            return
        self.seen.add(key)
        try:
            d = Decision(
                self.job.name, placement, route_placement(self.cluster, self.job, placement)
            )
        except CannotPlace as e:
            self.reason = self.reason or str(e)
            return
        rank = Rank(self.cluster, self.job, d)
        if self.best is None or rank < self.best:
            self.best = rank

    def greedy(self, rank: int, always: bool = True) -> bool:
        """One greedy rollout from the `rank`-th rated first node; `always`: whatever budget is
        left (the first rollout). False: no budget for it."""
        if not self._spend(always):
            return False
        ep = self.ep0.restart()
        rollout(self.policy, ep, greedy=True, first=int(self.ranked[rank]))
        if not ep.failed:
            self._consider(ep.placement_names())
        return True

    def network_aware(self) -> None:
        self._spend(always=True)
        with suppress(CannotPlace):
            self._consider(NetworkAware().positions(self.cluster, self.job))

    def other_first_nodes(self) -> None:
        for rank in range(1, len(self.ranked)):
            if not self.greedy(rank, always=False):
                return

    def improved(self) -> Decision:
        if self.best is None:
            raise CannotPlace(
                self.reason
                or f"job {self.job.name}: no placement the policy found has paths with bandwidth"
            )
        evaluations = self.budget // self.rollout_cost
        return (
            improve(self.cluster, self.job, self.best.decision, evaluations)
            if evaluations > 0
            else self.best.decision
        )


_POOLS: list[ThreadpoolController] = []


@contextmanager
def threads(n: int):
    """Run torch and numpy's BLAS on n threads inside the block: inference is latency-bound, and
    on a shared machine more threads only wait for each other (a 1000-row matmul on two BLAS
    threads took 7x longer than on one, measured on the 2-core CI machine under load)."""
    if not _POOLS:
        _POOLS.append(ThreadpoolController())  # finds the loaded libraries: once
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        with _POOLS[0].limit(limits=n):
            yield
    finally:
        torch.set_num_threads(before)
