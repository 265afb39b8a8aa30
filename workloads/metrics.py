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

from protocol.dilation import NONE, Dilation
from protocol.worker import DILATION_ENV, START_ENV


def dilation() -> Dilation:
    """The time dilation this worker runs under (`protocol.worker` DILATION_ENV; none when it is
    not set): it reports every time and rate in emulated units, on the emulated clock."""
    return Dilation.parse(os.environ.get(DILATION_ENV))


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


def default_threads(clock: Dilation = NONE) -> int:
    """One intra-op thread per granted core (rounded up): more only fight over the quota. Under
    time dilation, per core of the emulated node's quota (the host's share × K), so that a task
    computes the same way at any K."""
    cores = os.cpu_count() or 1
    quota = cpu_quota()
    if quota is None:
        return cores
    return max(1, min(cores, math.ceil(clock.emulated_cores(quota) - 1e-9)))


def cpu_counters() -> dict:
    """What this process got of the host's CPU, cumulative since it started, in host seconds —
    the fidelity check's view of "did the worker run whenever it was entitled to"
    (`experiments.e2e.fidelity`): `used_s` (user + system time of all its threads), `main_used_s`
    and `main_wait_s` (its main thread's time on a core and runnable but not on one: the thread
    that computes, with one intra-op thread per granted core, `default_threads`), `throttled_s`
    (time its cgroup's CFS quota held it back: cpu.stat), `wall_s` (since it started) and `quota`
    (cores, None if unlimited). main_wait_s − throttled_s is the time the training thread waited
    for a core while its quota allowed it to run: what an oversubscribed host costs it. Summed
    over threads, waits overlap (gloo's threads wait together: 161 s of wait in 138 s) and say
    nothing. (Measured on this host: a busy loop at --cpus 0.2 on an idle machine waited 5.10 s
    in 6.5 s, its cgroup throttled 5.15 s; three at 0.8 on 2 cores waited 7.5 s in 10 s, throttled
    0.)"""
    tick = os.sysconf("SC_CLK_TCK")
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    on_core_ns, waited_ns = (int(x) for x in Path("/proc/self/schedstat").read_text().split()[:2])
    return {
        "used_s": round((int(stat[11]) + int(stat[12])) / tick, 3),
        "main_used_s": round(on_core_ns / 1e9, 3),
        "main_wait_s": round(waited_ns / 1e9, 3),
        "throttled_s": _throttled_s(),
        "wall_s": round(time.time() - process_start_time(), 3),
        "quota": cpu_quota(),
    }


def _throttled_s() -> float | None:
    """Seconds this cgroup's CFS quota has throttled it (cgroup v2 or v1), None if unknown."""
    for path, key, scale in (
        ("/sys/fs/cgroup/cpu.stat", "throttled_usec", 1e-6),
        ("/sys/fs/cgroup/cpu/cpu.stat", "throttled_time", 1e-9),
        ("/sys/fs/cgroup/cpu,cpuacct/cpu.stat", "throttled_time", 1e-9),
    ):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return round(int(value) * scale, 3)
        except (OSError, ValueError):
            continue
    return None


# Fields of the kernel's struct tcp_info (linux/tcp.h; append-only, so the offsets are stable):
# offset → (name, format). busy/rwnd/sndbuf are microseconds (Linux ≥ 4.10), bytes_sent and
# bytes_retrans Linux ≥ 4.19; segs_out counts every segment sent, pure ACKs included,
# data_segs_out (Linux ≥ 4.6) those that carried data; rto_count (tcpi_total_rto) the
# retransmission timeouts and rto_ms (tcpi_total_rto_time) the milliseconds spent recovering from
# them (Linux ≥ 6.7; a kernel without them leaves them out).
_TCP_INFO_FIELDS = {
    5: ("options", "B"),
    120: ("bytes_acked", "Q"),
    136: ("segs_out", "I"),
    156: ("data_segs_out", "I"),
    168: ("busy_us", "Q"),
    176: ("rwnd_limited_us", "Q"),
    184: ("sndbuf_limited_us", "Q"),
    200: ("bytes_sent", "Q"),
    208: ("bytes_retrans", "Q"),
    240: ("rto_count", "H"),
    244: ("rto_ms", "I"),
}
_TCP_INFO_LEN = 248
_TCP_INFO_TIMES = ("busy_us", "rwnd_limited_us", "sndbuf_limited_us", "rto_ms")
_TCPI_OPT_TIMESTAMPS = 1


def tcp_send_counters(clock: Dilation = NONE) -> dict:
    """What the kernel measured of this process's TCP connections, for the network's view of its
    flows: {"address": this end's IP, "peers": {peer IP: counters}} with, per peer, the
    connection that sent it the most (bytes_acked, bytes_sent (retransmissions included),
    segs_out, options, busy_us: time with data queued or in flight, rwnd_limited_us,
    sndbuf_limited_us, bytes_retrans, rto_count and rto_ms: its retransmission timeouts and the
    time it spent recovering from them). bytes_acked / busy_us is the rate the network carried
    while the sender had something to send, whatever the application did in between
    (computing, waiting for a slower ring member); `wire_rate_mbps` adds the frames' headers.
    The times are emulated microseconds under time dilation (`clock`), so the rates are too."""
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
        for name in _TCP_INFO_TIMES:
            if name in info:
                info[name] = round(clock.emulated_seconds(info[name]))
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
    too) plus each data segment's Ethernet, IPv4 and TCP headers (+ 12 bytes of timestamps when
    negotiated) — the bytes a shaper or meter counts against the grant. Pure ACKs are left out:
    a connection that carries data both ways (a parameter server's, an all-to-all pair's)
    acknowledges its peer's data while its own sending is idle, outside the busy time this rate
    divides by — counted, they put a star's flows at 1.06-1.07 of their grant with goodput at
    1.00 (the mixed scenario, docs/workloads.md). Kernels before 4.6 (no data_segs_out): every
    segment. None without busy time or on kernels without bytes_sent."""
    busy = counters.get("busy_us", 0)
    if busy <= 0 or "bytes_sent" not in counters:
        return None
    header = 14 + 20 + 20 + (12 if counters.get("options", 0) & _TCPI_OPT_TIMESTAMPS else 0)
    segments = counters.get("data_segs_out", counters.get("segs_out", 0))
    return round((counters["bytes_sent"] + header * segments) * 8 / busy, 3)


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
