"""G as index arrays, for the hot loops that read it many times per decision (the placement
policy's features, CES's network decision): vertices and directed links numbered, the
neighbours of every vertex, and what depends on structure only, kept per graph object.

A Cluster's graph is read-only in structure (node leave/join and capacity changes do not touch
it), so a layout is made once per graph; its vertex count is checked all the same (the edge
count costs a pass over G in networkx). Compute nodes come
first, then switches; directed link 2i is G's i-th link in its own order and 2i+1 the same link
the other way.
"""

from __future__ import annotations

import heapq
import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from .model import EPS, Cluster


@dataclass
class Layout:
    size: int  # vertices
    compute: list[str]
    vertices: list[str]
    index: dict[str, int]
    src: np.ndarray  # (E,) int64
    dst: np.ndarray  # (E,) int64
    edge_id: dict[tuple[str, str], int]
    out_edges: list[list[tuple[int, int]]]  # per vertex: (neighbour, directed link)
    in_edges: list[list[tuple[int, int]]]
    degree: np.ndarray  # (V,)
    links: list[dict]  # G's link attribute dicts (live: a link's new bandwidth shows), G's order
    delay_ms: list[float]  # per directed link
    hop_cost: list[float]  # per directed link: 1 per hop plus a tiny delay tie-break
    trees: dict[int, Tree] = field(default_factory=dict)

    @property
    def n_compute(self) -> int:
        return len(self.compute)


def hop_cost(link: dict) -> float:
    """One per hop plus a tiny delay tie-break (the fewest-hop rule's weight of a link)."""
    return 1.0 + link.get("delay_ms", 0.0) * 1e-6


def relays(lay: Layout, v: int | np.ndarray, end: int) -> bool | np.ndarray:
    """Whether a path one of whose ends is vertex `end` may pass through vertex v — elementwise
    when v is an array of vertices: a switch does, and so does `end` itself (a path leaves its
    start and enters its end); a compute node is an end host and does not forward. Every path
    search of the scheduler asks this (here and in paths.py)."""
    return (v >= lay.n_compute) | (v == end)


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layout(cluster: Cluster) -> Layout:
    g = cluster.graph
    size = len(g)
    lay = _LAYOUTS.get(g)
    if lay is None or lay.size != size:
        compute = cluster.compute_nodes()
        vertices = compute + [v for v, d in g.nodes(data=True) if d["kind"] == "switch"]
        index = {v: i for i, v in enumerate(vertices)}
        links = list(g.edges(data=True))
        pairs = [(a, b) for u, v, _ in links for a, b in ((u, v), (v, u))]
        src = np.array([index[a] for a, _ in pairs], np.int64)
        dst = np.array([index[b] for _, b in pairs], np.int64)
        out_edges: list[list[tuple[int, int]]] = [[] for _ in vertices]
        in_edges: list[list[tuple[int, int]]] = [[] for _ in vertices]
        for e, (a, b) in enumerate(zip(src.tolist(), dst.tolist())):
            out_edges[a].append((b, e))
            in_edges[b].append((a, e))
        delay = [d.get("delay_ms", 0.0) for _, _, d in links for _ in (0, 1)]
        cost = [hop_cost(d) for _, _, d in links for _ in (0, 1)]
        lay = _LAYOUTS[g] = Layout(
            size,
            compute,
            vertices,
            index,
            src,
            dst,
            {pr: e for e, pr in enumerate(pairs)},
            out_edges,
            in_edges,
            np.bincount(src, minlength=len(vertices)),
            [d for _, _, d in links],
            delay,
            cost,
        )
    return lay


def capacities(lay: Layout) -> np.ndarray:
    """(E,) Mbit/s of every directed link (read from the live link attributes)."""
    return np.repeat(np.fromiter((d["bw_mbps"] for d in lay.links), float, len(lay.links)), 2)


def reservations(cluster: Cluster, lay: Layout) -> np.ndarray:
    """(E,) Mbit/s reserved on every directed link."""
    out = np.zeros(2 * len(lay.links))
    reserved = cluster.reserved
    if reserved:
        out[np.fromiter(map(lay.edge_id.__getitem__, reserved), np.int64, len(reserved))] = (
            np.fromiter(reserved.values(), float, len(reserved))
        )
    return out


def residuals(cluster: Cluster, lay: Layout) -> np.ndarray:
    """(E,) unreserved Mbit/s of every directed link, as `Cluster.residual` (not clipped)."""
    return capacities(lay) - reservations(cluster, lay)


@dataclass
class Tree:
    """The breadth-first shortest-path tree from one vertex (`relays`). Arrays over all
    vertices; -1 at the root and where unreachable."""

    parent: np.ndarray
    outward: np.ndarray  # the link parent -> vertex (away from the root)
    inward: np.ndarray  # the link vertex -> parent (towards the root)
    levels: list[np.ndarray]  # the vertices at 1, 2, ... hops
    hops: np.ndarray  # inf where unreachable


def hops_over(
    lay: Layout, res: np.ndarray, v: int, min_residual: float = 0.0, inward: bool = False
) -> np.ndarray:
    """(V,) hops from vertex v to every vertex (`relays`), using only directed links with at
    least `min_residual` of `res` free (every link when it is ≤ 0); `inward`, hops from every
    vertex *to* v (links taken in the reverse direction). inf where none.
    Breadth-first, a level at a time over the link arrays (network-aware and the placement
    policy's guidance run several per decision on 1000 nodes)."""
    nv = len(lay.vertices)
    # a link is taken from its end nearer v, which must relay
    near, far = (lay.dst, lay.src) if inward else (lay.src, lay.dst)
    usable = relays(lay, near, v)
    if min_residual > 0:
        usable &= res >= min_residual - EPS
    near, far = near[usable], far[usable]
    hops = np.full(nv, math.inf)
    hops[v] = 0
    frontier, d = np.zeros(nv, bool), 0
    frontier[v] = True
    while True:
        d += 1
        reached = far[frontier[near]]
        reached = reached[hops[reached] == math.inf]
        if not len(reached):
            return hops
        hops[reached] = d
        frontier[:] = False
        frontier[reached] = True


def flow_hops(
    lay: Layout, res: np.ndarray, peers: list[tuple[int, float, bool]], memo: dict
) -> tuple[np.ndarray, np.ndarray]:
    """Network-aware's measure of every vertex as the place of a task whose flows go to or come
    from placed peers `peers` — (peer vertex, demand, `inward`: the flow goes into the peer):
    (V,) whether some flow finds no path with its demand free, and (V,) the flows' hops weighted
    by demand, over links with the demand free (over any link where there is none; inf where
    none at all). `memo` keeps the searches (`hops_over`) for the caller's decision: the
    residuals do not change within it."""

    def hops(v: int, demand: float, inward: bool) -> np.ndarray:
        if (v, demand, inward) not in memo:
            memo[v, demand, inward] = hops_over(lay, res, v, demand, inward)
        return memo[v, demand, inward]

    blocked, cost = np.zeros(len(lay.vertices), bool), np.zeros(len(lay.vertices))
    for v, demand, inward in peers:
        h = hops(v, demand, inward)
        lost = np.isinf(h)
        if lost.any():
            blocked |= lost
            h = np.where(lost, hops(v, 0.0, inward), h)
        cost += demand * h
    return blocked, cost


def shortest_tree(lay: Layout, v: int) -> Tree:
    """The tree from vertex v, kept per layout."""
    if v not in lay.trees:
        nv = len(lay.vertices)
        parent = np.full(nv, -1, np.int64)
        outward, inward = np.full(nv, -1, np.int64), np.full(nv, -1, np.int64)
        hops = np.full(nv, np.inf)
        hops[v] = 0
        levels, frontier, seen = [], [v], {v}
        while frontier:
            nxt = []
            for u in frontier:
                if not relays(lay, u, v):
                    continue
                for w, e in lay.out_edges[u]:
                    if w not in seen:
                        seen.add(w)
                        parent[w], outward[w] = u, e
                        nxt.append(w)
            if nxt:
                levels.append(np.array(nxt, np.int64))
                hops[nxt] = len(levels)
            frontier = nxt
        for w in seen - {v}:
            inward[w] = lay.edge_id[(lay.vertices[w], lay.vertices[parent[w]])]
        lay.trees[v] = Tree(parent, outward, inward, levels, hops)
    return lay.trees[v]


def widths(
    lay: Layout, res: list[float], v: int, inward: bool = False, stop: int | None = None
) -> list[float]:
    """The bottleneck of the widest path (by directed residual `res`) from vertex v to every
    vertex (`relays`), or `inward`, from every vertex to v: inf at v, -inf where there is no
    path. A max-min Dijkstra; with `stop`, it ends once that vertex's width is known (those not
    yet settled are then lower bounds)."""
    width = [-math.inf] * len(lay.vertices)
    width[v] = math.inf
    done = [False] * len(lay.vertices)
    heap = [(-math.inf, v)]
    edges = lay.in_edges if inward else lay.out_edges
    while heap:
        w, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        if u == stop:
            break
        if not relays(lay, u, v):
            continue
        for x, e in edges[u]:
            cand = min(-w, res[e])
            if cand > width[x]:
                width[x] = cand
                heapq.heappush(heap, (-cand, x))
    return width


def widest_route(
    lay: Layout, res: list[float], src: int, dst: int, tolerance: float
) -> tuple[list[int], float] | None:
    """The widest src→dst path by directed residual `res`, fewest hops (then least delay) among
    those as wide: (its directed links, its width); None when dst is unreachable. Links narrower
    than the width by more than `tolerance` are not used."""
    width = widths(lay, res, src, stop=dst)[dst]
    if width == -math.inf:
        return None
    path = fewest_hops(lay, res, src, dst, min(width, max(width, tolerance) - tolerance))
    return (path, width) if path is not None else None


def fewest_hops(
    lay: Layout, res: list[float], src: int, dst: int, floor: float
) -> list[int] | None:
    """The fewest-hop (then least-delay) src→dst path (`relays`) over directed links with at
    least `floor` residual: its directed links, or None."""
    cost = [math.inf] * len(lay.vertices)
    via = [-1] * len(lay.vertices)
    cost[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        c, u = heapq.heappop(heap)
        if c > cost[u]:
            continue
        if u == dst:
            break
        if not relays(lay, u, src):
            continue
        for v, e in lay.out_edges[u]:
            if res[e] < floor:
                continue
            nc = c + lay.hop_cost[e]
            if nc < cost[v]:
                cost[v], via[v] = nc, e
                heapq.heappush(heap, (nc, v))
    if via[dst] < 0:
        return None
    path, v = [], dst
    while v != src:
        path.append(via[v])
        v = int(lay.src[via[v]])
    return path[::-1]
