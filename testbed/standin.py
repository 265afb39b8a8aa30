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

import re
import secrets
import shutil
import subprocess
import sys
import time
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
from testbed.names import Lifecycle
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
                    tc.shape(ports[-1], lk.bw_mbps, lk.delay_ms, switch_port=True)
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


# --- stand-in hosts of a cluster (run.py --cluster, lab.fabric) ----------------------------------
OVS_TOOLS = ("ovs-vswitchd", "ovsdb-server", "ovsdb-tool", "ovs-vsctl", "ovs-ofctl", "ovs-appctl")
OVS_HOME = "/opt/ces-ovs"  # in a stand-in host: this machine's Open vSwitch, bin/ and lib/
# The C library and its loader stay the container's (the same Debian release as this machine);
# every other library the tools link comes from this machine with them.
GLIBC = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libpthread", "libdl.so", "librt.so")
HOST_CAPS = ("NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE", "SYS_NICE", "IPC_LOCK")
UNDERLAY_NET = "10.77.0"  # the stand-in underlay, /24: only the hosts' namespaces see it
# What a VXLAN tunnel between two stand-in hosts carried of TCP at an inner MTU of 1400
# (ENVIRONMENT.md: ~550 Mbit/s, both OVS instances' userspace datapaths on this machine's cores),
# less a margin: the cluster file's underlay_mbps, which the budget checks the crossing against.
UNDERLAY_MBPS = 500
CLUSTER_HOST_START = (
    f"for t in {' '.join(OVS_TOOLS)}; do printf '#!/bin/sh\\nLD_LIBRARY_PATH={OVS_HOME}/lib exec "
    f'{OVS_HOME}/bin/%s "$@"\\n\' $t > /usr/local/bin/$t; chmod 755 /usr/local/bin/$t; done'
    " && mkdir -p /etc/openvswitch /var/run/openvswitch /var/log/openvswitch"
    " && ovsdb-tool create /etc/openvswitch/conf.db /usr/share/openvswitch/vswitch.ovsschema"
    " && ovsdb-server /etc/openvswitch/conf.db --remote=punix:/var/run/openvswitch/db.sock"
    " --pidfile --detach --log-file"
    " && ovs-vsctl --no-wait init && ovs-vswitchd --pidfile --detach --log-file && " + SSHD
)


def ovs_files(folder: Path) -> None:
    """This machine's Open vSwitch tools in `folder`/bin and the libraries they link (but the C
    library) in `folder`/lib, for a container of another image to run."""
    (folder / "bin").mkdir(parents=True, exist_ok=True)
    (folder / "lib").mkdir(exist_ok=True)
    for tool in OVS_TOOLS:
        path = shutil.which(tool) or f"/usr/sbin/{tool}"
        shutil.copy2(path, folder / "bin" / tool)
        for line in subprocess.run(
            ["ldd", path], capture_output=True, text=True
        ).stdout.splitlines():
            parts = line.split()
            linked = "=>" in parts and len(parts) > 2 and parts[2].startswith("/")
            if linked and not any(parts[0].startswith(g) for g in GLIBC):
                shutil.copy2(Path(parts[2]).resolve(), folder / "lib" / parts[0])


@dataclass
class ClusterHosts(Lifecycle):
    """Stand-in hosts of a cluster on this machine: containers of the worker image running sshd
    and an Open vSwitch of their own (this machine's binaries, their own ovsdb-server and
    ovs-vswitchd, database and sockets), reachable over SSH on a management network (a Docker
    bridge network; this machine is its gateway, where the Master and the SDN app listen), each
    with `eth1` on an underlay: a Linux bridge in a network namespace of its own (a switch
    between the hosts; in the root namespace the host's bridge netfilter would pass it through
    Docker's iptables), addresses UNDERLAY_NET.i/24.

    A host runs its nodes' containers on this machine's Docker engine (its CLI and socket, as in
    `LabHosts`), in this machine's PID namespace (to move a veth into a node's namespace by its
    pid, as a host's root shell does) with a root's capabilities (`HOST_CAPS`), with this
    machine's cgroup tree (a node's cgroup parent is where Docker makes it). Hosts on one machine share its kernel — one boot
    id — and so its cores: the budget pools them. Named with the harness's prefix (≤ 6
    characters), removed by `stop()`."""

    prefix: str
    hosts: tuple[str, ...]
    image: str
    pubkey: str
    client: docker.DockerClient = field(default_factory=docker.from_env)
    containers: dict[str, str] = field(default_factory=dict)  # host -> container name
    mgmt: dict[str, str] = field(default_factory=dict)  # host -> management address
    underlay: dict[str, str] = field(default_factory=dict)  # host -> underlay address
    gateway: str = ""

    def __post_init__(self) -> None:
        # not a run's prefix (`ces` + hex): a run's cleanup must not take the hosts, and the
        # hosts' removal (every interface named with the prefix) must not take a run's
        if not 2 <= len(self.prefix) <= 6 or self.prefix.startswith("ces"):
            raise ValueError(f"stand-in prefix {self.prefix!r}: 2-6 characters, not ces...")

    @property
    def _files(self) -> Path:
        return Path(f"/tmp/{self.prefix}-ovs")

    @property
    def _netns(self) -> str:
        return f"{self.prefix}-ul"

    def start(self) -> None:
        allow_congestion_control(TCP_CONGESTION_CONTROL)
        ovs_files(self._files)
        net = self.client.networks.create(
            f"{self.prefix}-mgmt", driver="bridge", labels={"ces.test": self.prefix}
        )
        self.gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        sh("ip", "netns", "add", self._netns)
        bridge = f"{self.prefix}ul"
        sh("ip", "netns", "exec", self._netns, "ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "netns", "exec", self._netns, "ip", "link", "set", bridge, "up")
        volumes = {
            "/var/run/docker.sock": {"bind": "/var/run/docker.sock", "mode": "rw"},
            DOCKER_CLI: {"bind": "/usr/local/bin/docker", "mode": "ro"},
            str(self._files): {"bind": OVS_HOME, "mode": "ro"},
            "/usr/share/openvswitch": {"bind": "/usr/share/openvswitch", "mode": "ro"},
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
        }
        for i, name in enumerate(self.hosts):
            c = self.client.containers.run(
                self.image,
                ["bash", "-c", CLUSTER_HOST_START],
                name=f"{self.prefix}-h-{name}",
                hostname=name,
                detach=True,
                environment={"PUBKEY": self.pubkey},
                network=net.name,
                volumes=volumes,
                # what a host's root does to build its part: interfaces, qdiscs, namespaces of
                # other processes (nsenter), a tap per OVS internal port. Not --privileged: it
                # asks for every capability, and a machine whose bounding set lacks one (this
                # development VM: CAP_SYS_RESOURCE) cannot start such a container at all.
                cap_add=list(HOST_CAPS),
                security_opt=["seccomp=unconfined", "apparmor=unconfined"],
                devices=["/dev/net/tun:/dev/net/tun:rwm"],
                pid_mode="host",
                labels={"ces.test": self.prefix},
            )
            c.reload()
            self.containers[name] = c.name
            self.mgmt[name] = c.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"]
            self.underlay[name] = f"{UNDERLAY_NET}.{i + 1}"
            outer, inner = f"{self.prefix}w{i}", f"{self.prefix}u{i}"
            sh("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            sh("ip", "link", "set", outer, "netns", self._netns)
            sh("ip", "netns", "exec", self._netns, "ip", "link", "set", outer, "master", bridge)
            sh("ip", "netns", "exec", self._netns, "ip", "link", "set", outer, "up")
            sh("ip", "link", "set", inner, "netns", str(c.attrs["State"]["Pid"]))
            for cmd in (
                f"ip link set {inner} name eth1",
                f"ip addr add {self.underlay[name]}/24 dev eth1",
                "ip link set eth1 up",
            ):
                sh("nsenter", "-t", str(c.attrs["State"]["Pid"]), "-n", *cmd.split())
        deadline = time.monotonic() + 60
        for name in self.hosts:
            while True:
                ready = self.exec(
                    name, "ovs-vsctl --timeout=2 show >/dev/null && ss -ltn | grep -q ':22 '"
                )
                if ready.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    logs = self.client.containers.get(self.containers[name]).logs()[-500:]
                    raise RuntimeError(f"stand-in host {name} did not come up: {logs!r}")
                time.sleep(0.2)

    def cluster_file(self, key_file: Path, known_hosts: Path, **fields: object) -> dict:
        """A cluster file of the hosts, `fields` added on top."""
        return {
            "master": self.gateway,
            "known_hosts": str(known_hosts),
            "defaults": {
                "user": "root",
                "key_file": str(key_file),
                "underlay": "eth1",
                "underlay_mbps": UNDERLAY_MBPS,
            },
            "hosts": [
                {"name": h, "address": self.mgmt[h], "underlay_ip": self.underlay[h]}
                for h in self.hosts
            ],
            **fields,
        }

    def exec(self, host: str, cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["docker", "exec", self.containers[host], "bash", "-c", cmd],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        mine = {"label": f"ces.test={self.prefix}"}
        for c in self.client.containers.list(all=True, filters=mine):
            c.remove(force=True)  # its Open vSwitch and sshd go with it
        for net in self.client.networks.list(filters=mine):
            net.remove()
        sh("ip", "netns", "del", self._netns, check=False)
        for name in re.findall(r"^\d+: ([^:@]+)", sh("ip", "-o", "link"), re.M):
            if name.startswith(self.prefix):
                sh("ip", "link", "del", name, check=False)
        shutil.rmtree(self._files, ignore_errors=True)


@contextmanager
def standin_cluster(
    workdir: Path, hosts: tuple[str, ...], image: str, prefix: str, **fields: object
) -> Iterator[tuple[ClusterHosts, Path]]:
    """Stand-in cluster hosts named `hosts` and a cluster file of them (`fields` on top, e.g.
    master_port, openflow_port, placement) in `workdir`, with its SSH key and known_hosts; the
    hosts and the key are removed on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "id_rsa"
    try:
        pubkey = new_key(key)
        with ClusterHosts(prefix, hosts, image, pubkey) as cluster:
            path = workdir / "cluster.yaml"
            doc = cluster.cluster_file(key, workdir / "known_hosts", **fields)
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
            yield cluster, path
    finally:
        key.unlink(missing_ok=True)
