"""Counters → rates, and switch ports → directed links. Pure logic, no framework imports."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from topologies import Topology

# OpenFlow 1.3 marks an unsupported duration field with all ones.
DURATION_UNSUPPORTED = 0xFFFFFFFF


@dataclass(frozen=True)
class Sample:
    value: int  # a monotonically growing byte counter
    t: float  # seconds


def sample_time(duration_sec: int, duration_nsec: int, received: float) -> float:
    """A counter's timestamp: the switch's own clock (the entry's/port's age) when it reports one,
    because the controller's receive time jitters with its load; else the receive time."""
    if duration_sec == DURATION_UNSUPPORTED or (duration_sec == 0 and duration_nsec == 0):
        return received
    return duration_sec + duration_nsec / 1e9


def rate_mbps(prev: Sample, cur: Sample) -> float | None:
    """Mbit/s between two samples of one counter; None when unknowable (no time passed, or the
    counter went backwards: the port, entry or meter was re-created in between)."""
    dt = cur.t - prev.t
    if dt <= 0 or cur.value < prev.value:
        return None
    return (cur.value - prev.value) * 8 / dt / 1e6


class Rates:
    """The latest rate of many counters, each keyed by anything hashable. Thread-safe: the app's
    event loop writes while REST threads read."""

    def __init__(self) -> None:
        self._last: dict[Hashable, Sample] = {}
        self._rate: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def update(self, key: Hashable, sample: Sample) -> None:
        with self._lock:
            prev = self._last.get(key)
            self._last[key] = sample
            if prev is None:
                return
            r = rate_mbps(prev, sample)
            if r is None:
                self._rate.pop(key, None)
            else:
                self._rate[key] = r

    def rate(self, key: Hashable) -> float | None:
        return self._rate.get(key)

    def value(self, key: Hashable) -> int | None:
        s = self._last.get(key)
        return None if s is None else s.value

    def forget(self, match: Callable[[Hashable], bool]) -> None:
        """Drop every key for which `match(key)` is true (e.g. a disconnected switch's)."""
        with self._lock:
            for d in (self._last, self._rate):
                for key in [k for k in d if match(k)]:
                    del d[key]


@dataclass(frozen=True)
class LinkEnd:
    """Where the traffic of one direction of a link is counted: the port a switch sends it from
    (tx), or — when the sender is a compute node — the port the switch receives it on (rx)."""

    src: str
    dst: str
    dpid: int
    port: int
    counter: str  # "tx" or "rx"
    capacity_mbps: float
    ports: tuple[tuple[int, int], ...]  # (dpid, port) of the link's switch ends: down if any is


def link_ends(topo: Topology) -> list[LinkEnd]:
    """Both directions of every link of `topo`, each with the switch counter that measures it."""
    switches = {s.name: s.dpid for s in topo.switches}
    ends = []
    for lk in topo.links:
        ports = tuple((switches[e], lk.port_of(e)) for e in (lk.a, lk.b) if e in switches)
        for a, b in ((lk.a, lk.b), (lk.b, lk.a)):
            if a in switches:
                ends.append(LinkEnd(a, b, switches[a], lk.port_of(a), "tx", lk.bw_mbps, ports))
            else:
                ends.append(LinkEnd(a, b, switches[b], lk.port_of(b), "rx", lk.bw_mbps, ports))
    return ends
