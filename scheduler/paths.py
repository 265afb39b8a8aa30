"""Paths through the physical network and the rates flows get on them.

A path runs from one compute node to another and passes through switches only (a compute node is
an end host, it does not forward: `layout.relays`). Paths are tuples of vertex names of
`Cluster.graph`.

Path rules (`PATH_RULES`; each routes the inter-node flows of a job one at a time, in job order):
  shortest     fewest hops (ties: least total delay). Network-blind.
  widest       largest bottleneck residual on the cluster as it is before this job (ties: fewest
               hops). Classic widest-shortest path.
  ksplit       among the k shortest paths (by hops), the one giving this flow the largest *share*:
               min over its links of residual / (1 + this job's flows already routed there);
               ties: fewer hops. Spreads a job's flows over parallel paths.
  constrained  fewest hops among links whose residual, minus the demands of this job's flows
               already routed there, still covers this flow's demand (bandwidth-constrained
               shortest path); when no such path exists, the widest path.

Rate rule (one for all path rules, `fair_rates`): the *rate split*. Each directed link's residual
is split among the job's flows that cross it by weighted max-min fairness (progressive filling):
every active flow's rate grows in proportion to its weight until it reaches its demand or one of
its links is full; frozen flows keep their rate, the others go on. A flow never gets more than it
asked for. With weights = bytes per iteration ("bytes", the default) every flow of the collective
finishes together, which minimises the collective's time max_f bytes_f / rate_f for the chosen
paths. With equal weights ("equal") it is TCP-like fair sharing (what a network-blind scheduler
gets). A single flow is never split over several paths: the SDN app installs one path per flow.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from collections.abc import Callable, Hashable, Mapping

import networkx as nx

from .layout import Layout, fewest_hops, hop_cost, layout, relays, residuals, widest_route
from .model import EPS, CannotPlace, Cluster, FlowAssignment, Job, LogicalFlow
from .perfmodel import IterationModel, collective_steps

Path = tuple[str, ...]
PATH_RULES = ("shortest", "widest", "ksplit", "constrained")
WEIGHTINGS = ("bytes", "equal")


class NoPath(CannotPlace):
    """No path through switches joins two compute nodes (or none with enough bandwidth)."""


def routing_view(cluster: Cluster, src: str, dst: str) -> nx.Graph:
    """G restricted to the vertices a src→dst path may use: the two ends and what `relays`."""
    lay = layout(cluster)
    s, t = lay.index[src], lay.index[dst]
    return nx.subgraph_view(
        cluster.graph,
        filter_node=lambda v: relays(lay, lay.index[v], s) or relays(lay, lay.index[v], t),
    )


def _check_ends(cluster: Cluster, src: str, dst: str) -> None:
    for v in (src, dst):
        if v not in cluster.graph or cluster.graph.nodes[v]["kind"] != "compute":
            raise ValueError(f"{v} is not a compute node of the cluster")
    if src == dst:
        raise ValueError(f"no path needed from {src} to itself")


def _hop_weight(
    cluster: Cluster,
    src: str,
    dst: str,
    min_residual: float = 0.0,
    extra: Mapping[tuple[str, str], float] | None = None,
) -> Callable:
    """Dijkstra weight for the directed step u→v: one per hop plus a tiny delay tie-break.
    Hides steps out of or into a vertex that does not relay (`relays`) and, with
    `min_residual` > 0, steps with less residual (minus `extra`) than that."""
    lay = layout(cluster)
    index, s, t = lay.index, lay.index[src], lay.index[dst]

    def weight(u: str, v: str, d: dict) -> float | None:
        if not (relays(lay, index[u], s) and relays(lay, index[v], t)):
            return None
        if min_residual > 0:
            free = cluster.residual(u, v) - (extra or {}).get((u, v), 0.0)
            if free < min_residual - EPS:
                return None
        return hop_cost(d)

    return weight


# Fewest-hop paths from one source to every vertex, per graph. They depend only on the graph's
# structure and delays, which stay fixed once a graph is routed on (capacities, residuals and
# offline nodes change; they do not enter this rule). The simulator asks for the same pairs
# again and again, and a Dijkstra with a Python weight is its most expensive step.
_SHORTEST_FROM: weakref.WeakKeyDictionary[nx.Graph, dict[str, dict[str, list[str]]]] = (
    weakref.WeakKeyDictionary()
)


def _shortest_from(cluster: Cluster, src: str) -> dict[str, list[str]]:
    per_source = _SHORTEST_FROM.setdefault(cluster.graph, {})
    if src not in per_source:
        lay = layout(cluster)
        index, s = lay.index, lay.index[src]

        def weight(u: str, v: str, d: dict) -> float | None:
            return hop_cost(d) if relays(lay, index[u], s) else None

        per_source[src] = nx.single_source_dijkstra_path(cluster.graph, src, weight=weight)
    return per_source[src]


def shortest_path(
    cluster: Cluster,
    src: str,
    dst: str,
    min_residual: float = 0.0,
    extra: Mapping[tuple[str, str], float] | None = None,
) -> Path:
    """Fewest-hop path src→dst (ties: least delay). With `min_residual` > 0 only directed links
    with at least that residual (after subtracting `extra` Mbit/s per link) are used.
    Raises `NoPath`."""
    _check_ends(cluster, src, dst)
    if min_residual <= 0:
        path = _shortest_from(cluster, src).get(dst)
        if path is None:
            raise NoPath(f"no path from {src} to {dst}")
        return tuple(path)
    try:
        _, path = nx.bidirectional_dijkstra(
            cluster.graph, src, dst, weight=_hop_weight(cluster, src, dst, min_residual, extra)
        )
    except nx.NetworkXNoPath:
        what = f" with {min_residual:g} Mbit/s free" if min_residual > 0 else ""
        raise NoPath(f"no path from {src} to {dst}{what}") from None
    return tuple(path)


def widest_path(cluster: Cluster, src: str, dst: str) -> Path:
    """The path with the largest bottleneck residual (directed), fewest hops among those.
    Raises `NoPath`."""
    _check_ends(cluster, src, dst)
    lay = layout(cluster)
    found = widest_route(lay, residuals(cluster, lay).tolist(), lay.index[src], lay.index[dst], EPS)
    if found is None:
        raise NoPath(f"no path from {src} to {dst}")
    return _vertex_path(lay, found[0])


def _vertex_path(lay: Layout, edges: list[int]) -> Path:
    return tuple(lay.vertices[v] for v in [int(lay.src[edges[0]])] + lay.dst[edges].tolist())


# The k shortest paths between two nodes, per graph: structure only, as `_SHORTEST_FROM`.
_CANDIDATES: weakref.WeakKeyDictionary[nx.Graph, dict[tuple[str, str, int], list[Path]]] = (
    weakref.WeakKeyDictionary()
)


def candidate_paths(cluster: Cluster, src: str, dst: str, k: int) -> list[Path]:
    """Up to k shortest loop-free paths src→dst by hop count (`routing_view`), remembered per
    graph. Raises `NoPath` when there is none."""
    memo = _CANDIDATES.setdefault(cluster.graph, {})
    if (src, dst, k) not in memo:
        _check_ends(cluster, src, dst)
        view = routing_view(cluster, src, dst)
        try:
            memo[(src, dst, k)] = [
                tuple(p) for p in itertools.islice(nx.shortest_simple_paths(view, src, dst), k)
            ]
        except nx.NetworkXNoPath:
            memo[(src, dst, k)] = []
    if not memo[(src, dst, k)]:
        raise NoPath(f"no path from {src} to {dst}")
    return memo[(src, dst, k)]


def links(path: Path) -> list[tuple[str, str]]:
    return list(itertools.pairwise(path))


def fair_rates(
    cluster: Cluster,
    paths: Mapping[Hashable, Path],
    demands: Mapping[Hashable, float],
    weights: Mapping[Hashable, float] | None = None,
) -> dict[Hashable, float]:
    """The rate split (see module doc): weighted max-min fair rates on the cluster's residual,
    each capped at its demand. Keys are any flow ids. A flow whose path has no residual gets 0.

    Progressive filling by events: every active flow's rate is its weight × a common fill level,
    which rises to the next level where a link fills or a flow reaches its demand (heap `reach`);
    there every link with at most EPS of its capacity left and every flow within EPS of its
    demand freezes (heap `due`: the level at which each does). A link's left capacity is kept as
    of the level it last changed (`since`), and its events are pushed again when its weight sum
    changes (older ones are skipped by their version). Each freeze touches only its flow's
    links: the Master re-shares the spare of hundreds of flows under its lock
    (master/network.py), and the simulator shares every running job's flows at each event."""
    w = {f: (weights[f] if weights else 1.0) for f in paths}
    if any(x <= 0 for x in w.values()):
        raise ValueError("flow weights must be > 0")
    rate = dict.fromkeys(paths, 0.0)
    on_path = {f: links(p) for f, p in paths.items()}
    active = {f for f in paths if demands[f] > EPS}
    crossing: dict[tuple[str, str], list[Hashable]] = {}  # link -> the active flows on it
    for f in active:
        for lk in on_path[f]:
            crossing.setdefault(lk, []).append(f)
    left = {lk: max(cluster.residual(*lk), 0.0) for lk in crossing}
    full_below = {lk: EPS * max(1.0, cluster.link_capacity(*lk)) for lk in crossing}
    # per link: the active flows' weight sum and count (the count says exactly when it is empty)
    wsum = {lk: sum(w[f] for f in fs) for lk, fs in crossing.items()}
    count = {lk: len(fs) for lk, fs in crossing.items()}
    since = dict.fromkeys(crossing, 0.0)
    version = dict.fromkeys(crossing, 0)
    # events (level, 0 link | 1 flow, tie-break, id, version): where it fills (reach), where it
    # freezes (due); the tie-break keeps ids (of any type) out of the comparison
    order = itertools.count()
    reach = [(demands[f] / w[f], 1, next(order), f, 0) for f in active]
    due = [((demands[f] - EPS) / w[f], 1, next(order), f, 0) for f in active]

    def link_events(lk: tuple[str, str]) -> tuple[tuple, tuple]:
        n = next(order)
        return (
            (since[lk] + left[lk] / wsum[lk], 0, n, lk, version[lk]),
            (since[lk] + (left[lk] - full_below[lk]) / wsum[lk], 0, n, lk, version[lk]),
        )

    for lk in crossing:
        r, d = link_events(lk)
        reach.append(r)
        due.append(d)
    heapq.heapify(reach)
    heapq.heapify(due)

    def stale(event: tuple) -> bool:
        _, kind, _, x, v = event
        return x not in active if kind else (v != version[x] or not count[x])

    level = 0.0
    while active:
        while stale(reach[0]):
            heapq.heappop(reach)
        level = max(level, reach[0][0])
        changed = set()
        while due and due[0][0] <= level:
            event = heapq.heappop(due)
            if stale(event):
                continue
            _, kind, _, x, _ = event
            for f in [x] if kind else [f for f in crossing[x] if f in active]:
                active.discard(f)
                rate[f] = w[f] * level
                for lk in on_path[f]:
                    left[lk] -= wsum[lk] * (level - since[lk])
                    since[lk] = level
                    wsum[lk] -= w[f]
                    count[lk] -= 1
                    version[lk] += 1
                    changed.add(lk)
        for lk in changed:
            if count[lk]:
                r, d = link_events(lk)
                heapq.heappush(reach, r)
                heapq.heappush(due, d)
    return rate


def route(
    cluster: Cluster,
    src: str,
    dst: str,
    rule: str,
    k: int = 4,
    demand: float = 0.0,
    routed: Mapping[tuple[str, str], tuple[int, float]] | None = None,
) -> Path:
    """One flow's path under `rule`. `routed` maps a directed link to (flows, Mbit/s demanded)
    of this job's flows routed before this one (used by ksplit and constrained)."""
    routed = routed or {}
    if rule == "shortest":
        return shortest_path(cluster, src, dst)
    if rule == "widest":
        return widest_path(cluster, src, dst)
    if rule == "ksplit":

        def share(p: Path) -> tuple[float, int]:
            s = min(
                cluster.residual(u, v) / (1 + routed.get((u, v), (0, 0.0))[0]) for u, v in links(p)
            )
            return (s, -len(p))

        return max(candidate_paths(cluster, src, dst, k), key=share)
    if rule == "constrained":
        try:
            return shortest_path(
                cluster,
                src,
                dst,
                min_residual=max(demand, EPS),
                extra={lk: d for lk, (_, d) in routed.items()},
            )
        except NoPath:
            return widest_path(cluster, src, dst)
    raise ValueError(f"unknown path rule '{rule}' (expected one of {', '.join(PATH_RULES)})")


def assign_flows(
    cluster: Cluster,
    job: Job,
    placement: Mapping[str, str],
    rule: str = "shortest",
    k: int = 4,
    weighting: str = "bytes",
) -> list[FlowAssignment]:
    """Paths (by `rule`) and rates (the rate split) for every inter-node flow of `job` placed as
    `placement`. Raises `NoPath` (a `CannotPlace`) when a flow finds no path or no bandwidth."""
    if weighting not in WEIGHTINGS:
        raise ValueError(
            f"unknown weighting '{weighting}' (expected one of {', '.join(WEIGHTINGS)})"
        )
    crossing = [f for f in job.flows if placement[f.src] != placement[f.dst]]
    paths: dict[tuple[str, str], Path] = {}
    routed: dict[tuple[str, str], tuple[int, float]] = {}
    for f in crossing:
        p = route(cluster, placement[f.src], placement[f.dst], rule, k, f.demand_mbps, routed)
        paths[(f.src, f.dst)] = p
        for lk in links(p):
            n, d = routed.get(lk, (0, 0.0))
            routed[lk] = (n + 1, d + f.demand_mbps)
    demands = {(f.src, f.dst): f.demand_mbps for f in crossing}
    return granted(
        crossing, paths, fair_rates(cluster, paths, demands, split_weights(crossing, weighting))
    )


def split_weights(
    crossing: list[LogicalFlow], weighting: str = "bytes"
) -> dict[tuple[str, str], float]:
    """The rate split's weight of each flow, keyed (src, dst): its bytes per iteration
    ("bytes": the collective's flows finish together), or 1 ("equal", and for all when one
    carries no bytes)."""
    use_bytes = weighting == "bytes" and all(f.bytes_per_iter > 0 for f in crossing)
    return {(f.src, f.dst): (f.bytes_per_iter if use_bytes else 1.0) for f in crossing}


def granted(
    crossing: list[LogicalFlow],
    paths: dict[tuple[str, str], Path],
    rates: dict[tuple[str, str], float],
) -> list[FlowAssignment]:
    """The flows' assignments on their paths at their rates; `NoPath` for one left no bandwidth."""
    out = []
    for f in crossing:
        key = (f.src, f.dst)
        if rates[key] <= EPS:
            raise NoPath(
                f"flow {f.src}->{f.dst}: no residual bandwidth on {' -> '.join(paths[key])}"
            )
        out.append(FlowAssignment(f.src, f.dst, paths[key], rates[key]))
    return out


def route_placement(
    cluster: Cluster,
    job: Job,
    placement: Mapping[str, str],
    k: int = 4,
    fixed: Mapping[tuple[str, str], Path] | None = None,
    sweeps: int = 3,
    model: IterationModel = IterationModel(),
) -> list[FlowAssignment]:
    """CES's network decision for a given placement: a path and a rate for every inter-node flow.

    Candidates per node pair: its k shortest loop-free paths, and its widest path when none of
    those is as wide as the pair's access links allow; those with residual bandwidth on every
    link (`fixed` pins a node pair to one path). The paths minimise the collective's
    bandwidth-bound time

        T = max( max_f b_f / d_f ,  max_l Σ_{f ∋ l} b_f / res_l )      (b_f: bytes as weights)

    which is what the rate split reaches (exact.py's closed form); with the iteration-time
    model's efficiency and the round trip of the longest path paid at every step of the
    collective, as `metrics.predicted_iteration_s` counts them; ties to the fewest hops weighted
    by bytes: flows placed largest first on their best path given the earlier ones, then one
    flow at a time moved while that lowers the time (at most `sweeps` rounds). The rates are the
    rate split on those paths. For a star or a tree, whose phases run one after the other
    (`perfmodel.collective_phases`), T, the slowest flow of all, stands in for the sum of the
    phases' slowest flows that the model counts. Raises `NoPath` when a flow has no usable path."""
    crossing = [f for f in job.flows if placement[f.src] != placement[f.dst]]
    if not crossing:
        return []
    lay = layout(cluster)
    res = residuals(cluster, lay).tolist()
    weight = split_weights(crossing)
    use_bytes = all(f.bytes_per_iter > 0 for f in crossing)
    demand = {(f.src, f.dst): f.demand_mbps for f in crossing}
    by_pair = {
        pair: _pair_options(cluster, lay, res, pair, k, fixed)
        for pair in dict.fromkeys((placement[f.src], placement[f.dst]) for f in crossing)
    }
    options: dict[tuple[str, str], list[tuple[Path, list[int]]]] = {}
    for f in crossing:
        pair = placement[f.src], placement[f.dst]
        if not by_pair[pair]:
            raise NoPath(
                f"flow {f.src}->{f.dst}: no path from {pair[0]} to {pair[1]} with "
                "residual bandwidth"
            )
        options[(f.src, f.dst)] = by_pair[pair]
    floor = max((weight[fl] / demand[fl] for fl in weight if demand[fl] > EPS), default=0.0)
    load: dict[int, float] = {}  # bytes of the flows placed so far, per directed link
    # seconds per unit of T (bytes / Mbit/s at the model's efficiency: weights are bytes, or all
    # 1 when a flow carries none), and the round trip paid at each step of the collective
    per_unit = 8e-6 / model.efficiency if use_bytes else 0.0
    steps = collective_steps(job.collective, len(job.tasks))
    delay = {
        p: 2e-3 * sum(lay.delay_ms[e] for e in edges) for ps in by_pair.values() for p, edges in ps
    }
    chosen: dict[tuple[str, str], tuple[Path, list[int]]] = {}

    def costs(fl: tuple[str, str]) -> list[tuple[float, float]]:
        """(seconds, hop-bytes) of each of fl's options, the other flows where `load` has them.
        Adding fl raises only its own links, so T is the larger of the busiest link now and
        the busiest of its links with it."""
        busiest = max([floor] + [x / res[e] for e, x in load.items() if x > EPS])
        rtt = max((delay[p] for other, (p, _) in chosen.items() if other != fl), default=0.0)
        out = []
        for p, edges in options[fl]:
            worst = max([busiest] + [(load.get(e, 0.0) + weight[fl]) / res[e] for e in edges])
            out.append(
                (
                    worst * per_unit + steps * max(rtt, delay[p]) if per_unit else worst,
                    weight[fl] * len(edges),
                )
            )
        return out

    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return a[0] < b[0] * (1 - 1e-9) or (a[0] <= b[0] * (1 + 1e-9) and a[1] < b[1])

    def put(fl: tuple[str, str], sign: float) -> None:
        for e in chosen[fl][1]:
            load[e] = load.get(e, 0.0) + sign * weight[fl]

    def best_of(fl: tuple[str, str]) -> tuple[int, list[tuple[float, float]]]:
        c = costs(fl)
        return min(range(len(c)), key=c.__getitem__), c

    for fl in sorted(options, key=lambda fl: -weight[fl]):
        i, _ = best_of(fl)
        chosen[fl] = options[fl][i]
        put(fl, +1)
    for _ in range(sweeps):
        moved = False
        for fl in (fl for fl in options if len(options[fl]) > 1):
            put(fl, -1)
            i, c = best_of(fl)
            now = options[fl].index(chosen[fl])
            if better(c[i], c[now]):
                chosen[fl], moved = options[fl][i], True
            put(fl, +1)
        if not moved:
            break
    paths = {fl: p for fl, (p, _) in chosen.items()}
    return granted(crossing, paths, fair_rates(cluster, paths, demand, weight))


def _pair_options(
    cluster: Cluster,
    lay: Layout,
    res: list[float],
    pair: tuple[str, str],
    k: int,
    fixed: Mapping[tuple[str, str], Path] | None,
) -> list[tuple[Path, list[int]]]:
    """route_placement's candidate paths of one node pair (with their directed links), those
    with residual on every link."""
    if fixed and pair in fixed:
        found = [tuple(fixed[pair])]
    else:
        found = list(candidate_paths(cluster, *pair, k))
    found_edges = [[lay.edge_id[lk] for lk in links(p)] for p in found]
    if not (fixed and pair in fixed):
        a, b = lay.index[pair[0]], lay.index[pair[1]]
        # No path is wider than the ends' access links: where one is that wide, the fewest-hop
        # such path is the widest path, and it is found without a search of the whole graph.
        bound = min(
            max(res[e] for _, e in lay.out_edges[a]), max(res[e] for _, e in lay.in_edges[b])
        )
        if max(min(res[e] for e in edges) for edges in found_edges) < bound - EPS:
            edges = fewest_hops(lay, res, a, b, bound - EPS)
            if edges is None:
                widest = widest_route(lay, res, a, b, EPS)
                edges = widest[0] if widest else None
            if edges is not None and _vertex_path(lay, edges) not in found:
                found.append(_vertex_path(lay, edges))
                found_edges.append(edges)
    return [(p, edges) for p, edges in zip(found, found_edges) if min(res[e] for e in edges) > EPS]
