"""What emulating costs this host: the CPU the network's traffic takes, measured on the datapath
the testbed uses here, and what the host burns with nothing running. A run's budget
(experiments/e2e/budget.py) adds these to its workers' quotas to decide whether the scenario
fits the host or must be time-dilated.

    python -m testbed.hostcost            # the figures for this host (measured once, then kept)
    python -m testbed.hostcost --measure  # measure again

How: a small emulation of two chains, one switch between two nodes and three switches between
two others, links shaped at 1000 Mbit/s as in a run; a paced iperf3 TCP transfer along each chain
in turn, at each of RATES_MBPS: the cost of a Gbit is not the same at every rate — the userspace
datapath reads a port's packets in batches, and a slow flow brings one packet a wake-up (on the
development VM a dilated run's ovs-vswitchd used 0.37 cores at K = 3 and 0.33 at K = 6, for half
the traffic). What it costs is read where it is spent rather than from the host's total, so another
load on the machine does not count: ovs-vswitchd's CPU time (on the userspace datapath it
forwards every packet on its own thread: the switches' share); idle, the daemons' CPU with the
emulation up and nothing flowing (ovs-vswitchd, dockerd, containerd). Two path lengths split the
switches' cost per switch crossed. What the two ends spend (their TCP stacks, veths, iperf3) is
charged to the nodes' cgroups, inside the quotas a budget already counts. Kept in build/ per machine, datapath, OVS version and kernel; a different host or
datapath measures again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy

from topologies import parse_topology

from . import ovs_sockets
from .containernet import detect_datapath
from .emulation import Emulation, EmulationError

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO / "build"
# Paced rates a flow is measured at: from a dilated tenant's few Mbit/s to what every datapath
# here carries without loss (ENVIRONMENT.md).
RATES_MBPS = (5.0, 25.0, 200.0)
SECONDS = 5.0


@dataclass(frozen=True)
class HostCost:
    """Host cores per Gbit/s of emulated traffic, and with nothing running."""

    key: str  # machine, datapath, OVS and kernel the figures belong to
    cores: int
    datapath: str
    rates_mbps: tuple[float, ...]  # the flow rates measured at
    switch_s_per_gbit: tuple[float, ...]  # per rate: host CPU s per Gbit per switch crossed
    idle_cores: float  # busy cores with the emulation up and nothing flowing
    measured_at: str

    def switching_cores(self, flows_mbps: list[float], switches: float) -> float:
        """Host cores the switches take for flows of `flows_mbps` (each at its host rate) crossing
        `switches` switches on average: each flow at the cost of a Gbit at its rate
        (interpolated on the log of the rate, held at the ends of the range measured)."""
        return sum(
            mbps / 1000 * switches * self._at(self.switch_s_per_gbit, mbps) for mbps in flows_mbps
        )

    def _at(self, costs: tuple[float, ...], mbps: float) -> float:
        x = [math.log(r) for r in self.rates_mbps]
        return float(numpy.interp(math.log(max(mbps, 1e-6)), x, costs))


def host_key(datapath: str) -> str:
    """What the figures depend on: the CPU, its count, the datapath, OVS and the kernel."""

    def first_line(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
            return out.strip().splitlines()[0]
        except (OSError, IndexError):
            return ""

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    parts = [
        cpu,
        str(_cores()),
        datapath,
        first_line(["ovs-vswitchd", "--version"]),
        platform.release(),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def busy_ticks(stat_line: str, niced: bool = True) -> int:
    """Clock ticks the cores have been busy, from /proc/stat's first line ("cpu user nice ..."):
    user, system, interrupts and steal (guest time is already in user and nice), and with
    `niced` the time of processes at a positive nice. Without it, what a run's verdict counts: a
    process at nice 19 gets about 1.5 % of a core another wants (CFS weights 15 against 1024),
    so its time was the emulation's for the asking, and a run beside a niced build or test is
    not short of CPU for it (the emulation's own processes run at nice 0, ovs-vswitchd at -10)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(x) for x in stat_line.split()[1:9]
    )
    return user + system + irq + softirq + steal + (nice if niced else 0)


def busy_seconds(niced: bool = True) -> float:
    """CPU seconds this host's cores have been busy since boot (`busy_ticks`)."""
    line = Path("/proc/stat").read_text().splitlines()[0]
    return busy_ticks(line, niced) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system seconds of process `pid` and of the children it waited for (0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main_thread_wait_s(pid: int) -> float:
    """Seconds the main thread of process `pid` has been runnable but not on a core since it
    started (the scheduler's run_delay; 0 when gone). ovs-vswitchd forwards on its main thread
    on the userspace datapath: its wait is the switches' share of an oversubscribed host."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _daemons() -> list[int]:
    """The pids of what every emulation runs on: ovs-vswitchd, dockerd, containerd."""
    out = subprocess.run(
        ["pgrep", "-x", "ovs-vswitchd|dockerd|containerd"], capture_output=True, text=True
    ).stdout
    return [int(x) for x in out.split()]


CALIBRATION_TOPOLOGY = {
    "name": "hostcost",
    "defaults": {"bw_mbps": 1000},
    "switches": [{"name": n} for n in ("s1", "t1", "t2", "t3")],
    "nodes": [{"name": n, "cpu": 0.5, "mem_mb": 256} for n in ("a1", "a2", "b1", "b2")],
    "links": [
        {"ends": ["a1", "s1"]},
        {"ends": ["a2", "s1"]},
        {"ends": ["b1", "t1"]},
        {"ends": ["t1", "t2"]},
        {"ends": ["t2", "t3"]},
        {"ends": ["b2", "t3"]},
        {"ends": ["s1", "t1"]},  # one network (the chains' transfers do not cross it)
    ],
}


def measure(image: str | None = None) -> HostCost:
    """Measure on a calibration emulation (see the module's doc); ~1 min."""
    topo = parse_topology(CALIBRATION_TOPOLOGY, "hostcost")
    datapath = detect_datapath()
    vswitchd = ovs_sockets.vswitchd_pid()
    with Emulation(topo, image=image) as net:  # standalone switches: nothing else runs

        def spent() -> tuple[float, float]:
            """(monotonic s, CPU s of the daemons)."""
            return time.monotonic(), sum(process_cpu_s(pid) for pid in _daemons())

        time.sleep(1.0)
        t0, d0 = spent()
        switch0 = process_cpu_s(vswitchd)
        time.sleep(SECONDS)
        t1, d1 = spent()
        idle = (d1 - d0) / (t1 - t0)
        idle_switch = (process_cpu_s(vswitchd) - switch0) / (t1 - t0)
        switch_s: dict[tuple[float, int], float] = {}
        for rate in RATES_MBPS:
            for src, dst, switches in (("a1", "a2", 1), ("b1", "b2", 3)):
                t0, s0 = time.monotonic(), process_cpu_s(vswitchd)
                gbit = _paced(net, src, dst, rate) / 1000 * SECONDS
                spent_switch = process_cpu_s(vswitchd) - s0 - idle_switch * (time.monotonic() - t0)
                switch_s[rate, switches] = spent_switch / gbit
    # per switch crossed: the three-switch path's cost per switch, which counts the first
    # switch's ports to the nodes' veths as a one-switch path does
    per_switch = [switch_s[r, 3] / 3 for r in RATES_MBPS]
    return HostCost(
        host_key(datapath),
        _cores(),
        datapath,
        RATES_MBPS,
        tuple(round(x, 4) for x in per_switch),
        round(idle, 4),
        time.strftime("%Y-%m-%d %H:%M:%S %z"),
    )


def _paced(net: Emulation, src: str, dst: str, rate: float) -> float:
    """A paced iperf3 TCP transfer from `src` to `dst` at `rate` for SECONDS: Mbit/s received."""
    dst_ip = net.topo.node(dst).ip
    code, out = net.exec(dst, "iperf3 -s -1 -D -p 5299")
    if code != 0:
        raise EmulationError(f"hostcost: iperf3 server on {dst}: {out.strip()}")
    net.wait_listening(dst, 5299, f"hostcost: iperf3 server on {dst}")
    code, out = net.exec(src, f"iperf3 -c {dst_ip} -p 5299 -t {SECONDS:g} -b {rate:g}M -J")
    try:
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    except (json.JSONDecodeError, KeyError):
        raise EmulationError(f"hostcost: iperf3 {src} -> {dst} failed: {out[-300:]}") from None


def cache_path(key: str) -> Path:
    return CACHE_DIR / f"hostcost-{key}.json"


def load(datapath: str | None = None) -> HostCost | None:
    """The kept figures for this host and datapath, None if not measured yet."""
    path = cache_path(host_key(datapath or detect_datapath()))
    try:
        doc = json.loads(path.read_text())
        return HostCost(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})
    except (OSError, ValueError, TypeError):  # none kept, or kept by an older version
        return None


def ensure(image: str | None = None, log=print) -> HostCost:
    """The kept figures, or measured now (and kept) when there are none for this host."""
    cost = load()
    if cost is None:
        log("measuring what forwarding costs this host (once per machine; ~1 min)")
        cost = measure(image)
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        cache_path(cost.key).write_text(json.dumps(asdict(cost), indent=1))
    return cost


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m testbed.hostcost", description=__doc__.split("\n")[0]
    )
    p.add_argument("--measure", action="store_true", help="measure again even if kept")
    a = p.parse_args(argv)
    if a.measure:
        cost = measure()
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        cache_path(cost.key).write_text(json.dumps(asdict(cost), indent=1))
    else:
        cost = ensure()
    print(json.dumps(asdict(cost), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
