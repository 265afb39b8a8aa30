"""NetworkMonitor: which switches are connected, and what the network is doing.

Every `stats_interval` seconds each connected switch is asked for its port, flow (job entries
only) and meter counters; the replies become rates (Mbit/s). Port counters are mapped onto the
topology's links, one rate per direction. Each port's packet and drop counters are kept as they
are (`port_counters`): a port that drops what it receives means the switch fell behind.

Under time dilation (`Settings.dilation`) the interval is emulated seconds, and a counter's
samples are timed on the emulated clock: the rates are emulated Mbit/s.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from .compat import (
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    BaseApp,
    hub,
    new_event,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from .flows import COOKIE_COUNTED_MASK, COOKIE_JOB
from .settings import settings
from .stats import Rates, Sample, link_ends, sample_time

# What a port's statistics say of packets it passed and dropped (OpenFlow 1.3 ofp_port_stats):
# rx_dropped counts what the switch could not take in — on OVS's userspace datapath, packets its
# forwarding thread did not read from the port in time.
PORT_COUNTERS = ("rx_packets", "tx_packets", "rx_dropped", "tx_dropped")


class NetworkMonitor(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        s = settings()
        self.topo = s.topo
        self.interval = s.stats_interval
        self.clock = s.dilation
        self.known = {sw.dpid: sw.name for sw in self.topo.switches}
        # Replaced, never mutated (copy-on-write): REST threads iterate them without a lock.
        self.datapaths: dict[int, Any] = {}
        self.connected_at: dict[int, float] = {}
        self.meter_limit: dict[int, int] = {}  # from each switch's meter features
        self.switch_events: deque[dict[str, Any]] = deque(maxlen=500)
        self.ports = Rates()  # (dpid, port, "rx"|"tx")
        self.flows = Rates()  # (dpid, cookie): bytes matched by a job entry or its way back
        self.flow_packets: dict[tuple[int, int], int] = {}
        self.meters_in = Rates()  # (dpid, meter_id): bytes entering the meter
        self.meters_dropped = Rates()  # (dpid, meter_id): bytes its drop band dropped
        self.down: frozenset[tuple[int, int]] = frozenset()  # (dpid, port) without link
        # (dpid, port) -> the port's counters as last reported (PORT_COUNTERS)
        self.port_counters: dict[tuple[int, int], dict[str, int]] = {}
        self._parts: dict[tuple[int, str], set[int]] = {}  # ids seen so far in a multi-part reply
        self.ends = link_ends(self.topo)
        self._stopping = new_event()
        self._poller = None

    def start(self) -> Any:
        thread = super().start()
        self._poller = hub.spawn(self._poll_loop)
        return thread

    def stop(self) -> None:
        self._stopping.set()
        super().stop()

    # --- switches come and go -------------------------------------------------------------------

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def state_change_handler(self, ev: Any) -> None:
        dp = ev.datapath
        if dp.id is None:
            return  # the connection died before the handshake finished
        if ev.state == MAIN_DISPATCHER:
            self.datapaths = {**self.datapaths, dp.id: dp}
            self.connected_at = {**self.connected_at, dp.id: self.clock.time()}
            self._event("connect", dp.id, address=f"{dp.address[0]}:{dp.address[1]}")
            if dp.id not in self.known:
                self.logger.warning(
                    "switch %016x is not in topology '%s': left alone", dp.id, self.topo.name
                )
            parser = dp.ofproto_parser
            dp.send_msg(parser.OFPMeterFeaturesStatsRequest(dp, 0))
            dp.send_msg(parser.OFPPortDescStatsRequest(dp, 0))  # which ports have a link
        elif self.datapaths.get(dp.id) is dp:  # not an old connection dying after a new one
            self.datapaths = {d: x for d, x in self.datapaths.items() if d != dp.id}
            self.connected_at = {d: t for d, t in self.connected_at.items() if d != dp.id}
            for rates in (self.ports, self.flows, self.meters_in, self.meters_dropped):
                rates.forget(lambda key, d=dp.id: key[0] == d)
            self.down = frozenset(p for p in self.down if p[0] != dp.id)  # unknown again
            self._event("disconnect", dp.id)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def port_status_handler(self, ev: Any) -> None:
        msg = ev.msg
        ofp = msg.datapath.ofproto
        reason = {
            ofp.OFPPR_ADD: "port_add",
            ofp.OFPPR_DELETE: "port_delete",
            ofp.OFPPR_MODIFY: "port_modify",
        }.get(msg.reason, "port_status")
        down = bool(msg.desc.state & ofp.OFPPS_LINK_DOWN) or msg.reason == ofp.OFPPR_DELETE
        self._port_state(msg.datapath.id, [(msg.desc.port_no, down)])
        self._event(reason, msg.datapath.id, port=msg.desc.port_no, link_down=down)

    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, MAIN_DISPATCHER)
    def port_desc_stats_reply_handler(self, ev: Any) -> None:
        ofp = ev.msg.datapath.ofproto
        self._port_state(
            ev.msg.datapath.id,
            [(p.port_no, bool(p.state & ofp.OFPPS_LINK_DOWN)) for p in ev.msg.body],
        )

    def _port_state(self, dpid: int, ports: list[tuple[int, bool]]) -> None:
        down = set(self.down)
        for port, is_down in ports:
            (down.add if is_down else down.discard)((dpid, port))
        self.down = frozenset(down)

    def _event(self, kind: str, dpid: int, **extra: Any) -> None:
        self.switch_events.append(
            {
                "time": self.clock.time(),
                "event": kind,
                "dpid": dpid,
                "switch": self.known.get(dpid),
                **extra,
            }
        )
        self.logger.info("%s %s %s", kind, self.known.get(dpid, f"{dpid:016x}"), extra or "")

    # --- polling --------------------------------------------------------------------------------

    def _poll_loop(self) -> None:
        while not self._stopping.wait(self.clock.host_seconds(self.interval)):
            for dp in list(self.datapaths.values()):
                self.request_stats(dp)

    def request_stats(self, dp: Any) -> None:
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))
        dp.send_msg(
            parser.OFPFlowStatsRequest(
                dp, 0, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY, COOKIE_JOB, COOKIE_COUNTED_MASK
            )
        )
        dp.send_msg(parser.OFPMeterStatsRequest(dp, 0, ofp.OFPM_ALL))

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    def port_stats_reply_handler(self, ev: Any) -> None:
        now, dpid = time.monotonic(), ev.msg.datapath.id
        counters = dict(self.port_counters)
        for st in ev.msg.body:
            t = self._sample_time(st, now)
            self.ports.update((dpid, st.port_no, "rx"), Sample(st.rx_bytes, t))
            self.ports.update((dpid, st.port_no, "tx"), Sample(st.tx_bytes, t))
            counters[(dpid, st.port_no)] = {k: getattr(st, k) for k in PORT_COUNTERS}
        self.port_counters = counters

    def _sample_time(self, st: Any, received: float) -> float:
        """A reply's sample time (`stats.sample_time`) on the emulated clock."""
        return self.clock.emulated_seconds(sample_time(st.duration_sec, st.duration_nsec, received))

    @set_ev_cls(ofp_event.EventOFPFlowStatsReply, MAIN_DISPATCHER)
    def flow_stats_reply_handler(self, ev: Any) -> None:
        now, dpid = time.monotonic(), ev.msg.datapath.id
        for st in ev.msg.body:
            t = self._sample_time(st, now)
            self.flows.update((dpid, st.cookie), Sample(st.byte_count, t))
            self.flow_packets[(dpid, st.cookie)] = st.packet_count
        cookies = self._complete(ev.msg, "flows", {st.cookie for st in ev.msg.body})
        if cookies is not None:  # entries of removed jobs: forget their counters
            self.flows.forget(lambda key: key[0] == dpid and key[1] not in cookies)
            self.flow_packets = {
                k: v for k, v in self.flow_packets.items() if k[0] != dpid or k[1] in cookies
            }

    @set_ev_cls(ofp_event.EventOFPMeterStatsReply, MAIN_DISPATCHER)
    def meter_stats_reply_handler(self, ev: Any) -> None:
        now, dpid = time.monotonic(), ev.msg.datapath.id
        for st in ev.msg.body:
            t = self._sample_time(st, now)
            self.meters_in.update((dpid, st.meter_id), Sample(st.byte_in_count, t))
            dropped = sum(b.byte_band_count for b in st.band_stats)
            self.meters_dropped.update((dpid, st.meter_id), Sample(dropped, t))
        meters = self._complete(ev.msg, "meters", {st.meter_id for st in ev.msg.body})
        if meters is not None:
            for rates in (self.meters_in, self.meters_dropped):
                rates.forget(lambda key: key[0] == dpid and key[1] not in meters)

    def _complete(self, msg: Any, kind: str, ids: set[int]) -> set[int] | None:
        """All ids of a reply that may come in several parts: None until its last part."""
        key = (msg.datapath.id, kind)
        seen = self._parts.setdefault(key, set())
        seen |= ids
        if msg.flags & msg.datapath.ofproto.OFPMPF_REPLY_MORE:
            return None
        return self._parts.pop(key)

    @set_ev_cls(ofp_event.EventOFPMeterFeaturesStatsReply, MAIN_DISPATCHER)
    def meter_features_reply_handler(self, ev: Any) -> None:
        for st in ev.msg.body:
            self.meter_limit = {**self.meter_limit, ev.msg.datapath.id: st.max_meter}

    # --- views ----------------------------------------------------------------------------------

    def link_usage(self) -> list[dict[str, Any]]:
        """Both directions of every link: measured Mbit/s (None until two samples arrived)."""
        usage = []
        for end in self.ends:
            mbps = self.ports.rate((end.dpid, end.port, end.counter))
            usage.append(
                {
                    "src": end.src,
                    "dst": end.dst,
                    "switch": self.known[end.dpid],
                    "port": end.port,
                    "counter": end.counter,
                    "capacity_mbps": end.capacity_mbps,
                    "up": not self.down.intersection(end.ports),
                    "mbps": None if mbps is None else round(mbps, 3),
                    "utilisation": None if mbps is None else round(mbps / end.capacity_mbps, 4),
                }
            )
        return usage
