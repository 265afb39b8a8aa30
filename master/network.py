"""The Network Controller: the network view and the enforcement of flow decisions.

View: the cluster's link capacities and reservations (the Master's `Cluster`), plus the measured
utilisation and state of every directed link (from the SDN app's statistics and port status).
Traffic the Master did not schedule (other tenants, background, best-effort jobs) is estimated per
directed link as measured minus granted and reserved in the view the Scheduler decides on, so a
network-aware algorithm sees it; a link that is down has nothing left.

Runtime adjustment: `contended` names the links where the grants no longer fit — the link is
down, its capacity fell below them, or unscheduled traffic leaves them less than `HEADROOM` of the
link — so that the Master can re-route the jobs that use them.

Work-conserving rates (`spare`, on by default): a grant is what a flow is guaranteed, and what the
view reserves; capacity nobody is guaranteed is not left idle. Every scheduled pair gets, on top
of its grants, a share of the spare capacity of its path — each link's `GRANTABLE` share less its
grants and its unscheduled traffic — by weighted max-min fairness with the grants as weights (a
job's flows keep the ratio its decision gave them, so its collective still finishes together). The
shares are recomputed whenever the grants change (a job starts, ends or is re-routed) and when the
unscheduled traffic moves them by more than `SPARE_STEP`; they are what the meters and the
senders' tc classes let through. A demand says what a job needs to run at the pace its decision
planned, not what it could use: a ring's iteration shortens with every Mbit/s it gets.

Unscheduled traffic on a link is what the link carries less what the scheduled pairs' flow entries
count (the SDN app's per-flow counters), so a grant left unused does not hide another tenant. A
pair whose last job ended counts as scheduled until `SETTLE_READINGS` link readings asked for
after the end have come (or a job is scheduled on it again): a reading may have been sampled
before the end, and the job's last traffic, taken for another tenant's, would send the next jobs
round it (on the ring, a job placed 2.5 s after the previous run's end got grants of 0.6–0.8
Mbit/s the long way round: docs/e2e.md).

Enforcement: per node pair. On the wire, the traffic between two compute nodes cannot be told
apart by job (the workers of several jobs share their node's address, as the containers of a
Kubernetes pod do, and gloo picks ephemeral ports), so every directed node pair carries at most one
scheduled path, and its rate is the sum of the rates granted to the job flows that use it. The
Master keeps this true by *pinning*: a new flow between a pair that already carries one takes that
path (and the decision is re-checked). Each pair becomes one SDN flow (exact path + one meter at
its first switch) and one tc HTB class at the sender (per destination address).

State and I/O are apart: `add`/`forget` change the pairs and `desired` takes a snapshot of what
the network should hold (the Master calls them under its lock); `push` makes the SDN app and the
agents match a snapshot, talking to them without any lock (only the Master's control loop pushes,
so pushes never overlap).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from protocol.messages import ShapingRule
from scheduler.model import Cluster, Decision, FlowAssignment, Job
from scheduler.paths import fair_rates
from topologies import Topology

from .compute import AgentError, ComputeController

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (src node, dst node)
Share = tuple[str, str, str]  # (job, src task, dst task)


class SdnApi(Protocol):
    """What the Network Controller needs from the SDN app (`sdn_app.client.SdnClient`)."""

    def put_job_flows(self, job_id: str, flows: list[dict]) -> object: ...
    def delete_job_flows(self, job_id: str) -> object: ...
    def links(self) -> list: ...  # objects with src, dst, mbps (None before two samples)
    def job_flows(self, job_id: str) -> list[dict]: ...  # with per-hop "mbps" counters


class EndedPair(NamedTuple):
    """A node pair whose last job ended, as its counters last saw it (`NetworkController.ended`)."""

    path: tuple[str, ...]
    carried: float  # Mbit/s
    carried_back: float
    since: float  # time.monotonic() of the end
    readings: int  # link readings asked for after the end still to come


@dataclass
class PairFlow:
    path: tuple[str, ...]  # compute node, switches..., compute node
    shares: dict[Share, float] = field(default_factory=dict)  # Mbit/s granted per job flow
    spare: float = 0.0  # Mbit/s on top of the grants (work-conserving, see module doc)

    @property
    def rate_mbps(self) -> float:
        """What the pair is guaranteed: the sum of its grants."""
        return sum(self.shares.values())

    @property
    def installed_mbps(self) -> float:
        """What its meter and tc class let through."""
        return self.rate_mbps + self.spare

    def installed_share(self, share: Share) -> float:
        """One job flow's part of the installed rate (the spare split as the grants are)."""
        rate = self.rate_mbps
        return self.shares[share] * (self.installed_mbps / rate if rate > 0 else 1.0)


@dataclass(frozen=True)
class NetworkState:
    """What the network should hold: the SDN app's flows and every sender's tc rules."""

    sdn_flows: tuple[dict, ...]
    shaping: dict[str, tuple[ShapingRule, ...]]  # node -> its rules (absent: none)


class NetworkController:
    # Below either floor, measured-minus-carried is counter noise: the switches' port and flow
    # counters are read at slightly different moments, so they disagree by a share of the rate
    # (on the ring topology, > 1 Mbit/s at 190 on an access link only the job's pair used).
    UNSCHEDULED_FLOOR_MBPS = 1.0
    UNSCHEDULED_FLOOR_SHARE = 0.02  # of the link's capacity
    # Grants plus unscheduled traffic above this share of a link: TCP's competition on the
    # link's queue already eats into the grants (the measured total cannot exceed the link).
    HEADROOM = 0.95
    # Unscheduled traffic re-shares the spare only when a pair's installed rate moves by more
    # than this (of the larger of the two): each change re-programs a meter and a tc class.
    SPARE_STEP = 0.1
    # A pair's acknowledgements, at most, against the data it carries: one 66-byte segment per
    # full-size one (1514 bytes on the wire). Its way back matches every packet the other way
    # that no flow schedules: beyond this it carries another's traffic.
    ACK_SHARE = 66 / 1514
    # The share of each direction of a link that grants (spare shares included) may take: with
    # the acknowledgements of as much granted the other way, the link is HEADROOM full. Streams
    # granted 0.95 of a link both ways at once (0.99 with the acknowledgements) read 0.92-0.99
    # of their grant with nothing else running, at 0.90 (0.94) 0.99 (experiments/
    # bench_headroom.py, K 1.75); in runs whose workers compute beside them, grants filling
    # 0.95 read 0.84-0.96 (the star, docs/e2e.md).
    GRANTABLE = HEADROOM / (1 + ACK_SHARE)
    # Readings after a pair's end in which it still counts as scheduled: the first may have been
    # sampled before the end (the SDN app samples every second, the Master reads every two).
    SETTLE_READINGS = 2

    def __init__(
        self,
        topo: Topology,
        cluster: Cluster,
        compute: ComputeController,
        sdn: SdnApi | None = None,
        sdn_job_id: str = "ces",
        spare: bool = True,
    ):
        self.cluster, self.compute, self.sdn = cluster, compute, sdn
        self.sdn_job_id, self.work_conserving = sdn_job_id, spare
        self.pairs: dict[Pair, PairFlow] = {}
        self._spare_stale = False  # the grants changed since the spare was last shared
        self.ip = {n.name: n.ip for n in topo.nodes}
        self.measured: dict[tuple[str, str], float] = {}  # directed link -> Mbit/s
        self.carried: dict[Pair, float] = {}  # Mbit/s each pair's flow entries count
        self.carried_back: dict[Pair, float] = {}  # and its way back's (`desired`)
        self.ended: dict[Pair, EndedPair] = {}  # pairs whose last job ended (`forget`)
        self.down: set[tuple[str, str]] = set()  # directed links without link (port status)
        # What the network holds, as far as pushes know (the control loop's own state).
        self.shaped: dict[str, tuple[ShapingRule, ...]] = {}  # node -> rules its agent applied
        self.dirty_shaping: set[str] = set()  # nodes whose agent missed an update
        self._sdn_has_job = False

    # --- the view -------------------------------------------------------------------------------
    def granted(self, u: str, v: str) -> float:
        return sum(p.rate_mbps for p in self.pairs.values() if (u, v) in zip(p.path, p.path[1:]))

    def unscheduled(self) -> dict[tuple[str, str], float]:
        """Unscheduled traffic per directed link: measured less what the scheduled pairs on it
        carry (their installed rate until their counters have two samples) and less their
        acknowledgements on the reverse links (what their ways back carry, up to `ACK_SHARE`:
        `desired`), and less what the pairs whose last job just ended carried (`ended`), above
        the floors."""
        scheduled: dict[tuple[str, str], float] = {}
        carrying = [
            (p.path, self.carried.get(pair, p.installed_mbps), self.carried_back.get(pair, 0.0))
            for pair, p in self.pairs.items()
        ]
        carrying += [(e.path, e.carried, e.carried_back) for e in self.ended.values()]
        for path, carried, carried_back in carrying:
            acks = min(carried_back, self.ACK_SHARE * carried)
            back = path[::-1]
            for links, mbps in (
                (itertools.pairwise(path), carried),
                (itertools.pairwise(back), acks),
            ):
                for link in links:
                    scheduled[link] = scheduled.get(link, 0.0) + mbps
        out = {}
        for link, mbps in self.measured.items():
            extra = mbps - scheduled.get(link, 0.0)
            capacity = (
                self.cluster.link_capacity(*link) if self.cluster.graph.has_edge(*link) else 0.0
            )
            if extra >= max(self.UNSCHEDULED_FLOOR_MBPS, self.UNSCHEDULED_FLOOR_SHARE * capacity):
                out[link] = extra
        return out

    def view(self, unschedulable: set[str], without: Iterable[str] = ()) -> Cluster:
        """The cluster the Scheduler decides on: nodes it may not use marked offline, the
        bandwidth unscheduled traffic takes reserved (capped at what is left), and 1 − `GRANTABLE`
        of every link: room for the acknowledgements of the grants the other way and for the
        link's queue (on the star, flows into links their grants and the acknowledgements filled
        to 90-104 % read 0.76-0.96 of their grant, retransmitting, against 0.91-1.05 at most 60 %
        loaded: docs/e2e.md). The jobs `without` are released first: what is reserved is capped
        at what the grants leave, so a job released after would find its links' unscheduled
        traffic and margin in the room it left."""
        view = self.cluster.copy(share_graph=True)  # the graph's structure never changes
        view.offline |= unschedulable
        for name in without:
            view.release(name)
        taken = dict(self.unscheduled())
        for link in self.down:
            taken[link] = float("inf")
        for u, v in view.graph.edges:
            for link in ((u, v), (v, u)):
                margin = (1 - self.GRANTABLE) * view.link_capacity(*link)
                taken[link] = taken.get(link, 0.0) + margin
        for link, mbps in taken.items():
            if view.graph.has_edge(*link):
                view.reserved[link] = view.reserved.get(link, 0.0) + min(mbps, view.residual(*link))
        return view

    def observe(self, links: list, flows: list[dict], read_at: float | None = None) -> bool:
        """Take the SDN app's link usage (src, dst, mbps, up per directed link) and the scheduled
        pairs' flows with their per-hop counters, asked for at `read_at` (time.monotonic(); by
        default now); True when the spare shares moved enough that the network should be pushed
        again (`SPARE_STEP`)."""
        read_at = time.monotonic() if read_at is None else read_at
        self.measured = {(u.src, u.dst): float(u.mbps) for u in links if u.mbps is not None}
        # a reading asked for before a pair's end does not count towards its SETTLE_READINGS
        counted = {
            pair: e._replace(readings=e.readings - 1) if e.since < read_at else e
            for pair, e in self.ended.items()
        }
        self.ended = {pair: e for pair, e in counted.items() if e.readings > 0}
        self.down = {(u.src, u.dst) for u in links if not u.up}
        self.carried, self.carried_back = {}, {}
        for f in flows:  # the last hop counts what the meter let through
            for hops, into in (("hops", self.carried), ("return_hops", self.carried_back)):
                mbps = f[hops][-1].get("mbps") if f.get(hops) else None
                if mbps is not None:
                    into[(f["src"], f["dst"])] = float(mbps)
        changed = self._share_spare(force=self._spare_stale)
        self._spare_stale = False
        return changed

    def _share_spare(self, force: bool) -> bool:
        """Re-share the spare capacity (module doc); `force` takes the new shares whatever they
        are, otherwise only when one moves by more than `SPARE_STEP`. True when they changed."""
        if not self.pairs:
            return False
        spare = dict.fromkeys(self.pairs, 0.0)
        weighted = {pair: p.rate_mbps for pair, p in self.pairs.items() if p.rate_mbps > 0}
        if self.work_conserving and weighted:
            # grants, unscheduled traffic and 1 - GRANTABLE reserved, down links full
            room = self.view(set())
            spare |= fair_rates(
                room,
                {pair: self.pairs[pair].path for pair in weighted},
                {pair: float("inf") for pair in weighted},
                weighted,
            )
        moved = any(
            abs(spare[pair] - p.spare)
            > self.SPARE_STEP * max(p.installed_mbps, p.rate_mbps + spare[pair])
            for pair, p in self.pairs.items()
        )
        if not (force or moved):
            return False
        changed = any(abs(spare[pair] - p.spare) > 1e-3 for pair, p in self.pairs.items())
        for pair, p in self.pairs.items():
            p.spare = spare[pair]
        return changed

    def set_capacity(self, u: str, v: str, bw_mbps: float) -> None:
        """A link's capacity changed (both directions): an operator or monitoring says so."""
        self.cluster.graph.edges[u, v]["bw_mbps"] = float(bw_mbps)
        self._spare_stale = True

    def contended(self) -> set[tuple[str, str]]:
        """Directed links whose grants no longer fit (see module doc)."""
        unscheduled = self.unscheduled()
        out = set()
        for link in {lk for p in self.pairs.values() for lk in zip(p.path, p.path[1:])}:
            granted, capacity = self.granted(*link), self.cluster.link_capacity(*link)
            if (
                link in self.down
                or granted > capacity + 1e-6
                or (link in unscheduled and granted + unscheduled[link] > self.HEADROOM * capacity)
            ):
                out.add(link)
        return out

    def contended_flows(self) -> dict[str, list[str]]:
        """Per job, its flows ("src>dst" tasks) whose pair's path crosses a `contended` link."""
        hot = self.contended()
        out: dict[str, list[str]] = {}
        for p in self.pairs.values():
            if hot.intersection(zip(p.path, p.path[1:])):
                for job, src, dst in p.shares:
                    out.setdefault(job, []).append(f"{src}>{dst}")
        return {job: sorted(flows) for job, flows in out.items()}

    def report(self) -> list[dict]:
        """Every directed link: capacity, granted by the Master, measured, unscheduled."""
        unscheduled = self.unscheduled()
        out = []
        for u, v, d in self.cluster.graph.edges(data=True):
            for a, b in ((u, v), (v, u)):
                installed = sum(
                    p.installed_mbps
                    for p in self.pairs.values()
                    if (a, b) in zip(p.path, p.path[1:])
                )
                out.append(
                    {
                        "src": a,
                        "dst": b,
                        "capacity_mbps": d["bw_mbps"],
                        "up": (a, b) not in self.down,
                        "granted_mbps": round(self.granted(a, b), 3),
                        "installed_mbps": round(installed, 3),
                        "measured_mbps": self.measured.get((a, b)),
                        "unscheduled_mbps": round(unscheduled.get((a, b), 0.0), 3),
                    }
                )
        return out

    # --- the flows a job adds (state only) ------------------------------------------------------
    def pin(self, decision: Decision) -> Decision:
        """`decision` with every flow between an already-carried node pair (or a pair an earlier
        flow of the same decision uses) moved onto that pair's one path."""
        chosen = {pair: p.path for pair, p in self.pairs.items()}
        flows = []
        for fa in decision.flows:
            pair = (fa.path[0], fa.path[-1])
            path = chosen.setdefault(pair, fa.path)
            flows.append(
                fa if path == fa.path else FlowAssignment(fa.src, fa.dst, path, fa.rate_mbps)
            )
        return Decision(decision.job, dict(decision.placement), flows, decision.decision_s)

    def add(self, job: Job, decision: Decision) -> None:
        """The flows of a (pinned, allocated) decision join their node pairs."""
        for fa in decision.flows:
            pair = (fa.path[0], fa.path[-1])
            self.pairs.setdefault(pair, PairFlow(fa.path)).shares[(job.name, fa.src, fa.dst)] = (
                fa.rate_mbps
            )
            # scheduled again: its counters (`carried`) count what the readings hold of it
            self.ended.pop(pair, None)
        self._spare_stale = True

    def forget(self, job_name: str) -> None:
        for pair in list(self.pairs):
            p = self.pairs[pair]
            for share in [s for s in p.shares if s[0] == job_name]:
                del p.shares[share]
            if not p.shares:
                del self.pairs[pair]
                if pair in self.carried:  # its counters saw traffic the readings may still hold
                    self.ended[pair] = EndedPair(
                        p.path,
                        self.carried[pair],
                        self.carried_back.get(pair, 0.0),
                        time.monotonic(),
                        self.SETTLE_READINGS,
                    )
        self._spare_stale = True

    def installed(self) -> dict[str, dict[str, float]]:
        """The rate each job flow gets now, grant and spare: {job: {"src>dst" task: Mbit/s}}."""
        out: dict[str, dict[str, float]] = {}
        for p in self.pairs.values():
            for job, src, dst in p.shares:
                out.setdefault(job, {})[f"{src}>{dst}"] = round(
                    p.installed_share((job, src, dst)), 3
                )
        return out

    def desired(self) -> NetworkState:
        """A snapshot of what the network should hold now (the spare re-shared first when the
        grants changed)."""
        if self._spare_stale:
            self._share_spare(force=True)
            self._spare_stale = False
        # symmetric: a pair's acknowledgements go back along its path, not by the default
        # routes, which may cross a link another tenant fills (docs/sdn_app.md)
        flows = tuple(
            {
                "src": s,
                "dst": d,
                "path": list(p.path[1:-1]),
                "rate_mbps": round(p.installed_mbps, 3),
                "symmetric": True,
                "name": ",".join(sorted({j for j, _, _ in p.shares})),
            }
            for (s, d), p in sorted(self.pairs.items())
        )
        rules: dict[str, list[ShapingRule]] = {}
        for (s, d), p in sorted(self.pairs.items()):
            rules.setdefault(s, []).append(ShapingRule(self.ip[d], round(p.installed_mbps, 3)))
        return NetworkState(flows, {n: tuple(r) for n, r in rules.items()})

    # --- enforcement (I/O, no lock) -------------------------------------------------------------
    def push(self, state: NetworkState) -> None:
        """Make the SDN app and the senders' tc match `state`. The SDN app gets the whole set in
        one request (it adds new entries before removing old ones) and a refusal raises; an
        agent that does not answer is retried on `resync`."""
        if self.sdn is not None:
            if state.sdn_flows:
                self.sdn.put_job_flows(self.sdn_job_id, list(state.sdn_flows))
                self._sdn_has_job = True
            elif self._sdn_has_job:
                self.sdn.delete_job_flows(self.sdn_job_id)
                self._sdn_has_job = False
        for node in sorted(set(state.shaping) | set(self.shaped) | self.dirty_shaping):
            rules = state.shaping.get(node, ())
            if rules == self.shaped.get(node, ()) and node not in self.dirty_shaping:
                continue
            self._shape(node, rules)

    def read_usage(self) -> tuple[list, list[dict]]:
        """The SDN app's link usage and the scheduled pairs' flows with their counters, for
        `observe` (I/O, no lock; the control loop is the only one that pushes, so the job it
        asks for exists)."""
        links = self.sdn.links()
        return links, self.sdn.job_flows(self.sdn_job_id) if self._sdn_has_job else []

    def _shape(self, node: str, rules: tuple[ShapingRule, ...]) -> None:
        agent = self.compute.agents.get(node)
        if agent is None or not agent.online:
            self.dirty_shaping.add(node)
            return
        try:
            self.compute.client(node).shape(list(rules))
            self.shaped[node] = rules
            self.dirty_shaping.discard(node)
        except AgentError as e:
            log.warning("shaping on %s deferred: %s", node, e)
            self.dirty_shaping.add(node)

    def resync(self, node: str, state: NetworkState) -> None:
        """An agent (re)registered: give it its complete rule set again."""
        self.dirty_shaping.add(node)
        self._shape(node, state.shaping.get(node, ()))
