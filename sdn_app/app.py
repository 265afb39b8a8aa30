"""CesSdnApp: makes the network carry each job's flows on the scheduled paths at the granted rates.

- On connect, a switch is wiped and given its full contents: per-destination default rules (so the
  network pings with no job) plus every job's entries and meters. The same happens when it
  reconnects or the controller restarts (jobs are re-learnt from the --state file).
- A job change is validated completely before any switch is touched, then applied in barrier-
  separated phases (meters + downstream entries → first-switch entries → removals), and rolled back
  if a switch refuses it: never a half-installed job.
- The REST API (rest.py) calls `put_job`, `delete_job` and the views; errors are `RequestError`s.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from .compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    FRAMEWORK,
    MAIN_DISPATCHER,
    BaseApp,
    WsgiServer,
    app_manager,
    hub,
    lldp_enabled,
    new_event,
    new_lock,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from .flows import (
    MAX_METER_ID,
    Meter,
    Plan,
    RequestError,
    Rule,
    job_cookie,
    job_rules,
    lldp_rules,
    parse_flows,
    parse_job_id,
    plan_change,
)
from .jobs import Job, JobTable
from .monitor import NetworkMonitor
from .rest import rest_api
from .settings import settings


class InstallError(RuntimeError):
    """Switches refused messages or did not answer a barrier: `problems` by dpid."""

    def __init__(self, problems: dict[int, list[str]]):
        super().__init__("; ".join(f"{dpid:#x}: {', '.join(p)}" for dpid, p in problems.items()))
        self.problems = problems


class CesSdnApp(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _CONTEXTS = {"monitor": NetworkMonitor}

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = settings()
        self.topo = self.settings.topo
        self.monitor: NetworkMonitor = kwargs["monitor"]
        self.table = JobTable(self.topo, self.settings.policy)
        if self.settings.state:
            self.table.load(self.settings.state)
        self.names = {s.dpid: s.name for s in self.topo.switches}
        # Switches whose contents match the table. Replaced, never mutated: REST threads read it.
        self.synced: frozenset[int] = frozenset()
        self.started = time.time()
        self._job_lock = new_lock()  # one job change or switch resync at a time
        self._barriers: dict[tuple[int, int], Any] = {}  # (dpid, xid) → event
        self._errors: dict[tuple[int, int], list[str]] = {}  # (dpid, xid) of tracked messages
        self.rest: WsgiServer | None = None

    def start(self) -> Any:
        thread = super().start()
        self.rest = WsgiServer(
            rest_api(self, self.settings.token),
            self.settings.rest_host,
            self.settings.rest_port,
            self.settings.tls,
        )
        self.logger.info(
            "OpenFlow 1.3 app on %s: topology '%s' (%d switches), %d job(s) from "
            "state, REST on %s://%s:%d",
            FRAMEWORK,
            self.topo.name,
            len(self.topo.switches),
            len(self.table.jobs),
            "https" if self.settings.tls else "http",
            self.settings.rest_host,
            self.rest.port,
        )
        return thread

    def stop(self) -> None:
        if self.rest:
            self.rest.stop()
        super().stop()

    # --- switch life cycle ----------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def state_change_handler(self, ev: Any) -> None:
        dp = ev.datapath
        if dp.id not in self.names:
            return
        if ev.state == MAIN_DISPATCHER:
            # Not here: the resync waits for barrier replies, which this event loop delivers.
            hub.spawn(self._resync, dp)
        else:
            self.synced = self.synced - {dp.id}

    def _resync(self, dp: Any) -> None:
        """Make the switch hold exactly what the table says: wipe it, then install everything."""
        ofp, parser = dp.ofproto, dp.ofproto_parser
        with self._job_lock:
            rules, meters = self.table.switch_contents(dp.id)
            if lldp_enabled():
                rules += [r for r in lldp_rules(self.topo) if r.dpid == dp.id]
            plan = plan_change([], [], rules, meters)
            wipe = [
                parser.OFPFlowMod(
                    dp,
                    command=ofp.OFPFC_DELETE,
                    table_id=ofp.OFPTT_ALL,
                    out_port=ofp.OFPP_ANY,
                    out_group=ofp.OFPG_ANY,
                ),
                parser.OFPMeterMod(dp, command=ofp.OFPMC_DELETE, meter_id=ofp.OFPM_ALL),
            ]
            t0 = time.monotonic()
            try:
                self._confirm({dp.id: (dp, wipe)})
                self._execute(plan, {dp.id: dp})
            except InstallError as e:
                self.logger.error("resync of %s failed: %s", self.names[dp.id], e)
                return
            if dp.is_active:
                self.synced = self.synced | {dp.id}
            self.logger.info(
                "resync %s: %d entries, %d meters in %.0f ms",
                self.names[dp.id],
                len(rules),
                len(meters),
                (time.monotonic() - t0) * 1000,
            )

    # --- job changes ----------------------------------------------------------------------------

    def put_job(self, job_id: str, doc: Any) -> dict[str, Any]:
        """Install or replace all flows of a job. Returns the job's view, with `install_ms`."""
        job_id = parse_job_id(job_id)
        specs = parse_flows(doc, self.topo)
        with self._job_lock:
            old = self.table.jobs.get(job_id)
            new = self.table.propose(job_id, specs, self._meter_limit)
            plan = plan_change(
                self.table.rules(old),
                self.table.meters(old),
                self.table.rules(new),
                self.table.meters(new),
            )
            needed = {r.dpid for r in plan.prepare + plan.steer} | {
                m.dpid for m in plan.meters_add + plan.meters_modify
            }
            down = sorted(self.names[d] for d in needed if d not in self.synced)
            if down:
                raise RequestError(
                    f"switch(es) not connected or not yet synchronised: "
                    f"{', '.join(down)}; nothing was changed",
                    status=503,
                )

            def undo() -> None:
                self._apply_or_resync(
                    plan_change(
                        self.table.rules(new),
                        self.table.meters(new),
                        self.table.rules(old),
                        self.table.meters(old),
                    )
                )

            t0 = time.monotonic()
            try:
                self._execute(plan, self._connected())
            except InstallError as e:
                undo()
                raise RequestError(
                    f"a switch refused the change ({e}); rolled back", status=502
                ) from None
            previous = self.table.jobs  # copy-on-write: this mapping stays as it is
            self.table.commit(new)
            try:
                self._save()
            except OSError as e:
                self.table.jobs = previous
                undo()
                raise RequestError(
                    f"cannot write the state file ({e}); rolled back", status=500
                ) from None
            elapsed = (time.monotonic() - t0) * 1000
        self.logger.info("job %s: %d flows installed in %.1f ms", job_id, len(specs), elapsed)
        return {
            "job": job_id,
            "updated": new.updated,
            "install_ms": round(elapsed, 2),
            "flows": [self._flow_view(new, f, counters=False) for f in new.flows],
        }

    def delete_job(self, job_id: str) -> dict[str, Any]:
        """Remove all flows and meters of a job. Switches that are down lose them when they
        reconnect (they are resynchronised from the table)."""
        job_id = parse_job_id(job_id)
        with self._job_lock:
            old = self.table.jobs.get(job_id)
            if old is None:
                raise RequestError(f"no job '{job_id}'", "job", status=404)
            plan = plan_change(self.table.rules(old), self.table.meters(old), [], [])
            previous = self.table.jobs
            self.table.remove(job_id)
            try:
                self._save()
            except OSError as e:
                self.table.jobs = previous
                raise RequestError(
                    f"cannot write the state file ({e}); nothing was changed", status=500
                ) from None
            self._apply_or_resync(plan)
        return {"job": job_id, "removed_flows": len(old.flows)}

    def _apply_or_resync(self, plan: Plan) -> None:
        """Apply `plan` as far as possible; switches that fail it are disconnected so that they
        reconnect and get resynchronised from the table."""
        try:
            self._execute(plan, self._connected())
        except InstallError as e:
            self.logger.error("forcing a resync after a failed change: %s", e)
            for dpid in e.problems:
                dp = self.monitor.datapaths.get(dpid)
                if dp is not None:
                    dp.close()

    def _save(self) -> None:
        if self.settings.state:
            self.table.save(self.settings.state)

    def _meter_limit(self, dpid: int) -> int:
        return self.monitor.meter_limit.get(dpid, MAX_METER_ID)

    def _connected(self) -> dict[int, Any]:
        return {d: dp for d, dp in self.monitor.datapaths.items() if d in self.synced}

    # --- OpenFlow: phases and barriers ----------------------------------------------------------

    def _execute(self, plan: Plan, dps: dict[int, Any]) -> None:
        """Run `plan` on the switches in `dps` (others are skipped), one barrier per phase."""
        phases: list[list[tuple[int, Any]]] = [
            [
                (m.dpid, lambda dp, m=m: _meter_mod(dp, m, dp.ofproto.OFPMC_ADD))
                for m in plan.meters_add
            ]
            + [
                (m.dpid, lambda dp, m=m: _meter_mod(dp, m, dp.ofproto.OFPMC_MODIFY))
                for m in plan.meters_modify
            ]
            + [(r.dpid, lambda dp, r=r: _flow_add(dp, r)) for r in plan.prepare],
            [(r.dpid, lambda dp, r=r: _flow_add(dp, r)) for r in plan.steer],
            [(r.dpid, lambda dp, r=r: _flow_delete(dp, r)) for r in plan.remove]
            + [
                (m.dpid, lambda dp, m=m: _meter_mod(dp, m, dp.ofproto.OFPMC_DELETE))
                for m in plan.meters_remove
            ],
        ]
        for phase in phases:
            batches: dict[int, tuple[Any, list[Any]]] = {}
            for dpid, build in phase:
                if dpid in dps:
                    dp = dps[dpid]
                    batches.setdefault(dpid, (dp, []))[1].append(build(dp))
            if batches:
                self._confirm(batches)

    def _confirm(self, batches: dict[int, tuple[Any, list[Any]]]) -> None:
        """Send each switch its messages and a barrier; return once every barrier is answered.
        OpenFlow reports errors of messages before the barrier reply, so when this returns
        without `InstallError`, every message was applied."""
        t0 = time.monotonic()
        waits: dict[int, Any] = {}
        tracked: list[tuple[int, int]] = []
        barriers: list[tuple[int, int]] = []
        problems: dict[int, list[str]] = {}
        for dpid, (dp, msgs) in batches.items():
            barrier = dp.ofproto_parser.OFPBarrierRequest(dp)
            for msg in msgs + [barrier]:
                dp.set_xid(msg)
                msg.serialize()
            for msg in msgs:
                self._errors[(dpid, msg.xid)] = []
                tracked.append((dpid, msg.xid))
            waits[dpid] = self._barriers[(dpid, barrier.xid)] = new_event()
            barriers.append((dpid, barrier.xid))
            # One write instead of one queued send per message: thousands of messages would
            # otherwise hand the GIL to the connection's sender thread thousands of times.
            if not dp.send(b"".join(m.buf for m in msgs + [barrier])):
                problems.setdefault(dpid, []).append("disconnected")
                waits.pop(dpid)
        sent = time.monotonic()
        deadline = sent + self.settings.barrier_timeout_s
        for dpid, event in waits.items():
            if not event.wait(max(0.0, deadline - time.monotonic())):
                problems.setdefault(dpid, []).append(
                    f"no barrier reply within {self.settings.barrier_timeout_s:g} s"
                )
        self.logger.debug(
            "%d messages to %d switches: built and sent in %.1f ms, confirmed %.1f ms later",
            len(tracked),
            len(batches),
            (sent - t0) * 1000,
            (time.monotonic() - sent) * 1000,
        )
        for key in barriers:
            self._barriers.pop(key, None)
        for key in tracked:
            for err in self._errors.pop(key, []):
                problems.setdefault(key[0], []).append(err)
        if problems:
            raise InstallError(problems)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev: Any) -> None:
        event = self._barriers.get((ev.msg.datapath.id, ev.msg.xid))
        if event is not None:
            event.set()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def error_msg_handler(self, ev: Any) -> None:
        msg = ev.msg
        ofp = msg.datapath.ofproto
        try:
            text = (
                f"{ofp.ofp_error_type_to_str(msg.type)}/"
                f"{ofp.ofp_error_code_to_str(msg.type, msg.code)}"
            )
        except (KeyError, AttributeError):
            text = f"error type {msg.type} code {msg.code}"
        errors = self._errors.get((msg.datapath.id, msg.xid))
        if errors is None:
            self.logger.warning(
                "switch %s: %s (xid %s)",
                self.names.get(msg.datapath.id, msg.datapath.id),
                text,
                msg.xid,
            )
        else:
            errors.append(text)

    # --- views (the REST API's GETs) ------------------------------------------------------------

    def jobs_view(self) -> list[dict[str, Any]]:
        return [
            {
                "job": j.job_id,
                "flows": len(j.flows),
                "updated": j.updated,
                "cookie": f"{job_cookie(j.seq, 0):#018x}",
            }
            for j in self.table.jobs.values()
        ]

    def job_view(self, job_id: str) -> dict[str, Any]:
        job = self.table.jobs.get(parse_job_id(job_id))
        if job is None:
            raise RequestError(f"no job '{job_id}'", "job", status=404)
        return {
            "job": job.job_id,
            "updated": job.updated,
            "flows": [self._flow_view(job, f) for f in job.flows],
        }

    def _flow_view(self, job: Job, flow: Any, counters: bool = True) -> dict[str, Any]:
        """A flow as installed: its request, cookie and meter, and with `counters` what the
        switches count for it (per hop, at its meter, and per hop of its way back when it is
        symmetric: `return_hops`)."""
        spec, mon = flow.spec, self.monitor
        cookie = job_cookie(job.seq, flow.flow_no)
        first = self.topo.switch(spec.path[0]).dpid
        rate_kbps, burst_kbit = self.table.policy.params(spec.rate_mbps)
        view = spec.to_json() | {
            "src_ip": self.topo.node(spec.src).ip,
            "dst_ip": self.topo.node(spec.dst).ip,
            "cookie": f"{cookie:#018x}",
            "meter": {
                "switch": spec.path[0],
                "dpid": first,
                "meter_id": flow.meter_id,
                "rate_kbps": rate_kbps,
                "burst_kbit": burst_kbit,
            },
        }
        if not counters:
            return view
        meter_in = mon.meters_in.rate((first, flow.meter_id))
        dropped = mon.meters_dropped.rate((first, flow.meter_id))
        view["meter"] |= {
            "in_mbps": None if meter_in is None else round(meter_in, 3),
            "dropped_mbps": None if dropped is None else round(dropped, 3),
        }
        path, back = job_rules(spec, self.topo, job.seq, flow.flow_no, flow.meter_id)
        view["hops"] = self._hops(path)
        if spec.symmetric:
            view["return_hops"] = self._hops(back)
        return view

    def _hops(self, rules: list[Rule]) -> list[dict[str, Any]]:
        """What the switches count for each entry (switch, out port, packets, bytes, Mbit/s)."""
        mon, hops = self.monitor, []
        for rule in rules:
            key = (rule.dpid, rule.cookie)
            mbps = mon.flows.rate(key)
            hops.append(
                {
                    "switch": self.names[rule.dpid],
                    "dpid": rule.dpid,
                    "out_port": rule.out_port,
                    "packets": mon.flow_packets.get(key),
                    "bytes": mon.flows.value(key),
                    "mbps": None if mbps is None else round(mbps, 3),
                }
            )
        return hops

    def switches_view(self) -> dict[str, Any]:
        mon = self.monitor
        switches = [
            {
                "name": s.name,
                "dpid": s.dpid,
                "dpid_hex": f"{s.dpid:016x}",
                "connected": s.dpid in mon.datapaths,
                "synced": s.dpid in self.synced,
                "connected_at": mon.connected_at.get(s.dpid),
                "address": _address(mon.datapaths.get(s.dpid)),
                "max_meters": mon.meter_limit.get(s.dpid),
                "ports": {
                    port: counters
                    for (dpid, port), counters in mon.port_counters.items()
                    if dpid == s.dpid
                },
            }
            for s in self.topo.switches
        ]
        unknown = [
            {"dpid": d, "dpid_hex": f"{d:016x}", "address": _address(dp)}
            for d, dp in mon.datapaths.items()
            if d not in self.names
        ]
        view = {"switches": switches, "unknown": unknown, "events": list(mon.switch_events)}
        discovery = app_manager.lookup_service_brick("LinkDiscovery")
        if discovery is not None:
            view["lldp"] = discovery.report()
        return view

    def links_view(self) -> dict[str, Any]:
        return {"interval_s": self.monitor.interval, "links": self.monitor.link_usage()}

    def health_view(self) -> dict[str, Any]:
        connected = sum(d in self.monitor.datapaths for d in self.names)
        return {
            "status": "ok",
            "framework": FRAMEWORK,
            "topology": self.topo.name,
            "switches": len(self.names),
            "connected": connected,
            "synced": len(self.synced & set(self.names)),
            "ready": len(self.synced & set(self.names)) == len(self.names),
            "jobs": len(self.table.jobs),
            "flows": sum(len(j.flows) for j in self.table.jobs.values()),
            "uptime_s": round(time.time() - self.started, 3),
        }


def _address(dp: Any) -> str | None:
    return None if dp is None else f"{dp.address[0]}:{dp.address[1]}"


@functools.lru_cache(maxsize=1 << 16)
def _match(parser: Any, fields: tuple[tuple[str, int | str], ...]) -> Any:
    """An OFPMatch, built once per flow: its construction dominates the cost of a flow-mod, and a
    flow's entries on every switch of its path share it (serialising does not change it)."""
    return parser.OFPMatch(**dict(fields))


def _flow_add(dp: Any, rule: Rule) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    instructions = [
        parser.OFPInstructionActions(
            ofp.OFPIT_APPLY_ACTIONS, [parser.OFPActionOutput(rule.out_port)]
        )
    ]
    if rule.meter_id:
        instructions.insert(0, parser.OFPInstructionMeter(rule.meter_id, ofp.OFPIT_METER))
    return parser.OFPFlowMod(
        dp,
        cookie=rule.cookie,
        command=ofp.OFPFC_ADD,
        priority=rule.priority,
        match=_match(parser, rule.match),
        instructions=instructions,
    )


def _flow_delete(dp: Any, rule: Rule) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    return parser.OFPFlowMod(
        dp,
        command=ofp.OFPFC_DELETE_STRICT,
        priority=rule.priority,
        match=_match(parser, rule.match),
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
    )


def _meter_mod(dp: Any, meter: Meter, command: int) -> Any:
    ofp, parser = dp.ofproto, dp.ofproto_parser
    bands = (
        []
        if command == ofp.OFPMC_DELETE
        else [parser.OFPMeterBandDrop(rate=meter.rate_kbps, burst_size=meter.burst_kbit)]
    )
    return parser.OFPMeterMod(
        dp,
        command=command,
        flags=ofp.OFPMF_KBPS | ofp.OFPMF_BURST | ofp.OFPMF_STATS,
        meter_id=meter.meter_id,
        bands=bands,
    )
