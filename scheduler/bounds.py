"""A lower bound of a job's predicted iteration time on a cluster, for instances the exact
reference cannot solve: how far from optimal an algorithm can at most be.

    iteration ≥ compute + communication + overhead          (metrics.predicted_iteration_s)

compute: every task runs somewhere it fits; the slowest task's best node bounds the slowest task:
    C ≥ max_t min_{n: t fits on n} compute(t, n).
communication: zero when one node can hold the whole job; otherwise the tasks span at least two
nodes, so some logical flows cross between nodes (a cut of the job's graph), each at a rate at
most its demand and what the links around its ends leave. Per collective:
  ring, all-to-all, tree, custom — every cut of a strongly connected logical graph is crossed by
    at least one flow in each direction; at best the crossing flow is the one with the fewest
    bytes, at the best rate any node's access links offer:
        T ≥ min_f b_f / min(d_f, R),  R = max_n min(residual out of n, residual into n);
    for a ring, a cut is crossed by at least two flows (one each way), each carrying
    2(k-1)/k·M — the ring bottleneck the collective cannot go below;
  star — the parameter server's node n receives the gradients of every worker it cannot hold
    itself through its one access link: r_n ≥ k − (workers that fit beside the server on n), so
        T ≥ min_{n hosts ps} b_w / min(d, residual of n's link / r_n)   (in, and as much out).
The collective's time divides by the model's efficiency and caps at its per-worker goodput
(one phase: a star's or a tree's phases, `perfmodel.collective_phases`, only add to it), plus
its step latency (the round trip of a path counts at zero: no path is shorter than none).
Every term is a relaxation of what any placement, path and rate must pay, so the sum is a lower
bound of `predicted_iteration_s` of every feasible decision (a test checks it against the exact
reference).
"""

from __future__ import annotations

import math

import networkx as nx

from .metrics import DEFAULT_MODEL
from .model import EPS, Cluster, Job, Resources
from .perfmodel import IterationModel, collective_steps, compute_time_s


def iteration_lower_bound(
    cluster: Cluster, job: Job, model: IterationModel = DEFAULT_MODEL
) -> float:
    """A lower bound of the job's predicted iteration time on `cluster` as it is (module doc);
    inf when some task fits on no node."""
    nodes = cluster.compute_nodes(online_only=True)
    free = {n: cluster.free(n) for n in nodes}
    compute = 0.0
    for t in job.tasks:
        best = min(
            (
                compute_time_s(job.compute_s, cluster.speed(n), t.demand.cpu)
                for n in nodes
                if t.demand.fits_in(free[n])
            ),
            default=math.inf,
        )
        compute = max(compute, best)
    if math.isinf(compute):
        return math.inf
    if (
        not job.flows
        or any(job.total_demand().fits_in(free[n]) for n in nodes)
        or not nx.is_connected(job.logical_graph().to_undirected())
    ):
        return compute + model.overhead_s  # (a split job may cross no flow)
    access = {n: _access_residual(cluster, n) for n in nodes}
    if job.collective == "star":
        seconds = _star_bound(job, nodes, free, access)
    else:
        best_rate = max(min(out, into) for out, into in access.values())
        seconds = min(
            f.bytes_per_iter * 8 / (min(f.demand_mbps, best_rate) * 1e6) for f in job.flows
        )
    flows = [(seconds * 1e6 / 8, 1.0)]  # as (bytes, Mbit/s): the model's own conversion
    steps = collective_steps(job.collective, len(job.tasks))
    return compute + model.communication_s(flows, steps=steps) + model.overhead_s


def _access_residual(cluster: Cluster, node: str) -> tuple[float, float]:
    """(residual out of, residual into) a compute node's one link."""
    switch = next(iter(cluster.graph.neighbors(node)))
    return cluster.residual(node, switch), cluster.residual(switch, node)


def _star_bound(
    job: Job, nodes: list[str], free: dict[str, Resources], access: dict[str, tuple[float, float]]
) -> float:
    ps = job.task("ps")
    workers = [t for t in job.tasks if t.name != "ps"]
    up = next(f for f in job.flows if f.dst == "ps")  # every worker's gradients: same bytes
    best = math.inf
    for n in nodes:
        if not ps.demand.fits_in(free[n]):
            continue
        room, beside = free[n] - ps.demand, 0
        for w in sorted(workers, key=lambda w: w.demand.as_tuple()):  # smallest first
            if not w.demand.fits_in(room):
                break
            room, beside = room - w.demand, beside + 1
        remote = len(workers) - beside
        if not remote:
            return 0.0
        # the remote workers share the server's link: the slowest gets at most a 1/remote share
        rate = min(up.demand_mbps, min(access[n]) / remote)
        if rate > EPS:
            best = min(best, up.bytes_per_iter * 8 / (rate * 1e6))
    return best
