"""The live system of a run spread over several hosts (`experiments/run.py --cluster FILE`): the
SDN app for every host's bridges and the Master on this machine's management address (the cluster
file's `master`), the topology built over the hosts (`lab.fabric.ClusterEmulation`), one edge agent
per compute node deployed on its node's host (`lab.deploy.run_agent`, beside the node's container
as in the emulation), the scenario's background traffic in the nodes' namespaces, and on every
host a sampler of what it spends (`lab.fabric.HostSampler`: the fidelity verdict of each host).

Brought up in that order and torn down in reverse — on exit, an exception, Ctrl-C or SIGTERM —
every host cleaned of the run's prefix (`lab.fabric.cleanup_host`); after a kill -9 of run.py,
`run.py --cleanup --cluster FILE --prefix P` does the same.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import docker
from rich.console import Console

from edge import cgroups
from lab import deploy
from lab import placement as placing
from lab.cluster import TUNNEL_OVERHEAD, ClusterInventory, Layout
from lab.fabric import ClusterEmulation, FabricError, HostFacts, HostSampler, cleanup_host, each
from lab.ssh import HostError, Remote
from protocol.dilation import NONE, Dilation
from protocol.tls import agent_identity
from sdn_app.client import SdnError
from testbed import cleanup, hostcost
from testbed.hostcost import busy_seconds, process_cpu_s
from testbed.image import worker_image_tag
from topologies import Topology

from .budget import K_MAX, chosen_dilation, cluster_budget
from .lab_stack import HostsStack
from .scenario import Plan, traffic_quota, undelayed
from .stack import LOCAL_PORTS, RunError

log = logging.getLogger("run")


class ClusterStack(HostsStack):
    """SDN app, the topology over the cluster's hosts, Master, agents, samplers, background
    traffic: brought up in that order and torn down in reverse."""

    def __init__(
        self,
        topo: Topology,
        prefix: str,
        out: Path,
        console: Console,
        layout: Layout,
        facts: dict[str, HostFacts],
        token_file: str,
        token: str,
        image: str,
        dilation: Dilation = NONE,
        pki: Path | None = None,
        accept_new_host_keys: bool = False,
    ):
        lacking = sorted(h for h, f in facts.items() if not f.netem)
        if lacking and any(lk.delay_ms > 0 for lk in topo.links):
            # as Stack: the Master and the SDN app decide on the network as it runs
            console.print(
                f"[yellow]warning:[/] {', '.join(lacking)} ha{'s' if len(lacking) == 1 else 've'} "
                "no sch_netem: the links are emulated without their delays, and the Master and "
                "the SDN app are given the topology without them"
            )
            topo = undelayed(topo)
        super().__init__(topo, prefix, out, console, dilation)
        self.layout, self.facts, self.pki = layout, facts, pki
        self.inv = layout.inv
        self.token_file, self.token, self.image = token_file, token, image
        self.accept_new = accept_new_host_keys
        self.net: ClusterEmulation | None = None
        self.agents = False  # some agent was started: the teardown stops them
        self.samplers: dict[str, HostSampler] = {}
        self._remotes: dict[str, Remote] = {}  # host -> the connection of traffic and samplers

    def start(self) -> None:
        t0 = time.monotonic()
        hosts = self.layout.used_hosts()
        self.console.print(
            f"[bold]bring-up[/] {self.topo.name} on {len(hosts)} hosts of {self.inv.path} "
            f"({self.layout.rule} placement, {self.inv.tunnel}; prefix {self.prefix})"
        )
        topo_arg, control = self._start_sdn_here()
        self.net = ClusterEmulation(
            self.topo,
            servers=self.inv,
            placement=self.layout.rule,
            prefix=self.prefix,
            controller=(self.inv.master, self.inv.openflow_port),
            image=self.image,
            dilation=self.dilation,
            pki=self.pki,
            accept_new_host_keys=self.accept_new,
            facts=self.facts,
            client=docker.from_env(),
        )
        try:
            self.net.__enter__()
        except (FabricError, HostError) as e:
            raise RunError(f"building the cluster: {e}") from None
        self._write_scripts()
        self.timings["fabric_s"] = self.net.timings["up_s"]
        self._wait_switches(60)
        lost = self.net.ping_check()
        if lost:
            raise RunError(
                f"{len(lost)} of {len(self.net.ping_pairs())} node pairs do not ping with no job "
                f"scheduled, e.g. {lost[0][0]} -> {lost[0][1]}"
            )
        self.timings["network_s"] = time.monotonic() - t0
        self._start_master_here(topo_arg, control)
        t1 = time.monotonic()
        self.agents = True
        _, errors = each(hosts, self.inv.known_hosts, self.accept_new, self._start_agents)
        if errors:
            raise RunError("agents: " + "; ".join(map(str, errors)))
        self.timings["deploy_s"] = time.monotonic() - t1
        self._wait_agents(60)
        for h in hosts:
            self.samplers[h.name] = HostSampler(
                self._remote_host(h.name), self.prefix, self.facts[h.name].cores
            ).start()
        try:  # a run's first counters need a sample of every host (else it is judged without)
            for sampler in self.samplers.values():
                sampler.wait_first()
        except HostError as e:
            raise RunError(f"sampling the hosts: {e}") from None
        self.timings["up_s"] = time.monotonic() - t0
        self.console.print(
            f"  up in {self.timings['up_s']:.1f} s: the network on {len(hosts)} hosts in "
            f"{self.timings['network_s']:.1f} s (inner MTU {self.net.mtu}), "
            f"{len(self.topo.nodes)} agents in {self.timings['deploy_s']:.1f} s"
        )

    def _write_scripts(self) -> None:
        """What ran on each host, for the logs (the scripts carry no secret)."""
        folder = self.logs / "hosts"
        folder.mkdir(parents=True, exist_ok=True)
        assert self.net is not None
        for key, script in self.net.scripts.items():
            (folder / f"{key.replace('/', '-')}.sh").write_text(script)

    def _start_agents(self, remote: Remote) -> list[str]:
        assert self.net is not None and self.master is not None
        host = remote.host.node
        started = []
        for node in self.layout.nodes_on(host):
            n = self.topo.node(node)
            argv = [
                "python3",
                "-m",
                "edge",
                "--node",
                node,
                "--master",
                self.master.url,
                "--listen",
                f"{remote.host.address}:{self.layout.agent_port(node)}",
                "--node-container",
                self.net.node_container_name(node),
                "--cpu",
                f"{n.cpu:g}",
                "--mem-mb",
                str(n.mem_mb),
                "--token-file",
                deploy.TOKEN_PATH,
                *(["--tls", deploy.TLS_PATH] if self.pki else ["--insecure"]),
                "--workdir",
                "/var/lib/ces-agent",
                *self._dilation_args(),
            ]
            started.append(
                deploy.run_agent(
                    remote,
                    self.facts[host].deploy_facts(),
                    deploy.agent_name(self.prefix, node),
                    self.prefix,
                    self.image,
                    argv,
                    self.token,
                    self.pki / agent_identity(node) if self.pki else None,
                )
            )
        return started

    def _remote_host(self, host: str) -> Remote:
        if host not in self._remotes:
            self._remotes[host] = Remote(
                self.inv.host(host),  # type: ignore[arg-type]
                self.inv.known_hosts,
                self.accept_new,
            ).connect()
        return self._remotes[host]

    def _remote(self, node: str) -> Remote:
        return self._remote_host(self.layout.placement[node])

    # --- what the run costs each host ------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        """This machine's control plane and busy time, and per host its sampler's counters with
        its switches' receive counters (judged per host: `fidelity.verdict`)."""
        control = sum(process_cpu_s(p.pid) for _, p in self.procs) + sum(os.times()[:2])
        rx = {h: {"rx_packets": 0, "rx_dropped": 0} for h in self.samplers}
        try:
            for s in self.sdn.switches()["switches"]:
                host = self.layout.placement.get(s["name"])
                for port, c in (s.get("ports") or {}).items() if host in rx else ():
                    if int(port) < LOCAL_PORTS:
                        for k in rx[host]:
                            rx[host][k] += c.get(k, 0)
        except SdnError as e:
            log.warning("switch counters: %s", e.message)
        return {
            "t": time.monotonic(),
            "cpu_s": {"control": control, "host": busy_seconds()},
            "switch": {"rx_packets": 0, "rx_dropped": 0},  # judged per host
            "switch_wait_s": None,
            "hosts": {h: {**s.snapshot(), "switch": rx[h]} for h, s in self.samplers.items()},
        }

    # --- background traffic --------------------------------------------------------------------
    def _start_end(self, node: str, name: str, argv: list[str], cpu: float, mem_mb: int):
        assert self.net is not None
        container = f"{self.prefix}-{name}-{node}"  # not `<prefix>-<node>-…`: the agent's workers
        period = self.net.cpu_period
        f = self.facts[self.layout.placement[node]]
        cmd = [
            "docker",
            "run",
            "-d",
            "--init",
            "--name",
            container,
            "--label",
            f"ces.run={self.prefix}",
            "--network",
            f"container:{self.net.node_container_name(node)}",
            "--cgroup-parent",
            self.net.parent(node, f),
            "--cpu-period",
            str(period),
            "--cpu-quota",
            str(cgroups.quota_us(self.dilation.host_cores(cpu), period)),
            "--memory",
            f"{mem_mb}m",
            self.image,
            *argv,
        ]
        try:
            self._remote(node).ok(shlex.join(cmd), f"cannot start {container}")
        except HostError as e:
            raise RunError(f"background: {e}") from None
        return node, container

    def _listens(self, node: str, port: int) -> bool:
        assert self.net is not None
        return (
            self._remote(node).run(
                f"docker exec {self.net.node_container_name(node)} ss -ltn | grep -q ':{port} '"
            )[0]
            == 0
        )

    # --- teardown --------------------------------------------------------------------------------
    def _down(self) -> None:
        """Traffic and samplers; the agents (they stop their workers); everything of the run on
        every host; the Master and the SDN app."""
        for i in list(self._traffic):
            self.stop_traffic(i)
        for s in self.samplers.values():
            s.stop()
        self.samplers.clear()
        for r in self._remotes.values():
            with contextlib.suppress(Exception):
                r.__exit__()
        self._remotes.clear()
        if self.agents:
            _, errors = each(
                self.layout.used_hosts(), self.inv.known_hosts, self.accept_new, self._stop_agents
            )
            for e in errors:
                log.warning("teardown: %s", e)
            self.agents = False
        if self.net is not None:
            self.net.__exit__(None, None, None)
            self.timings["teardown_fabric_s"] = self.net.timings.get("down_s", 0.0)
            self.net = None
        self._stop_processes()

    def _stop_agents(self, remote: Remote) -> None:
        """SIGTERM to every agent of the host at once (each stops its workers and tc classes)."""
        names = [deploy.agent_name(self.prefix, n) for n in self.layout.nodes_on(remote.host.node)]
        if names:
            remote.run(f"docker stop -t 20 {' '.join(names)} >/dev/null 2>&1", timeout_s=90)


# --- before and after a run ----------------------------------------------------------------------
def cluster_dilation(
    p: Plan,
    layout: Layout,
    facts: dict[str, HostFacts],
    asked: float | None,
    over_budget: bool,
    console: Console,
) -> tuple[Dilation, dict]:
    """`run.choose_dilation` for a run spread over hosts: the least K (or `asked`) at which every
    machine's CPU and every underlay fits (`budget.cluster_budget`); a ScenarioError in one line,
    naming the link or machine that does not fit, otherwise."""
    cost = hostcost.ensure(worker_image_tag(), log=lambda m: console.print(f"[bold]budget[/] {m}"))
    jobs = [d.job for d in p.scenario.jobs]
    cordoned = {v for b in p.scenario.background if b.cordon for v in (b.src, b.dst)}
    need = cluster_budget(
        p.topo,
        layout.placement,
        {h: (f.machine, round(f.cores)) for h, f in facts.items()},
        Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        [t.demand.cpu for job in jobs for t in job.tasks],
        [
            (v, traffic_quota(p.topo.node(v))[0])
            for b in p.scenario.background
            for v in (b.src, b.dst)
        ],
        [f.demand_mbps for job in jobs for f in job.flows]
        + [b.mbps for b in p.scenario.background],
        {n.name for n in p.topo.nodes} - cordoned,
        cost,
        {h: f.underlay_mbps for h, f in facts.items()},
    )
    unfit = (
        f"{p.scenario.source}: does not fit the cluster {layout.inv.path} even at dilation "
        f"K = {K_MAX:g}"
    )
    return chosen_dilation(need, cost, asked, over_budget, console, "the cluster", unfit)


def cluster_results(layout: Layout, facts: dict[str, HostFacts]) -> dict:
    """What results.json records of the cluster: the file, the rule, the tunnel, the inner MTU,
    each host's placement and facts, and the capacity crossing hosts."""
    inv = layout.inv
    mtu = min(f.underlay_mtu for f in facts.values()) - TUNNEL_OVERHEAD[inv.tunnel]
    return {
        "file": str(inv.path),
        "placement": layout.rule,
        "tunnel": inv.tunnel,
        "inner_mtu": mtu,
        "hosts": {
            h.name: {
                "address": h.address,
                "switches": layout.switches_on(h.name),
                "nodes": layout.nodes_on(h.name),
                **{k: v for k, v in asdict(facts[h.name]).items() if k != "netns"},
            }
            for h in layout.used_hosts()
        },
        "crossing": placing.summary(layout.topo, layout.placement, [h.name for h in inv.hosts]),
    }


def cleanup_cluster(inv: ClusterInventory, prefix: str, accept_new: bool) -> int:
    """What run `prefix` left on this machine (its SDN app and Master survive run.py's kill -9:
    sessions of their own) and on every host of `inv`; exit code 2 when a host could not be
    cleaned."""
    removed = cleanup(prefix)
    print(f"cleanup of {prefix} here: removed {removed.summary()}")
    done, errors = each(inv.hosts, inv.known_hosts, accept_new, lambda r: cleanup_host(r, prefix))
    for host, counts in done.items():
        print(f"{inv.host(host).label()}: removed {counts}")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 2 if errors else 0
