"""Local search over a placement by the shared iteration-time model (CES-PPO's decoding).

A constructive placement — a greedy rollout, network-aware's — decides one task at a time and
cannot undo an early choice that the later ones make costly (docs/ppo.md, "Decoding", has the
cases measured). `improve` takes the decision and moves one task or exchanges two while that
lowers the predicted iteration time of placement, paths and rates together (each candidate with
CES's network decision, `paths.route_placement`; at the same time, while it gives the flows more
room to spare: `metrics.Rank`), within a number of evaluations.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from .metrics import Rank
from .model import CannotPlace, Cluster, Decision, Job, Resources, placement_key
from .paths import route_placement


def improve(cluster: Cluster, job: Job, decision: Decision, evaluations: int) -> Decision:
    """The decision after steepest descent over single-task moves and two-task exchanges
    (`moves`), at most `evaluations` placements evaluated (each once): when they run out in the
    middle of a scan, the best of those it reached is taken. Never slower than `decision` by
    the model (but for what `metrics.Rank` counts as the same time: SIGNIFICANT a step);
    `decision` itself when nothing better is found."""
    best = Rank(cluster, job, decision)
    free = {n: cluster.free(n) for n in cluster.compute_nodes(online_only=True)}
    seen = {placement_key(decision.placement)}
    while evaluations > 0:
        step = None
        for placement in moves(job, best.decision.placement, free):
            if evaluations <= 0:
                break
            key = placement_key(placement)
            if key in seen:
                continue
            seen.add(key)
            evaluations -= 1
            try:
                d = Decision(job.name, placement, route_placement(cluster, job, placement))
            except CannotPlace:
                continue
            rank = Rank(cluster, job, d)
            if rank < best and (step is None or rank < step):
                step = rank
        if step is None:
            break
        best = step
    return best.decision


def moves(
    job: Job, placement: dict[str, str], free: dict[str, Resources]
) -> Iterator[dict[str, str]]:
    """The placements one move away that fit in `free` (what the cluster leaves, per node that
    may take tasks: a node not in it takes none): two tasks on different nodes exchanged, then
    one task moved to a node of the job, then to any other node. Exchanges first: they keep the
    nodes' load and so fit where a move does not."""
    used: dict[str, Resources] = {}
    for task, node in placement.items():
        used[node] = used.get(node, Resources()) + job.task(task).demand
    demand = {t: job.task(t).demand for t in placement}
    for a, b in itertools.combinations(placement, 2):
        na, nb = placement[a], placement[b]
        if (
            na != nb
            and (used[na] - demand[a] + demand[b]).fits_in(free.get(na, Resources()))
            and (used[nb] - demand[b] + demand[a]).fits_in(free.get(nb, Resources()))
        ):
            yield placement | {a: nb, b: na}
    others = [n for n in free if n not in used]
    for task, node in placement.items():
        for target in [n for n in used if n != node and n in free] + others:
            if (used.get(target, Resources()) + demand[task]).fits_in(free[target]):
                yield placement | {task: target}
