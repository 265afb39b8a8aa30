"""Topologies: the data (YAML files in this folder) and the one loader every part uses."""

from .load import (
    GraphDefaults,
    TopologyError,
    available_topologies,
    from_graph,
    is_number,
    load_topology,
    parse_topology,
    read_yaml,
    topology_document,
)
from .model import ComputeNode, Link, Switch, Topology, node_address

__all__ = [
    "ComputeNode",
    "GraphDefaults",
    "Link",
    "Switch",
    "Topology",
    "TopologyError",
    "available_topologies",
    "from_graph",
    "is_number",
    "load_topology",
    "node_address",
    "parse_topology",
    "read_yaml",
    "topology_document",
]
