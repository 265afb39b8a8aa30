"""What a task measures about itself: clocks, interface byte counters, CPU quota, JSON lines."""

from __future__ import annotations

import json
import math
import os
import socket
import struct
import sys
import time
from pathlib import Path
from typing import IO, Any

from protocol.worker import START_ENV


def process_start_time() -> float:
    """Epoch seconds at which this process was created (before the interpreter started)."""
    stat = Path("/proc/self/stat").read_text()
    # Field 22 (starttime, clock ticks since boot) counted after the ')' closing the command.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    # /proc/stat's btime is whole seconds; the boot clock gives the boot instant precisely.
    boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def container_start_time() -> float | None:
    value = os.environ.get(START_ENV)
    try:
        return float(value) if value else None
    except ValueError:
        return None


class InterfaceCounters:
    """Bytes sent/received on a network interface, from /sys/class/net/IFACE/statistics.

    Counters belong to the interface, so they include every process using it (on a testbed node
    several workers may share one interface; on loopback all local ranks share `lo`)."""

    def __init__(self, iface: str) -> None:
        self.base = Path("/sys/class/net") / iface / "statistics"
        self._last = self.read()

    def read(self) -> tuple[int, int] | None:
        try:
            return (
                int((self.base / "tx_bytes").read_text()),
                int((self.base / "rx_bytes").read_text()),
            )
        except OSError:
            return None

    def delta(self) -> tuple[int | None, int | None]:
        """(tx, rx) bytes since the previous call."""
        now = self.read()
        last, self._last = self._last, now
        if now is None or last is None:
            return None, None
        return now[0] - last[0], now[1] - last[1]


def cpu_quota() -> float | None:
    """Cores this process may use under its cgroup's CFS quota (v1 or v2), None if unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period_us = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def default_threads() -> int:
    """One intra-op thread per granted core (rounded up): more only fight over the quota."""
    cores = os.cpu_count() or 1
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


# Fields of the kernel's struct tcp_info (linux/tcp.h; append-only, so the offsets are stable):
# offset → (name, format). busy/rwnd/sndbuf are microseconds (Linux ≥ 4.10), bytes_sent and
# bytes_retrans Linux ≥ 4.19; segs_out counts every segment sent, pure ACKs included.
_TCP_INFO_FIELDS = {
    5: ("options", "B"),
    120: ("bytes_acked", "Q"),
    136: ("segs_out", "I"),
    168: ("busy_us", "Q"),
    176: ("rwnd_limited_us", "Q"),
    184: ("sndbuf_limited_us", "Q"),
    200: ("bytes_sent", "Q"),
    208: ("bytes_retrans", "Q"),
}
_TCP_INFO_LEN = 232
_TCPI_OPT_TIMESTAMPS = 1


def tcp_send_counters() -> dict:
    """What the kernel measured of this process's TCP connections, for the network's view of its
    flows: {"address": this end's IP, "peers": {peer IP: counters}} with, per peer, the
    connection that sent it the most (bytes_acked, bytes_sent (retransmissions included),
    segs_out, options, busy_us: time with data queued or in flight, rwnd_limited_us,
    sndbuf_limited_us, bytes_retrans). bytes_acked / busy_us is the rate the network carried
    while the sender had something to send, whatever the application did in between
    (computing, waiting for a slower ring member); `wire_rate_mbps` adds the frames' headers."""
    address, peers = None, {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        with sock:
            if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
                continue
            try:
                peer = sock.getpeername()[0]
                local = sock.getsockname()[0]
                raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
            except OSError:  # listening or not connected
                continue
        if peer == local:  # co-located ranks: never on the network
            continue
        info = {
            name: struct.unpack_from(fmt, raw, off)[0]
            for off, (name, fmt) in _TCP_INFO_FIELDS.items()
            if off + struct.calcsize(fmt) <= len(raw)
        }
        address = local
        if info.get("bytes_acked", 0) >= peers.get(peer, {}).get("bytes_acked", -1):
            peers[peer] = info
    return {"address": address, "peers": peers}


def busy_rate_mbps(counters: dict) -> float | None:
    """Goodput while busy: bytes acknowledged × 8 / time busy sending, in Mbit/s (None without
    busy time)."""
    busy = counters.get("busy_us", 0)
    return round(counters["bytes_acked"] * 8 / busy, 3) if busy > 0 else None


def wire_rate_mbps(counters: dict) -> float | None:
    """What the sender put on the wire while busy, in Mbit/s: every byte sent (retransmissions
    too) plus each segment's Ethernet, IPv4 and TCP headers (+ 12 bytes of timestamps when
    negotiated) — the bytes a shaper or meter counts against the grant. None without busy time
    or on kernels without bytes_sent."""
    busy = counters.get("busy_us", 0)
    if busy <= 0 or "bytes_sent" not in counters:
        return None
    header = 14 + 20 + 20 + (12 if counters.get("options", 0) & _TCPI_OPT_TIMESTAMPS else 0)
    return round((counters["bytes_sent"] + header * counters.get("segs_out", 0)) * 8 / busy, 3)


class JsonLines:
    """One JSON object per line, flushed at once so a crash loses nothing already measured."""

    def __init__(self, path: str) -> None:
        if path == "-":
            self._file: IO[str] = sys.stdout
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115  (closed by close())

    def write(self, kind: str, **fields: Any) -> None:
        self._file.write(json.dumps({"type": kind, **fields}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not sys.stdout:
            self._file.close()

    def __enter__(self) -> JsonLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
