"""The metrics every algorithm is judged by (one module; the simulator, evaluate and the
experiments all call these).

Per decision (one job placed on the cluster *before* it is allocated):
  predicted_iteration_s   the shared iteration-time model (`perfmodel`): the slowest task's compute
                          (job.compute_s on the task's cpu quota at its node's speed) plus the
                          collective: over its sequential phases (`perfmodel.collective_phases`),
                          the sum of each phase's max over inter-node flows of bytes/rate, plus
                          per-step latency and the round trip of the longest path. Co-located
                          flows cost nothing.
  spare_iteration_s       the same with each inter-node flow at its share of its path's residual,
                          not capped at its demand (what a work-conserving network gives it).
  Rank                    how CES orders the decisions of one job: predicted_iteration_s, then,
                          between those it rates the same on no more nodes, spare_iteration_s.
  job_completion_s        waiting (start - submit) + iterations × iteration time.
  bandwidth_satisfaction  (granted / demanded over all logical flows, fraction of flows fully
                          satisfied); a co-located flow counts as granted its demand (it never
                          touches the network).
  network_cost            Σ over flows of rate × hops (Mbit/s·hops).
  decision_ms             the algorithm's wall time.
Per cluster state (after allocation):
  load_balance            (std, max/mean) of the nodes' multi-resource utilisation Ū_n.
  fragmentation           seed 004 eq. (27): F = 1/N Σ_n Σ_{r∈R_n} (r_t - r_o)/r_t, the free
                          share of each resource summed over resources, averaged over the N
                          online nodes.
  load_variance           seed 004 eq. (28): population variance of Ū_n across nodes (or of one
                          resource's utilisation, e.g. gpu as the seed reports it).
  Ū_n                     seed 004 eq. (8): mean over the node's resources R_n of used/capacity.
R_n is cpu, mem and gpu for nodes that have GPUs, cpu and mem otherwise (a 0/0 share is undefined).
Over a sequence of jobs:
  deployed_count          seed 004 eq. (26): N = n_success + n_suc_jud — tasks placed plus tasks
                          of jobs rejected when no placement that fits the free resources exists
                          (a correct "cannot place"; `packable` decides that by exact search).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass, replace
from functools import cached_property

from .model import RESOURCES, Cluster, Decision, Job
from .paths import fair_rates, split_weights
from .perfmodel import IterationModel, collective_phases, collective_steps, compute_time_s

DEFAULT_MODEL = IterationModel()
SIGNIFICANT = 1e-9  # relative: a time lower by no more than this is the same time


# --- per decision ---------------------------------------------------------------------------------
def path_delay_ms(cluster: Cluster, path: tuple[str, ...]) -> float:
    return sum(cluster.graph.edges[u, v].get("delay_ms", 0.0) for u, v in itertools.pairwise(path))


def predicted_iteration_s(
    cluster: Cluster, job: Job, decision: Decision, model: IterationModel = DEFAULT_MODEL
) -> float:
    compute = [
        compute_time_s(job.compute_s, cluster.speed(node), job.task(t).demand.cpu)
        for t, node in decision.placement.items()
    ]
    by_pair = {(f.src, f.dst): f for f in decision.flows}
    rank = {t.name: r for r, t in enumerate(job.tasks)}
    flows, rtt_s = [], 0.0
    for lf in job.flows:
        if decision.placement[lf.src] == decision.placement[lf.dst]:
            continue
        fa = by_pair.get((lf.src, lf.dst))
        rate = fa.rate_mbps if fa else 0.0
        flows.append((rank[lf.src], rank[lf.dst], (lf.bytes_per_iter, rate)))
        if fa:
            rtt_s = max(rtt_s, 2 * path_delay_ms(cluster, fa.path) / 1000)
    steps = collective_steps(job.collective, len(job.tasks)) if flows else 0
    phases = collective_phases(job.collective, flows)
    return model.iteration_s(compute, *phases, steps=steps, rtt_s=rtt_s, buckets=job.ddp_buckets)


def spare_iteration_s(
    cluster: Cluster, job: Job, decision: Decision, model: IterationModel = DEFAULT_MODEL
) -> float:
    """The iteration time if every inter-node flow of `decision` ran at its share of its path's
    residual (the rate split with no demand cap: bytes-weighted max-min over the links as the
    cluster has them before this job), not at its grant. The network is work-conserving: a flow
    granted its demand runs faster where its links have room to spare, which the model, counting
    grants, does not see — on the ring (docs/e2e.md) it rates heavy's two placements the same
    while one runs 40 % faster on the wire."""
    if not decision.flows:
        return predicted_iteration_s(cluster, job, decision, model)
    key = {(f.src, f.dst): f for f in decision.flows}
    share = fair_rates(
        cluster,
        {k: f.path for k, f in key.items()},
        dict.fromkeys(key, math.inf),
        split_weights([f for f in job.flows if (f.src, f.dst) in key]),
    )
    widened = replace(decision, flows=[replace(f, rate_mbps=share[k]) for k, f in key.items()])
    return predicted_iteration_s(cluster, job, widened, model)


class Rank:
    """A decision's rank among the decisions of one job (`a < b`: a is better): the shorter
    predicted iteration time; at the same time (within SIGNIFICANT), on no more nodes, the
    shorter time with the spare (`spare_iteration_s`, computed only for such a tie). Spare is
    not worth more nodes: the model, counting grants, sees a placement spread wider for room
    only as whole nodes taken from the jobs to come (docs/ppo.md, "Decoding")."""

    def __init__(self, cluster: Cluster, job: Job, decision: Decision):
        self.cluster, self.job, self.decision = cluster, job, decision
        self.time_s = predicted_iteration_s(cluster, job, decision)
        self.nodes = len(set(decision.placement.values()))

    @cached_property
    def spare_s(self) -> float:
        return spare_iteration_s(self.cluster, self.job, self.decision)

    def __lt__(self, other: Rank) -> bool:
        if self.time_s < other.time_s * (1 - SIGNIFICANT):
            return True
        return (
            self.time_s <= other.time_s * (1 + SIGNIFICANT)
            and self.nodes <= other.nodes
            and self.spare_s < other.spare_s * (1 - SIGNIFICANT)
        )


def job_completion_s(
    cluster: Cluster,
    job: Job,
    decision: Decision,
    start_s: float | None = None,
    model: IterationModel = DEFAULT_MODEL,
) -> float:
    """Submit to finish; NaN when the job gives no iteration count (target accuracy only)."""
    if job.iterations is None:
        return math.nan
    wait = 0.0 if start_s is None else start_s - job.submit_time
    return wait + job.iterations * predicted_iteration_s(cluster, job, decision, model)


def bandwidth_satisfaction(job: Job, decision: Decision) -> tuple[float, float]:
    """(Σ granted / Σ demanded, fraction of flows granted their full demand)."""
    if not job.flows:
        return 1.0, 1.0
    by_pair = {(f.src, f.dst): f.rate_mbps for f in decision.flows}
    granted = demanded = 0.0
    full = 0
    for lf in job.flows:
        local = decision.placement[lf.src] == decision.placement[lf.dst]
        g = lf.demand_mbps if local else min(by_pair.get((lf.src, lf.dst), 0.0), lf.demand_mbps)
        granted += g
        demanded += lf.demand_mbps
        full += g >= lf.demand_mbps * (1 - 1e-6)
    return (granted / demanded if demanded > 0 else 1.0), full / len(job.flows)


def network_cost(decision: Decision) -> float:
    return sum((f.rate_mbps * (len(f.path) - 1) for f in decision.flows), 0.0)


# --- per cluster state ----------------------------------------------------------------------------
def node_resources(cluster: Cluster, node: str) -> list[int]:
    """Indices into RESOURCES of the resources node has (R_n)."""
    cap = cluster.capacity(node).as_tuple()
    return [i for i, c in enumerate(cap) if c > 0]


def node_utilisation(cluster: Cluster, node: str) -> float:
    """Ū_n, seed 004 eq. (8)."""
    util = cluster.utilisation(node)
    idx = node_resources(cluster, node)
    return sum(util[i] for i in idx) / len(idx) if idx else 0.0


def load_balance(cluster: Cluster) -> tuple[float, float]:
    """(population std, max/mean) of Ū_n over online nodes; max/mean is 1.0 on an idle cluster."""
    u = [node_utilisation(cluster, n) for n in cluster.compute_nodes(online_only=True)]
    if not u:
        return 0.0, 1.0
    mean = statistics.fmean(u)
    return statistics.pstdev(u), (max(u) / mean if mean > 0 else 1.0)


def fragmentation(cluster: Cluster) -> float:
    """Seed 004 eq. (27)."""
    nodes = cluster.compute_nodes(online_only=True)
    if not nodes:
        return 0.0
    total = 0.0
    for n in nodes:
        util = cluster.utilisation(n)
        total += sum(1.0 - util[i] for i in node_resources(cluster, n))
    return total / len(nodes)


def load_variance(cluster: Cluster, resource: str | None = None) -> float:
    """Seed 004 eq. (28): variance of Ū_n across online nodes; with `resource` ("cpu", "mem_mb",
    "gpu") the variance of that resource's utilisation over the nodes that have it."""
    nodes = cluster.compute_nodes(online_only=True)
    if resource is None:
        u = [node_utilisation(cluster, n) for n in nodes]
    else:
        if resource not in RESOURCES:
            raise ValueError(
                f"unknown resource '{resource}' (expected one of {', '.join(RESOURCES)})"
            )
        i = RESOURCES.index(resource)
        u = [cluster.utilisation(n)[i] for n in nodes if cluster.capacity(n).as_tuple()[i] > 0]
    return statistics.pvariance(u) if u else 0.0


# --- over a sequence of jobs ----------------------------------------------------------------------
def packable(cluster: Cluster, job: Job, budget: int = 200_000) -> bool | None:
    """Does some assignment of the job's tasks to online nodes fit the free resources (network
    ignored)? Exact backtracking, largest tasks first, nodes with equal free resources tried once.
    None when `budget` search steps did not settle it."""
    nodes = cluster.compute_nodes(online_only=True)
    free = {n: cluster.free(n) for n in nodes}
    tasks = sorted((t.demand for t in job.tasks), key=lambda d: d.as_tuple(), reverse=True)
    steps = 0

    def place(i: int) -> bool | None:
        nonlocal steps
        if i == len(tasks):
            return True
        seen: set[tuple[float, ...]] = set()
        for n in nodes:
            key = free[n].as_tuple()
            if key in seen or not tasks[i].fits_in(free[n]):
                continue
            seen.add(key)
            steps += 1
            if steps > budget:
                return None
            free[n] = free[n] - tasks[i]
            found = place(i + 1)
            free[n] = free[n] + tasks[i]
            if found is not False:
                return found
        return False

    return place(0)


def deployed_count(placed_tasks: int, correctly_rejected_tasks: int) -> int:
    """Seed 004 eq. (26): N = n_success + n_suc_jud."""
    return placed_tasks + correctly_rejected_tasks


# --- everything about one decision, as one record -------------------------------------------------
@dataclass(frozen=True)
class DecisionMetrics:
    iteration_time_s: float
    job_completion_s: float
    bw_satisfaction: float
    flows_satisfied: float
    network_cost: float
    decision_ms: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def decision_metrics(
    cluster: Cluster, job: Job, decision: Decision, model: IterationModel = DEFAULT_MODEL
) -> DecisionMetrics:
    """All per-decision metrics, on the cluster as it was when the decision was made."""
    sat, full = bandwidth_satisfaction(job, decision)
    return DecisionMetrics(
        iteration_time_s=predicted_iteration_s(cluster, job, decision, model),
        job_completion_s=job_completion_s(cluster, job, decision, model=model),
        bw_satisfaction=sat,
        flows_satisfied=full,
        network_cost=network_cost(decision),
        decision_ms=decision.decision_s * 1000,
    )


@dataclass(frozen=True)
class ClusterMetrics:
    balance_std: float
    balance_max_mean: float
    fragmentation: float
    load_variance: float
    gpu_load_variance: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def cluster_metrics(cluster: Cluster) -> ClusterMetrics:
    std, max_mean = load_balance(cluster)
    return ClusterMetrics(
        std, max_mean, fragmentation(cluster), load_variance(cluster), load_variance(cluster, "gpu")
    )
