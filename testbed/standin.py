"""Stand-in real hosts on this machine (the lab tests, experiments/bench_lab.py): containers of
the worker image running a real sshd, each reachable over SSH on a management network (a Docker
bridge network; this machine is its gateway, where the Master listens) and attached by a veth, as
`eth1` with its topology address, to Open vSwitch bridges made with plain `ovs-vsctl` (OpenFlow
1.3, fail-mode secure: the physical switch stand-ins, `testbed.netns.NetnsNetwork`) that the SDN
app controls. Each host has the Docker CLI and this machine's engine socket, as a host with its
own engine would.

Everything is named with the harness's own prefix (not a run's: a run's cleanup must not remove
the hosts) and removed by `stop()`. `standin_lab` also makes the lab's certificates (`lab.pki`)
for the hosts it made, and the switches connect to the controller over TLS with the first
switch's identity (one ovs-vswitchd: one SSL configuration for all its bridges).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
import paramiko
import yaml

from edge import tc
from protocol.tls import switch_identity
from testbed import ovs_sockets
from testbed.containernet import allow_congestion_control
from testbed.emulation import TCP_CONGESTION_CONTROL
from testbed.netns import NetnsNetwork, datapath_type, sh
from topologies import Topology, topology_document

DOCKER_CLI = (
    "/usr/local/bin/docker" if Path("/usr/local/bin/docker").exists() else "/usr/bin/docker"
)
SSHD = (
    "mkdir -p /run/sshd /root/.ssh && printf '%s\\n' \"$PUBKEY\" > /root/.ssh/authorized_keys"
    " && chmod 600 /root/.ssh/authorized_keys && ssh-keygen -A -q && exec /usr/sbin/sshd -D -e"
)


def new_key(path: Path) -> str:
    """An RSA key pair: the private key at `path` (0600); returns the public line."""
    key = paramiko.RSAKey.generate(2048)
    key.write_private_key_file(str(path))
    path.chmod(0o600)
    return f"{key.get_name()} {key.get_base64()}"


@dataclass
class LabHosts(NetnsNetwork):
    """`controller`: where the switches connect; the address "" is this machine's on the
    management network (where `experiments/run.py --hosts` listens: the inventory's `master`)."""

    image: str = ""
    pubkey: str = ""
    spares: tuple[str, ...] = ()  # extra hosts: SSH only, no Docker, no data interface
    # Every link shaped at its capacity and delay on both ends, as the emulation shapes them: a
    # physical link has a rate, a veth none (a comparison with the emulation needs the same).
    shape: bool = False
    client: docker.DockerClient = field(default_factory=docker.from_env)
    containers: dict[str, str] = field(default_factory=dict)  # node → container name
    mgmt: dict[str, str] = field(default_factory=dict)  # node → management address
    gateway: str = ""

    def start(self) -> None:
        net = self.client.networks.create(
            f"{self.prefix}-mgmt", driver="bridge", labels={"ces.test": self.prefix}
        )
        self.gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        if not self.controller[0]:
            self.controller = (self.gateway, self.controller[1])
        allow_congestion_control(TCP_CONGESTION_CONTROL)
        docker_access = {
            "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
            DOCKER_CLI: {"bind": "/usr/local/bin/docker", "mode": "ro"},
        }
        for n in self.topo.nodes:
            self._sshd(net.name, n.name, n.cpu, docker_access)
        for name in self.spares:
            self._sshd(net.name, name, 0.5, {})
        first = self.topo.nodes[0].name
        cli = self.exec(first, "docker version --format '{{.Server.Version}}'")
        if cli.returncode != 0:  # e.g. a dynamically linked CLI built for a newer libc
            raise RuntimeError(
                f"this machine's Docker CLI ({DOCKER_CLI}) does not run in the "
                f"worker image: {cli.stderr.strip()}"
            )
        super().start()
        if self.shape:
            self._shape()

    def _shape(self) -> None:
        ports = []
        for lk in self.topo.links:
            for end in (lk.a, lk.b):
                if end in self.bridges:
                    ports.append(self.port_name(end, lk.port_of(end)))
                    tc.shape(ports[-1], lk.bw_mbps, lk.delay_ms)
                else:
                    tc.shape("eth1", lk.bw_mbps, lk.delay_ms, self._pid(end))
        if datapath_type() == "netdev":  # as the emulation: see testbed/ovs_sockets.py
            ovs_sockets.enlarge_receive_buffers(ports)

    def _sshd(self, network: str, name: str, cpu: float, volumes: dict) -> None:
        c = self.client.containers.run(
            self.image,
            ["bash", "-c", SSHD],
            name=f"{self.prefix}-h-{name}",
            hostname=name,
            detach=True,
            environment={"PUBKEY": self.pubkey},
            network=network,
            volumes=volumes,
            nano_cpus=int(cpu * 1e9),
            labels={"ces.test": self.prefix},
            sysctls={"net.ipv4.tcp_congestion_control": TCP_CONGESTION_CONTROL},
        )
        c.reload()
        self.containers[name] = c.name
        self.mgmt[name] = c.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]

    def _pid(self, node: str) -> int:
        return self.client.containers.get(self.containers[node]).attrs["State"]["Pid"]

    def _host(self, node: str, veth: str) -> None:
        n = self.topo.node(node)
        pid = str(self._pid(node))
        sh("ip", "link", "set", veth, "netns", pid)
        for cmd in (
            f"ip link set {veth} name eth1",
            f"ip link set eth1 address {n.mac}",
            f"ip addr add {n.ip}/16 dev eth1",
            "ip link set eth1 up",
            "ethtool -K eth1 tx off",
        ):  # see NetnsNetwork._host
            sh("nsenter", "-t", pid, "-n", *cmd.split())

    def inventory(self, key_file: Path, known_hosts: Path, **fields: object) -> dict:
        """An inventory document of the hosts (every compute node's), `fields` added on top."""
        return {
            "master": self.gateway,
            "known_hosts": str(known_hosts),
            "defaults": {"user": "root", "key_file": str(key_file), "iface": "eth1"},
            "hosts": [{"node": n.name, "address": self.mgmt[n.name]} for n in self.topo.nodes],
            **fields,
        }

    def exec(self, node: str, cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", "exec", self.containers[node], "bash", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def stop(self) -> None:
        mine = {"label": f"ces.test={self.prefix}"}
        for c in self.client.containers.list(all=True, filters=mine):
            c.remove(force=True)
        for net in self.client.networks.list(filters=mine):
            net.remove()
        super().stop()


@contextmanager
def standin_lab(
    workdir: Path,
    topo: Topology,
    image: str,
    prefix: str,
    openflow_port: int,
    master_port: int,
    shape: bool = True,
) -> Iterator[tuple[LabHosts, Path, Path, Path]]:
    """Stand-in hosts of every compute node of `topo`, and its switches connecting to a
    controller at this machine's management address on `openflow_port` over TLS. Yields (the
    hosts, an inventory of them that puts the Master at `master_port`, a token file, the lab's
    certificates); the key, the token, the certificates and known_hosts are made in `workdir`.
    The hosts are removed on exit, and so are the key, the token and the certificates (secrets,
    of no use without the hosts), while `workdir`'s logs stay."""
    workdir.mkdir(parents=True, exist_ok=True)
    key, token, pki = workdir / "id_rsa", workdir / "token", workdir / "pki"
    try:
        pubkey = new_key(key)
        token.write_text(secrets.token_urlsafe(24) + "\n")
        token.chmod(0o600)
        with LabHosts(
            topo, prefix, ("", openflow_port), image=image, pubkey=pubkey, shape=shape
        ) as hosts:
            inventory = workdir / "inventory.yaml"
            inventory.write_text(
                yaml.safe_dump(
                    hosts.inventory(
                        key,
                        workdir / "known_hosts",
                        master_port=master_port,
                        openflow_port=openflow_port,
                    )
                )
            )
            topo_file = workdir / "topology.yaml"
            topo_file.write_text(yaml.safe_dump(topology_document(topo), sort_keys=False))
            certs = subprocess.run(  # the user's one command (the lab sits above the testbed)
                [sys.executable, "-m", "lab", "certs", "--hosts", str(inventory)]
                + ["--topo", str(topo_file), "--pki", str(pki)],
                capture_output=True,
                text=True,
                timeout=120,
                cwd=Path(__file__).resolve().parent.parent,
            )
            if certs.returncode != 0:
                raise RuntimeError(f"python -m lab certs failed: {certs.stderr.strip()}")
            hosts.use_tls(str(pki / switch_identity(topo.switches[0].name)))
            yield hosts, inventory, token, pki
    finally:
        key.unlink(missing_ok=True)
        token.unlink(missing_ok=True)
        shutil.rmtree(pki, ignore_errors=True)
