"""Worker containers: one per task, joining a node's network namespace, under the node's cgroup.

Plain functions over a docker client, so the edge agent drives a real host's Docker engine with
the same code the emulation uses (there the "node" is the host: no network or cgroup parent).
"""

from __future__ import annotations

import re

import docker
import docker.errors
from docker.models.containers import Container

from . import cgroups


def start_worker(
    client: docker.DockerClient,
    image: str,
    name: str,
    command: str | list[str],
    cpu: float,
    mem_mb: int,
    env: dict[str, str] | None = None,
    node_container: str | None = None,
    cgroup_parent: str | None = None,
    labels: dict[str, str] | None = None,
    period_us: int = cgroups.PERIOD_US,
) -> Container:
    """Start a detached worker container.

    node_container: share that container's network namespace (`--network container:NAME`),
        i.e. the emulated node's interface and address; None = the host's network.
    cgroup_parent: the node's cgroup, which caps all workers of the node together.
    """
    return client.containers.run(
        image,
        command,
        name=name,
        detach=True,
        init=True,
        environment=env or {},
        network_mode=f"container:{node_container}" if node_container else "host",
        cgroup_parent=cgroup_parent,
        labels=labels or {},
        cpu_period=period_us,
        cpu_quota=cgroups.quota_us(cpu, period_us),
        mem_limit=f"{mem_mb}m",
        memswap_limit=f"{mem_mb}m",
    )


def stop_worker(client: docker.DockerClient, name: str, timeout_s: int = 5) -> None:
    """Stop (SIGTERM, then SIGKILL after `timeout_s`) and remove a worker; absent is fine."""
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return
    try:
        container.stop(timeout=timeout_s)
        container.remove(force=True)
    except docker.errors.NotFound:
        pass


def find_workers(client: docker.DockerClient, name_prefix: str) -> list[Container]:
    """Containers (running or not) whose name starts with `name_prefix` (anchored match)."""
    pattern = re.compile("^" + re.escape(name_prefix))
    return [
        c
        for c in client.containers.list(all=True, filters={"name": f"^{name_prefix}"})
        if pattern.match(c.name)
    ]  # Docker's filter is a regex; re-check literally
