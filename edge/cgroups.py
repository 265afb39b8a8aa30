"""The cgroup parent of an emulated node: caps the node container and all its workers together.

Docker puts a container started with `--cgroup-parent P` under P but sets no limit on P itself;
the node's capacity is written here, on P, so workers of several jobs share the node's CPU and
memory like pods on a Kubernetes node. Works with cgroup v1 (cpu + memory hierarchies) and v2
(unified), with Docker's cgroupfs driver (P = "/name") and systemd driver (P = "name.slice").
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
# The parent's CPU weight per core of capacity (v1 cpu.shares, v2 cpu.weight), and the least the
# kernel takes. A process outside every node weighs 1024 (v1, nice 0) or sits in a cgroup of
# weight 100 (v2), so nodes of a few cores yield the host's cores to the emulated switches (on
# the userspace datapath ovs-vswitchd forwards every packet on them) and to the control plane,
# as edge nodes never share a CPU with the network that connects them; among themselves, nodes
# short of CPU slow by the same factor, as their capacities say.
WEIGHT_PER_CORE = 16
MIN_WEIGHT = {1: 2, 2: 1}


def version() -> int:
    return 2 if (ROOT / "cgroup.controllers").exists() else 1


def parent_name(name: str, systemd_driver: bool) -> str:
    """What to pass as Docker's cgroup_parent for a node called `name` (a top-level cgroup;
    systemd reads '-' in a slice name as nesting, so it becomes '_' there)."""
    return f"{name.replace('-', '_')}.slice" if systemd_driver else f"/{name}"


def _roots() -> list[Path]:
    return [ROOT] if version() == 2 else [ROOT / "cpu", ROOT / "memory"]


def _dirs(parent: str) -> list[Path]:
    return [root / parent.strip("/") for root in _roots()]


MAX_PERIOD_US = 1_000_000  # the kernel's longest CFS period


def period_us(dilation: float = 1.0) -> int:
    """The CFS period under time dilation K: K × PERIOD_US (at most 1 s), so that a quota grants
    and throttles in the same emulated rhythm at any K — and stays the same milliseconds per
    period, far above the kernel's 5 ms bandwidth slice. With the period left at 100 ms, a 0.2-core
    task at K = 6 got 3.3 ms per period and every ring ran 2-10 % slower per iteration than at
    K = 3 (contention scenario, CES-PPO, seeds 0-1)."""
    return min(round(PERIOD_US * dilation), MAX_PERIOD_US)


def quota_us(cpu: float, period: int = PERIOD_US) -> int:
    """The CFS quota per `period` µs for `cpu` cores (the kernel's minimum is 1 ms)."""
    return max(int(cpu * period), 1000)


def weight(cpu: float, v: int) -> int:
    """The CPU weight of a node of `cpu` cores under cgroup version `v` (`WEIGHT_PER_CORE`)."""
    return max(MIN_WEIGHT[v], round(cpu * WEIGHT_PER_CORE))


def set_limits(parent: str, cpu: float, mem_mb: int, period: int = PERIOD_US) -> None:
    """Cap everything under `parent` at `cpu` cores and `mem_mb` MiB, and weigh it by its cores
    (`WEIGHT_PER_CORE`) when the host's cores are short (the parent must exist)."""
    v = version()
    current = PERIOD_US if v == 2 else int((_dirs(parent)[0] / "cpu.cfs_period_us").read_text())
    # v1 refuses a memory limit below current usage of the children; the node is fresh or the
    # caller lowers it deliberately, so let the error surface.
    for path, value in limit_writes(parent, cpu, mem_mb, period, v, current):
        path.write_text(value)


def limit_writes(
    parent: str,
    cpu: float,
    mem_mb: int,
    period: int = PERIOD_US,
    v: int = 1,
    current_period: int = PERIOD_US,
) -> list[tuple[Path, str]]:
    """The (file, value) writes of `set_limits` under cgroup version `v`, in their order, for a
    parent whose CFS period is `current_period` (a fresh one's is the kernel's default): also for
    a host reached over SSH (`lab.fabric`), whose cgroups sit at the same paths."""
    quota = quota_us(cpu, period)
    mem = int(mem_mb) * 1024 * 1024
    if v == 2:
        d = ROOT / parent.strip("/")
        return [
            (d / "cpu.max", f"{quota} {period}"),
            (d / "cpu.weight", str(weight(cpu, 2))),
            (d / "memory.max", str(mem)),
        ]
    cpu_dir, mem_dir = (ROOT / h / parent.strip("/") for h in ("cpu", "memory"))
    # v1 checks every write against the children's quota/period: the quota first when the period
    # grows, the period first when it shrinks, so that no step lowers the ratio below the target
    steps = [
        (cpu_dir / "cpu.cfs_quota_us", str(quota)),
        (cpu_dir / "cpu.cfs_period_us", str(period)),
    ]
    if period < current_period:
        steps.reverse()
    return [
        *steps,
        (cpu_dir / "cpu.shares", str(weight(cpu, 1))),
        (mem_dir / "memory.limit_in_bytes", str(mem)),
    ]


def limits(parent: str) -> tuple[float, int]:
    """(cpu cores, memory MiB) currently set on `parent`."""
    if version() == 2:
        (d,) = _dirs(parent)
        quota, period = (d / "cpu.max").read_text().split()
        cpu = float("inf") if quota == "max" else int(quota) / int(period)
        mem = (d / "memory.max").read_text().strip()
        return cpu, (1 << 62) if mem == "max" else int(mem) // (1024 * 1024)
    cpu_dir, mem_dir = _dirs(parent)
    quota_us = int((cpu_dir / "cpu.cfs_quota_us").read_text())
    period_us = int((cpu_dir / "cpu.cfs_period_us").read_text())
    limit = int((mem_dir / "memory.limit_in_bytes").read_text())
    return (float("inf") if quota_us < 0 else quota_us / period_us), limit // (1024 * 1024)


def usage_ns(parent: str) -> int | None:
    """CPU nanoseconds everything under `parent` has used (cgroup v2 cpu.stat, v1 cpuacct);
    None when the parent is gone."""
    parent = parent.strip("/")
    try:
        if version() == 2:
            for line in (ROOT / parent / "cpu.stat").read_text().splitlines():
                if line.startswith("usage_usec"):
                    return int(line.split()[1]) * 1000
            return None
        for hierarchy in ("cpuacct", "cpu,cpuacct", "cpu"):
            path = ROOT / hierarchy / parent / "cpuacct.usage"
            if path.exists():
                return int(path.read_text())
    except (OSError, ValueError):
        pass
    return None


def remove(parent: str) -> None:
    """Remove the parent (after its containers are gone) in every hierarchy that has it."""
    roots = [ROOT] if version() == 2 else [d for d in ROOT.iterdir() if d.is_dir()]
    for root in roots:
        d = root / parent.strip("/")
        if not d.is_dir():
            continue
        # Deepest first; cgroup directories are removed with rmdir (their files are virtual).
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            sub.rmdir()
        d.rmdir()


def find(pattern: re.Pattern[str]) -> list[str]:
    """Cgroup parents (as Docker's cgroup_parent strings) whose name matches `pattern`."""
    found = set()
    for root in _roots():
        for d in root.iterdir():
            if d.is_dir() and pattern.match(d.name):
                found.add(d.name if d.name.endswith(".slice") else f"/{d.name}")
    return sorted(found)
