"""Stand-in real hosts for the lab tests: containers of the worker image running a real sshd,
each reachable over SSH on a management network (a Docker bridge network; this machine is its
gateway, where the Master listens) and attached by a veth, as `eth1` with its topology address,
to an Open vSwitch bridge made with plain `ovs-vsctl` (OpenFlow 1.3, fail-mode secure: the
physical switch stand-in, `sdn_netns.NetnsNetwork`) that the SDN app controls. Each host has the
Docker CLI and this machine's engine socket, as a host with its own engine would.

Everything is named with the harness's own prefix (not the run's: a run's cleanup must not
remove the hosts) and removed by `stop()`.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import paramiko

from sdn_netns import NetnsNetwork, sh

DOCKER_CLI = "/usr/local/bin/docker" if Path("/usr/local/bin/docker").exists() else \
    "/usr/bin/docker"
SSHD = ("mkdir -p /run/sshd /root/.ssh && printf '%s\\n' \"$PUBKEY\" > /root/.ssh/authorized_keys"
        " && chmod 600 /root/.ssh/authorized_keys && ssh-keygen -A -q && exec /usr/sbin/sshd -D -e")


def new_key(path: Path) -> str:
    """An RSA key pair: the private key at `path` (0600); returns the public line."""
    key = paramiko.RSAKey.generate(2048)
    key.write_private_key_file(str(path))
    path.chmod(0o600)
    return f"{key.get_name()} {key.get_base64()}"


@dataclass
class LabHosts(NetnsNetwork):
    image: str = ""
    pubkey: str = ""
    spares: tuple[str, ...] = ()  # extra hosts: SSH only, no Docker, no data interface
    client: docker.DockerClient = field(default_factory=docker.from_env)
    containers: dict[str, str] = field(default_factory=dict)  # node → container name
    mgmt: dict[str, str] = field(default_factory=dict)  # node → management address
    gateway: str = ""

    def start(self) -> None:
        net = self.client.networks.create(f"{self.prefix}-mgmt", driver="bridge",
                                          labels={"ces.test": self.prefix})
        self.gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        docker_access = {"/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
                         DOCKER_CLI: {"bind": "/usr/local/bin/docker", "mode": "ro"}}
        for n in self.topo.nodes:
            self._sshd(net.name, n.name, n.cpu, docker_access)
        for name in self.spares:
            self._sshd(net.name, name, 0.5, {})
        first = self.topo.nodes[0].name
        cli = self.exec(first, "docker version --format '{{.Server.Version}}'")
        if cli.returncode != 0:  # e.g. a dynamically linked CLI built for a newer libc
            raise RuntimeError(f"this machine's Docker CLI ({DOCKER_CLI}) does not run in the "
                               f"worker image: {cli.stderr.strip()}")
        super().start()

    def _sshd(self, network: str, name: str, cpu: float, volumes: dict) -> None:
        c = self.client.containers.run(
            self.image, ["bash", "-c", SSHD], name=f"{self.prefix}-h-{name}", hostname=name,
            detach=True, environment={"PUBKEY": self.pubkey}, network=network, volumes=volumes,
            nano_cpus=int(cpu * 1e9), labels={"ces.test": self.prefix})
        c.reload()
        self.containers[name] = c.name
        self.mgmt[name] = c.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]

    def _host(self, node: str, veth: str) -> None:
        n = self.topo.node(node)
        pid = str(self.client.containers.get(self.containers[node]).attrs["State"]["Pid"])
        sh("ip", "link", "set", veth, "netns", pid)
        for cmd in (f"ip link set {veth} name eth1", f"ip link set eth1 address {n.mac}",
                    f"ip addr add {n.ip}/16 dev eth1", "ip link set eth1 up",
                    "ethtool -K eth1 tx off"):  # see NetnsNetwork._host
            sh("nsenter", "-t", pid, "-n", *cmd.split())

    def exec(self, node: str, cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", "exec", self.containers[node], "bash", "-c", cmd],
                              capture_output=True, text=True, timeout=60)

    def stop(self) -> None:
        for c in self.client.containers.list(all=True, filters={"label": f"ces.test={self.prefix}"}):
            c.remove(force=True)
        for net in self.client.networks.list(filters={"label": f"ces.test={self.prefix}"}):
            net.remove()
        super().stop()
