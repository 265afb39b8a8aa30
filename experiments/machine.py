"""What a testbed run was measured on: `scheduler.evaluate.machine_info` (CPU, cores, Python,
load) plus the testbed's side (host, kernel, memory, OVS datapath and versions, when)."""

from __future__ import annotations

import platform
import subprocess
import time
from pathlib import Path

from scheduler.evaluate import machine_info
from testbed import detect_datapath


def machine() -> dict:
    def first_line(cmd: list[str]) -> str:
        try:
            return (
                subprocess.run(cmd, capture_output=True, text=True).stdout.strip().splitlines()[0]
            )
        except (OSError, IndexError):
            return ""

    mem_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        ),
        0,
    )
    return {
        **machine_info(),
        "host": platform.node(),
        "kernel": platform.release(),
        "mem_gb": round(mem_kb / 2**20, 1),
        "datapath": detect_datapath(),
        "docker": first_line(["docker", "--version"]),
        "ovs": first_line(["ovs-vswitchd", "--version"]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def cpu_stall_us() -> int | None:
    """Microseconds during which some runnable task of this machine waited for a CPU since boot
    (pressure stall information, `some` line of /proc/pressure/cpu); None where the kernel has
    no PSI. Over a run, its increase / the run's wall time is the share of the time the
    emulation (switching, shaping, training) was short of CPU."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(some.rsplit("total=", 1)[1]) if "total=" in some else None
