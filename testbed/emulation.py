"""Emulate a `Topology`: OVS switches, Docker containers as compute nodes, HTB-shaped veth links.

    with Emulation(load_topology("campus"), controller=("127.0.0.1", 6653)) as net:
        net.exec("lab1", "ping -c1 10.0.0.2")

Names follow the topology exactly where the rest of the project relies on them: every bridge has
the switch's dpid, every port its OpenFlow number, every node's `eth0` its ip/mac. Everything
created carries the run prefix and is removed on exit, on exceptions, on Ctrl-C and SIGTERM.

`dilation` (protocol.dilation) runs the emulated network K times slower than real time: every
link's rate and every node's and worker's CPU quota is the host's share (÷ K) of what the
topology and the caller say, a link's delay lasts K times longer; the API takes and returns the
topology's units.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors
import networkx as nx
from docker.models.containers import Container
from mininet.link import Intf
from mininet.node import RemoteController

from edge import cgroups, tc, workers
from protocol.dilation import NONE, Dilation
from topologies import ComputeNode, Link, Topology

from . import ovs_sockets
from .cleanup import PID_LABEL, cleanup
from .containernet import (
    Containernet,
    Docker,
    EdgeSwitch,
    allow_congestion_control,
    detect_datapath,
    netns_run,
)
from .names import Lifecycle, Names, new_prefix

log = logging.getLogger(__name__)
PROJECT_LABEL = "ces.run"
# The nodes' TCP, whatever the host's default: loss-based cubic (Linux's usual default) keeps
# retransmissions rare in the links' short queues, where BBR's probing above the shaped rate
# retransmitted 3–5 % of all segments and up to tripled small models' all-reduce times
# (docs/testbed.md).
TCP_CONGESTION_CONTROL = "cubic"


class EmulationError(RuntimeError):
    pass


class Emulation(Lifecycle):
    def __init__(
        self,
        topo: Topology,
        prefix: str | None = None,
        controller: tuple[str, int] | None = None,
        image: str | None = None,
        datapath: str | None = None,
        client: docker.DockerClient | None = None,
        converge_timeout_s: float = 30.0,
        tcp_cc: str = TCP_CONGESTION_CONTROL,
        dilation: Dilation = NONE,
    ) -> None:
        self.topo = topo
        self.dilation = dilation
        self.cpu_period = cgroups.period_us(dilation.factor)
        self.names = Names(prefix or new_prefix())
        self.prefix = self.names.prefix
        self.controller = controller
        self.image = image  # None: the worker image of the current inputs, built if missing
        self.datapath = datapath or detect_datapath()
        self.client = client or docker.from_env()
        self.converge_timeout_s = converge_timeout_s
        self.tcp_cc = tcp_cc
        self.net: Containernet | None = None
        self.nodes: dict[str, Docker] = {}
        self.switches: dict[str, EdgeSwitch] = {}
        self.timings: dict[str, float] = {}  # up_s (built), converged_s (forwarding), down_s
        self._systemd_cgroups = False  # Docker's cgroup driver, learnt in start()
        self._saved_handlers: dict[int, object] = {}

    # --- life cycle ------------------------------------------------------------------------------

    def __enter__(self) -> Emulation:
        self._trap_signals()
        return super().__enter__()

    def start(self) -> None:
        if self.image is None:
            # Imported here, not at the top: `python -m testbed.image` runs that module as
            # __main__ and must not find it imported already through the package.
            from . import image

            try:
                self.image = image.ensure(self.client)  # a no-op unless workloads/ etc. changed
            except image.ImageError as e:
                raise EmulationError(f"worker image: {e}") from None
        try:
            self.client.images.get(self.image)
        except docker.errors.ImageNotFound:
            raise EmulationError(f"image {self.image} does not exist") from None
        try:
            allow_congestion_control(self.tcp_cc)
        except (OSError, ValueError) as e:
            raise EmulationError(f"TCP congestion control of the nodes: {e}") from None
        t0 = time.monotonic()
        self._systemd_cgroups = self.client.info().get("CgroupDriver") == "systemd"
        self.net = Containernet(
            client=self.client, stop_at_exit=False, controller=None, build=False, listenPort=None
        )
        if self.controller:
            ip, port = self.controller
            self.net.addController("c0", controller=RemoteController, ip=ip, port=port)
        standalone = self.controller is None
        for s in self.topo.switches:
            self.switches[s.name] = self.net.addSwitch(
                self.names.bridge(s.name),
                dpid=f"{s.dpid:016x}",
                protocols="OpenFlow13",
                failMode="standalone" if standalone else "secure",
                datapath=self.datapath,
                batch=True,
            )
        # Containers start in parallel: `docker run` is most of the bring-up time.
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(self._add_container, self.topo.nodes))
        for lk in self.topo.links:
            self._add_link(lk)
        self.net.build()
        self._prepare_interfaces(self.net.links)
        self.net.start()
        self._enlarge_port_buffers()
        self.timings["up_s"] = time.monotonic() - t0
        if standalone:
            self.wait_converged(self.converge_timeout_s)
        self.timings["converged_s"] = time.monotonic() - t0
        log.info(
            "%s: %d nodes, %d switches, %d links up in %.1f s (%s datapath)",
            self.prefix,
            len(self.nodes),
            len(self.switches),
            len(self.topo.links),
            self.timings["converged_s"],
            self.datapath,
        )

    def stop(self) -> None:
        """Tear everything down; safe to call at any point of a bring-up, and twice."""
        held = self._hold_signals()
        try:
            t0 = time.monotonic()
            removed = cleanup(self.prefix, self.client)
            for n in list(self.nodes.values()) + list(self.switches.values()):
                n.terminate()  # close the Mininet shells' ptys; the processes are gone
            self.nodes.clear()
            self.switches.clear()
            self.net = None
            self.timings["down_s"] = time.monotonic() - t0
            if removed.total():
                log.info(
                    "%s: removed %s in %.1f s",
                    self.prefix,
                    removed.summary(),
                    self.timings["down_s"],
                )
        finally:
            self._restore_signals(held)
            self._restore_signals(self._saved_handlers)
            self._saved_handlers = {}

    def _trap_signals(self) -> None:
        """SIGTERM behaves like Ctrl-C (an exception), so the `with` block tears down."""
        if threading.current_thread() is not threading.main_thread():
            return

        def terminate(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        self._saved_handlers = {signal.SIGTERM: signal.signal(signal.SIGTERM, terminate)}

    @staticmethod
    def _hold_signals() -> dict[int, object]:
        """Ignore SIGINT/SIGTERM during teardown so a second Ctrl-C cannot leave half of it."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}

    @staticmethod
    def _restore_signals(saved: dict[int, object]) -> None:
        for s, handler in saved.items():
            signal.signal(s, handler)

    # --- building blocks -------------------------------------------------------------------------

    def _add_container(self, node: ComputeNode) -> Docker:
        assert self.net is not None
        name = self.names.container(node.name)
        parent = cgroups.parent_name(self.names.cgroup_parent(node.name), self._systemd_cgroups)
        docker_node = self.net.addDocker(
            name,
            container_name=name,
            dimage=self.image,
            hostname=node.name,
            network_mode="none",
            cgroup_parent=parent,
            labels=self._labels(node=node.name),
            cpu_period=self.cpu_period,
            cpu_quota=cgroups.quota_us(self.dilation.host_cores(node.cpu), self.cpu_period),
            mem_limit=f"{node.mem_mb}m",
            memswap_limit=f"{node.mem_mb}m",
            sysctls={"net.ipv4.tcp_congestion_control": self.tcp_cc},
            ip=f"{node.ip}/16",
            mac=node.mac,
        )
        # The parent caps the node container and every worker started under it together.
        cgroups.set_limits(parent, self.dilation.host_cores(node.cpu), node.mem_mb, self.cpu_period)
        self.nodes[node.name] = docker_node
        return docker_node

    def _labels(self, **more: str) -> dict[str, str]:
        # The pid tells `cleanup()` that this run is alive (see testbed/cleanup.py).
        return {PROJECT_LABEL: self.prefix, PID_LABEL: str(os.getpid())} | {
            f"ces.{k}": v for k, v in more.items()
        }

    def _end(self, name: str, port: int) -> tuple[object, str, dict]:
        """(Mininet node, interface name, interface params) of one end of a link."""
        if name in self.nodes:
            return self.nodes[name], "eth0", {"edge": True}
        return self.switches[name], self.names.interface(name, port), {}

    def _add_link(self, lk: Link):
        assert self.net is not None
        # A switch first: the veth pair is made in its (the root) namespace with the node's
        # end created straight inside the container, where `eth0` clashes with nothing.
        a, b = (lk.b, lk.a) if lk.a in self.nodes else (lk.a, lk.b)
        node1, if1, p1 = self._end(a, lk.port_of(a))
        node2, if2, p2 = self._end(b, lk.port_of(b))
        macs = {"addr2": self.topo.node(b).mac} if b in self.nodes else {}
        return self.net.addLink(
            node1,
            node2,
            port1=lk.port_of(a),
            port2=lk.port_of(b),
            intfName1=if1,
            intfName2=if2,
            **macs,
            params1=p1 | {"bw_mbps": lk.bw_mbps, "edge": "edge" in p2},
            params2=p2 | {"bw_mbps": lk.bw_mbps},
        )

    def _pid(self, intf: Intf) -> int | None:
        return intf.node.container_pid if isinstance(intf.node, Docker) else None

    def _prepare_interfaces(self, links) -> None:
        """HTB shaping on both ends of `links` (Containernet.addLink did checksum offload)."""
        by_ends = {frozenset((lk.a, lk.b)): lk for lk in self.topo.links}
        for mlink in links:
            lk = by_ends[
                frozenset((self._topo_name(mlink.intf1.node), self._topo_name(mlink.intf2.node)))
            ]
            for intf in (mlink.intf1, mlink.intf2):
                pid = self._pid(intf)  # a switch's port is in the host's namespace
                tc.shape(intf.name, lk.bw_mbps, lk.delay_ms, pid, self.dilation, pid is None)

    def _enlarge_port_buffers(self, ports: list[str] | None = None) -> None:
        """Room for the userspace datapath to fall behind without dropping (ovs_sockets), on
        `ports` (default: every port of our switches)."""
        if self.datapath != "user":
            return
        if ports is None:
            ports = [
                intf.name
                for s in self.switches.values()
                for intf in s.intfList()
                if intf.name != "lo"
            ]
        try:
            ovs_sockets.enlarge_receive_buffers(ports)
        except (ovs_sockets.SocketBufferError, OSError) as e:
            # Still a working network, with the loss the module describes.
            log.warning("%s: ports keep the default receive buffer: %s", self.prefix, e)

    def _topo_name(self, mininet_node: object) -> str:
        for name, n in list(self.nodes.items()) + list(self.switches.items()):
            if n is mininet_node:
                return name
        raise KeyError(mininet_node)

    def wait_converged(self, timeout_s: float) -> None:
        """Standalone mode: wait until RSTP has settled every port of our bridges."""
        deadline = time.monotonic() + timeout_s
        while True:
            unsettled = self._unsettled_ports()
            if not unsettled:
                return
            if time.monotonic() > deadline:
                raise EmulationError(
                    f"RSTP did not converge in {timeout_s:.0f} s: "
                    f"{', '.join(unsettled[:5])} still learning"
                )
            time.sleep(0.2)

    def _rstp_ports(self) -> dict[str, tuple[str | None, str | None]]:
        """{our switch-side interface: (RSTP role, RSTP state)}."""
        out = subprocess.run(
            ["ovs-vsctl", "--format=json", "--columns=name,rstp_status", "list", "Port"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        ports = {}
        for name, status in json.loads(out)["data"]:
            if not name.startswith(self.prefix) or name in self.names.bridges.values():
                continue  # not ours, or a bridge's internal port (no RSTP there)
            fields = dict(status[1]) if status[0] == "map" else {}
            ports[name] = (fields.get("rstp_port_role"), fields.get("rstp_port_state"))
        return ports

    def _unsettled_ports(self) -> list[str]:
        # Root/Designated ports must forward; Alternate/Backup ports stay discarding.
        return [
            name
            for name, (role, state) in self._rstp_ports().items()
            if role is None or (role in ("Root", "Designated") and state != "Forwarding")
        ]

    def forwarding_path(self, src: str, dst: str) -> list[str]:
        """The path traffic from `src` to `dst` takes in standalone mode: the RSTP tree's.

        With a controller the path is the controller's decision; ask it instead."""
        if self.controller is not None:
            raise EmulationError("forwarding_path: the controller decides paths in this run")
        ports = self._rstp_ports()
        tree = self.topo.graph().copy()
        for lk in self.topo.links:
            ends = [e for e in (lk.a, lk.b) if e in self.switches]
            if any(
                ports.get(self.interface_name(e, lk.port_of(e)), (None,))[0]
                in ("Alternate", "Backup", "Disabled")
                for e in ends
            ):
                tree.remove_edge(lk.a, lk.b)
        return nx.shortest_path(tree, src, dst)

    def bottleneck_mbps(self, path: list[str]) -> float:
        g = self.topo.graph()
        return min(g.edges[u, v]["bw_mbps"] for u, v in itertools.pairwise(path))

    def iperf(
        self, src: str, dst: str, seconds: float = 5.0, port: int = 5201, omit_s: int = 0
    ) -> float:
        """TCP goodput from `src` to `dst` in Mbit/s, measured by iperf3 at the receiver
        (the first `omit_s` seconds, TCP's slow start, not counted); emulated seconds and
        Mbit/s under dilation."""
        dst_node = self._node(dst)
        code, out = dst_node.exec(f"iperf3 -s -1 -D -p {port}")
        if code != 0:
            raise EmulationError(f"iperf3 server on {dst}: {out.strip()}")
        self.wait_listening(dst, port, f"iperf3 server on {dst}")
        code, out = self._node(src).exec(
            f"iperf3 -c {dst_node.ip} -p {port} -t {self.dilation.host_seconds(seconds):g} "
            f"-O {round(self.dilation.host_seconds(omit_s))} -J"
        )
        try:
            result = json.loads(out)
            return self.dilation.emulated_mbps(
                result["end"]["sum_received"]["bits_per_second"] / 1e6
            )
        except (json.JSONDecodeError, KeyError):
            raise EmulationError(f"iperf3 {src} → {dst} failed: {out.strip()[-500:]}") from None

    def wait_listening(self, node: str, port: int, what: str, timeout_s: float = 10.0) -> None:
        """Return once something in `node` listens on TCP `port`; EmulationError after
        `timeout_s` ("`what` did not start listening")."""
        deadline = time.monotonic() + timeout_s
        while f":{port} " not in self.exec(node, "ss -ltnH")[1]:
            if time.monotonic() > deadline:
                raise EmulationError(f"{what} did not start listening")
            time.sleep(0.05)

    # --- the API the rest of the project uses ----------------------------------------------------

    def node_container_name(self, node: str) -> str:
        return self.names.container(node)

    def bridge_name(self, switch: str) -> str:
        return self.names.bridges[switch]

    def interface_name(self, switch: str, port: int) -> str:
        return self.names.interfaces[(switch, port)]

    def exec(self, node: str, command: str) -> tuple[int, str]:
        """Run a shell command inside the node's container: (exit code, output)."""
        return self._node(node).exec(command)

    def _node(self, name: str) -> Docker:
        if name not in self.nodes:
            raise EmulationError(f"no compute node '{name}' (have: {', '.join(self.nodes)})")
        return self.nodes[name]

    def add_node(self, node: ComputeNode, link: Link) -> Docker:
        """Add a compute node at run time, attached by `link` to an existing switch."""
        assert self.net is not None
        switch = link.other(node.name)
        if node.name in self.nodes or node.name in self.switches:
            raise EmulationError(f"add_node: '{node.name}' already exists")
        if node.name not in (link.a, link.b) or switch not in self.switches:
            raise EmulationError(
                f"add_node: link {link.a}–{link.b} must join '{node.name}' to an existing switch"
            )
        port = link.port_of(switch)
        if any(lk.port_of(switch) == port for lk in self.topo.links_of(switch)):
            raise EmulationError(f"add_node: port {port} of '{switch}' is already used")
        self.topo = dataclasses.replace(
            self.topo, nodes=self.topo.nodes + [node], links=self.topo.links + [link]
        )
        docker_node = self._add_container(node)
        mlink = self._add_link(link)  # attached to the running switch by Containernet
        docker_node.configDefault()
        self._prepare_interfaces([mlink])
        self._enlarge_port_buffers([mlink.intf1.name])
        if self.controller is None:
            self.wait_converged(self.converge_timeout_s)  # the new port starts discarding
        return docker_node

    def remove_node(self, name: str) -> None:
        """Remove a compute node (its workers, container, link and switch port) at run time."""
        assert self.net is not None
        docker_node = self._node(name)
        for w in workers.find_workers(self.client, self.names.worker(name, "")):
            w.remove(force=True)
        self.net.removeDocker(docker_node)
        cgroups.remove(docker_node.cgroup_parent)  # its workers are gone already
        del self.nodes[name]
        self.topo = dataclasses.replace(
            self.topo,
            nodes=[n for n in self.topo.nodes if n.name != name],
            links=[lk for lk in self.topo.links if name not in (lk.a, lk.b)],
        )

    def set_link(self, a: str, b: str, bw_mbps: float, delay_ms: float | None = None) -> None:
        """Change a link's capacity (and delay) at run time, both directions."""
        assert self.net is not None
        lk = next((lk for lk in self.topo.links if {lk.a, lk.b} == {a, b}), None)
        if lk is None:
            raise EmulationError(f"set_link: no link between '{a}' and '{b}'")
        for end in (a, b):
            if end in self.nodes:
                tc.change("eth0", bw_mbps, delay_ms, self.nodes[end].container_pid, self.dilation)
            else:
                tc.change(
                    self.interface_name(end, lk.port_of(end)),
                    bw_mbps,
                    delay_ms,
                    dilation=self.dilation,
                    switch_port=True,
                )
        new = dataclasses.replace(
            lk, bw_mbps=bw_mbps, delay_ms=lk.delay_ms if delay_ms is None else delay_ms
        )
        self.topo = dataclasses.replace(
            self.topo, links=[new if x is lk else x for x in self.topo.links]
        )

    def set_link_up(self, a: str, b: str, up: bool) -> None:
        """Take a link down (both ends lose carrier: the switches report the ports down to the
        controller) or bring it back."""
        lk = next((lk for lk in self.topo.links if {lk.a, lk.b} == {a, b}), None)
        if lk is None:
            raise EmulationError(f"set_link_up: no link between '{a}' and '{b}'")
        for end in (a, b):
            if end in self.nodes:
                pid, dev = self.nodes[end].container_pid, "eth0"
            else:
                pid, dev = None, self.interface_name(end, lk.port_of(end))
            done = netns_run(pid, "ip", "link", "set", dev, "up" if up else "down")
            if done.returncode != 0:
                raise EmulationError(f"set_link_up {a}-{b}: {done.stderr.strip()}")

    def restart_vswitchd(self, timeout_s: float = 20.0) -> None:
        """Restart the host's ovs-vswitchd, a fault to inject (it carries every bridge of the
        host, not only ours): ask it to exit, wait until it and its monitor are gone, and start
        it again with the command line it ran with, whatever happened meanwhile. The bridges
        come back from ovsdb with empty flow tables and reconnect to their controller, which
        must install them again; our ports get their larger receive buffers again."""
        try:
            pid = ovs_sockets.vswitchd_pid()
            argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
            ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            monitor = Path(f"/proc/{ppid}/comm").read_text().strip() == "ovs-vswitchd"
        except (ovs_sockets.SocketBufferError, OSError) as e:
            raise EmulationError(f"restart_vswitchd: {e}") from None
        argv = argv[:-1] if argv[-1] == "" else argv
        if "--detach" not in argv:  # started in the foreground by someone we cannot replace
            raise EmulationError(
                f"restart_vswitchd: ovs-vswitchd ({pid}) runs without "
                "--detach: not restarted, it could not be started the same way"
            )
        procs = [Path(f"/proc/{pid}")] + ([Path(f"/proc/{ppid}")] if monitor else [])
        try:
            subprocess.run(
                ["ovs-appctl", "-t", "ovs-vswitchd", "exit"], capture_output=True, timeout=timeout_s
            )
            deadline = time.monotonic() + timeout_s
            while any(p.exists() for p in procs) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            if not procs[0].exists():  # --detach: returns once the daemon serves
                done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
                if done.returncode != 0:
                    raise EmulationError(
                        f"ovs-vswitchd did not start again "
                        f"({' '.join(argv)}): {done.stderr.strip()}"
                    )
        if procs[0].exists():
            raise EmulationError(f"ovs-vswitchd ({pid}) did not exit within {timeout_s:g} s")
        self._enlarge_port_buffers()

    def update_node(self, name: str, cpu: float | None = None, mem_mb: int | None = None) -> None:
        """Change a node's CPU/memory capacity (node container and the cgroup of its workers)."""
        docker_node = self._node(name)
        parent = docker_node.cgroup_parent
        old_cpu, old_mem = cgroups.limits(parent)  # the host's share
        cpu = old_cpu if cpu is None else self.dilation.host_cores(cpu)
        mem_mb = old_mem if mem_mb is None else mem_mb
        try:
            # cgroup v1 refuses a child CPU quota above its parent's: widen the parent first,
            # narrow it last.
            if cpu >= old_cpu:
                cgroups.set_limits(parent, cpu, max(mem_mb, old_mem), self.cpu_period)
            docker_node.updateCpuLimit(
                cpu_period=self.cpu_period, cpu_quota=cgroups.quota_us(cpu, self.cpu_period)
            )
            docker_node.updateMemoryLimit(mem_limit=f"{mem_mb}m", memswap_limit=f"{mem_mb}m")
            cgroups.set_limits(parent, cpu, mem_mb, self.cpu_period)
        except (OSError, docker.errors.APIError) as e:
            raise EmulationError(
                f"update_node {name} (cpu={cpu}, mem_mb={mem_mb}): {e} — the "
                "node's workers or its memory in use may exceed the new limit"
            ) from None

    def start_worker(
        self,
        node: str,
        name: str,
        command: str | list[str],
        cpu: float,
        mem_mb: int,
        env: dict[str, str] | None = None,
    ) -> Container:
        """Start a worker container in `node`'s network namespace and cgroup, with `cpu` emulated
        cores (the host's share under dilation)."""
        docker_node = self._node(node)
        # gloo picks the address of the hostname; with --network none that is loopback.
        env = {"GLOO_SOCKET_IFNAME": "eth0", **(env or {})}
        return workers.start_worker(
            self.client,
            self.image,
            self.names.worker(node, name),
            command,
            self.dilation.host_cores(cpu),
            mem_mb,
            env,
            node_container=docker_node.container.name,
            cgroup_parent=docker_node.cgroup_parent,
            labels=self._labels(node=node, worker=name),
            period_us=self.cpu_period,
        )

    def ping_all(self, timeout_s: float = 1.0) -> float:
        """Ping every node from every other node once; the fraction of pings lost."""
        ips = {name: n.ip for name, n in self.nodes.items()}

        def from_node(src: str) -> tuple[int, int]:
            targets = " ".join(ip for name, ip in ips.items() if name != src)
            _code, out = self.exec(
                src,
                f"for ip in {targets}; do ping -c1 -W{timeout_s} $ip "
                ">/dev/null 2>&1 && echo ok || echo lost; done",
            )
            return out.split().count("ok"), len(ips) - 1

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(from_node, ips))
        sent = sum(total for _, total in results)
        return 1.0 - sum(ok for ok, _ in results) / sent if sent else 0.0
