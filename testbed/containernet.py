"""Containernet's API on plain Mininet: Docker containers as hosts.

    from testbed.containernet import Containernet
    net = Containernet(controller=Controller)
    d1 = net.addDocker('d1', ip='10.0.0.251', dimage='ces-worker:…', cpu_quota=25000)
    net.addLink(d1, s1, cls=TCLink, bw=10)

`Docker` is a Mininet host that is a Docker container, created with Containernet's arguments
(`dimage`, `dcmd`, `cpu_quota`/`cpu_period`/`cpu_shares`, `cpuset_cpus`, `mem_limit`,
`volumes`, `ports`, `environment`, `network_mode`, ...). As in Containernet its shell is a
`docker exec` shell: `cmd`, `popen` and the CLI run inside the container (its file system,
charged to its CPU and memory limits), so an image needs bash, iproute2 and net-tools (Mininet
configures interfaces with `ifconfig`). Veth pairs reach a container from the host's PID
namespace (a shell inside the container cannot name host PIDs); checksum offload is switched off
on every interface of a link that touches a userspace-datapath bridge, since OVS's userspace
datapath would leave TCP checksums unfilled (ping works, TCP hangs).

`Containernet` adds `addDocker` / `removeDocker` (also at run time: links added later are
attached to running switches), `ping(..., manualdestip=...)`, a userspace datapath where the
kernel has no openvswitch module, Mininet's `Controller` served by `ovs-testcontroller` on
loopback when there is no `controller` binary, and TCLink delay/loss/jitter left out with a
warning where the kernel has no sch_netem. `testbed.Emulation` builds on these classes.

`EdgeSwitch` is an OVSSwitch that keeps the requested OpenFlow port numbers also for ports
attached at run time and runs RSTP in standalone mode (topologies have redundant paths; without
a controller a loop would flood forever).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import docker.errors
from mininet.link import TCLink
from mininet.log import info, output, warn
from mininet.net import Mininet
from mininet.node import Controller, Host, OVSController, OVSSwitch

from edge import tc

log = logging.getLogger(__name__)
_ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
_AVAILABLE_CC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
# Containernet's own label, on containers made without `labels=` (its tools find them by it).
CONTAINERNET_LABEL = "com.containernet"
NETEM_PARAMS = ("delay", "jitter", "loss")
SHELL_BUSY_S = 120  # Containernet's wait for a shell still busy with an earlier sendCmd


def detect_datapath() -> str:
    """'kernel' where the openvswitch module is loaded (ovs-ctl loads it), else 'user'."""
    return "kernel" if Path("/sys/module/openvswitch").exists() else "user"


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
        raise ValueError(
            f"TCP congestion control '{name}' is not in this kernel "
            f"(available: {_AVAILABLE_CC.read_text().strip()})"
        )
    _ALLOWED_CC.write_text(" ".join(allowed + [name]))
    log.info("added %s to the host's net.ipv4.tcp_allowed_congestion_control", name)


def netns_run(pid: int | None, *cmd: str) -> subprocess.CompletedProcess:
    """Run a host tool in the network namespace of `pid` (None: the root namespace)."""
    return subprocess.run(tc.netns_prefix(pid) + list(cmd), capture_output=True, text=True)


class Docker(Host):
    """A Mininet host that is a Docker container, made from Containernet's arguments.

    Extensions: `client` (a docker.DockerClient), `container_name` (default `mn.<name>`, as
    Containernet), `cgroup_parent`, `labels`, `hostname`."""

    def __init__(
        self,
        name: str,
        dimage: str | None = None,
        dcmd: str | None = None,
        client: docker.DockerClient | None = None,
        container_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not dimage:
            raise ValueError(f"{name}: addDocker needs dimage= (the image to run)")
        self.dimage = dimage
        self.dcmd = dcmd or "/bin/bash"
        self.client = client or docker.from_env()
        self.resources = {
            k: kwargs.get(k)
            for k in (
                "cpu_quota",
                "cpu_period",
                "cpu_shares",
                "cpuset_cpus",
                "mem_limit",
                "memswap_limit",
            )
        }
        cap_add = list(kwargs.get("cap_add") or [])
        if "NET_ADMIN" not in (c.upper() for c in cap_add):
            cap_add.append("NET_ADMIN")  # the shell configures the container's interfaces
        ports = kwargs.get("ports") or []
        bindings = dict(kwargs.get("port_bindings") or {})
        cpus = kwargs.get("cpus")
        self.container = self.client.containers.run(
            dimage,
            shlex.split(self.dcmd),
            name=container_name or f"mn.{name}",
            hostname=kwargs.get("hostname", name),
            detach=True,
            tty=True,
            stdin_open=True,
            # The image's entrypoint is run by start(), once the network is up (Containernet).
            entrypoint=[""],
            labels=kwargs.get("labels") or {CONTAINERNET_LABEL: ""},
            environment=kwargs.get("environment") or {},
            volumes=list(kwargs.get("volumes") or []),
            tmpfs=_tmpfs(kwargs.get("tmpfs")),
            network_mode=kwargs.get("network_mode"),
            ports={p: bindings.pop(p, None) for p in ports} | bindings,
            publish_all_ports=kwargs.get("publish_all_ports", False),
            dns=kwargs.get("dns") or None,
            ipc_mode=kwargs.get("ipc_mode"),
            devices=kwargs.get("devices") or None,
            cap_add=cap_add,
            sysctls=kwargs.get("sysctls") or None,
            storage_opt=kwargs.get("storage_opt"),
            shm_size=kwargs.get("shm_size"),
            cgroup_parent=kwargs.get("cgroup_parent"),
            nano_cpus=int(cpus * 1e9) if cpus else None,
            device_requests=kwargs.get("device_requests") or None,
            **{k: v for k, v in self.resources.items() if v is not None},
        )
        self.container.reload()
        self.container_pid: int = self.container.attrs["State"]["Pid"]
        self.cgroup_parent: str | None = kwargs.get("cgroup_parent")
        try:
            super().__init__(name, inNamespace=True, **kwargs)
        except BaseException:
            self.container.remove(force=True)
            raise

    # --- the shell: `docker exec`, like Containernet -------------------------------------------

    def _popen(self, cmd: list[str], **params: Any):  # type: ignore[override]
        if self.shell is None and cmd[:1] == ["mnexec"]:
            # Mininet's shell command (`mnexec OPTS env PS1=… bash …`) run inside the container;
            # a session of its own, so a Ctrl-C at the terminal does not kill it.
            cmd = ["docker", "exec", "-it", self.container.name] + cmd[2:]
            params["start_new_session"] = True
        return super()._popen(cmd, **params)

    def startShell(self, mnopts: str | None = None) -> None:
        super().startShell(mnopts)
        # Mininet moves interfaces into `pid`'s namespace: the container's, not the exec client's.
        self.pid = self.container_pid

    def sendCmd(self, *args: Any, **kwargs: Any) -> None:
        # Containernet lets a command follow a `sendCmd` whose output nobody read (its examples
        # do): the earlier one may finish first, within SHELL_BUSY_S; its output is dropped.
        deadline = time.monotonic() + SHELL_BUSY_S
        while self.waiting and self.shell and time.monotonic() < deadline:
            self.monitor(timeoutms=200)
        if self.waiting:
            raise RuntimeError(
                f"{self.name}: the shell is still running {self.lastCmd!r} after {SHELL_BUSY_S} s"
            )
        kwargs.setdefault("printPid", False)  # mnexec is a host tool, not in the image
        super().sendCmd(*args, **kwargs)

    def popen(self, *args: Any, **kwargs: Any):
        """A process inside the container (`docker exec`), charged to its limits."""
        kwargs.setdefault("mncmd", ["docker", "exec", "-i", self.container.name])
        return super().popen(*args, **kwargs)

    # --- Containernet's extras ----------------------------------------------------------------

    @property
    def ip(self) -> str:
        return self.params["ip"].split("/")[0]

    def exec(self, command: str) -> tuple[int, str]:
        """Run `command` with bash inside the container: (exit code, stdout+stderr)."""
        code, out = self.container.exec_run(["bash", "-c", command])
        return code, out.decode(errors="replace")

    def start(self) -> None:
        """Run the image's ENTRYPOINT + CMD in the background (Containernet's `start`)."""
        config = self.client.images.get(self.dimage).attrs.get("Config") or {}
        argv = (config.get("Entrypoint") or []) + (config.get("Cmd") or [])
        if argv and argv != ["/bin/bash"]:
            info(f"{self.name}: running {argv}\n")
            self.cmd(shlex.join(argv) + " > /proc/1/fd/1 2>&1 &")

    def updateCpuLimit(
        self,
        cpu_quota: int | None = None,
        cpu_period: int | None = None,
        cpu_shares: int | None = None,
        cores: str | None = None,
    ) -> None:
        """Change CPU limits at run time (None: unchanged); `cores` like '0-1'."""
        self._update(
            cpu_quota=cpu_quota, cpu_period=cpu_period, cpu_shares=cpu_shares, cpuset_cpus=cores
        )

    def updateMemoryLimit(
        self, mem_limit: int | str | None = None, memswap_limit: int | str | None = None
    ) -> None:
        """Change memory limits at run time (bytes or '512m'; None: unchanged)."""
        self._update(mem_limit=mem_limit, memswap_limit=memswap_limit)

    def _update(self, **changes: Any) -> None:
        changes = {k: v for k, v in changes.items() if v is not None}
        if changes:
            self.container.update(**changes)
            self.resources.update(changes)

    def terminate(self) -> None:
        super().terminate()
        with contextlib.suppress(docker.errors.NotFound):
            self.container.remove(force=True)


def _tmpfs(spec: Any) -> dict[str, str] | None:
    """Containernet's tmpfs list ("/path:opts") as docker-py's dict."""
    if not spec or isinstance(spec, dict):
        return spec or None
    return dict((s.split(":", 1) + [""])[:2] for s in spec)


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
            opts += (
                " rstp_enable=true other_config:rstp-forward-delay=4 other_config:rstp-max-age=6"
            )
        return opts

    def intfOpts(self, intf) -> str:
        opts = super().intfOpts(intf)
        port_opts: list[str] = []
        if intf.params.get("bw_mbps"):
            # IEEE 802.1D-2004 path cost: 20 Tbit/s / link speed.
            port_opts.append(
                f"other_config:rstp-path-cost={max(1, int(2e7 / intf.params['bw_mbps']))}"
            )
        if intf.params.get("edge"):
            port_opts.append("other_config:rstp-port-admin-edge=true")
        # OVS replaces an interface's root qdisc unless its QoS is "linux-noop"; links are
        # shaped with HTB (edge.tc, Mininet's TCLink), which must survive the port being added.
        qos = f"qos{str(intf).replace('-', '_')}"
        port_opts.append(f"qos=@{qos} -- --id=@{qos} create QoS type=linux-noop")
        return opts + f" -- set Port {intf} " + " ".join(port_opts)

    def attach(self, intf) -> None:
        """Add a port at run time, with its port number (Mininet's attach has none)."""
        self.cmd(f"ovs-vsctl add-port {self} {intf}" + self.intfOpts(intf))
        self.cmd("ip link set", intf, "up")


class Containernet(Mininet):
    """Mininet with Docker containers as hosts: Containernet's `addDocker` / `removeDocker`.

    Extra arguments: `client` (a docker.DockerClient shared by the containers); `stop_at_exit`
    (default True: a script that dies on an exception or `exit()` still removes its containers,
    switches and links; False for an owner that tears down by itself, as `Emulation`)."""

    def __init__(
        self, client: docker.DockerClient | None = None, stop_at_exit: bool = True, **params: Any
    ) -> None:
        # Mininet.init() would otherwise raise host-wide limits (sysctl, ulimit) on first use.
        Mininet.inited = True
        self.client = client or docker.from_env()
        self.datapath = detect_datapath()
        self.started = False
        self.stopped = False
        self._netem_warned = False
        params.setdefault("switch", EdgeSwitch)
        super().__init__(**params)
        if stop_at_exit:
            atexit.register(self._stop_at_exit)

    def addDocker(self, name: str, cls: type = Docker, **params: Any) -> Docker:
        params.setdefault("client", self.client)
        return self.addHost(name, cls=cls, **params)

    def removeDocker(self, name: str | Docker, **params: Any) -> None:
        node = self[name] if isinstance(name, str) else name
        for link in [lk for lk in self.links if node in (lk.intf1.node, lk.intf2.node)]:
            for intf in (link.intf1, link.intf2):
                if isinstance(intf.node, OVSSwitch) and self.started:
                    intf.node.detach(intf)
            self.delLink(link)
        self.delHost(node)

    def addSwitch(self, name: str, cls: type | None = None, **params: Any):
        if issubclass(cls or self.switch, OVSSwitch):
            params.setdefault("datapath", self.datapath)
        return super().addSwitch(name, cls=cls, **params)

    def addController(self, name: str = "c0", controller: type | None = None, **params: Any):
        cls = controller or self.controller
        if cls is Controller and not shutil.which("controller") and OVSController.isAvailable():
            cls = OVSController  # Debian ships Mininet's reference controller as ovs-testcontroller
        if isinstance(cls, type) and issubclass(cls, Controller):
            # Listen on loopback only: an OpenFlow controller accepts any caller.
            params.setdefault("cargs", "ptcp:%d:127.0.0.1")
        return super().addController(name, controller=cls, **params)

    def addLink(self, node1, node2, port1=None, port2=None, cls=None, **params: Any):
        node1 = self[node1] if isinstance(node1, str) else node1
        node2 = self[node2] if isinstance(node2, str) else node2
        if isinstance(node1, Docker):
            # Mininet makes the veth pair in node1's namespace with `ip link add … netns PID`,
            # which a shell in the container's PID namespace cannot run: make it in the root
            # namespace and move the ends (Containernet's way).
            params.setdefault("fast", False)
        link_cls = cls or self.link
        if isinstance(link_cls, type) and issubclass(link_cls, TCLink):
            self._drop_netem_params(node1, node2, params)
        link = super().addLink(node1, node2, port1, port2, cls, **params)
        if any(isinstance(n, OVSSwitch) and n.datapath == "user" for n in (node1, node2)):
            for intf in (link.intf1, link.intf2):
                pid = None if isinstance(intf.node, OVSSwitch) else intf.node.pid
                netns_run(pid, "ethtool", "-K", intf.name, "tx", "off")
        if self.started:
            for intf in (link.intf1, link.intf2):
                if isinstance(intf.node, OVSSwitch):
                    intf.node.attach(intf)
        return link

    def _drop_netem_params(self, node1, node2, params: dict) -> None:
        asked = [p for p in NETEM_PARAMS if params.get(p)]
        if asked and not tc.probe_netem():
            for p in asked:
                params.pop(p)
            if not self._netem_warned:
                warn(
                    f"*** this kernel has no sch_netem: {', '.join(asked)} of TCLinks are NOT "
                    f"emulated (first: {node1}-{node2}); bandwidth shaping works\n"
                )
                self._netem_warned = True

    def ping(self, hosts=None, timeout=None, manualdestip: str | None = None):
        """Mininet's ping; with `manualdestip`, every host in `hosts` pings that address."""
        if manualdestip is None:
            return super().ping(hosts, timeout)
        sent = received = 0
        for node in hosts or self.hosts:
            opts = f"-W {timeout}" if timeout else ""
            s, r = self._parsePing(node.cmd(f"ping -c1 {opts} {manualdestip}"))
            sent, received = sent + s, received + r
            output(f"{node.name} -> {manualdestip if r else 'X'}\n")
        ploss = 100.0 * (sent - received) / sent if sent else 0.0
        output(f"*** Results: {ploss:.0f}% dropped ({received}/{sent} received)\n")
        return ploss

    def start(self) -> None:
        super().start()
        self.started = True

    def stop(self) -> None:
        self.started = False
        self.stopped = True
        super().stop()

    def _stop_at_exit(self) -> None:
        if not self.stopped:
            warn("*** the script ended without net.stop(): stopping the network\n")
            self.stop()
