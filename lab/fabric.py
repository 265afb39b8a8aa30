"""One emulated topology spread over several hosts (`experiments/run.py --cluster FILE`): on each
host of a cluster file (`lab.cluster`) the Open vSwitch bridges of its switches, the containers of
its compute nodes and their shaped links — what `testbed.Emulation` builds on one machine — and
between hosts, for every link whose ends run on two of them, an Open vSwitch tunnel port pair.

    with ClusterEmulation(topo, servers=load_cluster("cluster.yaml"), placement="metis",
                          controller=("192.168.50.1", 6653)) as net:
        net.exec("lab1", "ping -c1 10.0.0.2")

(the arguments of Mininet's cluster edition, `MininetCluster(topo, servers=, placement=)`: a
cluster file's hosts, and a rule name of `lab.placement.RULES` or a `Placer` class.)

Everything on a host is done over SSH (`lab.ssh`) by a few shell scripts, one per phase and host,
run on every host at once; a host needs Open vSwitch, a Docker engine, iproute2, ethtool and
util-linux, and the worker image (copied where missing, as `lab.deploy.install`). On a host:

- each switch is a bridge with the topology's dpid and port numbers, OpenFlow 1.3, fail-mode
  secure, connected to the one SDN app at `controller` (over TLS with the lab's certificates: a
  switch identity of the host given to its ovs-vswitchd, whose one SSL configuration is put back
  at teardown);
- each compute node is a container `<prefix>-<node>` of the worker image as in the emulation
  (`--network none`, its quota, memory and CPU weight on a cgroup parent per node that its
  workers join, its `eth0` with the topology's address and MAC);
- a link within the host is a veth pair, HTB-shaped at both ends (`edge.tc`);
- a link to another host is, at each end, a veth pair from the switch's port (with its OpenFlow
  number, HTB-shaped at the link's rate: the host shapes what it sends) to the host's tunnel
  bridge `<prefix>t`, where two flows join it to a tunnel port (VXLAN by default; Geneve or GRE:
  the file's `tunnel`) to the peer host's underlay address, its key (VNI) the link's. The
  tunnel bridge has no controller: to the SDN app a link between hosts is a link between two
  switch ports like any other;
- on a userspace datapath (no openvswitch kernel module), OVS carries tunnels itself and needs
  the underlay interface on a bridge of its own, `<prefix>u`, holding the interface's address
  for the run (put back at teardown); with the kernel module the interface is not touched.

Every data interface's MTU is the underlay's less the tunnel's overhead (`cluster
.TUNNEL_OVERHEAD`) — on one host too, so a run on one host and on several send the same packets.
Everything the run makes on a host is named with its prefix — containers `<prefix>-…`, bridges
and interfaces `<prefix>…`, cgroups `/<prefix>-…`, the state folder /var/lib/ces/<prefix> — and
`cleanup_host` removes exactly that (an anchored match: nothing of another run), also after a
kill -9 (`run.py --cleanup --cluster FILE --prefix P`).
"""

from __future__ import annotations

import io
import logging
import os
import shlex
import tarfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import paramiko

from edge import cgroups, tc
from protocol.dilation import NONE, Dilation
from protocol.tls import identity_files, switch_identity
from testbed.cleanup import PID_LABEL
from testbed.emulation import PROJECT_LABEL, TCP_CONGESTION_CONTROL
from testbed.hostcost import busy_ticks
from testbed.names import Lifecycle, Names
from topologies import Link, Topology

from . import deploy
from .cluster import TUNNEL_OVERHEAD, ClusterHost, ClusterInventory, Layout
from .ssh import HostError, Remote

log = logging.getLogger(__name__)
STATE_DIR = "/var/lib/ces"  # /var/lib/ces/<prefix>: a run's files on a host (TLS, what to put back)
OVS_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
PARALLEL_DOCKER_RUNS = 4  # `docker run` is most of a bring-up; the emulation starts 4 at once
# VNIs (tunnel keys) of a run: the link's index in its low 12 bits, the run prefix's last three
# hex digits above them, so that two runs between the same hosts use different keys.
VNI_LINK_BITS = 12


class FabricError(RuntimeError):
    """A host could not be built or cleaned: one line naming the host and what failed."""


# --- what a host is ------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostFacts:
    """What `probe` found on a host of the cluster."""

    docker: str
    netns: str  # the host's network namespace for `docker run --network` (lab.deploy.netns)
    cores: float
    mem_mb: float
    clock_offset_s: float
    ovs: str
    datapath: str  # "system" (kernel module) or "netdev" (userspace)
    machine: str  # the kernel's boot id: hosts on one kernel share its cores
    underlay_cidr: str  # the underlay address with its prefix length
    underlay_mtu: int
    underlay_mbps: float
    cgroup_version: int
    systemd_cgroups: bool
    netem: bool

    def deploy_facts(self) -> deploy.Facts:
        return deploy.Facts(self.docker, self.netns, self.cores, self.mem_mb, self.clock_offset_s)


PROBE = r"""
echo "docker=$(docker version --format '{{.Server.Version}}' 2>/dev/null)"
echo "ovs=$(ovs-vsctl --version 2>/dev/null | head -1)"
echo "ovs_up=$(ovs-vsctl --timeout=5 show >/dev/null 2>&1 && echo yes)"
echo "iface_types=$(ovs-vsctl --timeout=5 get Open_vSwitch . iface_types 2>/dev/null)"
echo "kmod=$(grep -c '^openvswitch ' /proc/modules 2>/dev/null)"
echo "exists=$(test -e /sys/class/net/$IF && echo yes)"
echo "addrs=$(ip -4 -o addr show dev $IF 2>/dev/null | awk '{print $4}' | tr '\n' ' ')"
echo "mgmt_dev=$(ip -4 -o addr show 2>/dev/null | awk -v a="$ADDR" 'index($4, a "/") == 1 {print $2}')"
echo "in_bridge=$(ovs-vsctl --timeout=5 port-to-br $IF 2>/dev/null)"
echo "mtu=$(cat /sys/class/net/$IF/mtu 2>/dev/null)"
echo "speed=$(cat /sys/class/net/$IF/speed 2>/dev/null)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
echo "cgroup2=$(test -e /sys/fs/cgroup/cgroup.controllers && echo yes)"
echo "driver=$(docker info --format '{{.CgroupDriver}}' 2>/dev/null)"
echo "netem=$(unshare -n tc qdisc add dev lo root netem delay 1ms >/dev/null 2>&1 && echo yes)"
echo "missing=$(for t in ip tc ethtool nsenter ovs-ofctl bash; do command -v $t >/dev/null || printf '%s ' $t; done)"
"""


def probe(remote: Remote, host: ClusterHost, tunnel: str, nodes_mem_mb: float) -> HostFacts:
    """Check a host for the run: Docker, Open vSwitch (running, with the tunnel kind), the tools,
    the underlay interface with its address (not the management one's), the clock, memory for
    its nodes; a HostError names the first problem. (Its CPU is the budget's business.)"""
    out = remote.ok(
        f"IF={shlex.quote(host.underlay)} ADDR={shlex.quote(host.address)} bash -c "
        + shlex.quote(PROBE),
        "cannot run the checks",
    )
    f = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    fail = lambda problem: HostError(host, problem)
    if not f.get("docker"):
        raise fail("no Docker engine answers to `docker version`")
    if not f.get("ovs"):
        raise fail("no Open vSwitch (ovs-vsctl) on the host")
    if f.get("ovs_up") != "yes":
        raise fail("Open vSwitch does not answer (`ovs-vsctl show`): is ovs-vswitchd running?")
    if f.get("missing", "").strip():
        raise fail(f"missing tools: {f['missing'].strip()}")
    if tunnel not in f.get("iface_types", ""):
        raise fail(f"this Open vSwitch has no {tunnel} ports (iface_types {f.get('iface_types')})")
    if f.get("exists") != "yes":
        raise fail(f"underlay interface {host.underlay} does not exist")
    if f.get("in_bridge"):
        raise fail(
            f"underlay interface {host.underlay} is a port of Open vSwitch bridge "
            f"{f['in_bridge']} (a killed run's? run.py --cleanup --cluster FILE --prefix "
            f"{f['in_bridge'][:7]})"
        )
    cidrs = f.get("addrs", "").split()
    cidr = next((c for c in cidrs if c.split("/")[0] == host.underlay_ip), "")
    if not cidr:
        raise fail(
            f"underlay interface {host.underlay} has {', '.join(cidrs) or 'no IPv4'}, "
            f"not {host.underlay_ip}"
        )
    if f.get("mgmt_dev") == host.underlay:
        raise fail(
            f"underlay interface {host.underlay} also carries the management address "
            f"{host.address}: the tunnels need an interface of their own"
        )
    if host.underlay_mbps is not None:
        mbps = host.underlay_mbps
    elif f.get("speed", "").lstrip("-").isdigit() and int(f["speed"]) > 0:
        mbps = float(f["speed"])
    else:
        raise fail(
            f"underlay interface {host.underlay} reports no speed: give the host's underlay_mbps"
        )
    offset = deploy.check_clock(remote)
    cores, mem = deploy.capacity(remote)
    if mem + 1e-9 < nodes_mem_mb:
        raise fail(
            f"too small for its nodes: {mem:.0f} MB free, its nodes take {nodes_mem_mb:.0f} MB"
        )
    return HostFacts(
        f["docker"],
        deploy.netns(remote),
        cores,
        mem,
        offset,
        f["ovs"],
        "system" if f.get("kmod", "0").strip() not in ("", "0") else "netdev",
        f.get("boot_id", host.name),
        cidr,
        int(f.get("mtu") or 1500),
        mbps,
        2 if f.get("cgroup2") == "yes" else 1,
        f.get("driver") == "systemd",
        f.get("netem") == "yes",
    )


def each(
    hosts: Iterable[ClusterHost],
    known_hosts: Path,
    accept_new: bool,
    fn: Callable[[Remote], object],
) -> tuple[dict[str, object], list[HostError]]:
    """`fn` over an SSH connection to every host at once: (results by host name, errors in the
    hosts' order)."""
    hosts = list(hosts)

    def one(h: ClusterHost) -> object:
        with Remote(h, known_hosts, accept_new) as remote:  # type: ignore[arg-type]
            return fn(remote)

    results: dict[str, object] = {}
    errors: list[HostError] = []
    if not hosts:
        return results, errors
    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        futures = [(h, pool.submit(one, h)) for h in hosts]
    for h, future in futures:
        try:
            results[h.name] = future.result()
        except HostError as e:
            errors.append(e)
    return results, errors


def check_cluster(layout: Layout, accept_new: bool) -> tuple[dict[str, HostFacts], list[HostError]]:
    """`probe` every host something is placed on: (facts by host, the hosts' errors)."""
    topo, inv = layout.topo, layout.inv

    def one(r: Remote) -> HostFacts:
        mem = sum(topo.node(n).mem_mb for n in layout.nodes_on(r.host.node))
        return probe(r, r.host, inv.tunnel, mem)  # type: ignore[arg-type]

    return each(layout.used_hosts(), inv.known_hosts, accept_new, one)  # type: ignore[return-value]


# --- the scripts ---------------------------------------------------------------------------------
HEADER = """set -eEuo pipefail
trap 'echo "line $LINENO: $BASH_COMMAND failed (exit $?)" >&2' ERR
"""


def _q(*words: object) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def vni(prefix: str, index: int) -> int:
    return (int(prefix[-3:], 16) << VNI_LINK_BITS) | index


@dataclass
class HostPlan:
    """What one host builds: its switches, nodes, links within it and ends of links to others."""

    host: ClusterHost
    facts: HostFacts
    switches: list[str]
    nodes: list[str]
    inner: list[Link] = field(default_factory=list)  # both ends here
    outer: list[tuple[int, Link, str]] = field(default_factory=list)  # (index, link, local end)


class ClusterEmulation(Lifecycle):
    """A topology spread over a cluster's hosts; entered, it is built on every host; left
    (normally, by an exception, Ctrl-C or SIGTERM in the owner's `with`), it is removed."""

    def __init__(
        self,
        topo: Topology,
        servers: ClusterInventory,
        placement: str | type | None = None,
        prefix: str = "",
        controller: tuple[str, int] = ("127.0.0.1", 6653),
        image: str = "",
        dilation: Dilation = NONE,
        pki: Path | None = None,
        accept_new_host_keys: bool = False,
        facts: dict[str, HostFacts] | None = None,
        client: docker.DockerClient | None = None,
    ):
        from testbed.names import new_prefix

        self.topo = topo
        self.inv = servers
        self.layout = Layout.make(servers, topo, placement)  # type: ignore[arg-type]
        self.names = Names(prefix or new_prefix())
        self.prefix = self.names.prefix
        self.controller = controller
        self.image = image
        self.dilation = dilation
        self.cpu_period = cgroups.period_us(dilation.factor)
        self.pki = pki
        self.accept_new = accept_new_host_keys
        self.facts: dict[str, HostFacts] = dict(facts or {})
        self.client = client
        self.timings: dict[str, float] = {}
        self.built: set[str] = set()  # hosts something was made on: the teardown cleans them
        self.scripts: dict[str, str] = {}  # "host/phase" -> the script run (no secrets in them)
        self.plans = self._plans() if self.facts else {}
        for s in topo.switches:  # global names, so a name tells its switch on any host
            self.names.bridge(s.name)

    # --- life cycle ------------------------------------------------------------------------------
    @property
    def mtu(self) -> int:
        """The inner MTU of every data interface: the smallest underlay's less the tunnel's
        overhead."""
        return min(f.underlay_mtu for f in self.facts.values()) - TUNNEL_OVERHEAD[self.inv.tunnel]

    def host_of(self, name: str) -> ClusterHost:
        return self.inv.host(self.layout.placement[name])

    def _plans(self) -> dict[str, HostPlan]:
        plans = {
            h.name: HostPlan(
                h,
                self.facts[h.name],
                self.layout.switches_on(h.name),
                self.layout.nodes_on(h.name),
            )
            for h in self.layout.used_hosts()
        }
        crossing = 0
        for lk in self.topo.links:
            ha, hb = self.layout.placement[lk.a], self.layout.placement[lk.b]
            if ha == hb:
                plans[ha].inner.append(lk)
            else:
                plans[ha].outer.append((crossing, lk, lk.a))
                plans[hb].outer.append((crossing, lk, lk.b))
                crossing += 1
        if crossing >= 1 << VNI_LINK_BITS:
            raise FabricError(
                f"{crossing} links cross hosts: at most {(1 << VNI_LINK_BITS) - 1} have a key"
            )
        return plans

    def start(self) -> None:
        t0 = time.monotonic()
        if not self.facts:
            self.facts, errors = check_cluster(self.layout, self.accept_new)
            if errors:
                raise FabricError("; ".join(map(str, errors)))
            self.plans = self._plans()
        if self.image and self.client is not None:
            self._on_hosts("image", lambda r: deploy.install(r, self.client, self.image))
        self.built = set(self.plans)
        self._on_hosts("secrets", self._give_switch_identity)
        self._on_hosts("fabric", lambda r: self._run(r, "fabric", self.fabric_script(r.host.node)))
        self._on_hosts("nodes", lambda r: self._run(r, "nodes", self.nodes_script(r.host.node)))
        self.timings["up_s"] = time.monotonic() - t0
        log.info(
            "%s: %d nodes, %d switches on %d hosts up in %.1f s (%s tunnels, inner MTU %d)",
            self.prefix,
            len(self.topo.nodes),
            len(self.topo.switches),
            len(self.plans),
            self.timings["up_s"],
            self.inv.tunnel,
            self.mtu,
        )

    def stop(self) -> None:
        """Remove everything of the run on every host it touched (safe twice, and after a
        partial start)."""
        t0 = time.monotonic()
        hosts = [h for h in self.inv.hosts if h.name in self.built]
        _, errors = each(
            hosts, self.inv.known_hosts, self.accept_new, lambda r: cleanup_host(r, self.prefix)
        )
        self.built.clear()
        self.timings["down_s"] = time.monotonic() - t0
        for e in errors:
            log.warning(
                "teardown: %s (clean up later: run.py --cleanup --cluster %s --prefix %s)",
                e,
                self.inv.path,
                self.prefix,
            )

    def _on_hosts(self, phase: str, fn: Callable[[Remote], object]) -> dict[str, object]:
        hosts = [self.inv.host(h) for h in self.plans]
        done, errors = each(hosts, self.inv.known_hosts, self.accept_new, fn)
        if errors:
            raise FabricError(f"{phase}: " + "; ".join(map(str, errors)))
        return done

    def _run(self, remote: Remote, phase: str, script: str, timeout_s: float = 600.0) -> str:
        self.scripts[f"{remote.host.node}/{phase}"] = script
        status, out, err = remote.run("bash -s", timeout_s, stdin=[script.encode()])
        if status != 0:
            last = (err.strip() or out.strip() or f"exit {status}").splitlines()[-1]
            raise HostError(remote.host, f"{phase}: {last}")
        return out

    def _give_switch_identity(self, remote: Remote) -> None:
        """The host's ovs-vswitchd takes one SSL configuration for all its bridges: the identity
        of the first switch placed there, copied to the run's state folder (0600 keys)."""
        state = f"{STATE_DIR}/{self.prefix}"
        remote.ok(f"mkdir -p -m 700 {state}", "cannot make the run's state folder")
        plan = self.plans[remote.host.node]
        if self.pki is None or not plan.switches:
            return
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            folder = tarfile.TarInfo("switch")
            folder.type, folder.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(folder)
            for path in identity_files(self.pki / switch_identity(plan.switches[0])):
                data = path.read_bytes()
                info = tarfile.TarInfo(f"switch/{path.name}")
                info.size, info.mode = len(data), 0o600
                tar.addfile(info, io.BytesIO(data))
        status, _, err = remote.run(f"tar -x -C {state}", stdin=[buf.getvalue()])
        if status != 0:
            raise HostError(remote.host, f"cannot copy the switches' certificate ({err.strip()})")

    # --- phase 1: bridges, the underlay, links ---------------------------------------------------
    def fabric_script(self, host: str) -> str:
        p = self.plans[host]
        f, pre, mtu = p.facts, self.prefix, self.mtu
        state = f"{STATE_DIR}/{pre}"
        dp = f.datapath
        lines = [HEADER, f"P={pre}; S={state}; mkdir -p -m 700 $S"]
        # the nodes' TCP may pick cubic (a namespace may only take what the host allows)
        lines.append(
            "a=/proc/sys/net/ipv4/tcp_allowed_congestion_control; "
            f"if [ -w $a ] && ! grep -qw {TCP_CONGESTION_CONTROL} $a; then "
            f'echo "$(cat $a) {TCP_CONGESTION_CONTROL}" > $a; fi'
        )
        scheme = "tcp"
        if self.pki is not None and p.switches:
            scheme = "ssl"
            lines.append(
                "[ -e $S/ssl-before ] || ovs-vsctl --timeout=10 get-ssl > $S/ssl-before\n"
                "ovs-vsctl --timeout=10 set-ssl $S/switch/key.pem $S/switch/cert.pem "
                "$S/switch/ca.pem"
            )
        if dp == "netdev":
            u = f"{pre}u"
            lines += [
                "# the userspace datapath sends tunnels through a bridge holding the underlay",
                f"ethtool -k {p.host.underlay} | grep -q '^tx-checksumming: on' && "
                "echo on > $S/underlay-tx || true",
                _q(
                    "ovs-vsctl",
                    "--timeout=30",
                    "--",
                    "add-br",
                    u,
                    "--",
                    "set",
                    "bridge",
                    u,
                    "datapath_type=netdev",
                    "fail-mode=standalone",
                    "--",
                    "add-port",
                    u,
                    p.host.underlay,
                ),
                f"ethtool -K {p.host.underlay} tx off >/dev/null 2>&1 || true",
                _q("ip", "addr", "del", f.underlay_cidr, "dev", p.host.underlay),
                _q("ip", "addr", "add", f.underlay_cidr, "dev", u),
                _q("ip", "link", "set", u, "up"),
            ]
        vsctl = ["ovs-vsctl", "--timeout=60"]
        c_ip, c_port = self.controller
        for i, sw in enumerate(p.switches):
            br = self.names.bridge(sw)
            vsctl += [
                "--", "add-br", br, "--", "set", "bridge", br, f"datapath_type={dp}",
                "protocols=OpenFlow13", "fail-mode=secure",
                f"other-config:datapath-id={self.topo.switch(sw).dpid:016x}",
                "other-config:disable-in-band=true",
                "--", f"--id=@c{i}", "create", "Controller",
                f'target="{scheme}:{c_ip}:{c_port}"', "max_backoff=1000",
                "--", "set", "bridge", br, f"controller=@c{i}",
            ]  # fmt: skip
        tun = f"{pre}t"
        if p.outer:
            vsctl += [
                "--", "add-br", tun, "--", "set", "bridge", tun, f"datapath_type={dp}",
                "protocols=OpenFlow13", "fail-mode=secure", "other-config:disable-in-band=true",
            ]  # fmt: skip
        if len(vsctl) > 2:
            lines.append(_q(*vsctl))
        # links: veth pairs, up, offload off on a userspace datapath, ports, shaping
        veths, ports, shaping, flows = [], [], [], []

        def port(switch: str, ofport: int, ifname: str) -> list[str]:
            return [
                "--", "add-port", self.names.bridge(switch), ifname,
                "--", "set", "Interface", ifname, f"ofport_request={ofport}",
                "--", "set", "Port", ifname, f"qos=@q{ifname}",
                "--", f"--id=@q{ifname}", "create", "QoS", "type=linux-noop",
            ]  # fmt: skip

        for lk in p.inner:
            if lk.a in p.nodes or lk.b in p.nodes:
                continue  # a node's access link: made with the node (phase 2)
            a, b = self.names.interface(lk.a, lk.port_a), self.names.interface(lk.b, lk.port_b)
            veths.append((a, b))
            ports += port(lk.a, lk.port_a, a) + port(lk.b, lk.port_b, b)
            shaping += self._shape(a, lk, f) + self._shape(b, lk, f)
        remote_ip = {h.name: h.underlay_ip for h in self.inv.hosts}
        for index, lk, end in p.outer:
            other = lk.other(end)
            a, y, v = (
                self.names.interface(end, lk.port_of(end)),
                f"{pre}y{index:x}",
                f"{pre}v{index:x}",
            )
            veths.append((a, y))
            ports += port(end, lk.port_of(end), a)
            ports += [
                "--", "add-port", tun, y, "--", "set", "Interface", y,
                f"ofport_request={2 * index + 1}",
                "--", "add-port", tun, v, "--", "set", "Interface", v,
                f"type={self.inv.tunnel}",
                f"options:remote_ip={remote_ip[self.layout.placement[other]]}",
                f"options:key={vni(pre, index)}", f"ofport_request={2 * index + 2}",
            ]  # fmt: skip
            flows += [
                f"in_port={2 * index + 1},actions=output:{2 * index + 2}",
                f"in_port={2 * index + 2},actions=output:{2 * index + 1}",
            ]
            shaping += self._shape(a, lk, f)
        for a, b in veths:
            lines.append(
                _q(
                    "ip",
                    "link",
                    "add",
                    a,
                    "mtu",
                    mtu,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    b,
                    "mtu",
                    mtu,
                )
            )
        ups = [f"link set {x} up" for pair in veths for x in pair]
        if ups:
            lines.append("ip -batch - <<'EOF'\n" + "\n".join(ups) + "\nEOF")
        if dp == "netdev":  # the userspace datapath does not complete offloaded checksums
            for pair in veths:
                lines += [f"ethtool -K {x} tx off >/dev/null" for x in pair]
        if ports:
            lines.append(_q("ovs-vsctl", "--timeout=60", *ports))
        if flows:
            lines.append(
                f"ovs-ofctl -O OpenFlow13 add-flows {tun} - <<'EOF'\n" + "\n".join(flows) + "\nEOF"
            )
        if shaping:
            lines.append("tc -batch - <<'EOF'\n" + "\n".join(shaping) + "\nEOF")
        if dp == "netdev":  # learn the peers' addresses before the first tunnelled packet
            for peer in sorted(
                {remote_ip[self.layout.placement[lk.other(e)]] for _, lk, e in p.outer}
            ):
                lines.append(f"ping -c 2 -W 1 {peer} >/dev/null 2>&1 || true")
        return "\n".join(lines) + "\n"

    def _shape(self, dev: str, lk: Link, f: HostFacts) -> list[str]:
        """A switch's port `dev` on `lk`, as `tc -batch` lines (a node's interface: phase 2)."""
        return tc.shape_lines(
            dev, lk.bw_mbps, lk.delay_ms, self.dilation, f.netem, switch_port=True
        )

    # --- phase 2: the compute nodes --------------------------------------------------------------
    def parent(self, node: str, f: HostFacts) -> str:
        return cgroups.parent_name(self.names.cgroup_parent(node), f.systemd_cgroups)

    def nodes_script(self, host: str) -> str:
        p = self.plans[host]
        f, mtu = p.facts, self.mtu
        if not p.nodes:
            return HEADER
        lines = [HEADER, "running=0; failed=0"]
        for n in p.nodes:
            node = self.topo.node(n)
            run = _q(
                "docker", "run", "-d", "-t", "-i", "--entrypoint", "",
                "--name", self.names.container(n), "--hostname", n, "--network", "none",
                "--cap-add", "NET_ADMIN", "--cgroup-parent", self.parent(n, f),
                "--cpu-period", self.cpu_period,
                "--cpu-quota", cgroups.quota_us(self.dilation.host_cores(node.cpu), self.cpu_period),
                "--memory", f"{node.mem_mb}m", "--memory-swap", f"{node.mem_mb}m",
                "--sysctl", f"net.ipv4.tcp_congestion_control={TCP_CONGESTION_CONTROL}",
                "--label", f"{PROJECT_LABEL}={self.prefix}", "--label", f"{PID_LABEL}={os.getpid()}",
                "--label", f"ces.node={n}", self.image, "/bin/bash",
            )  # fmt: skip
            lines.append(
                f"( {run} >/dev/null ) & running=$((running + 1))\n"
                f"if [ $running -ge {PARALLEL_DOCKER_RUNS} ]; then wait -n || failed=1; "
                "running=$((running - 1)); fi"
            )
        lines.append(
            "while [ $running -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done\n"
            '[ $failed = 0 ] || { echo "docker run failed" >&2; exit 1; }'
        )
        containers = [self.names.container(n) for n in p.nodes]
        lines.append(
            "declare -A PID; while read -r name pid; do PID[${name#/}]=$pid; done < <("
            + _q("docker", "inspect", "-f", "{{.Name}} {{.State.Pid}}", *containers)
            + ")"
        )
        ports, host_shaping, host_ups = [], [], []
        for n in p.nodes:
            node, lk = self.topo.node(n), self.topo.access_link(n)
            sw = lk.other(n)
            sw_if = self.names.interface(sw, lk.port_of(sw))
            pid = f"${{PID[{self.names.container(n)}]}}"
            lines.append(
                _q("ip", "link", "add", sw_if, "mtu", mtu, "type", "veth", "peer", "name", "eth0",
                   "mtu", mtu, "address", node.mac, "netns") + f" {pid}"
            )  # fmt: skip
            inner = [f"addr add {node.ip}/16 dev eth0", "link set eth0 up", "link set lo up"]
            lines.append(f"nsenter -t {pid} -n ip -batch - <<'EOF'\n" + "\n".join(inner) + "\nEOF")
            if f.datapath == "netdev":
                lines.append(f"nsenter -t {pid} -n ethtool -K eth0 tx off >/dev/null")
                lines.append(f"ethtool -K {sw_if} tx off >/dev/null")
            lines.append(
                f"nsenter -t {pid} -n tc -batch - <<'EOF'\n"
                + "\n".join(tc.shape_lines("eth0", lk.bw_mbps, lk.delay_ms, self.dilation, f.netem))
                + "\nEOF"
            )
            host_ups.append(f"link set {sw_if} up")
            host_shaping += self._shape(sw_if, lk, f)
            ports += [
                "--", "add-port", self.names.bridge(sw), sw_if,
                "--", "set", "Interface", sw_if, f"ofport_request={lk.port_of(sw)}",
                "--", "set", "Port", sw_if, f"qos=@q{sw_if}",
                "--", f"--id=@q{sw_if}", "create", "QoS", "type=linux-noop",
            ]  # fmt: skip
            # the parent caps the node container and every worker started under it together
            for path, value in cgroups.limit_writes(
                self.parent(n, f),
                self.dilation.host_cores(node.cpu),
                node.mem_mb,
                self.cpu_period,
                f.cgroup_version,
            ):
                lines.append(f"printf %s {value} > {shlex.quote(str(path))}")
        lines.append("ip -batch - <<'EOF'\n" + "\n".join(host_ups) + "\nEOF")
        lines.append(_q("ovs-vsctl", "--timeout=60", *ports))
        lines.append("tc -batch - <<'EOF'\n" + "\n".join(host_shaping) + "\nEOF")
        return "\n".join(lines) + "\n"

    # --- using it ----------------------------------------------------------------------------------
    def node_container_name(self, node: str) -> str:
        return self.names.container(node)

    def remote(self, name: str) -> Remote:
        """A new SSH connection to the host of switch or node `name` (the caller closes it)."""
        return Remote(self.host_of(name), self.inv.known_hosts, self.accept_new).connect()  # type: ignore[arg-type]

    def exec(self, node: str, command: str, timeout_s: float = 60.0) -> tuple[int, str]:
        """Run a shell command inside the node's container: (exit code, output)."""
        with self.remote(node) as r:
            status, out, err = r.run(
                _q("docker", "exec", self.names.container(node), "bash", "-c", command), timeout_s
            )
        return status, out + err

    def ping_pairs(self) -> list[tuple[str, str]]:
        """The pairs a bring-up check pings: all of them on a small topology; on a large one
        each node to the next and to the one halfway round the node list (both often on
        another host)."""
        nodes = [n.name for n in self.topo.nodes]
        if len(nodes) <= 16:
            return [(a, b) for a in nodes for b in nodes if a != b]
        k = len(nodes)
        return [(nodes[i], nodes[(i + d) % k]) for i in range(k) for d in (1, k // 2)]

    def ping_check(self, attempts: int = 3, timeout_s: float = 60.0) -> list[tuple[str, str]]:
        """The pairs (`ping_pairs`) that no ping of `attempts` crossed within `timeout_s`; every
        host pings from its nodes at once, and pings again the pairs it lost, until none is
        lost or the time is up: on a large topology the SDN app installs a path at each pair's
        first packet, and gen:internet:100's 200 pairs at once did not all cross in one round."""
        pairs = self.ping_pairs()
        deadline = time.monotonic() + timeout_s
        while True:
            lost = self._ping_round(pairs, attempts)
            if not lost or time.monotonic() > deadline:
                return lost
            pairs = lost
            time.sleep(1)

    def _ping_round(self, pairs: list[tuple[str, str]], attempts: int) -> list[tuple[str, str]]:
        by_src: dict[str, list[str]] = {}
        for a, b in pairs:
            by_src.setdefault(a, []).append(b)

        def host_pings(r: Remote) -> list[tuple[str, str]]:
            script = ["set -u"]
            for a in self.layout.nodes_on(r.host.node):
                targets = " ".join(f"{b}={self.topo.node(b).ip}" for b in by_src.get(a, []))
                if targets:
                    script.append(
                        f"( for t in {targets}; do ip=${{t#*=}}; "
                        f"docker exec {self.names.container(a)} ping -c {attempts} -W 1 -i 0.2 "
                        f'$ip >/dev/null 2>&1 || echo "lost {a} ${{t%%=*}}"; done ) &'
                    )
            script.append("wait")
            _, out, _ = r.run("bash -s", 300, stdin=["\n".join(script).encode()])
            lost = [line.split() for line in out.splitlines() if line.startswith("lost ")]
            return [(w[1], w[2]) for w in lost]

        done = self._on_hosts("ping", host_pings)
        return [pair for lost in done.values() for pair in lost]  # type: ignore[attr-defined]


# --- cleanup ---------------------------------------------------------------------------------------
CLEANUP = r"""
set -uo pipefail
P=$1; S=/var/lib/ces/$P
case $P in ces[0-9a-f][0-9a-f][0-9a-f][0-9a-f]) ;; *) echo "bad prefix $P" >&2; exit 2;; esac
ids=$(docker ps -aq --filter "name=^$P-")
[ -n "$ids" ] && docker rm -f $ids >/dev/null
for i in $(seq 50); do [ -z "$(docker ps -aq --filter "name=^$P-")" ] && break; sleep 0.2; done
# the underlay's address back on its interface before its bridge goes
U=${P}u
if ovs-vsctl --timeout=10 br-exists $U; then
  cidr=$(ip -4 -o addr show dev $U 2>/dev/null | awk '{print $4}' | head -1)
  dev=$(ovs-vsctl --timeout=10 list-ports $U | head -1)
  ovs-vsctl --timeout=30 del-br $U
  if [ -n "$dev" ] && [ -n "$cidr" ]; then ip addr add $cidr dev $dev 2>/dev/null; ip link set $dev up; fi
  [ -n "$dev" ] && [ -e $S/underlay-tx ] && ethtool -K $dev tx on >/dev/null 2>&1
fi
brs=""
for br in $(ovs-vsctl --timeout=10 list-br); do case $br in $P*) brs="$brs -- --if-exists del-br $br";; esac; done
[ -n "$brs" ] && ovs-vsctl --timeout=60 $brs
for br in $(ovs-vsctl --timeout=10 list-br); do
  for port in $(ovs-vsctl --timeout=10 list-ports $br); do
    case $port in $P*) ovs-vsctl --timeout=10 --if-exists del-port $br $port;; esac
  done
done
for i in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1); do
  case $i in $P*) ip link del $i 2>/dev/null;; esac
done
for d in /sys/fs/cgroup/$P-* /sys/fs/cgroup/${P}_*.slice /sys/fs/cgroup/*/$P-* /sys/fs/cgroup/*/${P}_*.slice; do
  [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
done
if [ -e $S/ssl-before ] && ovs-vsctl --timeout=10 get-ssl | grep -q "$S/"; then
  k=$(sed -n 's/^Private key: //p' $S/ssl-before); c=$(sed -n 's/^Certificate: //p' $S/ssl-before)
  ca=$(sed -n 's/^CA Certificate: //p' $S/ssl-before)
  if [ -n "$k" ]; then ovs-vsctl --timeout=10 set-ssl "$k" "$c" "$ca"; else ovs-vsctl --timeout=10 del-ssl; fi
fi
rm -rf $S
left=$(docker ps -aq --filter "name=^$P-" | wc -l)
echo "containers=$(echo $ids | wc -w) left=$left bridges=$(echo $brs | grep -o del-br | wc -l)"
"""


def cleanup_host(remote: Remote, prefix: str) -> dict[str, int]:
    """Remove everything of run `prefix` on the host (see the module doc): {what: how many}."""
    status, out, err = remote.run(f"bash -s {shlex.quote(prefix)}", 120, stdin=[CLEANUP.encode()])
    counts = {}
    for word in (out.strip().splitlines() or [""])[-1].split():
        k, _, v = word.partition("=")
        if v.isdigit():
            counts[k] = int(v)
    if status != 0 or counts.get("left"):
        raise HostError(
            remote.host, f"cleanup of {prefix}: {(err.strip() or out.strip()).splitlines()[-1:]}"
        )
    return counts


# --- what a host spends, second by second ------------------------------------------------------
SAMPLER = r"""
pid=$(cat %(pidfile)s 2>/dev/null)
P=%(prefix)s
while :; do
  sw=$( [ -n "$pid" ] && cut -d' ' -f14,15 /proc/$pid/stat 2>/dev/null || echo "0 0")
  wait=$( [ -n "$pid" ] && cut -d' ' -f2 /proc/$pid/schedstat 2>/dev/null || echo 0)
  # %%.0f, not %%d: mawk (Debian's awk) caps %%d at 2^31 - 1, 2.1 s of CPU in nanoseconds
  nodes=$( (cat %(cgroups)s/cpuacct/$P[-_]*/cpuacct.usage 2>/dev/null; \
            awk '/^usage_usec/ {printf "%%.0f\n", $2 * 1000}' %(cgroups)s/$P[-_]*/cpu.stat 2>/dev/null) \
          | awk '{s += $1} END {printf "%%.0f", s}')
  echo "$(date +%%s.%%N) $(head -1 /proc/stat) | $sw | $wait | $nodes"
  sleep 1
done
"""


def sampler_script(prefix: str, cgroups: str = "/sys/fs/cgroup") -> str:
    """The sampler's script for run `prefix`, its nodes' cgroups under `cgroups`."""
    return SAMPLER % {"pidfile": OVS_PIDFILE, "prefix": prefix, "cgroups": cgroups}


class HostSampler:
    """Every second, on one host: its cores' busy time, its ovs-vswitchd's CPU and forwarding
    thread's wait, its nodes' cgroups' CPU — streamed over an SSH channel of its own, read by a
    thread; `snapshot()` is what `experiments.e2e.stack.usage` turns into a run's figures."""

    def __init__(self, remote: Remote, prefix: str, cores: float):
        self.remote, self.prefix, self.cores = remote, prefix, cores
        self.rows: list[tuple[float, float, float, float, float]] = []  # t, busy, sw, wait, nodes
        self.busy: list[float] = []  # each window's busy share of the host's cores
        self.tick = os.sysconf("SC_CLK_TCK")
        self._chan: paramiko.Channel | None = None
        self._thread = threading.Thread(target=self._read, daemon=True, name="sampler")

    def start(self) -> HostSampler:
        transport = self.remote.client.get_transport()
        assert transport is not None
        self._chan = transport.open_session()
        self._chan.exec_command("bash -c " + shlex.quote(sampler_script(self.prefix)))
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._chan is not None
        self.parse(self._chan.makefile("r"))

    def parse(self, lines: Iterable[str]) -> None:
        """The sampler script's lines: the host's busy seconds count niced processes (the cores
        used, as on one host), its windows do not (what the verdict judges: `busy_ticks`)."""
        active_before = 0.0
        for line in lines:
            try:
                head, sw, wait, nodes = line.split("|")
                stamp, stat = head.split(maxsplit=1)
                busy, active = (busy_ticks(stat, niced) / self.tick for niced in (True, False))
                row = (float(stamp), busy, sum(int(x) for x in sw.split()) / self.tick,
                       int(wait) / 1e9, int(nodes or 0) / 1e9)  # fmt: skip
            except (ValueError, IndexError):
                continue
            if self.rows:
                dt = row[0] - self.rows[-1][0]
                if dt > 0:
                    self.busy.append((active - active_before) / dt / self.cores)
            self.rows.append(row)
            active_before = active

    def wait_first(self, timeout_s: float = 15.0) -> None:
        """Until the first sample is in (a run's first counters need one from every host); a
        HostError after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self.rows:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise HostError(self.remote.host, f"no CPU sample within {timeout_s:g} s")
            time.sleep(0.1)

    def snapshot(self) -> dict:
        """Cumulative counters as of the last sample (host seconds), and every window so far."""
        if not self.rows:
            return {"t": time.monotonic(), "cpu_s": {}, "busy": [], "switch_wait_s": None}
        t, busy, sw, wait, nodes = self.rows[-1]
        return {
            "t": t,
            "cpu_s": {"host": busy, "switch": sw, "nodes": nodes},
            "switch_wait_s": wait,
            "busy": list(self.busy),
        }

    def stop(self) -> None:
        if self._chan is not None:
            self._chan.close()
        self._thread.join(timeout=5)
