"""The edge agent: one per compute node. Messenger + Compute Manager + Network Manager.

    python -m edge --node lab1 --master http://127.0.0.1:7070 \\
        [--node-container ces1a2b-lab1] [--iface eth0] [--listen 127.0.0.1:0] [--heartbeat 2]

The Messenger (`edge.messenger`) registers with the Master, sends a heartbeat every `--heartbeat`
seconds (CPU, memory and network usage, the state of every worker, new metric lines) and at once
when a worker ends, and serves the Master's commands over HTTP (`protocol.messages`). The agent
talks only to its local Docker engine, its local `tc` and the Master, so the same program runs on a real
host (workers on the host's network, `--iface` the data interface, `--line-mbps` its rate) and
beside an emulated node (`--node-container`: workers join that container's network namespace and
cgroup parent; tc runs in its namespace).

Beyond loopback the agent requires the deployment's shared secret (`--token-file`, default
$CES_TOKEN_FILE) of every command and sends it to the Master: it runs only what a Master that
knows the secret sends it. It serves and calls over TLS with its host's identity (`--tls DIR`,
default $CES_TLS_DIR: cert.pem, key.pem, ca.pem of `python -m lab certs`): only the holder of the
control machine's certificate may command it, and it talks only to a Master whose certificate
the lab's CA signed for the address it calls. Plain HTTP beyond loopback needs `--insecure`.

SIGTERM/SIGINT: the agent leaves — it stops its workers, removes its tc classes and exits; the
Master notices the silence and reschedules. A killed agent (SIGKILL) leaves its workers running;
when it comes back, the Master's answer to its registration says which of them to keep. An
emulated node whose container stopped is gone (its network went with it): the agent stops its
workers and exits with code 1, and the Master notices the silence.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from protocol.dilation import Dilation
from protocol.http import JsonApp, Server, TokenError, default_token_file, listen_tls, listen_token
from protocol.messages import Registration
from protocol.tls import TlsError, control_only, default_tls_dir

from . import cgroups, tc
from .compute import ComputeManager
from .messenger import Messenger
from .network import NetworkManager, ShapingError, UsageMeter

log = logging.getLogger("edge.agent")


@dataclass
class AgentConfig:
    node: str
    master: str
    listen: str = "127.0.0.1:0"
    advertise: str = ""  # the URL the Master uses to reach us (default: the listen address)
    node_container: str = ""  # emulation: the node's container
    iface: str = "eth0"
    ip: str = ""  # data address (default: the interface's IPv4)
    line_mbps: float = 0.0  # shape the interface at this rate if it has no HTB root yet
    cgroup_parent: str = ""  # default: the node container's, none on a host
    name_prefix: str = ""  # worker container names (default: "<node container>-" / "ces-<node>-")
    workdir: str = ""
    heartbeat_s: float = 2.0
    token_file: str = ""
    tls: str = ""  # the host's TLS identity folder (protocol.tls)
    insecure: bool = False  # plain HTTP beyond loopback
    cpu: float = 0.0  # capacity reported (default: the cgroup parent's limits / the host)
    mem_mb: float = 0.0
    dilation: str = ""  # emulation: the run's time dilation, "K@ORIGIN" (protocol.dilation)


def _node_pid(client: docker.DockerClient, name: str) -> tuple[int, str]:
    """(PID of the node container's init, its cgroup parent)."""
    c = client.containers.get(name)
    pid = c.attrs["State"]["Pid"]
    if not pid:
        raise RuntimeError(f"node container {name} is not running")
    return pid, c.attrs["HostConfig"].get("CgroupParent") or ""


def _start_time(pid: int) -> str | None:
    """When process `pid` started (None once it is gone): with its pid, it names one process
    even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _node_gone(node_container: str, pid: int | None) -> Callable[[], str]:
    """Why the node is gone ('' while it is there): the emulated node's container stopped."""
    if pid is None:  # a host: the agent goes down with it
        return lambda: ""
    started = _start_time(pid)
    return lambda: "" if _start_time(pid) == started else f"node container {node_container} stopped"


def _iface_ip(iface: str, pid: int | None) -> str:
    cmd = tc.netns_prefix(pid) + ["ip", "-4", "-o", "addr", "show", "dev", iface]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout.split()
    if "inet" not in out:
        raise RuntimeError(f"{iface} has no IPv4 address (give --ip)")
    return out[out.index("inet") + 1].split("/")[0]


def _capacity(cfg: AgentConfig, parent: str, dilation: Dilation) -> tuple[float, float]:
    """(emulated cores, MiB) the node offers: as configured, else its cgroup parent's limits (the
    host's share of the emulated node under dilation), else the host's."""
    if cfg.cpu and cfg.mem_mb:
        return cfg.cpu, cfg.mem_mb
    mem: float  # MiB: the cgroup's limit in whole MiB, or the host's memory
    if parent:
        cpu, mem = cgroups.limits(parent)
        cpu = dilation.emulated_cores(cpu)
    else:
        cpu = float(os.cpu_count() or 1)
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    return cfg.cpu or cpu, cfg.mem_mb or mem


def serve(cfg: AgentConfig) -> int:
    host, _, port = cfg.listen.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    token = listen_token(host, cfg.token_file)  # before anything is made
    tls = listen_tls(host, cfg.tls, cfg.insecure, f"agent {cfg.node}")
    if cfg.master.startswith("https:") and tls is None:
        raise TlsError(f"--master {cfg.master}: an https URL needs --tls DIR")
    client = docker.from_env(max_pool_size=64)  # one streaming log connection per worker
    pid, parent = _node_pid(client, cfg.node_container) if cfg.node_container else (None, "")
    parent = cfg.cgroup_parent or parent
    prefix = cfg.name_prefix or (
        f"{cfg.node_container}-" if cfg.node_container else f"ces-{cfg.node}-"
    )
    workdir = Path(cfg.workdir or f"/tmp/ces-agent-{cfg.node}")
    workdir.mkdir(parents=True, exist_ok=True)
    dilation = Dilation.parse(cfg.dilation)
    network = NetworkManager(cfg.iface, pid, cfg.line_mbps or None, dilation)
    cpu, mem = _capacity(cfg, parent, dilation)
    app = JsonApp(token=token, peers=control_only)
    server = Server(app, host, int(port or 0), tls)
    reg = Registration(
        cfg.node,
        cfg.advertise or server.url,
        cfg.ip or _iface_ip(cfg.iface, pid),
        cfg.iface,
        cpu,
        mem,
    )
    compute = ComputeManager(
        client,
        cfg.node,
        prefix,
        workdir,
        cfg.node_container or None,
        parent or None,
        dilation=dilation,
    )
    gone = _node_gone(cfg.node_container, pid)
    messenger = Messenger(
        reg,
        cfg.master,
        compute,
        network,
        UsageMeter(network, parent),
        cfg.heartbeat_s,
        token,
        gone,
        clock=dilation,
        tls=tls,
    )
    messenger.routes(app)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: messenger.leave())
    server.start()
    log.info(
        "agent %s listening on %s (ip %s, iface %s, netns pid %s)",
        cfg.node,
        server.url,
        reg.ip,
        cfg.iface,
        pid,
    )
    try:
        messenger.run()
    finally:
        server.stop()
        compute.stop_all()
        if not gone():  # a gone node's tc classes went with its network namespace
            try:
                network.clear()
            except ShapingError as e:
                log.warning("could not remove every tc class: %s", e)
        log.info("agent %s left", cfg.node)
    return 1 if gone() else 0


def parse_args(argv: list[str] | None = None) -> AgentConfig:
    p = argparse.ArgumentParser(prog="python -m edge", description=__doc__.split("\n")[0])
    p.add_argument("--node", required=True, help="the topology's name of this compute node")
    p.add_argument("--master", required=True, help="the Master's URL, e.g. http://10.0.0.254:7070")
    p.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT of the command channel")
    p.add_argument("--advertise", default="", help="URL the Master should use to reach us")
    p.add_argument("--node-container", default="", help="emulation: the node's container")
    p.add_argument("--iface", default="eth0", help="the data interface")
    p.add_argument("--ip", default="", help="the data address (default: the interface's)")
    p.add_argument(
        "--line-mbps",
        type=float,
        default=0.0,
        help="shape the interface at this rate when it has no HTB root (real hosts)",
    )
    p.add_argument("--cgroup-parent", default="")
    p.add_argument("--name-prefix", default="", help="prefix of worker container names")
    p.add_argument("--workdir", default="", help="where the workers' metric lines are kept")
    p.add_argument(
        "--heartbeat",
        dest="heartbeat_s",
        type=float,
        default=2.0,
        help="seconds between heartbeats (emulated seconds under --dilation)",
    )
    p.add_argument(
        "--dilation",
        default="",
        help="emulation: the run's time dilation K@ORIGIN (rates and CPU quotas ÷ K, its clock "
        "K times slower; docs/testbed.md)",
    )
    p.add_argument(
        "--token-file",
        default=default_token_file(),
        help="the deployment's shared secret (default $CES_TOKEN_FILE)",
    )
    p.add_argument(
        "--tls",
        default=default_tls_dir(),
        help="TLS identity folder: cert.pem, key.pem, ca.pem (default $CES_TLS_DIR)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve plain HTTP beyond loopback (the token and jobs cross the network in clear)",
    )
    p.add_argument("--cpu", type=float, default=0.0)
    p.add_argument("--mem-mb", type=float, default=0.0)
    a = p.parse_args(argv)
    if a.heartbeat_s <= 0:
        p.error("--heartbeat: expected a positive number of seconds")
    try:
        Dilation.parse(a.dilation)
    except ValueError as e:
        p.error(f"--dilation: {e}")
    return AgentConfig(**dict(vars(a).items()))


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{cfg.node}] %(message)s")
    try:
        return serve(cfg)
    except (docker.errors.DockerException, RuntimeError, OSError, TokenError, TlsError) as e:
        print(f"agent {cfg.node}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
