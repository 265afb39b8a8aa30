"""The physical network as data: compute nodes, switches, links.

A `Topology` is what every other part is built from: the testbed emulates it, the SDN app routes
over it, the scheduler models it. Port numbers and addresses are fixed here, once, so that the
emulated network, the controller and a physical switch described in a file all agree on them.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import networkx as nx

# Addresses of compute nodes on the data network (one flat L2/L3 segment, routed by the SDN app).
DATA_NETWORK = ipaddress.ip_network("10.0.0.0/16")


@dataclass(frozen=True)
class ComputeNode:
    name: str
    cpu: float  # cores: the node's CPU quota
    mem_mb: int
    gpu: int = 0
    speed: float = 1.0  # relative compute speed (1.0 = one reference core)
    ip: str = ""  # data-network address; assigned by `Topology` when empty
    mac: str = ""
    label: str = ""  # a human name (e.g. a city) when the name is synthetic


@dataclass(frozen=True)
class Switch:
    name: str
    dpid: int
    tier: str = ""  # core / aggregation / access / edge (informational)
    label: str = ""


@dataclass(frozen=True)
class Link:
    a: str
    b: str
    bw_mbps: float
    delay_ms: float = 0.0
    # OpenFlow port numbers at each end that is a switch (0 at a compute-node end).
    port_a: int = 0
    port_b: int = 0

    def port_of(self, end: str) -> int:
        return self.port_a if end == self.a else self.port_b

    def other(self, end: str) -> str:
        return self.b if end == self.a else self.a


@dataclass
class Topology:
    name: str
    nodes: list[ComputeNode]
    switches: list[Switch]
    links: list[Link]
    source: str = ""  # the file or key it was loaded from
    description: str = ""
    _graph: nx.Graph | None = field(default=None, init=False, repr=False, compare=False)

    def node(self, name: str) -> ComputeNode:
        return next(n for n in self.nodes if n.name == name)

    def switch(self, name: str) -> Switch:
        return next(s for s in self.switches if s.name == name)

    def switch_by_dpid(self, dpid: int) -> Switch:
        return next(s for s in self.switches if s.dpid == dpid)

    def links_of(self, name: str) -> list[Link]:
        return [lk for lk in self.links if name in (lk.a, lk.b)]

    def access_link(self, node: str) -> Link:
        """The one link that attaches compute node `node` to its switch."""
        return self.links_of(node)[0]

    def graph(self) -> nx.Graph:
        """The topology as an undirected networkx graph (built once, treat it as read-only).

        Node attributes: ``kind`` ('compute' or 'switch') plus the dataclass fields.
        Edge attributes: ``bw_mbps``, ``delay_ms`` and ``ports`` ({end name: port number}).
        """
        if self._graph is None:
            g = nx.Graph(name=self.name)
            for n in self.nodes:
                g.add_node(
                    n.name,
                    kind="compute",
                    cpu=n.cpu,
                    mem_mb=n.mem_mb,
                    gpu=n.gpu,
                    speed=n.speed,
                    ip=n.ip,
                    mac=n.mac,
                )
            for s in self.switches:
                g.add_node(s.name, kind="switch", dpid=s.dpid, tier=s.tier)
            for lk in self.links:
                g.add_edge(
                    lk.a,
                    lk.b,
                    bw_mbps=lk.bw_mbps,
                    delay_ms=lk.delay_ms,
                    ports={lk.a: lk.port_a, lk.b: lk.port_b},
                )
            self._graph = g
        return self._graph


def node_address(index: int) -> tuple[str, str]:
    """(ip, mac) of the compute node at position `index` of a topology's node list."""
    host = index + 1
    ip = str(DATA_NETWORK.network_address + host)
    mac = f"02:ce:00:00:{host >> 8:02x}:{host & 0xFF:02x}"
    return ip, mac
