"""A small OpenFlow network built by hand: Open vSwitch bridges made with `ovs-vsctl` outside
Mininet (the stand-in for a physical OpenFlow 1.3 switch: it knows nothing but its dpid, its port
numbers and the controller's address) and network namespaces as hosts. The SDN app's tests use it
as it is; `testbed.standin` puts stand-in lab hosts on it.

Everything is named with the given prefix and removed by `stop()` (also after a partial start).

With `tls` (a switch's identity folder of `python -m lab certs`) the bridges connect to the
controller over `ssl:`, showing that certificate and checking the controller's against its CA
(`ovs-vsctl set-ssl`). Open vSwitch keeps one SSL configuration per ovs-vswitchd, so every bridge
of the machine shows the same one: it is set at start and what was there before is put back at
`stop()`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from protocol.tls import identity_files
from topologies import Topology

from .names import Lifecycle


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def datapath_type() -> str:
    """'system' where the kernel has the openvswitch module, else the userspace 'netdev'."""
    types = sh("ovs-vsctl", "get", "Open_vSwitch", ".", "datapath_types")
    try:
        with open("/proc/modules") as f:
            kernel = any(line.startswith("openvswitch ") for line in f)
    except OSError:
        kernel = False
    return "system" if kernel and "system" in types else "netdev"


@dataclass
class NetnsNetwork(Lifecycle):
    topo: Topology
    prefix: str  # ≤ 6 characters: interface names are ≤ 15
    controller: tuple[str, int]
    bridges: dict[str, str] = field(default_factory=dict)  # switch → bridge name
    namespaces: dict[str, str] = field(default_factory=dict)  # node → netns name
    tls: str = ""  # a switch's TLS identity folder: connect over ssl
    _ssl_before: list[str] | None = None  # the SSL configuration to put back

    def start(self) -> None:
        if self.tls:
            self._set_ssl()
        dp_type = datapath_type()
        for i, sw in enumerate(self.topo.switches):
            br = self.bridges[sw.name] = f"{self.prefix}b{i}"
            sh(
                "ovs-vsctl",
                "add-br",
                br,
                "--",
                "set",
                "bridge",
                br,
                f"datapath_type={dp_type}",
                "protocols=OpenFlow13",
                "fail-mode=secure",
                f"other-config:datapath-id={sw.dpid:016x}",
                "other-config:disable-in-band=true",
            )
        for lk in self.topo.links:
            if lk.a in self.bridges and lk.b in self.bridges:
                names = [self.port_name(lk.a, lk.port_a), self.port_name(lk.b, lk.port_b)]
                sh("ip", "link", "add", names[0], "type", "veth", "peer", "name", names[1])
                self._attach(lk.a, lk.port_a, names[0])
                self._attach(lk.b, lk.port_b, names[1])
            else:
                sw, node = (lk.a, lk.b) if lk.a in self.bridges else (lk.b, lk.a)
                outer = self.port_name(sw, lk.port_of(sw))
                inner = f"{self.prefix}n{[n.name for n in self.topo.nodes].index(node)}"
                sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
                self._attach(sw, lk.port_of(sw), outer)
                self._host(node, inner)
        for br in self.bridges.values():
            self.connect(br)

    def connect(self, bridge: str) -> None:
        """Point the bridge at the controller, retrying at most every second when it is away
        (OVS's default backoff grows to 8 s)."""
        sh(
            "ovs-vsctl",
            "--",
            "--id=@c",
            "create",
            "Controller",
            f'target="{"ssl" if self.tls else "tcp"}:{self.controller[0]}:{self.controller[1]}"',
            "max_backoff=1000",
            "--",
            "set",
            "Bridge",
            bridge,
            "controller=@c",
        )

    def use_tls(self, folder: str) -> None:
        """From now on, connect over ssl with the switch identity in `folder` (the bridges made
        already are pointed at the controller again)."""
        self.tls = folder
        self._set_ssl()
        for br in self.bridges.values():
            self.disconnect(br)
            self.connect(br)

    def _set_ssl(self) -> None:
        if self._ssl_before is None:
            shown = dict(
                line.split(": ", 1)
                for line in sh("ovs-vsctl", "get-ssl").splitlines()
                if ": " in line
            )
            keys = ("Private key", "Certificate", "CA Certificate")
            self._ssl_before = [shown[k] for k in keys] if all(k in shown for k in keys) else []
        cert, key, ca = identity_files(self.tls)
        sh("ovs-vsctl", "set-ssl", str(key), str(cert), str(ca))

    def _restore_ssl(self) -> None:
        if self._ssl_before is None:
            return
        if self._ssl_before:
            sh("ovs-vsctl", "set-ssl", *self._ssl_before, check=False)
        else:
            sh("ovs-vsctl", "del-ssl", check=False)
        self._ssl_before = None

    def disconnect(self, bridge: str) -> None:
        sh("ovs-vsctl", "del-controller", bridge)

    def port_name(self, switch: str, port: int) -> str:
        return f"{self.bridges[switch]}p{port}"

    def _attach(self, switch: str, port: int, name: str) -> None:
        sh("ip", "link", "set", name, "up")
        sh(
            "ovs-vsctl",
            "add-port",
            self.bridges[switch],
            name,
            "--",
            "set",
            "Interface",
            name,
            f"ofport_request={port}",
        )

    def _host(self, node: str, veth: str) -> None:
        ns = self.namespaces[node] = f"{self.prefix}-{node}"
        n = self.topo.node(node)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "set", veth, "netns", ns)
        for cmd in (
            f"ip link set {veth} name eth0",
            f"ip link set eth0 address {n.mac}",
            f"ip addr add {n.ip}/16 dev eth0",
            "ip link set eth0 up",
            "ip link set lo up",
            # the userspace datapath breaks TCP when the sender leaves checksums to the NIC
            "ethtool -K eth0 tx off",
        ):
            sh("ip", "netns", "exec", ns, *cmd.split())

    def stop(self) -> None:
        """Remove exactly what this prefix names: bridges, namespaces, leftover veths."""
        for br in sh("ovs-vsctl", "list-br").split():
            if br.startswith(self.prefix):
                sh("ovs-vsctl", "--if-exists", "del-br", br, check=False)
        for line in sh("ip", "netns", "list").splitlines():
            ns = line.split()[0] if line.strip() else ""
            if ns.startswith(f"{self.prefix}-"):
                sh("ip", "netns", "del", ns, check=False)
        for name in re.findall(r"^\d+: ([^:@]+)", sh("ip", "-o", "link"), re.M):
            if name.startswith(self.prefix):
                sh("ip", "link", "del", name, check=False)
        self._restore_ssl()

    # --- using it -------------------------------------------------------------------------------

    def run(self, node: str, cmd: str, check: bool = True, timeout: float = 60) -> str:
        return sh(
            "ip", "netns", "exec", self.namespaces[node], *cmd.split(), check=check, timeout=timeout
        )

    def popen(self, node: str, cmd: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[node], *cmd.split()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def ping(self, src: str, dst: str, count: int = 1, timeout_s: int = 2) -> bool:
        ip = self.topo.node(dst).ip
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.namespaces[src],
                "ping",
                "-c",
                str(count),
                "-W",
                str(timeout_s),
                ip,
            ],
            capture_output=True,
        )
        return out.returncode == 0

    def iperf(
        self, src: str, dst: str, seconds: float = 3, port: int = 5201, extra: str = ""
    ) -> float:
        """TCP goodput src → dst in Mbit/s as the receiver counted it."""
        server = self.popen(dst, f"iperf3 -s -1 -p {port}")
        try:
            deadline = time.monotonic() + 5
            while f":{port} " not in self.run(dst, "ss -ltn") and time.monotonic() < deadline:
                time.sleep(0.05)
            out = self.run(
                src,
                f"iperf3 -c {self.topo.node(dst).ip} -p {port} -t {seconds} -J {extra}",
                timeout=seconds + 30,
            )
        finally:
            server.kill()
            server.wait()
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6

    def dump_flows(self, switch: str) -> list[dict[str, Any]]:
        """The switch's flow entries: cookie, priority, match text, actions text, n_bytes."""
        out = sh("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", self.bridges[switch])
        flows = []
        for line in out.splitlines():
            m = re.search(
                r"cookie=(0x[0-9a-f]+),.*n_bytes=(\d+),.*priority=(\d+),?(\S*) "
                r"actions=(\S+)",
                line,
            )
            if m:
                flows.append(
                    {
                        "cookie": int(m[1], 16),
                        "n_bytes": int(m[2]),
                        "priority": int(m[3]),
                        "match": m[4],
                        "actions": m[5],
                    }
                )
        return flows

    def dump_meters(self, switch: str) -> dict[int, dict[str, int]]:
        """{meter id: {"rate": kbps, "burst": kbit}}."""
        out = sh("ovs-ofctl", "-O", "OpenFlow13", "dump-meters", self.bridges[switch])
        return {
            int(m[1]): {"rate": int(m[2]), "burst": int(m[3])}
            for m in re.finditer(r"meter=(\d+) .*?rate=(\d+) burst_size=(\d+)", out, re.S)
        }

    def port_tx_bytes(self, switch: str) -> dict[int, int]:
        out = sh("ovs-ofctl", "-O", "OpenFlow13", "dump-ports", self.bridges[switch])
        return {
            int(m[1]): int(m[2])
            for m in re.finditer(r"port\s+(\d+):.*?tx pkts=\d+, bytes=(\d+)", out, re.S)
        }
