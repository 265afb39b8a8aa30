"""The cluster file: the hosts one emulated topology is spread over (`experiments/run.py --topo T
--cluster FILE`, `lab.fabric`). An inventory like the lab's (`lab.inventory`), checked the same
way: every problem is one `InventoryError` naming the file, the field and what was expected.

    master: 192.168.50.1            # the control machine's management address (SDN app, Master)
    known_hosts: ~/.ssh/known_hosts # SSH host keys to trust (default: this one)
    master_port: 7070               # the Master (default)
    openflow_port: 6653             # the SDN app, for every host's bridges (default)
    agent_port: 7071                # a host's first agent; its i-th node's agent on agent_port + i
    tunnel: vxlan                   # vxlan (default), geneve or gre: the links between hosts
    placement: metis                # metis (default), block, round-robin or explicit
    defaults: {user: ces, port: 22, key_file: ~/.ssh/id_ed25519, underlay: eth1, underlay_mbps: 1000}
    hosts:
      - {name: h1, address: 192.168.50.11, underlay_ip: 10.99.0.11}
      - {name: h2, address: 192.168.50.12, underlay_ip: 10.99.0.12, underlay: enp3s0}

Per host: `name` (how results and messages name it), `address` (SSH and its agents' command
channels, on the management network), `port`, `user`, `key_file`, `underlay` (the interface the
tunnels to the other hosts leave by), `underlay_ip` (its address there: the other hosts'
tunnels end at it), `underlay_mbps` (what that interface carries between two hosts: the
capacity crossing hosts is checked against it; default the interface's speed as the kernel
reports it) and, with `placement: explicit`, `place` (the switches it runs, and optionally
compute nodes, which must then be those of its switches).

`load_cluster` reads the file without a topology (enough to reach the hosts: `--cleanup`);
`Layout` binds it to a topology: where every switch and node runs (`lab.placement`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from topologies import Topology

from . import placement as placing
from .inventory import (
    InventoryError,
    _address,
    _port,
    check_address_free,
    check_key_file,
    field_error,
    host_entries,
    parse_top,
    read_document,
)

TUNNELS = ("vxlan", "geneve", "gre")
# Bytes a tunnel adds to an inner Ethernet frame on the underlay, for an IPv4 underlay: outer IP
# (20) + UDP (8) + VXLAN or Geneve without options (8) + the inner Ethernet header (14); GRE with a
# key: outer IP (20) + GRE (8) + inner Ethernet (14). The inner MTU is the underlay's less this.
TUNNEL_OVERHEAD = {"vxlan": 50, "geneve": 50, "gre": 42}
# What a firewall between the hosts must let through for each kind (docs/cluster.md).
TUNNEL_PORTS = {"vxlan": "UDP 4789", "geneve": "UDP 6081", "gre": "IP protocol 47"}
DEFAULT_PLACEMENT = "metis"
HOST_FIELDS = (
    "name",
    "address",
    "port",
    "user",
    "key_file",
    "underlay",
    "underlay_ip",
    "underlay_mbps",
    "place",
)
SHARED_FIELDS = ("port", "user", "key_file", "underlay", "underlay_mbps")
TOP_FIELDS = (
    "master",
    "known_hosts",
    "master_port",
    "openflow_port",
    "agent_port",
    "tunnel",
    "placement",
    "defaults",
    "hosts",
)


@dataclass(frozen=True)
class ClusterHost:
    name: str
    address: str
    port: int
    user: str
    key_file: Path
    underlay: str
    underlay_ip: str
    underlay_mbps: float | None  # None: the interface's speed, read at the check
    place: tuple[str, ...] = ()

    def label(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"

    # `lab.ssh.Remote` names a host by these, as it names a lab host
    @property
    def node(self) -> str:
        return self.name


@dataclass(frozen=True)
class ClusterInventory:
    path: Path
    master: str
    known_hosts: Path
    master_port: int
    openflow_port: int
    agent_port: int
    tunnel: str
    placement: str
    hosts: tuple[ClusterHost, ...]

    def host(self, name: str) -> ClusterHost:
        return next(h for h in self.hosts if h.name == name)

    def fail(self, where: str, message: str) -> InventoryError:
        return field_error(self.path, where, message)


def load_cluster(path: str | Path) -> ClusterInventory:
    path = Path(path)
    return parse_cluster(read_document(path), path)


def parse_cluster(doc: Any, path: Path = Path("<cluster>")) -> ClusterInventory:
    fail = partial(field_error, path)
    master, ports, known_hosts = parse_top(doc, fail, TOP_FIELDS)
    tunnel = doc.get("tunnel", "vxlan")
    if tunnel not in TUNNELS:
        raise fail("tunnel", f"expected one of {', '.join(TUNNELS)}, got {tunnel!r}")
    rule = doc.get("placement", DEFAULT_PLACEMENT)
    if rule not in placing.RULES:
        raise fail("placement", f"expected one of {', '.join(placing.RULES)}, got {rule!r}")
    hosts: list[ClusterHost] = []
    for where, h in host_entries(
        doc, fail, HOST_FIELDS, SHARED_FIELDS, ("name", "address", "user", "key_file", "underlay")
    ):
        name = h["name"]
        if any(o.name == name for o in hosts):
            raise fail(f"{where}.name", f"'{name}' is given twice")
        address = _address(h["address"], lambda m, where=where: fail(f"{where}.address", m))
        underlay_ip = _address(
            h.get("underlay_ip"), lambda m, where=where: fail(f"{where}.underlay_ip", m)
        )
        mbps = h.get("underlay_mbps")
        if mbps is not None and (
            isinstance(mbps, bool) or not isinstance(mbps, int | float) or not mbps > 0
        ):
            raise fail(f"{where}.underlay_mbps", f"expected a positive number, got {mbps!r}")
        place = h.get("place", [])
        if not isinstance(place, list) or not all(isinstance(x, str) for x in place):
            raise fail(f"{where}.place", "expected a list of switch and node names")
        if place and rule != "explicit":
            raise fail(f"{where}.place", f"only with 'placement: explicit' (this file: {rule})")
        host = ClusterHost(
            name,
            address,
            _port(h["port"], lambda m, where=where: fail(f"{where}.port", m)),
            h["user"],
            Path(h["key_file"]).expanduser(),
            h["underlay"],
            underlay_ip,
            None if mbps is None else float(mbps),
            tuple(place),
        )
        check_address_free(host, hosts, where, fail)
        if any(o.underlay_ip == host.underlay_ip for o in hosts):
            raise fail(f"{where}.underlay_ip", f"{host.underlay_ip} is another host's too")
        if host.underlay_ip == host.address:
            raise fail(
                f"{where}.underlay_ip",
                "the management address: the tunnels need an interface of their own "
                "(on a userspace datapath it is handed to Open vSwitch for the run)",
            )
        check_key_file(host, where, fail)
        hosts.append(host)
    return ClusterInventory(
        path,
        master,
        known_hosts,
        ports["master_port"],
        ports["openflow_port"],
        ports["agent_port"],
        tunnel,
        rule,
        tuple(hosts),
    )


@dataclass
class Layout:
    """A cluster bound to a topology: where every switch and compute node runs."""

    inv: ClusterInventory
    topo: Topology
    placement: dict[str, str]  # switch or node -> host name
    rule: str
    links: dict[tuple[str, str], list] = field(default_factory=dict)  # crossing host pairs

    @classmethod
    def make(cls, inv: ClusterInventory, topo: Topology, rule: str | None = None) -> Layout:
        """Place `topo` on `inv`'s hosts by `rule` (default: the file's); an InventoryError
        naming the field when the file's explicit placement does not fit the topology."""
        rule = rule or inv.placement
        servers = [h.name for h in inv.hosts]
        given: dict[str, str] = {}
        if rule == "explicit":
            given = _explicit(inv, topo)
        try:
            placement = placing.place(topo, servers, rule, given)
        except placing.PlacementError as e:
            raise inv.fail("placement", str(e)) from None
        return cls(inv, topo, placement, rule, placing.crossing(topo, placement))

    @property
    def master(self) -> str:
        return self.inv.master

    def switches_on(self, host: str) -> list[str]:
        return [s.name for s in self.topo.switches if self.placement[s.name] == host]

    def nodes_on(self, host: str) -> list[str]:
        return [n.name for n in self.topo.nodes if self.placement[n.name] == host]

    def agent_port(self, node: str) -> int:
        """Where the agent of `node` listens on its host: the file's agent_port + its index
        among that host's nodes."""
        return self.inv.agent_port + self.nodes_on(self.placement[node]).index(node)

    def agent_addresses(self) -> dict[str, str]:
        """{compute node: the management address its agent listens on}."""
        return {n.name: self.inv.host(self.placement[n.name]).address for n in self.topo.nodes}

    def used_hosts(self) -> list[ClusterHost]:
        """The hosts something is placed on, in the file's order."""
        used = set(self.placement.values())
        return [h for h in self.inv.hosts if h.name in used]


def _explicit(inv: ClusterInventory, topo: Topology) -> dict[str, str]:
    """{switch: host} from the hosts' `place`, every compute node listed checked against its
    access switch; an InventoryError naming the field otherwise."""
    switches = {s.name for s in topo.switches}
    nodes = {n.name for n in topo.nodes}
    given: dict[str, str] = {}
    listed_nodes: dict[str, tuple[str, str]] = {}
    for i, h in enumerate(inv.hosts):
        for name in h.place:
            where = f"hosts[{i}].place"
            if name in given or name in listed_nodes:
                raise inv.fail(where, f"'{name}' is placed twice")
            if name in switches:
                given[name] = h.name
            elif name in nodes:
                listed_nodes[name] = (h.name, where)
            else:
                raise inv.fail(
                    where, f"'{name}' is neither a switch nor a compute node of '{topo.name}'"
                )
    missing = [s.name for s in topo.switches if s.name not in given]
    if missing:
        raise inv.fail(
            "placement",
            f"explicit: no host's 'place' lists switch(es) {', '.join(missing[:8])}"
            + (" ..." if len(missing) > 8 else ""),
        )
    for node, (host, where) in listed_nodes.items():
        switch = topo.access_link(node).other(node)
        if given.get(switch) != host:
            raise inv.fail(
                where,
                f"compute node '{node}' on {host} but its access switch '{switch}' on "
                f"{given.get(switch)}: a node runs with its switch",
            )
    return given
