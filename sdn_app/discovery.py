"""LinkDiscovery (optional, `--lldp`): the framework's LLDP link discovery, checked against the
topology file. On a physical testbed this is how a cabling mistake or a wrong port number in the
file shows up: a link the file has but LLDP does not see, or one LLDP sees that the file lacks.

The discovery itself is the framework's `topology.switches` app (loaded alongside, with
`observe_links`); CesSdnApp's resync installs the LLDP-to-controller entry on every switch.
"""

from __future__ import annotations

import time
from typing import Any

from .compat import BaseApp, app_manager, hub, new_event, ofproto_v1_3, set_ev_cls, topology_event
from .settings import settings

Port = tuple[int, int]  # (dpid, port number)


class LinkDiscovery(BaseApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.topo = settings().topo
        self.names = {s.dpid: s.name for s in self.topo.switches}
        self.seen: dict[Port, tuple[Port, float]] = {}  # src port → (dst port, since)
        self._stopping = new_event()

    def start(self) -> Any:
        thread = super().start()
        hub.spawn(self._wake_loop)
        return thread

    def stop(self) -> None:
        self._stopping.set()
        super().stop()

    def _wake_loop(self) -> None:
        """The framework's LLDP app paces its sending and link expiry with
        `hub.Event.wait(timeout)`, which never times out on os-ken's native hub: it would send
        LLDP once per new port (often before our resync installed the LLDP entry) and never
        again. Waking it every second makes it work as under eventlet (there, harmlessly)."""
        while not self._stopping.wait(1.0):
            lldp = app_manager.lookup_service_brick("switches")
            if lldp is not None:
                lldp.lldp_event.set()
                lldp.link_event.set()

    @set_ev_cls(topology_event.EventLinkAdd)
    def link_add_handler(self, ev: Any) -> None:
        src, dst = ev.link.src, ev.link.dst
        self.seen = {**self.seen, (src.dpid, src.port_no): ((dst.dpid, dst.port_no), time.time())}

    @set_ev_cls(topology_event.EventLinkDelete)
    def link_delete_handler(self, ev: Any) -> None:
        key = (ev.link.src.dpid, ev.link.src.port_no)
        self.seen = {k: v for k, v in self.seen.items() if k != key}

    def expected(self) -> set[tuple[Port, Port]]:
        """Both directions of every switch-to-switch link of the topology file."""
        dpid = {s.name: s.dpid for s in self.topo.switches}
        links = set()
        for lk in self.topo.links:
            if lk.a in dpid and lk.b in dpid:
                a, b = (dpid[lk.a], lk.port_a), (dpid[lk.b], lk.port_b)
                links |= {(a, b), (b, a)}
        return links

    def report(self) -> dict[str, Any]:
        seen = {(src, dst) for src, (dst, _) in self.seen.items()}
        expected = self.expected()
        return {
            "discovered": [self._describe(x) for x in sorted(seen)],
            "missing": [self._describe(x) for x in sorted(expected - seen)],
            "unexpected": [self._describe(x) for x in sorted(seen - expected)],
        }

    def _describe(self, link: tuple[Port, Port]) -> dict[str, Any]:
        (a, pa), (b, pb) = link
        return {
            "src": self.names.get(a, f"{a:016x}"),
            "src_port": pa,
            "dst": self.names.get(b, f"{b:016x}"),
            "dst_port": pb,
        }
