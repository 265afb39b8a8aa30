"""What a testbed run was measured on: `scheduler.evaluate.machine_info` (CPU, cores, Python,
load) plus the testbed's side (host, kernel, memory, OVS datapath and versions, when)."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scheduler.evaluate import machine_info
from testbed import detect_datapath
from testbed.hostcost import busy_seconds


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


class HostBusy:
    """The host's busy share (all cores' non-idle time but that of niced processes, which yield
    it on demand: `busy_seconds`, / cores) in every `window_s` of a run,
    sampled by a thread of its own: how close the host came to running out of CPU, second by
    second (the budget's averages hide the bursts: a ring's iterations start together)."""

    def __init__(self, window_s: float = 1.0):
        self.window_s, self.shares = window_s, []
        self.cores = len(os.sched_getaffinity(0))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="host-busy", daemon=True)

    def __enter__(self) -> HostBusy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        for share in busy_windows(self.window_s, self._stop.wait):  # read while it runs
            self.shares.append(share)

    def summary(self, saturated: float) -> dict:
        return busy_summary(self.shares, saturated)


def busy_windows(window_s: float, wait: Callable[[float], Any] | None = None) -> Iterator[float]:
    """The host's busy share (`busy_seconds`, niced time left out, / cores) of each `window_s`,
    one window after another, until `wait` (by default time.sleep; a stop event's wait) returns
    true."""
    wait = wait or time.sleep
    cores = len(os.sched_getaffinity(0))
    t0, b0 = time.monotonic(), busy_seconds(niced=False)
    while not wait(window_s):
        t1, b1 = time.monotonic(), busy_seconds(niced=False)
        yield (b1 - b0) / (t1 - t0) / cores
        t0, b0 = t1, b1


# Between runs the stack only idles: its switches, agents, SDN app and Master took 1-11 % of this
# host's 2 cores, second by second, in the gaps between the fat-tree set's runs (20 switches;
# 41-69 % during them; sampled beside results/e2e/contention-fattree, not recorded in it). A host
# busier than this is still finishing something else (the image build, the last run's containers
# going away, another user's job), and a run started then shares the cores with it. QUIET_S
# seconds in a row below it make the host quiet; a run waits at most QUIET_TIMEOUT_S for that (a
# scenario whose tenant sends all session long, not from a `start_s`, idles higher).
QUIET_BUSY, QUIET_S, QUIET_TIMEOUT_S = 0.15, 3, 60.0


def wait_quiet(
    busy_max: float = QUIET_BUSY,
    seconds: int = QUIET_S,
    timeout_s: float = QUIET_TIMEOUT_S,
    window_s: float = 1.0,
) -> dict:
    """Wait until the host's busy share (`busy_windows`) stayed at most `busy_max` for `seconds`
    windows in a row, or `timeout_s` passed: {"quiet", "waited_s", "busy": the share of each
    window waited}, recorded with the run it preceded."""
    if not 1 <= seconds <= timeout_s / window_s:
        raise ValueError(f"wait_quiet: {seconds} windows of {window_s} s do not fit {timeout_s} s")
    t_start, shares, quiet = time.monotonic(), [], False
    for share in busy_windows(window_s):
        shares.append(round(share, 3))
        quiet = len(shares) >= seconds and max(shares[-seconds:]) <= busy_max
        if quiet or time.monotonic() - t_start >= timeout_s:
            break
    return {"quiet": quiet, "waited_s": round(time.monotonic() - t_start, 1), "busy": shares}


def busy_summary(shares: list[float], saturated: float) -> dict:
    """{mean, max, saturated_share: the share of windows with at least `saturated` of the cores
    busy} of windows' busy `shares`; {} before a window ended."""
    if not shares:
        return {}
    return {
        "mean": round(sum(shares) / len(shares), 3),
        "max": round(max(shares), 3),
        "saturated_share": round(sum(s >= saturated for s in shares) / len(shares), 4),
    }
