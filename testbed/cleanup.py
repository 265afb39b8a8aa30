"""Remove what testbed runs created, found by their anchored name prefix.

`cleanup(prefix)` is both the normal teardown of an `Emulation` and the recovery after a run that
was killed (`python experiments/run.py --cleanup [--prefix P]`). Without a prefix it removes what
every *dead* run of this project left (`ces` + 4 hex digits): a run whose process is still alive
(its containers carry its pid, its Mininet shells are its children) is left alone, so a cleanup
never pulls the network from under a run in progress. Never anything else: no `mn -c`, no broad
kills. Order matters: the run's own processes first (the SDN app, the Master and the agents that
`experiments/run.py` starts in sessions of their own survive its kill -9; found by the prefix in
their environment, they must not react to what is removed next), then containers (and the
processes in them), then the Mininet shells that still hold their network namespaces, then OVS
bridges and ports, then veths left in the root namespace (their qdiscs go with them), then the
nodes' cgroup parents.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors

from edge import cgroups

from .names import FAMILY_RE, check_prefix


@dataclass
class Removed:
    processes: list[int] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    shells: list[int] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    live_runs_kept: list[str] = field(default_factory=list)  # prefixes of runs still running

    def total(self) -> int:
        return sum(len(v) for k, v in vars(self).items() if k != "live_runs_kept")

    def summary(self) -> str:
        parts = [f"{len(v)} {k}" for k, v in vars(self).items() if v and k != "live_runs_kept"]
        text = ", ".join(parts) if parts else "nothing"
        if self.live_runs_kept:
            text += f" (kept the live runs {', '.join(self.live_runs_kept)})"
        return text

    def add(self, other: Removed) -> None:
        for k, v in vars(other).items():
            getattr(self, k).extend(v)


def pattern_for(prefix: str | None) -> re.Pattern[str]:
    return re.compile("^" + re.escape(check_prefix(prefix))) if prefix else FAMILY_RE


PID_LABEL = "ces.pid"  # on every container of a run: the pid of the process that owns the run
PREFIX_ENV = "CES_RUN_PREFIX"  # in the environment of every process a run starts: its prefix


def cleanup(prefix: str | None = None, client: docker.DockerClient | None = None) -> Removed:
    """Remove the run `prefix` (alive or not), or with no prefix every run that is not alive."""
    client = client or docker.from_env()
    if prefix is None:
        removed = Removed()
        for run in run_prefixes(client):
            if run_alive(run, client):
                removed.live_runs_kept.append(run)
            else:
                removed.add(cleanup(run, client))
        return removed
    pattern = pattern_for(prefix)
    removed = Removed()
    _processes(pattern, removed)
    _containers(client, pattern, removed)
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


def run_prefixes(client: docker.DockerClient) -> list[str]:
    """Prefixes of every run that left anything on this machine."""
    names = [name for name, _ in _matching_containers(client, FAMILY_RE)]
    names += _vsctl("list-br").split() + _root_interfaces()
    names += [p.lstrip("/") for p in cgroups.find(FAMILY_RE)]
    names += [arg[len("mininet:") :] for _, arg in _shell_pids(FAMILY_RE)]
    names += [run for _, run in _run_processes(FAMILY_RE)]
    return sorted({n[:7] for n in names if FAMILY_RE.match(n)})


def run_alive(prefix: str, client: docker.DockerClient) -> bool:
    """Is the process that runs `prefix` still there? (the pid on its containers, or the
    parent of its Mininet shells or of the processes it started — after a crash those are
    re-parented away)."""
    pattern = pattern_for(prefix)
    pids = {
        (c.attrs.get("Labels") or {}).get(PID_LABEL)
        for _, c in _matching_containers(client, pattern)
    }
    pids |= {_parent_pid(pid) for pid, _ in _shell_pids(pattern) + _run_processes(pattern)}
    return any(_is_owner(pid) for pid in pids if pid)


def _parent_pid(pid: int) -> str | None:
    try:
        # /proc/PID/stat: "pid (comm) state ppid ..."; comm may contain spaces.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return None


def _is_owner(pid: str) -> bool:
    """A live Python process (an orchestrator), not init or a reaper that adopted orphans."""
    if not pid.isdigit() or int(pid) <= 1:
        return False
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def leftovers(
    prefix: str | None = None, client: docker.DockerClient | None = None
) -> dict[str, list]:
    """What still exists with the prefix (empty lists after a clean teardown)."""
    pattern = pattern_for(prefix)
    client = client or docker.from_env()
    return {
        "processes": [pid for pid, _ in _run_processes(pattern)],
        "containers": [name for name, _ in _matching_containers(client, pattern)],
        "shells": [pid for pid, _ in _shell_pids(pattern)],
        "bridges": [b for b in _vsctl("list-br").split() if pattern.match(b)],
        "ports": [
            p
            for b in _vsctl("list-br").split()
            for p in _vsctl("list-ports", b).split()
            if pattern.match(p)
        ],
        "interfaces": [i for i in _root_interfaces() if pattern.match(i)],
        "qdiscs": [
            line
            for line in _run(["tc", "qdisc", "show"]).splitlines()
            if any(pattern.match(w) for w in line.split())
        ],
        "cgroups": cgroups.find(pattern),
    }


def _matching_containers(
    client: docker.DockerClient, pattern: re.Pattern[str]
) -> list[tuple[str, object]]:
    """(name, container) of every container, in any state, whose name matches. Listed without
    inspecting each one (`sparse`): inspecting a container that another run removes meanwhile
    raises NotFound, and what is gone is no leftover."""
    out = []
    for c in client.containers.list(all=True, sparse=True):
        name = (c.attrs.get("Names") or ["/"])[0].lstrip("/")
        if pattern.match(name):
            out.append((name, c))
    return out


def _containers(client: docker.DockerClient, pattern: re.Pattern[str], removed: Removed) -> None:
    doomed = _matching_containers(client, pattern)

    def remove(item) -> str | None:
        name, c = item
        try:
            c.remove(force=True)  # SIGKILL: the processes inside die with it
            return name
        except docker.errors.NotFound:
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        removed.containers += [n for n in pool.map(remove, doomed) if n]


def _run_processes(pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """(pid, prefix) of the live processes a matching run started (`PREFIX_ENV`), not ours."""
    key = PREFIX_ENV.encode() + b"="
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")  # a zombie's is empty
        except OSError:
            continue
        for var in env:
            if var.startswith(key):
                run = var[len(key) :].decode(errors="replace")
                if pattern.match(run):
                    found.append((int(proc.name), run))
    return found


def _processes(pattern: re.Pattern[str], removed: Removed) -> None:
    """SIGKILL the run's processes (the agents' workers go with the containers next) and wait
    until they are gone."""
    pids = [pid for pid, _ in _run_processes(pattern)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            removed.processes.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _run_processes(pattern):
        time.sleep(0.05)


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
        # Deleting one end of a veth deletes its peer too, so failures here are expected.
        if (
            pattern.match(name)
            and subprocess.run(["ip", "link", "del", name], capture_output=True).returncode == 0
        ):
            removed.interfaces.append(name)
