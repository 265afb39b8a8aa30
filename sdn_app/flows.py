"""Scheduled flows as data: parsing a job's flow request against the topology, and the OpenFlow
rules and meters that make the network carry it. Pure logic, no framework imports.

A scheduled flow is directional (src → dst, optionally narrowed to TCP ports), follows an explicit
path of switches, and is policed by one meter at its first switch. A `symmetric` flow also takes
the traffic that answers it (dst → src: its TCP acknowledgements) back along the same switches,
unmetered and below any flow scheduled that way: left to the default routes, a job's
acknowledgements could cross a link another tenant fills and hold the flow back, however wide
its own path. Unscheduled traffic follows proactive per-destination default rules, which also
keep every packet deliverable while a job's path is being replaced.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from protocol.dilation import NONE, Dilation
from protocol.http import ApiError
from topologies import Topology
from topologies.routes import paths_to

ETH_IPV4 = 0x0800
ETH_ARP = 0x0806
ETH_LLDP = 0x88CC
LLDP_MAC = "01:80:c2:00:00:0e"  # nearest bridge: LLDP frames are never forwarded
OFPP_CONTROLLER = 0xFFFFFFFD
IPPROTO_TCP = 6

PRIORITY_DEFAULT = 10  # per-destination forwarding of unscheduled traffic
PRIORITY_LLDP = 0xFFFF
PRIORITY_FLOW = 100  # + 10 per TCP port given: a narrower flow wins over a host-pair flow
PRIORITY_RETURN = 90  # + 3 per TCP port: a symmetric flow's way back, below every scheduled flow

# Cookies mark who owns an entry: 0xce50… the defaults, 0xce51|job(24 bits)|flow(24 bits) job flows,
# 0xce53|job|flow their ways back — one bit apart, so that one request masked with
# COOKIE_COUNTED_MASK reads the counters of both and none of the defaults'.
COOKIE_DEFAULT = 0xCE50 << 48
COOKIE_JOB = 0xCE51 << 48
COOKIE_RETURN = 0xCE53 << 48
COOKIE_COUNTED_MASK = 0xFFFD << 48
MAX_SEQ = (1 << 24) - 1

MAX_METER_ID = 0xFFFF0000  # OFPM_MAX
MAX_RATE_MBPS = 100_000.0
MIN_RATE_MBPS = 0.001  # a meter's unit is 1 kbit/s
MAX_FLOWS_PER_JOB = 20_000
MAX_NAME = 1024  # a flow's free-form label (e.g. the jobs sharing it)
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # fullmatch: no trailing newline
FLOW_KEYS = ("src", "dst", "path", "rate_mbps", "tcp_src", "tcp_dst", "name", "symmetric")


class RequestError(ApiError, ValueError):
    """A request the app refuses; nothing was changed. `status` is the HTTP status to answer."""

    def __init__(self, message: str, field: str = "", status: int = 400):
        super().__init__(status, message, field)


FlowKey = tuple[str, str, "int | None", "int | None"]  # src, dst, tcp_src, tcp_dst


@dataclass(frozen=True)
class FlowSpec:
    """One scheduled flow of a job, validated against the topology (names, not addresses)."""

    src: str
    dst: str
    path: tuple[str, ...]  # switch names; the src's access switch first, the dst's last
    rate_mbps: float
    tcp_src: int | None = None
    tcp_dst: int | None = None
    name: str = ""
    symmetric: bool = False  # dst → src (the acknowledgements) back along the same switches

    @property
    def key(self) -> FlowKey:
        """What identifies the flow in the network: two flows with one key would share entries."""
        return self.src, self.dst, self.tcp_src, self.tcp_dst

    def describe(self) -> str:
        ports = "".join(
            f" {k}={v}"
            for k, v in (("tcp_src", self.tcp_src), ("tcp_dst", self.tcp_dst))
            if v is not None
        )
        return f"{self.src}->{self.dst}{ports}"

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "src": self.src,
            "dst": self.dst,
            "path": list(self.path),
            "rate_mbps": self.rate_mbps,
        }
        for k in ("tcp_src", "tcp_dst"):
            if getattr(self, k) is not None:
                doc[k] = getattr(self, k)
        if self.name:
            doc["name"] = self.name
        if self.symmetric:
            doc["symmetric"] = True
        return doc


@dataclass(frozen=True)
class Rule:
    """One flow entry in table 0 of switch `dpid`."""

    dpid: int
    priority: int
    match: tuple[tuple[str, int | str], ...]  # OXM field → value, as OFPMatch(**dict(match)) takes
    out_port: int
    meter_id: int = 0  # 0: no meter instruction
    cookie: int = 0
    # where traffic enters a path (`_path_rules`): installed after the path's other entries
    # (`plan_change`), as a metered entry always is
    entry: bool = False

    @property
    def key(self) -> tuple[int, int, tuple]:
        """Entries with the same key overwrite each other (OpenFlow's identity of an entry)."""
        return self.dpid, self.priority, self.match


@dataclass(frozen=True)
class Meter:
    dpid: int
    meter_id: int
    rate_kbps: int
    burst_kbit: int


@dataclass(frozen=True)
class MeterPolicy:
    """How a granted rate becomes a meter (a drop band). The burst decides what TCP gets: with
    0.1 s of traffic it collapses to ~0.5-0.7 R, 0.25 s gives ~0.97 R, 0.5 s gives 0.92-1.0 R, and
    1 s overshoots (1.06 R over 8 s: the full bucket is extra) — measured on the userspace
    datapath, see docs/sdn_app.md."""

    burst_s: float = 0.5
    min_burst_kbit: int = 64
    dilation: Dilation = NONE  # the emulation's (protocol.dilation): the meter runs at rate ÷ K

    def params(self, rate_mbps: float) -> tuple[int, int]:
        """(rate in kbit/s, burst in kbit) of the meter for a flow granted `rate_mbps`. Under
        dilation the burst is the same bits (burst_s emulated seconds at the granted rate, K times
        as many host seconds at the meter's rate), as an HTB class keeps its bytes (edge.tc)."""
        rate_kbps = max(1, round(self.dilation.host_mbps(rate_mbps) * 1000))
        burst_kbit = math.ceil(max(1, round(rate_mbps * 1000)) * self.burst_s)
        return rate_kbps, max(self.min_burst_kbit, burst_kbit)


# --- parsing -------------------------------------------------------------------------------------


def parse_job_id(text: str) -> str:
    if not JOB_ID_RE.fullmatch(text):
        raise RequestError(
            "a job id is 1-64 letters, digits, '_', '.' or '-', starting with a "
            f"letter or digit; got {text!r}",
            "job",
        )
    return text


def parse_flows(doc: Any, topo: Topology) -> list[FlowSpec]:
    """Validate a `{"flows": [...]}` document completely; the first problem is a `RequestError`."""
    if not isinstance(doc, dict):
        raise RequestError('expected a JSON object like {"flows": [...]}')
    unknown = sorted(set(doc) - {"flows"})
    if unknown:
        raise RequestError("unknown field (allowed: flows)", unknown[0])
    flows = doc.get("flows")
    if not isinstance(flows, list):
        raise RequestError("expected a list of flows", "flows")
    if len(flows) > MAX_FLOWS_PER_JOB:
        raise RequestError(f"at most {MAX_FLOWS_PER_JOB} flows per job, got {len(flows)}", "flows")
    resolver = _Resolver(topo)
    specs: list[FlowSpec] = []
    seen: dict[FlowKey, int] = {}
    for i, item in enumerate(flows):
        spec = parse_flow(item, resolver, f"flows[{i}]")
        if spec.key in seen:
            raise RequestError(
                f"same src, dst and TCP ports as flows[{seen[spec.key]}] ({spec.describe()})",
                f"flows[{i}]",
            )
        seen[spec.key] = i
        specs.append(spec)
    return specs


def parse_flow(item: Any, resolver: _Resolver, where: str) -> FlowSpec:
    if not isinstance(item, dict):
        raise RequestError("expected an object with src, dst, path and rate_mbps", where)
    unknown = sorted(set(item) - set(FLOW_KEYS))
    if unknown:
        raise RequestError(
            f"unknown field (allowed: {', '.join(FLOW_KEYS)})", f"{where}.{unknown[0]}"
        )
    for key in ("src", "dst", "path", "rate_mbps"):
        if key not in item:
            raise RequestError("missing", f"{where}.{key}")
    src = resolver.node(item["src"], f"{where}.src")
    dst = resolver.node(item["dst"], f"{where}.dst")
    if src == dst:
        raise RequestError(f"src and dst are the same node '{src}'", where)
    rate = item["rate_mbps"]
    if (
        isinstance(rate, bool)
        or not isinstance(rate, (int, float))
        or not MIN_RATE_MBPS <= rate <= MAX_RATE_MBPS
    ):  # also refuses nan and inf
        raise RequestError(
            f"expected a number from {MIN_RATE_MBPS} to {MAX_RATE_MBPS:g}, got {rate!r}",
            f"{where}.rate_mbps",
        )
    ports = {k: _tcp_port(item.get(k), f"{where}.{k}") for k in ("tcp_src", "tcp_dst")}
    name = item.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME:
        raise RequestError(f"expected a string of at most {MAX_NAME} characters", f"{where}.name")
    symmetric = item.get("symmetric", False)
    if not isinstance(symmetric, bool):
        raise RequestError(f"expected true or false, got {symmetric!r}", f"{where}.symmetric")
    path = resolver.path(item["path"], src, dst, f"{where}.path")
    return FlowSpec(
        src, dst, path, float(rate), ports["tcp_src"], ports["tcp_dst"], name, symmetric
    )


def _tcp_port(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise RequestError(f"expected a TCP port 1-65535, got {value!r}", where)
    return value


class _Resolver:
    """Names, addresses and dpids of one topology → canonical names, with path checks."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.graph = topo.graph()
        self.switch_names = {s.name for s in topo.switches}
        self.by_dpid = {s.dpid: s.name for s in topo.switches}
        self.nodes = {n.name: n.name for n in topo.nodes} | {n.ip: n.name for n in topo.nodes}
        self.access = {n.name: topo.access_link(n.name).other(n.name) for n in topo.nodes}

    def node(self, value: Any, where: str) -> str:
        if isinstance(value, str) and value in self.nodes:
            return self.nodes[value]
        raise RequestError(
            f"unknown compute node {value!r} (expected a node name or its IP "
            f"in topology '{self.topo.name}')",
            where,
        )

    def switch(self, value: Any, where: str) -> str:
        if isinstance(value, str) and value in self.switch_names:
            return value
        dpid = parse_dpid(value)
        if dpid is not None and dpid in self.by_dpid:
            return self.by_dpid[dpid]
        hint = (
            " (a compute node, not a switch)"
            if isinstance(value, str) and value in self.nodes
            else ""
        )
        raise RequestError(
            f"unknown switch {value!r}{hint} (expected a switch name or dpid "
            f"in topology '{self.topo.name}')",
            where,
        )

    def path(self, value: Any, src: str, dst: str, where: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not value:
            raise RequestError("expected a non-empty list of switch names or dpids", where)
        path = [self.switch(v, f"{where}[{i}]") for i, v in enumerate(value)]
        for i, (a, b) in enumerate(itertools.pairwise(path)):
            if not self.graph.has_edge(a, b):
                raise RequestError(
                    f"not contiguous: no link between '{a}' and '{b}'", f"{where}[{i + 1}]"
                )
        if len(set(path)) != len(path):
            twice = next(s for s in path if path.count(s) > 1)
            raise RequestError(f"visits switch '{twice}' twice", where)
        if path[0] != self.access[src]:
            raise RequestError(
                f"must start at '{self.access[src]}', the switch of src '{src}', not '{path[0]}'",
                f"{where}[0]",
            )
        if path[-1] != self.access[dst]:
            raise RequestError(
                f"must end at '{self.access[dst]}', the switch of dst '{dst}', not '{path[-1]}'",
                f"{where}[{len(path) - 1}]",
            )
        return tuple(path)


def parse_dpid(value: Any) -> int | None:
    """A dpid given as an integer, a '0x..' / decimal string, or the '00:00:..:01' colon form."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str) or not value or not value[0].isdigit():
        return None  # switch names start with a letter, so they never parse as dpids
    try:
        return int(value.replace(":", ""), 16) if ":" in value else int(value, 0)
    except ValueError:
        return None


# --- rules ---------------------------------------------------------------------------------------


def flow_match(
    spec: FlowSpec, topo: Topology, back: bool = False
) -> tuple[tuple[str, int | str], ...]:
    """The flow's packets, or with `back` those that answer them (ends and ports swapped)."""
    src, dst, tcp_src, tcp_dst = (
        spec.key if not back else (spec.dst, spec.src, spec.tcp_dst, spec.tcp_src)
    )
    fields: list[tuple[str, int | str]] = [
        ("eth_type", ETH_IPV4),
        ("ipv4_src", topo.node(src).ip),
        ("ipv4_dst", topo.node(dst).ip),
    ]
    if tcp_src is not None or tcp_dst is not None:
        fields.append(("ip_proto", IPPROTO_TCP))
        fields += [(k, v) for k, v in (("tcp_src", tcp_src), ("tcp_dst", tcp_dst)) if v is not None]
    return tuple(fields)


def _ports(spec: FlowSpec) -> int:
    return sum(p is not None for p in (spec.tcp_src, spec.tcp_dst))


def flow_priority(spec: FlowSpec) -> int:
    return PRIORITY_FLOW + 10 * _ports(spec)


def job_cookie(job_seq: int, flow_no: int, kind: int = COOKIE_JOB) -> int:
    return kind | (job_seq & MAX_SEQ) << 24 | (flow_no & MAX_SEQ)


def _path_rules(
    topo: Topology, hops: list[str], match: tuple, priority: int, cookie: int, meter_id: int = 0
) -> list[Rule]:
    """One entry per switch of `hops` (switches, then the compute node they deliver to), each
    forwarding to the next; the first is the path's entry and applies `meter_id`."""
    g = topo.graph()
    return [
        Rule(
            topo.switch(here).dpid,
            priority,
            match,
            g.edges[here, nxt]["ports"][here],
            meter_id if i == 0 else 0,
            cookie,
            entry=i == 0,
        )
        for i, (here, nxt) in enumerate(itertools.pairwise(hops))
    ]


def flow_rules(spec: FlowSpec, topo: Topology, cookie: int, meter_id: int) -> list[Rule]:
    """One entry per switch of the path; the first one also applies the flow's meter."""
    return _path_rules(
        topo,
        list(spec.path) + [spec.dst],
        flow_match(spec, topo),
        flow_priority(spec),
        cookie,
        meter_id,
    )


def return_rules(spec: FlowSpec, topo: Topology, cookie: int) -> list[Rule]:
    """A symmetric flow's way back: dst → src along its switches in reverse, one unmetered entry
    per switch, below every scheduled flow (`PRIORITY_RETURN`; a narrower way back above a wider
    one) (none for a flow that is not symmetric)."""
    if not spec.symmetric:
        return []
    return _path_rules(
        topo,
        list(spec.path[::-1]) + [spec.src],
        flow_match(spec, topo, back=True),
        PRIORITY_RETURN + 3 * _ports(spec),
        cookie,
    )


def job_rules(
    spec: FlowSpec, topo: Topology, job_seq: int, flow_no: int, meter_id: int
) -> tuple[list[Rule], list[Rule]]:
    """A job's flow as entries: its path (`flow_rules`) and its way back (`return_rules`), each
    with its own cookie."""
    return (
        flow_rules(spec, topo, job_cookie(job_seq, flow_no), meter_id),
        return_rules(spec, topo, job_cookie(job_seq, flow_no, COOKIE_RETURN)),
    )


def default_rules(topo: Topology) -> list[Rule]:
    """Per-destination IPv4 and ARP forwarding along the default paths
    (`topologies.routes.paths_to`). ARP
    requests go to the target host itself rather than being flooded or answered by the
    controller, so hosts learn their peers' real MACs and ARP keeps working while the controller
    is down."""
    g = topo.graph()
    rules = []
    for node in topo.nodes:
        for sw_name, path in paths_to(g, node.name).items():
            nxt = path[1] if len(path) > 1 else node.name
            port = g.edges[sw_name, nxt]["ports"][sw_name]
            dpid = topo.switch(sw_name).dpid
            rules.append(
                Rule(
                    dpid,
                    PRIORITY_DEFAULT,
                    (("eth_type", ETH_IPV4), ("ipv4_dst", node.ip)),
                    port,
                    0,
                    COOKIE_DEFAULT,
                )
            )
            rules.append(
                Rule(
                    dpid,
                    PRIORITY_DEFAULT,
                    (("eth_type", ETH_ARP), ("arp_tpa", node.ip)),
                    port,
                    0,
                    COOKIE_DEFAULT,
                )
            )
    return rules


def lldp_rules(topo: Topology) -> list[Rule]:
    """LLDP frames to the controller, on every switch (only when link discovery runs)."""
    return [
        Rule(
            s.dpid,
            PRIORITY_LLDP,
            (("eth_type", ETH_LLDP), ("eth_dst", LLDP_MAC)),
            OFPP_CONTROLLER,
            0,
            COOKIE_DEFAULT,
        )
        for s in topo.switches
    ]


# --- changes ------------------------------------------------------------------------------------


@dataclass
class Plan:
    """The messages that turn one switch state into another, in a safe order:
    `meters` and `prepare` (entries that do not steer traffic yet) → barrier →
    `steer` (first-switch entries: traffic moves onto the new path only now) → barrier →
    `remove` (entries no longer wanted), then `meters_remove` → barrier."""

    meters_add: list[Meter] = field(default_factory=list)
    meters_modify: list[Meter] = field(default_factory=list)
    prepare: list[Rule] = field(default_factory=list)
    steer: list[Rule] = field(default_factory=list)
    remove: list[Rule] = field(default_factory=list)
    meters_remove: list[Meter] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not any(
            (
                self.meters_add,
                self.meters_modify,
                self.prepare,
                self.steer,
                self.remove,
                self.meters_remove,
            )
        )

    def dpids(self) -> set[int]:
        items: Iterable[Rule | Meter] = [
            *self.meters_add,
            *self.meters_modify,
            *self.prepare,
            *self.steer,
            *self.remove,
            *self.meters_remove,
        ]
        return {x.dpid for x in items}


def plan_change(
    old_rules: Iterable[Rule],
    old_meters: Iterable[Meter],
    new_rules: Iterable[Rule],
    new_meters: Iterable[Meter],
) -> Plan:
    old_r = {r.key: r for r in old_rules}
    new_r = {r.key: r for r in new_rules}
    old_m = {(m.dpid, m.meter_id): m for m in old_meters}
    new_m = {(m.dpid, m.meter_id): m for m in new_meters}
    plan = Plan()
    for key, m in new_m.items():
        if key not in old_m:
            plan.meters_add.append(m)
        elif old_m[key] != m:
            plan.meters_modify.append(m)  # a rate change: same meter, modified in place
    for key, r in new_r.items():
        if old_r.get(key) != r:  # OFPFC_ADD of an existing key replaces its actions in place
            (plan.steer if r.meter_id or r.entry else plan.prepare).append(r)
    plan.remove = [r for key, r in old_r.items() if key not in new_r]
    plan.meters_remove = [m for key, m in old_m.items() if key not in new_m]
    return plan
