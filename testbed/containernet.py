"""Mininet with Docker containers as hosts: Containernet's calls on top of plain Mininet.

`DockerNode` is a Mininet host whose network namespace is a Docker container's. The container is
started with `--network none` under a per-node cgroup parent; Mininet moves the veth into it
(`ip link ... netns PID`) and its command shell joins only the container's network namespace
(`nsenter -t PID -n`), so host tools (ip, tc, ethtool) see the container's interfaces. Commands
meant to run *as the node* (and be charged to its CPU/memory quota) go through `docker exec`.

`DockerNet` adds Containernet's `addDocker` / `removeDocker` to `Mininet`; `EdgeSwitch` is an
OVSSwitch that keeps the topology's OpenFlow port numbers also for ports attached at run time and
runs RSTP in standalone mode (topologies have redundant paths; without a controller a loop would
flood forever).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import docker
import docker.errors
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch

from edge import cgroups

log = logging.getLogger(__name__)
_ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
_AVAILABLE_CC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def allow_congestion_control(name: str) -> None:
    """Let containers choose TCP congestion control `name`.

    A network namespace other than the host's may only pick an algorithm in the host's
    `tcp_allowed_congestion_control` list (EPERM otherwise), and a new namespace starts with
    the host's default, which some kernels set to BBR with cubic not allowed. The list only
    widens: nothing the host does changes."""
    allowed = _ALLOWED_CC.read_text().split()
    if name in allowed:
        return
    if name not in _AVAILABLE_CC.read_text().split():
        raise ValueError(f"TCP congestion control '{name}' is not in this kernel "
                         f"(available: {_AVAILABLE_CC.read_text().strip()})")
    _ALLOWED_CC.write_text(" ".join(allowed + [name]))
    log.info("added %s to the host's net.ipv4.tcp_allowed_congestion_control", name)


class DockerNode(Host):
    """A compute node: a long-lived container that owns the node's network interface."""

    def __init__(self, name: str, dimage: str, cpu: float, mem_mb: int, cgroup_parent: str,
                 client: docker.DockerClient, hostname: str, labels: dict[str, str],
                 tcp_cc: str, **params: Any) -> None:
        self.client = client
        self.cgroup_parent = cgroup_parent
        self.container = client.containers.run(
            dimage, ["sleep", "infinity"], name=name, hostname=hostname, detach=True, init=True,
            network_mode="none", cgroup_parent=cgroup_parent, labels=labels,
            cpu_period=cgroups.PERIOD_US, cpu_quota=cgroups.quota_us(cpu),
            mem_limit=f"{mem_mb}m", memswap_limit=f"{mem_mb}m",
            sysctls={"net.ipv4.tcp_congestion_control": tcp_cc})
        self.container.reload()
        self.container_pid: int = self.container.attrs["State"]["Pid"]
        # The parent caps the node container and every worker started under it together.
        cgroups.set_limits(cgroup_parent, cpu, mem_mb)
        super().__init__(name, inNamespace=False, **params)

    def _popen(self, cmd: list[str], **params: Any):  # type: ignore[override]
        # Mininet starts the node's shell with mnexec; prefixing nsenter puts that shell in the
        # container's network namespace (but the host's file system, for the host's tools).
        if self.shell is None and cmd[:1] == ["mnexec"]:
            cmd = ["nsenter", "-t", str(self.container_pid), "-n"] + cmd
        return super()._popen(cmd, **params)

    @property
    def ip(self) -> str:
        return self.params["ip"].split("/")[0]

    def exec(self, command: str) -> tuple[int, str]:
        """Run `command` with bash inside the container: (exit code, stdout+stderr)."""
        code, out = self.container.exec_run(["bash", "-c", command])
        return code, out.decode(errors="replace")

    def update(self, cpu: float | None = None, mem_mb: int | None = None) -> None:
        """Change the node's CPU (cores) and memory (MiB) limits through Docker's API."""
        old_cpu, old_mem = cgroups.limits(self.cgroup_parent)
        cpu = old_cpu if cpu is None else cpu
        mem_mb = old_mem if mem_mb is None else mem_mb
        # cgroup v1 refuses a child CPU quota above its parent's: widen the parent first,
        # narrow it last.
        if cpu >= old_cpu:
            cgroups.set_limits(self.cgroup_parent, cpu, max(mem_mb, old_mem))
        self.container.update(cpu_period=cgroups.PERIOD_US, cpu_quota=cgroups.quota_us(cpu),
                              mem_limit=f"{mem_mb}m", memswap_limit=f"{mem_mb}m")
        cgroups.set_limits(self.cgroup_parent, cpu, mem_mb)

    def terminate(self) -> None:
        super().terminate()
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        cgroups.remove(self.cgroup_parent)  # its workers must be gone already


class EdgeSwitch(OVSSwitch):
    """OVS bridge with fixed port numbers; RSTP (fast convergence) when standalone.

    Interface params used: `bw_mbps` (RSTP path cost, so the spanning tree keeps fast links)
    and `edge` (a port toward a compute node: forwards at once, no RSTP negotiation)."""

    @classmethod
    def isOldOVS(cls) -> bool:
        # Mininet compares OVS versions with distutils (deprecated, gone in Python 3.12); the
        # project needs OVS ≥ 2.x anyway (OpenFlow 1.3 meters).
        return False

    def bridgeOpts(self) -> str:
        opts = super().bridgeOpts()
        if self.failMode == "standalone":
            opts += (" rstp_enable=true other_config:rstp-forward-delay=4"
                     " other_config:rstp-max-age=6")
        return opts

    def intfOpts(self, intf) -> str:
        opts = super().intfOpts(intf)
        port_opts: list[str] = []
        if intf.params.get("bw_mbps"):
            # IEEE 802.1D-2004 path cost: 20 Tbit/s / link speed.
            port_opts.append(f"other_config:rstp-path-cost={max(1, int(2e7 / intf.params['bw_mbps']))}")
        if intf.params.get("edge"):
            port_opts.append("other_config:rstp-port-admin-edge=true")
        # OVS replaces an interface's root qdisc unless its QoS is "linux-noop"; the links are
        # shaped with our own HTB (edge.tc), which must survive the port being added.
        qos = f"qos{str(intf).replace('-', '_')}"
        port_opts.append(f"qos=@{qos} -- --id=@{qos} create QoS type=linux-noop")
        return opts + f" -- set Port {intf} " + " ".join(port_opts)

    def attach(self, intf) -> None:
        """Add a port at run time, with its topology port number (Mininet's attach has none)."""
        self.cmd(f"ovs-vsctl add-port {self} {intf}" + self.intfOpts(intf))
        self.cmd("ip link set", intf, "up")


class DockerNet(Mininet):
    """Mininet whose hosts are Docker containers, with Containernet's addDocker/removeDocker."""

    def __init__(self, client: docker.DockerClient, **params: Any) -> None:
        # Mininet.init() would otherwise raise host-wide limits (sysctl, ulimit) on first use.
        Mininet.inited = True
        self.client = client
        super().__init__(switch=EdgeSwitch, host=DockerNode, controller=None, build=False,
                         listenPort=None, **params)

    def addDocker(self, name: str, dimage: str, **params: Any) -> DockerNode:
        return self.addHost(name, cls=DockerNode, dimage=dimage, client=self.client, **params)

    def removeDocker(self, name: str) -> None:
        node = self[name]
        for link in [lk for lk in self.links if node in (lk.intf1.node, lk.intf2.node)]:
            for intf in (link.intf1, link.intf2):
                if isinstance(intf.node, OVSSwitch):
                    intf.node.detach(intf)
            self.delLink(link)
        self.delHost(node)
