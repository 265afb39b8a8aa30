"""The default routes of a network: where traffic nobody scheduled goes.

Between two compute nodes it takes the fewest switch hops, the wider links on ties. The SDN app
installs these routes as its per-destination default rules; the Master uses them to know which
links a best-effort job's traffic crosses. Works on any graph with node attribute `kind`
('compute' | 'switch') and link attribute `bw_mbps` (`Topology.graph()`, a scheduler `Cluster`'s).
"""

from __future__ import annotations

import networkx as nx


def access_switch(graph: nx.Graph, node: str) -> str:
    """The switch a compute node hangs on (a compute node has exactly one link)."""
    return next(iter(graph.neighbors(node)))


def paths_to(graph: nx.Graph, node: str) -> dict[str, list[str]]:
    """{switch: the default path from that switch to compute node `node`'s access switch}."""
    switches = graph.subgraph(v for v, d in graph.nodes(data=True) if d["kind"] == "switch")
    # 1 per hop plus a tie-breaker far smaller than a hop: prefer the higher-capacity link.
    paths = nx.single_source_dijkstra_path(
        switches, access_switch(graph, node), weight=lambda a, b, d: 1.0 + 1e-6 / d["bw_mbps"]
    )
    return {sw: path[::-1] for sw, path in paths.items()}


def default_path(graph: nx.Graph, src: str, dst: str) -> list[str]:
    """The switches unscheduled traffic from compute node `src` to `dst` crosses."""
    return paths_to(graph, dst)[access_switch(graph, src)]
