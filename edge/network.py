"""The edge agent's Network Manager and resource sensing.

Network Manager: the sender-side half of a flow decision. The Master sends the complete set of
(destination address, granted Mbit/s) for this node; one HTB class per destination on the data
interface (`edge.tc`) enforces it. The interface must carry the HTB root at its line rate: the
emulation puts it there; on a real host the agent does it once with `--line-mbps`.

Usage: CPU and memory of the node's cgroup parent (all its workers together, cgroup v1 or v2), or
of the whole host when there is none; bytes on the data interface from /proc/PID/net/dev of a
process inside the node's network namespace (PID 1 of the node container, or the agent's own).

Both speak emulated units under time dilation (`protocol.dilation`): a grant's class runs at the
host's share of it, and usage is taken over emulated seconds (a host core busy for K host
seconds is one emulated core for one emulated second).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from protocol.dilation import NONE, Dilation
from protocol.messages import ShapingRule, Usage

from . import cgroups, tc

CG = Path("/sys/fs/cgroup")


class ShapingError(RuntimeError):
    """tc refused some destinations (the others were applied)."""


class NetworkManager:
    def __init__(
        self,
        iface: str,
        pid: int | None,
        line_mbps: float | None = None,
        dilation: Dilation = NONE,
    ):
        self.iface, self.pid, self.dilation = iface, pid, dilation
        self.lock = threading.Lock()
        if tc.link_rate(iface, pid, dilation) is None:
            if not line_mbps:
                raise RuntimeError(
                    f"{iface} has no HTB root: give the line rate (--line-mbps) "
                    "so the agent can shape it"
                )
            tc.shape(iface, line_mbps, pid=pid, dilation=dilation)

    def apply(self, rules: list[ShapingRule]) -> dict:
        """Make the per-destination classes exactly `rules` (add, change, remove)."""
        wanted: dict[int, ShapingRule] = {}
        for r in rules:  # every rule checked before anything changes
            if not r.rate_mbps > 0:
                raise ValueError(f"{r.dst_ip}: rate must be > 0, got {r.rate_mbps}")
            try:
                minor = tc.class_minor(r.dst_ip)
            except (ValueError, tc.TcError) as e:
                raise ValueError(f"dst_ip {r.dst_ip!r}: {e}") from None
            if minor in wanted:
                raise ValueError(
                    f"dst_ip {r.dst_ip!r}: shares its class with "
                    f"{wanted[minor].dst_ip} (one rule per destination)"
                )
            wanted[minor] = r
        errors = []
        with self.lock:
            current = tc.destinations(self.iface, self.pid, self.dilation)
            # Each destination on its own: one that tc refuses does not hold up the others.
            for minor in set(current) - set(wanted):
                try:
                    tc.remove_class(self.iface, minor, self.pid)
                except tc.TcError as e:
                    errors.append(str(e))
            for minor, r in wanted.items():
                if abs(current.get(minor, -1.0) - r.rate_mbps) > 1e-3:
                    try:
                        tc.set_destination(
                            self.iface, r.dst_ip, r.rate_mbps, self.pid, self.dilation
                        )
                    except tc.TcError as e:
                        errors.append(str(e))
        if errors:
            raise ShapingError("; ".join(errors))
        return {"classes": len(wanted)}

    def clear(self) -> None:
        self.apply([])

    def counters(self) -> tuple[int, int]:
        """(tx, rx) bytes of the data interface."""
        netdev = Path(f"/proc/{self.pid or 'self'}/net/dev").read_text()
        for line in netdev.splitlines():
            name, _, rest = line.partition(":")
            if name.strip() == self.iface:
                f = rest.split()
                return int(f[8]), int(f[0])
        raise RuntimeError(f"no interface {self.iface} in the node's network namespace")


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


class UsageMeter:
    """Usage since the previous sample: cores busy, memory in use, interface Mbit/s."""

    def __init__(self, network: NetworkManager, cgroup_parent: str | None):
        self.network, self.parent = network, (cgroup_parent or "").strip("/")
        self.clock = network.dilation
        self._last = self._sample()

    def _cpu_ns(self) -> int | None:
        if not self.parent:
            fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
            busy = sum(map(int, fields)) - int(fields[3]) - int(fields[4])  # minus idle, iowait
            return busy * 10**9 // os.sysconf("SC_CLK_TCK")
        return cgroups.usage_ns(self.parent)

    def _mem_mb(self) -> float:
        if not self.parent:
            info = dict(
                line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines()
            )
            used_kb = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
            return used_kb / 1024
        path = (
            CG / self.parent / "memory.current"
            if cgroups.version() == 2
            else CG / "memory" / self.parent / "memory.usage_in_bytes"
        )
        return (_read_int(path) or 0) / 2**20

    def _sample(self) -> tuple[float, int | None, tuple[int, int]]:
        return self.clock.monotonic(), self._cpu_ns(), self.network.counters()

    def sample(self) -> Usage:
        now = self._sample()
        (t0, cpu0, (tx0, rx0)), (t1, cpu1, (tx1, rx1)) = self._last, now
        self._last = now
        dt = max(t1 - t0, 1e-6)
        cores = (cpu1 - cpu0) / 1e9 / dt if cpu0 is not None and cpu1 is not None else 0.0
        return Usage(
            cpu_cores=round(max(cores, 0.0), 3),
            mem_mb=round(self._mem_mb(), 1),
            tx_mbps=round((tx1 - tx0) * 8 / dt / 1e6, 3),
            rx_mbps=round((rx1 - rx0) * 8 / dt / 1e6, 3),
        )
