"""Remove what testbed runs created, found by their anchored name prefix.

`cleanup(prefix)` is both the normal teardown of an `Emulation` and the recovery after a run that
was killed (`python experiments/run.py --cleanup [--prefix P]`). Without a prefix it removes what
*any* run of this project left (`ces` + 4 hex digits), never anything else: no `mn -c`, no broad
kills. Order matters: containers (and the processes in them) first, then the Mininet shells that
still hold their network namespaces, then OVS bridges and ports, then veths left in the root
namespace (their qdiscs go with them), then the nodes' cgroup parents.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from . import cgroups
from .names import FAMILY_RE, check_prefix


@dataclass
class Removed:
    containers: list[str] = field(default_factory=list)
    shells: list[int] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)

    def total(self) -> int:
        return sum(len(v) for v in vars(self).values())

    def summary(self) -> str:
        parts = [f"{len(v)} {k}" for k, v in vars(self).items() if v]
        return ", ".join(parts) if parts else "nothing"


def pattern_for(prefix: str | None) -> re.Pattern[str]:
    return re.compile("^" + re.escape(check_prefix(prefix))) if prefix else FAMILY_RE


def cleanup(prefix: str | None = None, client: docker.DockerClient | None = None) -> Removed:
    pattern = pattern_for(prefix)
    removed = Removed()
    _containers(client or docker.from_env(), pattern, removed)
    _shells(pattern, removed)
    _ovs(pattern, removed)
    _interfaces(pattern, removed)
    for parent in cgroups.find(pattern):
        try:
            cgroups.remove(parent)
            removed.cgroups.append(parent)
        except OSError:
            pass  # a process still inside: gone once its container is; reported by leftovers()
    return removed


def leftovers(prefix: str | None = None, client: docker.DockerClient | None = None) -> dict[str, list]:
    """What still exists with the prefix (empty lists after a clean teardown)."""
    pattern = pattern_for(prefix)
    client = client or docker.from_env()
    return {
        "containers": [c.name for c in client.containers.list(all=True) if pattern.match(c.name)],
        "shells": [pid for pid, _ in _shell_pids(pattern)],
        "bridges": [b for b in _vsctl("list-br").split() if pattern.match(b)],
        "ports": [p for b in _vsctl("list-br").split() for p in _vsctl("list-ports", b).split()
                  if pattern.match(p)],
        "interfaces": [i for i in _root_interfaces() if pattern.match(i)],
        "qdiscs": [line for line in _run(["tc", "qdisc", "show"]).splitlines()
                   if any(pattern.match(w) for w in line.split())],
        "cgroups": cgroups.find(pattern),
    }


def _containers(client: docker.DockerClient, pattern: re.Pattern[str], removed: Removed) -> None:
    doomed = [c for c in client.containers.list(all=True) if pattern.match(c.name)]

    def remove(c) -> str | None:
        try:
            c.remove(force=True)  # SIGKILL: the processes inside die with it
            return c.name
        except docker.errors.NotFound:
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        removed.containers += [n for n in pool.map(remove, doomed) if n]


def _shell_pids(pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """Mininet node shells (`bash ... mininet:NAME`) of matching nodes."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            if arg.startswith(b"mininet:") and pattern.match(arg[8:].decode(errors="replace")):
                found.append((int(proc.name), arg.decode()))
    return found


def _shells(pattern: re.Pattern[str], removed: Removed) -> None:
    for pid, _ in _shell_pids(pattern):
        try:
            os.kill(pid, signal.SIGKILL)
            removed.shells.append(pid)
        except ProcessLookupError:
            pass


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout


def _vsctl(*args: str) -> str:
    return _run(["ovs-vsctl", "--timeout=10", *args])


def _ovs(pattern: re.Pattern[str], removed: Removed) -> None:
    bridges = _vsctl("list-br").split()
    ours = [b for b in bridges if pattern.match(b)]
    if ours:
        cmd = ["ovs-vsctl", "--timeout=30"]
        for b in ours:
            cmd += ["--", "--if-exists", "del-br", b]
        subprocess.run(cmd, capture_output=True, check=False)
        removed.bridges += ours
    # Our interfaces attached to someone else's bridge (rare) leave port rows behind.
    for b in bridges:
        if b in ours:
            continue
        for port in _vsctl("list-ports", b).split():
            if pattern.match(port):
                _vsctl("--if-exists", "del-port", b, port)
                removed.ports.append(port)


def _root_interfaces() -> list[str]:
    names = []
    for line in _run(["ip", "-o", "link", "show"]).splitlines():
        # "12: ces1a2bs0p1@ces1a2bs1p1: <BROADCAST,..."
        names.append(line.split(":", 2)[1].strip().split("@")[0])
    return names


def _interfaces(pattern: re.Pattern[str], removed: Removed) -> None:
    for name in _root_interfaces():
        if pattern.match(name):
            # Deleting one end of a veth deletes its peer too, so failures here are expected.
            if subprocess.run(["ip", "link", "del", name], capture_output=True).returncode == 0:
                removed.interfaces.append(name)
