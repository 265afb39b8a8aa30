"""The Network Controller: the network view and the enforcement of flow decisions.

View: the cluster's link capacities, the bandwidth reserved by running jobs, and the measured
utilisation of every directed link (from the SDN app's statistics). Traffic the Master did not
schedule (other tenants, background) is estimated per directed link as measured minus granted and
reserved in the view the Scheduler decides on, so a network-aware algorithm sees it.

Enforcement: per node pair. On the wire, the traffic between two compute nodes cannot be told
apart by job (the workers of several jobs share their node's address, as the containers of a
Kubernetes pod do, and gloo picks ephemeral ports), so every directed node pair carries at most one
scheduled path, and its rate is the sum of the rates granted to the job flows that use it. The
Master keeps this true by *pinning*: a new flow between a pair that already carries one takes that
path (and the decision is re-checked). Each pair becomes one SDN flow (exact path + one meter at
its first switch) and one tc HTB class at the sender (per destination address).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from topologies import Topology

from ..model import Cluster, Decision, FlowAssignment, Job
from .compute import AgentError, ComputeController
from .protocol import ShapingRule

log = logging.getLogger(__name__)

Pair = tuple[str, str]  # (src node, dst node)
Share = tuple[str, str, str]  # (job, src task, dst task)


class SdnApi(Protocol):
    """What the Network Controller needs from the SDN app (`sdn_app.client.SdnClient`)."""

    def put_job_flows(self, job_id: str, flows: list[dict]) -> object: ...
    def delete_job_flows(self, job_id: str) -> object: ...
    def links(self) -> list: ...  # objects with src, dst, mbps (None before two samples)


@dataclass
class PairFlow:
    path: tuple[str, ...]  # compute node, switches..., compute node
    shares: dict[Share, float] = field(default_factory=dict)  # Mbit/s granted per job flow

    @property
    def rate_mbps(self) -> float:
        return sum(self.shares.values())


class NetworkController:
    BACKGROUND_FLOOR_MBPS = 1.0  # below this, measured-minus-granted is counter noise

    def __init__(self, topo: Topology, cluster: Cluster, compute: ComputeController,
                 sdn: SdnApi | None = None, sdn_job_id: str = "ces"):
        self.topo, self.cluster, self.compute, self.sdn = topo, cluster, compute, sdn
        self.sdn_job_id = sdn_job_id
        self.pairs: dict[Pair, PairFlow] = {}
        self.ip = {n.name: n.ip for n in topo.nodes}
        self.measured: dict[tuple[str, str], float] = {}  # directed link -> Mbit/s
        self.shaped: dict[str, list[ShapingRule]] = {}  # node -> rules its agent applied
        self.dirty_shaping: set[str] = set()  # nodes whose agent missed an update
        self._sdn_has_job = False

    # --- the view -------------------------------------------------------------------------------
    def granted(self, u: str, v: str) -> float:
        return sum(p.rate_mbps for p in self.pairs.values() if (u, v) in zip(p.path, p.path[1:]))

    def background(self) -> dict[tuple[str, str], float]:
        """Unscheduled traffic per directed link: measured - granted, where above the floor."""
        out = {}
        for link, mbps in self.measured.items():
            extra = mbps - self.granted(*link)
            if extra >= self.BACKGROUND_FLOOR_MBPS:
                out[link] = extra
        return out

    def view(self, unschedulable: set[str]) -> Cluster:
        """The cluster the Scheduler decides on: nodes it may not use marked offline, and the
        bandwidth unscheduled traffic takes reserved (capped at what is left)."""
        view = self.cluster.copy()
        view.offline |= unschedulable
        for link, mbps in self.background().items():
            if view.graph.has_edge(*link):
                view.reserved[link] = view.reserved.get(link, 0.0) + min(mbps,
                                                                         view.residual(*link))
        return view

    def observe(self, links: list) -> None:
        """Take the SDN app's link usage (src, dst, mbps per directed link)."""
        self.measured = {(u.src, u.dst): float(u.mbps) for u in links if u.mbps is not None}

    # --- pinning --------------------------------------------------------------------------------
    def pin(self, decision: Decision) -> Decision:
        """`decision` with every flow between an already-carried node pair (or a pair an earlier
        flow of the same decision uses) moved onto that pair's one path."""
        chosen = {pair: p.path for pair, p in self.pairs.items()}
        flows = []
        for fa in decision.flows:
            pair = (fa.path[0], fa.path[-1])
            path = chosen.setdefault(pair, fa.path)
            flows.append(fa if path == fa.path else FlowAssignment(fa.src, fa.dst, path,
                                                                   fa.rate_mbps))
        return Decision(decision.job, dict(decision.placement), flows, decision.decision_s)

    # --- enforcement ----------------------------------------------------------------------------
    def install(self, job: Job, decision: Decision) -> None:
        """Reserve and enforce a (pinned, checked) decision: SDN paths + meters, then tc."""
        self.cluster.allocate(job, decision)
        for fa in decision.flows:
            pair = (fa.path[0], fa.path[-1])
            self.pairs.setdefault(pair, PairFlow(fa.path)).shares[(job.name, fa.src, fa.dst)] = \
                fa.rate_mbps
        try:
            self.push()
        except Exception:
            self._forget(job.name)
            try:
                self.push()
            except Exception as e:  # the first error is the one to report
                log.warning("undoing job %s in the network failed too: %s", job.name, e)
            raise

    def remove(self, job_name: str) -> None:
        self._forget(job_name)
        self.push()

    def _forget(self, job_name: str) -> None:
        if job_name in self.cluster.jobs:
            self.cluster.release(job_name)
        for pair in list(self.pairs):
            p = self.pairs[pair]
            for share in [s for s in p.shares if s[0] == job_name]:
                del p.shares[share]
            if not p.shares:
                del self.pairs[pair]

    def sdn_flows(self) -> list[dict]:
        return [{"src": s, "dst": d, "path": list(p.path[1:-1]),
                 "rate_mbps": round(p.rate_mbps, 3),
                 "name": ",".join(sorted({j for j, _, _ in p.shares}))}
                for (s, d), p in sorted(self.pairs.items())]

    def shaping(self) -> dict[str, list[ShapingRule]]:
        rules: dict[str, list[ShapingRule]] = {}
        for (s, d), p in sorted(self.pairs.items()):
            rules.setdefault(s, []).append(ShapingRule(self.ip[d], round(p.rate_mbps, 3)))
        return rules

    def push(self) -> None:
        """Make the SDN app and the senders' tc match `pairs`. The SDN app gets the whole set in
        one request (it adds new entries before removing old ones); an agent that does not answer
        is retried on `resync`. An SDN refusal raises (the caller undoes the job)."""
        if self.sdn is not None:
            flows = self.sdn_flows()
            if flows:
                self.sdn.put_job_flows(self.sdn_job_id, flows)
                self._sdn_has_job = True
            elif self._sdn_has_job:
                self.sdn.delete_job_flows(self.sdn_job_id)
                self._sdn_has_job = False
        wanted = self.shaping()
        for node in sorted(set(wanted) | set(self.shaped) | self.dirty_shaping):
            rules = wanted.get(node, [])
            if rules == self.shaped.get(node, []) and node not in self.dirty_shaping:
                continue
            self._shape(node, rules)

    def _shape(self, node: str, rules: list[ShapingRule]) -> None:
        agent = self.compute.agents.get(node)
        if agent is None or not agent.online:
            self.dirty_shaping.add(node)
            return
        try:
            agent.client.shape(rules)
            self.shaped[node] = rules
            self.dirty_shaping.discard(node)
        except AgentError as e:
            log.warning("shaping on %s deferred: %s", node, e)
            self.dirty_shaping.add(node)

    def resync(self, node: str) -> None:
        """An agent (re)registered: give it its complete rule set again."""
        self.dirty_shaping.add(node)
        self._shape(node, self.shaping().get(node, []))

    def report(self) -> list[dict]:
        """Every directed link: capacity, granted by the Master, measured, background."""
        bg = self.background()
        out = []
        for u, v, d in self.cluster.graph.edges(data=True):
            for a, b in ((u, v), (v, u)):
                out.append({"src": a, "dst": b, "capacity_mbps": d["bw_mbps"],
                            "granted_mbps": round(self.granted(a, b), 3),
                            "measured_mbps": self.measured.get((a, b)),
                            "background_mbps": round(bg.get((a, b), 0.0), 3)})
        return out
