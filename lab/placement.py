"""Where each switch and compute node of a topology runs when the emulation is spread over several
hosts (`lab.fabric`): placement rules with the interface of Mininet's cluster edition
(`mininet.examples.cluster`: a placer is made with the servers and the topology's names and
answers `place(node)`), and what a placement costs — the capacity of the links that cross hosts.

    placer = MetisPlacer(servers=["h1", "h2"], topo=topo)
    placement = {name: placer.place(name) for name in names(topo)}
    crossing(topo, placement)   # {("h1", "h2"): [links between the two hosts]}

The rules (`RULES`, the cluster file's `placement`):
- `block` (`SwitchBinPlacer`, Mininet's): the switches in the topology's order, cut into as many
  contiguous bins as there are servers, of sizes differing by at most one;
- `round-robin` (`RoundRobinPlacer`): switch i on server i mod n;
- `metis` (`MetisPlacer`): a partition of the switch graph by METIS (pymetis), as MaxiNet does:
  each link weighs its capacity, so as little capacity as possible crosses hosts, and each switch
  weighs the CPU of the compute nodes behind it (`vertex_weight`), so the hosts' CPU is balanced;
- `explicit` (`ExplicitPlacer`): the cluster file says, per host, which switches (and nodes) it
  runs.

A compute node always runs on the host of its access switch (MaxiNet's rule; Mininet's
RoundRobinPlacer also deals hosts round-robin): apart from it, every byte the node sends would
cross hosts, and its access link would need a tunnel of its own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from topologies import Link, Topology

# A switch with no compute node still forwards: it weighs as this many cores in the partition,
# so that hosts holding only switches still balance their count.
SWITCH_CORES = 0.1
METIS_SEED = 1  # the partition is the same on every run of the same inputs


class PlacementError(ValueError):
    """A placement that cannot be made (the message names what and why)."""


class Placer:
    """Mininet's `Placer`: made with the servers and the topology's names, `place(node)` answers
    the server of a node. `topo` (ours) gives the links and capacities a rule may weigh."""

    def __init__(
        self,
        servers: Sequence[str] | None = None,
        nodes: Iterable[str] | None = None,
        hosts: Iterable[str] | None = None,
        switches: Iterable[str] | None = None,
        controllers: Iterable[str] | None = None,
        links: Iterable[tuple[str, str]] | None = None,
        topo: Topology | None = None,
    ):
        self.servers = list(servers or [])
        if not self.servers:
            raise PlacementError("no servers to place on")
        self.topo = topo
        self.switches = list(switches or (topo and [s.name for s in topo.switches]) or [])
        self.hosts = list(hosts or (topo and [n.name for n in topo.nodes]) or [])
        self.nodes = list(nodes or self.hosts + self.switches)
        self.controllers = list(controllers or [])
        self.links = list(links or (topo and [(lk.a, lk.b) for lk in topo.links]) or [])
        self._switch_of = _access_switches(self.hosts, self.switches, self.links)
        self.placement: dict[str, str] = {}

    def place(self, node: str) -> str:
        if not self.placement:
            self.placement = self.place_switches()
            for h in self.hosts:
                if h not in self._switch_of:
                    raise PlacementError(f"compute node {h} is attached to no switch")
                self.placement[h] = self.placement[self._switch_of[h]]
        return self.placement[node]

    def place_switches(self) -> dict[str, str]:
        raise NotImplementedError


def _access_switches(
    hosts: list[str], switches: list[str], links: list[tuple[str, str]]
) -> dict[str, str]:
    """{compute node: the switch it hangs off} (Mininet's `switchFor`)."""
    hset, sset = set(hosts), set(switches)
    out = {}
    for a, b in links:
        if a in hset and b in sset:
            out[a] = b
        elif b in hset and a in sset:
            out[b] = a
    return out


class SwitchBinPlacer(Placer):
    """`block`: contiguous bins of switches, sizes differing by at most one (Mininet's)."""

    def place_switches(self) -> dict[str, str]:
        q, r = divmod(len(self.switches), len(self.servers))
        tickets = [s for i, s in enumerate(self.servers) for _ in range(q + (i < r))]
        return dict(zip(self.switches, tickets, strict=True))


class RoundRobinPlacer(Placer):
    """`round-robin`: switch i on server i mod n."""

    def place_switches(self) -> dict[str, str]:
        return {s: self.servers[i % len(self.servers)] for i, s in enumerate(self.switches)}


class MetisPlacer(Placer):
    """`metis`: METIS's k-way partition of the switch graph, links weighted by capacity (the cut
    it minimises is the capacity that crosses hosts) and switches by the CPU behind them (each
    part within METIS's default 3 % of an equal share, where the graph allows)."""

    def place_switches(self) -> dict[str, str]:
        if self.topo is None:
            raise PlacementError("metis: needs the topology (link capacities, node CPU)")
        if len(self.servers) == 1:
            return dict.fromkeys(self.switches, self.servers[0])
        import pymetis  # imported here: only this rule needs it

        index = {s: i for i, s in enumerate(self.switches)}
        weights: dict[tuple[int, int], int] = {}
        for lk in self.topo.links:
            if lk.a in index and lk.b in index and lk.a != lk.b:
                key = (min(index[lk.a], index[lk.b]), max(index[lk.a], index[lk.b]))
                weights[key] = weights.get(key, 0) + max(1, math.ceil(lk.bw_mbps))
        adjacency: list[list[tuple[int, int]]] = [[] for _ in self.switches]
        for (u, v), w in weights.items():
            adjacency[u].append((v, w))
            adjacency[v].append((u, w))
        starts, adjacent, eweights = [0], [], []
        for row in adjacency:
            adjacent += [v for v, _ in sorted(row)]
            eweights += [w for _, w in sorted(row)]
            starts.append(len(adjacent))
        vweights = [
            max(1, round(1000 * w)) for w in vertex_weights(self.topo, self.switches).values()
        ]
        result = pymetis.part_graph(
            len(self.servers),
            adjacency=pymetis.CSRAdjacency(starts, adjacent),
            vweights=vweights,
            eweights=eweights,
            options=pymetis.Options(seed=METIS_SEED),
        )
        parts = list(result.vertex_part)
        return {s: self.servers[parts[index[s]]] for s in self.switches}


class ExplicitPlacer(Placer):
    """`explicit`: `given` {switch: server} (every switch of the topology)."""

    def __init__(self, *args, given: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.given = dict(given or {})

    def place_switches(self) -> dict[str, str]:
        missing = [s for s in self.switches if s not in self.given]
        if missing:
            raise PlacementError(
                f"explicit placement: no server for switch(es) {', '.join(missing)}"
            )
        return {s: self.given[s] for s in self.switches}


RULES: dict[str, type[Placer]] = {
    "block": SwitchBinPlacer,
    "round-robin": RoundRobinPlacer,
    "metis": MetisPlacer,
    "explicit": ExplicitPlacer,
}


def vertex_weights(topo: Topology, switches: Iterable[str] | None = None) -> dict[str, float]:
    """{switch: cores it stands for}: the CPU of the compute nodes hanging off it, and
    `SWITCH_CORES` for its own forwarding."""
    names = list(switches) if switches is not None else [s.name for s in topo.switches]
    w = dict.fromkeys(names, SWITCH_CORES)
    for n in topo.nodes:
        sw = topo.access_link(n.name).other(n.name)
        if sw in w:
            w[sw] += n.cpu
    return w


def place(
    topo: Topology,
    servers: Sequence[str],
    rule: str | type[Placer],
    given: dict[str, str] | None = None,
) -> dict[str, str]:
    """{switch or compute node: server} by `rule` (a name of `RULES` or a Placer class)."""
    cls = RULES[rule] if isinstance(rule, str) else rule
    placer = (
        ExplicitPlacer(servers=servers, topo=topo, given=given)
        if cls is ExplicitPlacer
        else cls(servers=servers, topo=topo)
    )
    return {
        name: placer.place(name)
        for name in [s.name for s in topo.switches] + [n.name for n in topo.nodes]
    }


def crossing(topo: Topology, placement: dict[str, str]) -> dict[tuple[str, str], list[Link]]:
    """{(server a, server b) with a < b: the links between an element on a and one on b}."""
    out: dict[tuple[str, str], list[Link]] = {}
    for lk in topo.links:
        ha, hb = placement[lk.a], placement[lk.b]
        if ha != hb:
            out.setdefault((min(ha, hb), max(ha, hb)), []).append(lk)
    return out


def crossing_mbps(topo: Topology, placement: dict[str, str]) -> float:
    """The capacity of every link that crosses hosts."""
    return sum(lk.bw_mbps for links in crossing(topo, placement).values() for lk in links)


def cpu_by_server(topo: Topology, placement: dict[str, str]) -> dict[str, float]:
    """{server: cores of the compute nodes on it}."""
    out: dict[str, float] = {}
    for n in topo.nodes:
        out[placement[n.name]] = out.get(placement[n.name], 0.0) + n.cpu
    return out


def summary(topo: Topology, placement: dict[str, str], servers: Sequence[str]) -> dict:
    """What a placement costs: the capacity crossing hosts (in all and by pair, with the links),
    and per server its switches, nodes and cores."""
    pairs = crossing(topo, placement)
    cpu = cpu_by_server(topo, placement)
    return {
        "crossing_mbps": round(crossing_mbps(topo, placement), 3),
        "crossing_links": sum(len(v) for v in pairs.values()),
        "total_mbps": round(sum(lk.bw_mbps for lk in topo.links), 3),
        "pairs": {
            f"{a}-{b}": {
                "mbps": round(sum(lk.bw_mbps for lk in links), 3),
                "links": [f"{lk.a}-{lk.b}" for lk in links],
            }
            for (a, b), links in sorted(pairs.items())
        },
        "servers": {
            s: {
                "switches": sum(1 for sw in topo.switches if placement[sw.name] == s),
                "nodes": sum(1 for n in topo.nodes if placement[n.name] == s),
                "cpu": round(cpu.get(s, 0.0), 3),
            }
            for s in servers
        },
    }


def link_label(lk: Link) -> str:
    return f"{lk.a}–{lk.b}"


def pairs_of(servers: Sequence[str]) -> list[tuple[str, str]]:
    return [(min(a, b), max(a, b)) for a, b in itertools.combinations(servers, 2)]
