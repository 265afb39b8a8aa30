"""The live system of an end-to-end run, brought up once and torn down in reverse on exit,
exception, Ctrl-C or SIGTERM: the SDN app, the network (emulated here; real hosts in
`lab_stack`), the Master, one edge agent per node, and the scenario's background traffic."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from docker.errors import DockerException
from rich.console import Console

from edge import cgroups, tc
from experiments.machine import busy_summary
from master.client import MasterClient
from protocol.dilation import NONE, Dilation
from protocol.http import free_port
from protocol.tls import load_tls
from sdn_app.client import FlowRequest, SdnClient, SdnError
from testbed import Emulation, ovs_sockets
from testbed.cleanup import PREFIX_ENV
from testbed.hostcost import busy_seconds, main_thread_wait_s, process_cpu_s
from testbed.image import worker_image_tag
from testbed.names import Lifecycle
from topologies import Topology, topology_document

from .fidelity import HOST_SATURATED
from .scenario import REPO, BackgroundFlow, traffic_quota, undelayed

log = logging.getLogger("run")
T = TypeVar("T")


# --- the testbed stack -------------------------------------------------------------------------
class RunError(RuntimeError):
    """The testbed broke (a component did not start, the network does not connect)."""


class StackBase(Lifecycle):
    """What a run brings up on any network — the SDN app and the Master as processes of this
    machine, the scenario's background traffic — and tears down in reverse on exit, exception,
    Ctrl-C or SIGTERM. `Stack` adds the emulated network and local agents; `lab_stack.LabStack`
    real hosts' agents over SSH."""

    def __init__(
        self,
        topo: Topology,
        prefix: str,
        out: Path,
        console: Console,
        dilation: Dilation = NONE,
    ):
        self.topo, self.prefix, self.out, self.console = topo, prefix, out, console
        self.dilation = dilation  # the emulation's (protocol.dilation); none on real hosts
        self.logs = out / "logs"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.commands: dict[str, list[str]] = {}  # process -> its arguments (`restart`)
        self.sdn: SdnClient | None = None
        self.master: MasterClient | None = None
        self.timings: dict[str, float] = {}
        self._traffic: dict[int, list] = {}  # background flow -> its traffic ends
        self._saved_handlers: dict[int, object] = {}

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.commands[name] = args
        self.procs.append((name, self._popen(name, "w")))
        return self.procs[-1][1]

    def _popen(self, name: str, mode: str) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        logf = (self.logs / f"{name}.log").open(mode)
        # A session of its own: Ctrl-C reaches only us, and we stop children in order. The run's
        # prefix in its environment: a cleanup after our own kill -9 finds it by that.
        return subprocess.Popen(
            [sys.executable, *self.commands[name]],
            cwd=REPO,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", PREFIX_ENV: self.prefix},
        )

    def process(self, name: str) -> subprocess.Popen:
        return next(p for n, p in self.procs if n == name)

    def restart(self, name: str) -> None:
        """kill -9 process `name` ("master", "sdn_app", "agent-NODE") and start it again with
        the same arguments (its log goes on): a fault to inject."""
        i = next(i for i, (n, _) in enumerate(self.procs) if n == name)
        old = self.procs[i][1]
        old.kill()
        old.wait()
        self.procs[i] = (name, self._popen(name, "a"))

    def _check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                raise RunError(
                    f"{name} exited with code {p.returncode} (see {self.logs / (name + '.log')})"
                )

    def __enter__(self) -> StackBase:
        if threading.current_thread() is threading.main_thread():
            self._saved_handlers = {signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupt)}
        return super().__enter__()

    def stop(self) -> None:
        """Down in reverse, with Ctrl-C and SIGTERM ignored meanwhile: a second one must not
        leave half of it."""
        t0 = time.monotonic()
        held = (
            {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
            if threading.current_thread() is threading.main_thread()
            else {}
        )
        try:
            self._down()
        finally:
            for s, handler in {**held, **self._saved_handlers}.items():
                signal.signal(s, handler)
            self._saved_handlers = {}
            self.timings["down_s"] = time.monotonic() - t0

    def _down(self) -> None:
        raise NotImplementedError

    def _topology_file(self) -> str:
        """The SDN app and the Master load exactly the topology of the run (scaled ones too)."""
        self.out.mkdir(parents=True, exist_ok=True)
        topo_file = self.out / "topology.yaml"
        topo_file.write_text(yaml.safe_dump(topology_document(self.topo), sort_keys=False))
        return str(topo_file)

    def _start_sdn(self, topo_arg: str, of_host: str, of_port: int, tls_dir: str = "") -> None:
        """The SDN app, its OpenFlow port on `of_host`:`of_port`, its REST API on loopback (only
        the Master and we call it); until every switch of the topology is connected. With
        `tls_dir` (the control machine's identity) the switches connect over TLS and the REST
        API is https."""
        rest_port = free_port()
        self._spawn(
            "sdn_app",
            [
                "-m",
                "sdn_app",
                "--topo",
                topo_arg,
                "--of-port",
                str(of_port),
                "--of-host",
                of_host,
                "--rest",
                f"127.0.0.1:{rest_port}",
                *(["--tls", tls_dir] if tls_dir else []),
                *self._dilation_args(),
            ],
        )
        tls = load_tls(tls_dir) if tls_dir else None
        self.sdn = SdnClient(f"{'https' if tls else 'http'}://127.0.0.1:{rest_port}", tls=tls)

    def _dilation_args(self) -> list[str]:
        """The run's time dilation for a process of the stack (every one runs on its clock)."""
        return ["--dilation", self.dilation.spec()] if self.dilation.on else []

    def _wait_switches(self, timeout_s: float) -> None:
        try:
            self.sdn.wait_ready(timeout_s=timeout_s)
        except SdnError as e:
            self._check_alive()
            raise RunError(f"the SDN app did not get every switch: {e.message}") from None

    def _start_master(
        self,
        topo_arg: str,
        image: str,
        host: str,
        port: int,
        token_file: str = "",
        token: str | None = None,
        tls_dir: str = "",
        insecure: bool = False,
    ) -> None:
        """The Master on `host`:`port`; with `tls_dir` (the control machine's identity) over
        mutual TLS, else in plain HTTP (beyond loopback only if `insecure`)."""
        self._spawn(
            "master",
            [
                "-m",
                "master",
                "serve",
                "--topo",
                topo_arg,
                "--host",
                host,
                "--port",
                str(port),
                "--sdn",
                self.sdn.url,
                "--sdn-job-id",
                f"{self.prefix}-jobs",
                "--image",
                image,
                *self._dilation_args(),
                # a Master restarted in this run (not the next) takes its jobs over
                "--state",
                str(self.logs / f"master-{self.prefix}.sqlite"),
                *(["--token-file", token_file] if token_file else []),
                *(["--tls", tls_dir] if tls_dir else ["--insecure"] if insecure else []),
            ],
        )
        tls = load_tls(tls_dir) if tls_dir else None
        self.master = MasterClient(
            f"{'https' if tls else 'http'}://{host}:{port}", token=token, tls=tls
        )

    def _wait_agents(self, timeout_s: float) -> None:
        try:
            self.master.wait_ready(len(self.topo.nodes), timeout_s=timeout_s)
        except TimeoutError as e:
            self._check_alive()
            raise RunError(str(e)) from None

    def _stop_processes(self) -> None:
        for _, p in reversed(self.procs):  # agents, then the Master, then the SDN app
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop: killing it", name)
                p.kill()
                p.wait()
        self.procs.clear()

    # --- what the run costs the host -------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        """Cumulative counters a run's fidelity is judged on, taken at its start and its end
        (`usage`): host CPU seconds by part — the control plane (this process and the stack's),
        the switches (ovs-vswitchd), the emulated nodes (their cgroups: workers and tenants),
        the whole host —, how long ovs-vswitchd's forwarding thread waited for a core, and the
        switches' packets received and dropped on receive."""
        control = sum(process_cpu_s(p.pid) for _, p in self.procs) + sum(os.times()[:2])
        cpu = {"control": control, "host": busy_seconds(), **self._node_cpu_s()}
        waited = None
        with contextlib.suppress(ovs_sockets.SocketBufferError):
            pid = ovs_sockets.vswitchd_pid()
            cpu["switch"], waited = process_cpu_s(pid), main_thread_wait_s(pid)
        rx = {"rx_packets": 0, "rx_dropped": 0}
        ours = {s.name for s in self.topo.switches}
        try:
            for s in self.sdn.switches()["switches"]:
                for port, c in (s.get("ports") or {}).items() if s["name"] in ours else ():
                    if int(port) < LOCAL_PORTS:  # not the bridge's own port
                        for k in rx:
                            rx[k] += c.get(k, 0)
        except SdnError as e:
            log.warning("switch counters: %s", e.message)
        return {
            "t": time.monotonic(),
            "cpu_s": cpu,
            "switch": rx,
            "switch_wait_s": waited,
        }

    def _node_cpu_s(self) -> dict[str, float]:
        return {}

    # --- background traffic --------------------------------------------------------------------
    def prepare_background(self, flows: list[BackgroundFlow]) -> None:
        """Cordon the endpoints of every background flow that asks for it (another tenant's
        machines) and pin the paths given (the tenant's own route; its meter only guards
        against a runaway sender)."""
        for i, b in enumerate(flows):
            if b.cordon:
                for node in (b.src, b.dst):
                    self.master.set_schedulable(node, False)
            if b.path:
                self.pin_traffic(i, b, list(b.path))

    def pin_traffic(self, i: int, b: BackgroundFlow, path: list[str]) -> None:
        """Background flow `i` along the switches `path` until `unpin_traffic`."""
        self.sdn.put_job_flows(
            f"{self.prefix}-bg{i}", [FlowRequest(b.src, b.dst, path, round(b.mbps * 1.2, 3))]
        )

    def unpin_traffic(self, i: int) -> None:
        self.sdn.delete_job_flows(f"{self.prefix}-bg{i}")

    def start_traffic(self, i: int, b: BackgroundFlow, wait: bool = True) -> None:
        """Start background flow `i`: a paced iperf3 TCP transfer, server and client as
        containers in the nodes' namespaces, until `stop_traffic`. With `wait`, return once the
        switches see it flowing."""
        dst = self.topo.node(b.dst)
        port = 5201 + i
        self._traffic[i] = [
            self._start_end(
                b.dst, f"bg{i}-server", ["iperf3", "-s", "-p", str(port)], *traffic_quota(dst)
            )
        ]
        poll(
            lambda: self._listens(b.dst, port),
            15,
            f"background: the iperf3 server on {b.dst} does not listen",
        )
        self._traffic[i].append(
            self._start_end(
                b.src,
                f"bg{i}-client",
                # paced at the host's share of its rate: a tenant is dilated like everything else
                [
                    "iperf3",
                    "-c",
                    dst.ip,
                    "-p",
                    str(port),
                    "-t",
                    "86400",
                    "-b",
                    f"{self.dilation.host_mbps(b.mbps):g}M",
                ],
                *traffic_quota(self.topo.node(b.src)),
            )
        )
        if wait:
            first_hop = b.path[0] if b.path else self.topo.access_link(b.src).other(b.src)
            poll(
                lambda: any(
                    lk.src == b.src and lk.dst == first_hop and (lk.mbps or 0) >= 0.5 * b.mbps
                    for lk in self.sdn.links()
                ),
                20,
                f"background {b.label()}: no traffic seen on {b.src}->{first_hop}",
            )

    def stop_traffic(self, i: int) -> None:
        self._stop_ends(self._traffic.pop(i, []))

    def _start_end(self, node: str, name: str, argv: list[str], cpu: float, mem_mb: int):
        """A traffic end `name` running `argv` in `node`'s network namespace; its handle."""
        raise NotImplementedError

    def _listens(self, node: str, port: int) -> bool:
        raise NotImplementedError

    def _stop_ends(self, ends: list) -> None:
        raise NotImplementedError


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM behaves like Ctrl-C (an exception), so the `with` block tears down."""
    raise KeyboardInterrupt(f"signal {signum}")


class Stack(StackBase):
    """SDN app + emulated network + Master + one agent per node + background traffic, brought up
    in that order and torn down in reverse on exit, exception, Ctrl-C or SIGTERM."""

    def __init__(
        self,
        topo: Topology,
        prefix: str,
        out: Path,
        console: Console,
        dilation: Dilation = NONE,
    ):
        if any(lk.delay_ms > 0 for lk in topo.links) and not tc.probe_netem():
            # The Master and the SDN app decide on the network as it runs: a scheduler given
            # delays the links do not have chooses paths for them (on sndlib/atlanta, 9-93 ms,
            # CES-PPO shared a link for a shorter delay that was not there: docs/e2e.md).
            console.print(
                "[yellow]warning:[/] this kernel has no sch_netem: the links are "
                "emulated without their delays, and the Master and the SDN app are "
                "given the topology without them"
            )
            topo = undelayed(topo)
        super().__init__(topo, prefix, out, console, dilation)
        self.net: Emulation | None = None

    def start(self) -> None:
        t0 = time.monotonic()
        image = worker_image_tag()
        topo_arg = self._topology_file()
        of_port = free_port()
        self.console.print(f"[bold]bring-up[/] {self.topo.name} (prefix {self.prefix})")
        self._start_sdn(topo_arg, "127.0.0.1", of_port)
        self.net = Emulation(
            self.topo,
            prefix=self.prefix,
            controller=("127.0.0.1", of_port),
            image=image,
            dilation=self.dilation,
        )
        self.net.__enter__()
        self._wait_switches(60)
        loss = self.net.ping_all(timeout_s=1.0)
        if loss > 0:
            raise RunError(f"{loss:.0%} of pings lost with no job scheduled")
        self._start_master(topo_arg, image, "127.0.0.1", free_port())
        for n in self.topo.nodes:
            self._spawn(
                f"agent-{n.name}",
                [
                    "-m",
                    "edge",
                    "--node",
                    n.name,
                    "--master",
                    self.master.url,
                    "--node-container",
                    self.net.node_container_name(n.name),
                    "--workdir",
                    str(self.out / "agents" / n.name),
                    *self._dilation_args(),
                ],
            )
        self._wait_agents(60)
        self.timings["up_s"] = time.monotonic() - t0
        self.console.print(
            f"  up in {self.timings['up_s']:.1f} s: {len(self.topo.switches)} "
            f"switches on the SDN app, {len(self.topo.nodes)} agents on the Master"
        )

    def _node_cpu_s(self) -> dict[str, float]:
        """CPU seconds of the emulated nodes' cgroups (their workers and tenants)."""
        ns = [cgroups.usage_ns(n.cgroup_parent) for n in self.net.nodes.values()]
        return {"nodes": sum(x or 0 for x in ns) / 1e9}

    def _start_end(self, node: str, name: str, argv: list[str], cpu: float, mem_mb: int):
        return self.net.start_worker(node, name, argv, cpu, mem_mb)

    def _listens(self, node: str, port: int) -> bool:
        return self.net.exec(node, f"ss -ltn | grep -q ':{port} '")[0] == 0

    def _stop_ends(self, ends: list) -> None:
        for container in ends:
            try:
                container.remove(force=True)
            except DockerException as e:  # gone already: nothing to stop
                log.debug("background: %s", e)

    def _down(self) -> None:
        self._stop_processes()
        if self.net is not None:
            self.net.__exit__(None, None, None)
            self.net = None


LOCAL_PORTS = 0xFFFFFF00  # OpenFlow's reserved port numbers start here (OFPP_MAX)


def usage(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What the host gave a run between two `StackBase.counters`: mean host cores by part (and
    `other`: what the host used beyond them — the Docker engine, the kernel's softirqs, any
    other tenant of the machine), the share of the run ovs-vswitchd's forwarding thread waited for
    a core (`switch_wait_share`; None on a real switch) and the switches' receive counters."""
    wall = max(after["t"] - before["t"], 1e-6)
    cores = {
        k: round((after["cpu_s"][k] - before["cpu_s"].get(k, 0.0)) / wall, 3)
        for k in after["cpu_s"]
    }
    parts = sum(v for k, v in cores.items() if k != "host")
    cores["other"] = round(max(cores["host"] - parts, 0.0), 3)
    drops = {k: after["switch"][k] - before["switch"][k] for k in after["switch"]}
    waits = before.get("switch_wait_s"), after.get("switch_wait_s")
    wait = None if None in waits else round((waits[1] - waits[0]) / wall, 4)
    out: dict[str, Any] = {"cpu_cores": cores, "switch_wait_share": wait, "switch_drops": drops}
    if "busy" in after:  # a host of a cluster, sampled every second (lab.fabric.HostSampler)
        out["host_busy"] = busy_summary(after["busy"][len(before["busy"]) :], HOST_SATURATED)
    hosts = {
        h: usage(before["hosts"][h], a)
        for h, a in after.get("hosts", {}).items()
        if before.get("hosts", {}).get(h, {}).get("cpu_s") and a.get("cpu_s")
    }
    return {**out, "hosts": hosts} if "hosts" in after else out


def poll(ok: Callable[[], T], timeout_s: float, error: str) -> T:
    """The first true value of `ok()`, polled every 0.3 s; RunError(`error`) after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (value := ok()):
        if time.monotonic() > deadline:
            raise RunError(error)
        time.sleep(0.3)
    return value
