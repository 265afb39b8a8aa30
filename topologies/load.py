"""Loading topologies: our YAML format, GML/GraphML files, topohub's real networks, generators.

`load_topology(spec)` accepts
  - a name of a file in this folder (``campus``, ``star``, ``ring``, ``fattree``),
  - a path to a ``.yaml``/``.yml`` file in our format (see README "Topology files"),
  - a path to a ``.gml`` or ``.graphml`` file,
  - a topohub key such as ``topozoo/Abilene``, ``sndlib/polska`` or ``gabriel/100/0``,
  - a generated graph ``gen:internet:N[:SEED]`` (networkx's random Internet AS graph).
Every problem is a `TopologyError` whose message names the file, the element and what was wrong.

Graph formats describe routers only, so each graph vertex becomes a switch ``s<i>`` with one
compute node ``h<i>`` (an edge site) attached to it. Defaults for what they lack are in
`GraphDefaults` and documented in the README.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from .model import ComputeNode, Link, Switch, Topology, node_address

HERE = Path(__file__).resolve().parent
NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,15}")  # fullmatch: no trailing newline
MAX_BW_MBPS = 100_000.0


class TopologyError(ValueError):
    """A topology that cannot be loaded; the message says where and why."""


@dataclass(frozen=True)
class GraphDefaults:
    """Attributes given to graph-format topologies (GML, GraphML, topohub) that lack them."""

    node_cpu: float = 4.0
    node_mem_mb: int = 8192
    node_speed: float = 1.0
    backbone_bw_mbps: float = 1000.0  # when an edge has no capacity attribute
    access_bw_mbps: float = 1000.0  # edge site to its router
    km_per_ms: float = 200.0  # light in fibre: delay = distance / 200 km per ms


def available_topologies() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.yaml"))


def load_topology(spec: str | Path, defaults: GraphDefaults = GraphDefaults()) -> Topology:
    spec = str(spec)
    path = Path(spec)
    if spec.startswith("gen:"):
        return _generated(spec, defaults)
    if not path.exists() and (HERE / f"{spec}.yaml").exists():
        path = HERE / f"{spec}.yaml"
    if path.exists():
        suffix = path.suffix.lower()
        if suffix in (".yaml", ".yml"):
            return _from_yaml(path)
        if suffix in (".gml", ".graphml"):
            return _from_graph_file(path, defaults)
        raise TopologyError(
            f"{path}: unknown topology format '{suffix}' (expected .yaml, .yml, .gml or .graphml)"
        )
    if "/" in spec and not spec.startswith((".", "/")):
        return _from_topohub(spec, defaults)
    raise TopologyError(
        f"{spec}: no such topology file or name (known names: "
        f"{', '.join(available_topologies())}; or a .yaml/.gml/.graphml path, "
        "a topohub key like topozoo/Abilene, or gen:internet:N)"
    )


# --- our YAML format -----------------------------------------------------------------------------

NODE_KEYS = {"name", "cpu", "mem_mb", "gpu", "speed", "ip", "mac", "label"}
SWITCH_KEYS = {"name", "dpid", "tier", "label"}
LINK_KEYS = {"ends", "bw_mbps", "delay_ms", "ports"}
TOP_KEYS = {"name", "description", "defaults", "nodes", "switches", "links"}


def read_yaml(path: Path, error: type[Exception]) -> Any:
    """A YAML file's document; an unreadable or invalid file raises `error` naming the file (the
    loaders of topologies, jobs and scenarios each have their own error type)."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror}") from None
    except (yaml.YAMLError, ValueError) as e:  # ValueError: bad UTF-8, a date like 2020-13-45
        raise error(f"{path}: not valid YAML: {e}") from None
    except RecursionError:
        raise error(f"{path}: not valid YAML: nested too deeply") from None


def is_number(value: Any) -> bool:
    """A YAML/JSON number usable as a float: not a bool, not nan or ±inf, and (an integer) not
    beyond the float range."""
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and -sys.float_info.max < value < sys.float_info.max
    )


def _from_yaml(path: Path) -> Topology:
    return parse_topology(read_yaml(path, TopologyError), str(path), default_name=path.stem)


def parse_topology(doc: Any, where: str, default_name: str = "topology") -> Topology:
    """Validate a topology document (already parsed YAML) and build the `Topology`."""
    if not isinstance(doc, dict):
        raise TopologyError(f"{where}: expected a mapping with 'nodes', 'switches' and 'links'")
    _no_unknown(doc, TOP_KEYS, where, "top level")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise TopologyError(f"{where}: defaults: expected a mapping like {{bw_mbps: 100}}")
    _no_unknown(defaults, {"bw_mbps", "delay_ms"}, where, "defaults")

    raw_nodes = _list(doc, "nodes", where)
    raw_switches = _list(doc, "switches", where)
    raw_links = _list(doc, "links", where)
    seen: set[str] = set()

    switches = []
    for i, s in enumerate(raw_switches):
        el = _element("switches", i, s)
        _mapping(s, where, el)
        _no_unknown(s, SWITCH_KEYS, where, el)
        name = _name(s, where, el, seen)
        dpid = _dpid(s.get("dpid", i + 1), where, el)
        switches.append(Switch(name, dpid, str(s.get("tier", "")), str(s.get("label", ""))))
    dpids = [s.dpid for s in switches]
    if len(set(dpids)) != len(dpids):
        dup = next(d for d in dpids if dpids.count(d) > 1)
        raise TopologyError(f"{where}: switches: dpid {dup} is used by more than one switch")

    nodes = []
    for i, n in enumerate(raw_nodes):
        el = _element("nodes", i, n)
        _mapping(n, where, el)
        _no_unknown(n, NODE_KEYS, where, el)
        name = _name(n, where, el, seen)
        ip, mac = node_address(i)
        nodes.append(
            ComputeNode(
                name=name,
                cpu=_number(n, "cpu", where, el, required=True, low=0.01),
                mem_mb=int(_number(n, "mem_mb", where, el, required=True, low=16)),
                gpu=int(_number(n, "gpu", where, el, default=0, low=0)),
                speed=_number(n, "speed", where, el, default=1.0, low=0.01),
                ip=str(n.get("ip", ip)),
                mac=str(n.get("mac", mac)),
                label=str(n.get("label", "")),
            )
        )

    kinds = {s.name: "switch" for s in switches} | {n.name: "compute" for n in nodes}
    next_port = {s.name: 1 for s in switches}
    used_ports: dict[str, set[int]] = {s.name: set() for s in switches}
    links = []
    for i, lk in enumerate(raw_links):
        el = f"links[{i}]"
        _mapping(lk, where, el)
        _no_unknown(lk, LINK_KEYS, where, el)
        ends = lk.get("ends")
        if not (
            isinstance(ends, list) and len(ends) == 2 and all(isinstance(e, str) for e in ends)
        ):
            raise TopologyError(f"{where}: {el}: 'ends' must be a list of two names, got {ends!r}")
        a, b = ends
        for e in ends:
            if e not in kinds:
                raise TopologyError(f"{where}: {el}: unknown endpoint '{e}' (not a node or switch)")
        if a == b:
            raise TopologyError(f"{where}: {el}: a link from '{a}' to itself")
        if kinds[a] == kinds[b] == "compute":
            raise TopologyError(
                f"{where}: {el}: compute nodes '{a}' and '{b}' must connect through a switch"
            )
        bw = _number(
            lk,
            "bw_mbps",
            where,
            el,
            default=defaults.get("bw_mbps"),
            required=True,
            low=0.001,
            high=MAX_BW_MBPS,
        )
        delay = _number(lk, "delay_ms", where, el, default=defaults.get("delay_ms", 0.0), low=0)
        ports = lk.get("ports", [None, None])
        if not (isinstance(ports, list) and len(ports) == 2):
            raise TopologyError(f"{where}: {el}: 'ports' must be [port at {a}, port at {b}]")
        resolved = []
        for end, port in zip((a, b), ports):
            if kinds[end] == "compute":
                resolved.append(0)
                continue
            if port is None:
                while next_port[end] in used_ports[end]:
                    next_port[end] += 1
                port = next_port[end]
            elif not isinstance(port, int) or isinstance(port, bool) or port < 1:
                raise TopologyError(
                    f"{where}: {el}: port at '{end}' must be an integer ≥ 1, got {port!r}"
                )
            if port in used_ports[end]:
                raise TopologyError(f"{where}: {el}: port {port} of switch '{end}' is already used")
            used_ports[end].add(port)
            resolved.append(port)
        links.append(Link(a, b, bw, delay, resolved[0], resolved[1]))

    for n in nodes:
        attached = [lk for lk in links if n.name in (lk.a, lk.b)]
        if len(attached) != 1:
            raise TopologyError(
                f"{where}: node '{n.name}': must have exactly one link to a "
                f"switch, has {len(attached)}"
            )
    topo = Topology(
        str(doc.get("name", default_name)),
        nodes,
        switches,
        links,
        source=where,
        description=str(doc.get("description", "")),
    )
    if not nodes:
        raise TopologyError(f"{where}: nodes: a topology needs at least one compute node")
    if not nx.is_connected(topo.graph()):
        parts = sorted(sorted(c) for c in nx.connected_components(topo.graph()))
        raise TopologyError(
            f"{where}: links: the network is not connected; separate parts: "
            + "; ".join(", ".join(p[:5]) + (" ..." if len(p) > 5 else "") for p in parts)
        )
    return topo


def topology_document(topo: Topology) -> dict:
    """The YAML document of `topo`: `parse_topology` of it gives `topo` back (names, capacities,
    delays, dpids, ports, addresses), so a topology made in code can be handed to another
    process as a file."""

    def some(**fields: Any) -> dict:
        return {k: v for k, v in fields.items() if v not in ("", None)}

    return some(name=topo.name, description=topo.description) | {
        "switches": [
            some(name=s.name, dpid=s.dpid, tier=s.tier, label=s.label) for s in topo.switches
        ],
        "nodes": [
            some(
                name=n.name,
                cpu=n.cpu,
                mem_mb=n.mem_mb,
                gpu=n.gpu,
                speed=n.speed,
                ip=n.ip,
                mac=n.mac,
                label=n.label,
            )
            for n in topo.nodes
        ],
        "links": [
            {
                "ends": [lk.a, lk.b],
                "bw_mbps": lk.bw_mbps,
                "delay_ms": lk.delay_ms,
                "ports": [lk.port_a or None, lk.port_b or None],
            }
            for lk in topo.links
        ],
    }


def _list(doc: dict, key: str, where: str) -> list:
    value = doc.get(key)
    if value is None:
        raise TopologyError(f"{where}: '{key}' is missing (expected a list)")
    if not isinstance(value, list):
        raise TopologyError(f"{where}: '{key}' must be a list, got {type(value).__name__}")
    return value


def _element(kind: str, i: int, item: Any) -> str:
    name = item.get("name") if isinstance(item, dict) else None
    return f"{kind}[{i}]" + (f" '{name}'" if isinstance(name, str) else "")


def _mapping(item: Any, where: str, el: str) -> None:
    if not isinstance(item, dict):
        raise TopologyError(f"{where}: {el}: expected a mapping, got {item!r}")


def _no_unknown(item: dict, allowed: set[str], where: str, el: str) -> None:
    unknown = sorted(str(k) for k in set(item) - allowed)  # YAML keys need not be strings
    if unknown:
        raise TopologyError(
            f"{where}: {el}: unknown field '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})"
        )


def _name(item: dict, where: str, el: str, seen: set[str]) -> str:
    name = item.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise TopologyError(
            f"{where}: {el}: 'name' must be a letter followed by up to 15 "
            f"letters, digits or '_', got {name!r}"
        )
    if name in seen:
        raise TopologyError(f"{where}: {el}: name '{name}' is used twice")
    seen.add(name)
    return name


def _number(
    item: dict,
    key: str,
    where: str,
    el: str,
    default: Any = None,
    required: bool = False,
    low: float | None = None,
    high: float | None = None,
) -> float:
    value = item.get(key, default)
    if value is None:
        if required:
            raise TopologyError(f"{where}: {el}: '{key}' is missing (expected a number)")
        return 0.0
    if not is_number(value):
        raise TopologyError(f"{where}: {el}: '{key}' must be a number, got {value!r}")
    if low is not None and value < low:
        raise TopologyError(f"{where}: {el}: '{key}' must be ≥ {low}, got {value}")
    if high is not None and value > high:
        raise TopologyError(f"{where}: {el}: '{key}' must be ≤ {high}, got {value}")
    return float(value)


def _dpid(value: Any, where: str, el: str) -> int:
    """A datapath id given as an integer, '0x..' hex, or 'aa:bb:..' colon form."""
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, int):
            dpid = value
        elif isinstance(value, str):
            dpid = int(value.replace(":", ""), 16) if ":" in value else int(value, 0)
        else:
            raise ValueError
    except ValueError:
        raise TopologyError(
            f"{where}: {el}: 'dpid' must be an integer, '0x..' or '00:00:..:01', got {value!r}"
        ) from None
    if not 0 < dpid < 2**64:
        raise TopologyError(f"{where}: {el}: 'dpid' must be between 1 and 2^64-1, got {dpid}")
    return dpid


# --- graph formats -------------------------------------------------------------------------------


def _from_graph_file(path: Path, defaults: GraphDefaults) -> Topology:
    try:
        g = (
            nx.read_gml(path, label="id")
            if path.suffix.lower() == ".gml"
            else nx.read_graphml(path)
        )
    except (nx.NetworkXError, OSError, ValueError, SyntaxError) as e:
        raise TopologyError(f"{path}: cannot read {path.suffix[1:].upper()}: {e}") from None
    return from_graph(g, str(path), path.stem, defaults)


def _from_topohub(key: str, defaults: GraphDefaults) -> Topology:
    import topohub

    try:
        data = topohub.get(key)
    except (KeyError, FileNotFoundError, OSError):
        raise TopologyError(
            f"{key}: not a topohub topology (examples: topozoo/Abilene, "
            "sndlib/polska, gabriel/100/0)"
        ) from None
    return from_graph(
        nx.node_link_graph(data, edges="edges"), f"topohub:{key}", key.replace("/", "-"), defaults
    )


def _generated(spec: str, defaults: GraphDefaults) -> Topology:
    parts = spec.split(":")
    try:
        kind, n, seed = parts[1], int(parts[2]), int(parts[3]) if len(parts) > 3 else 0
        if kind != "internet" or n < 2:
            raise ValueError
    except (IndexError, ValueError):
        raise TopologyError(f"{spec}: expected gen:internet:N[:SEED] with N ≥ 2") from None
    return from_graph(nx.random_internet_as_graph(n, seed=seed), spec, f"internet{n}", defaults)


def from_graph(g: nx.Graph, where: str, name: str, defaults: GraphDefaults) -> Topology:
    """A router graph → a topology with one edge site (compute node) per router."""
    g = nx.Graph(g)  # collapse multigraph edges
    g.remove_edges_from(nx.selfloop_edges(g))
    if g.number_of_nodes() == 0:
        raise TopologyError(f"{where}: the graph has no nodes")
    if not nx.is_connected(g):
        # Real topologies sometimes list isolated sites; keep the largest connected part.
        g = g.subgraph(max(nx.connected_components(g), key=len)).copy()
    index = {v: i for i, v in enumerate(g.nodes)}
    switches, nodes, links = [], [], []
    port = dict.fromkeys(g.nodes, 0)

    def next_port(v: Any) -> int:
        port[v] += 1
        return port[v]

    for v, i in index.items():
        attrs = g.nodes[v]
        label = str(attrs.get("name", attrs.get("label", v)))
        switches.append(Switch(f"s{i}", i + 1, "edge", label))
        ip, mac = node_address(i)
        nodes.append(
            ComputeNode(
                f"h{i}",
                defaults.node_cpu,
                defaults.node_mem_mb,
                0,
                defaults.node_speed,
                ip,
                mac,
                label,
            )
        )
        links.append(Link(f"h{i}", f"s{i}", defaults.access_bw_mbps, 0.0, 0, next_port(v)))
    for u, v, attrs in g.edges(data=True):
        links.append(
            Link(
                f"s{index[u]}",
                f"s{index[v]}",
                _capacity(attrs, defaults),
                _delay(g, u, v, attrs, defaults),
                next_port(u),
                next_port(v),
            )
        )
    return Topology(
        name,
        nodes,
        switches,
        links,
        source=where,
        description=f"{where}: {len(switches)} routers, one edge site each",
    )


def _capacity(attrs: dict, defaults: GraphDefaults) -> float:
    for key, scale in (("bw_mbps", 1.0), ("capacity", 1.0), ("LinkSpeedRaw", 1e-6)):
        value = attrs.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return min(float(value) * scale, MAX_BW_MBPS)
    return defaults.backbone_bw_mbps


def _delay(g: nx.Graph, u: Any, v: Any, attrs: dict, defaults: GraphDefaults) -> float:
    if isinstance(attrs.get("delay_ms"), (int, float)):
        return float(attrs["delay_ms"])
    km = attrs.get("dist")
    if not isinstance(km, (int, float)):
        km = _haversine_km(g.nodes[u], g.nodes[v])
    return round(km / defaults.km_per_ms, 3) if km else 0.0


def _haversine_km(a: dict, b: dict) -> float | None:
    def lonlat(n: dict) -> tuple[float, float] | None:
        if isinstance(n.get("pos"), (list, tuple)):
            return float(n["pos"][0]), float(n["pos"][1])
        if isinstance(n.get("Longitude"), (int, float)) and isinstance(
            n.get("Latitude"), (int, float)
        ):
            return float(n["Longitude"]), float(n["Latitude"])
        return None

    pa, pb = lonlat(a), lonlat(b)
    if pa is None or pb is None:
        return None
    (lon1, lat1), (lon2, lat2) = (map(math.radians, pa)), (map(math.radians, pb))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * 6371.0 * math.asin(math.sqrt(h))
