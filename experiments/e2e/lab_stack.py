"""The live system of a run on real hosts (`experiments/run.py --hosts`): the SDN app for the
lab's OpenFlow switches, the Master beyond loopback with the shared secret, one edge agent per
host deployed over SSH (`lab.deploy`), and the scenario's background traffic on the hosts.

The switches are the user's: configured to connect to the inventory's `master` address on its
`openflow_port` (docs/lab.md), they are waited for, never created. With the lab's certificates
(`pki`, `lab.pki`) the switches connect over TLS, and the Master, the agents and run.py speak
mutual TLS, each with its own identity; without, plain HTTP (`--insecure` only). Everything the run creates on
a host is a container named with the run prefix, removed at teardown or by `run.py --cleanup
--hosts FILE --prefix P` after a kill -9.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import docker
import docker.errors
from rich.console import Console

from lab import deploy
from lab.cluster import ClusterInventory
from lab.inventory import Inventory
from lab.ssh import HostError, Remote
from protocol.tls import CONTROL
from topologies import Topology

from .stack import RunError, StackBase

log = logging.getLogger("run")


class HostsRefused(Exception):
    """Hosts that cannot be used (`lab.deploy.probe`'s checks, or their deployment failed):
    `errors` each name the host and the problem in one line; nothing of the run is left."""

    def __init__(self, errors: list[HostError]):
        super().__init__("; ".join(map(str, errors)))
        self.errors = errors


class HostsStack(StackBase):
    """What a run on other hosts (`LabStack`, `cluster_stack.ClusterStack`) brings up on this
    machine: the SDN app and the Master on its management address (the inventory's `master`),
    the Master with the shared secret and, with the certificates in `pki`, over mutual TLS
    (without, plain HTTP: `--insecure`); and the background traffic's ends on the hosts."""

    # set by each kind's constructor
    inv: Inventory | ClusterInventory
    token_file: str
    token: str
    image: str
    pki: Path | None

    def _start_sdn_here(self) -> tuple[str, str]:
        """The SDN app on the inventory's `master` and `openflow_port`; (the topology file, the
        control machine's identity folder or "") for `_start_master_here`."""
        topo_arg = self._topology_file()
        control = str(self.pki / CONTROL) if self.pki else ""
        self._start_sdn(topo_arg, self.inv.master, self.inv.openflow_port, control)
        return topo_arg, control

    def _start_master_here(self, topo_arg: str, control: str) -> None:
        self._start_master(
            topo_arg,
            self.image,
            self.inv.master,
            self.inv.master_port,
            self.token_file,
            self.token,
            tls_dir=control,
            insecure=not control,
        )

    def _remote(self, node: str) -> Remote:
        """The SSH connection to `node`'s host."""
        raise NotImplementedError

    def _stop_ends(self, ends: list) -> None:
        for node, name in ends:
            try:
                deploy.remove(self._remote(node), [name])
            except HostError as e:  # the teardown's cleanup removes it
                log.warning("background: %s", e)


class LabStack(HostsStack):
    """Hosts checked, SDN app (its switches connected), Master, agents deployed, background
    traffic: brought up in that order and torn down in reverse."""

    def __init__(
        self,
        topo: Topology,
        prefix: str,
        out: Path,
        console: Console,
        inv: Inventory,
        token_file: str,
        token: str,
        image: str,
        accept_new_host_keys: bool = False,
        force_copy: bool = False,
        pki: Path | None = None,
    ):
        super().__init__(topo, prefix, out, console)
        self.pki = pki
        self.inv, self.token_file, self.token, self.image = inv, token_file, token, image
        self.accept_new, self.force_copy = accept_new_host_keys, force_copy
        self.facts: dict[str, deploy.Facts] = {}
        self.deployed = False  # agents started on some host: the teardown stops them
        self._remotes: dict[str, Remote] = {}  # node -> SSH connection of the traffic ends

    def start(self) -> None:
        t0 = time.monotonic()
        try:
            client = docker.from_env()
            client.images.get(self.image)
        except docker.errors.DockerException as e:
            raise RunError(
                f"the worker image {self.image} is not on this machine ({e}); run "
                "`python -m testbed.image ensure`"
            ) from None
        self.console.print(
            f"[bold]bring-up[/] {self.topo.name} on {len(self.inv.hosts)} hosts "
            f"of {self.inv.path} (prefix {self.prefix})"
        )
        self.facts, errors = deploy.check_hosts(self.inv, self.topo, self.accept_new)
        if errors:
            raise HostsRefused(errors)
        topo_arg, control = self._start_sdn_here()
        self._wait_switches(60)
        self._start_master_here(topo_arg, control)
        t1 = time.monotonic()
        self.deployed = True
        _, errors = deploy.deploy_agents(
            self.inv,
            self.topo,
            self.accept_new,
            client,
            self.image,
            self.prefix,
            self.master.url,
            self.token,
            self.facts,
            self.force_copy,
            self.pki,
        )
        if errors:
            raise HostsRefused(errors)
        self.timings["deploy_s"] = time.monotonic() - t1
        self._wait_agents(60)
        self.timings["register_s"] = time.monotonic() - t1
        self.timings["up_s"] = time.monotonic() - t0
        self.console.print(
            f"  up in {self.timings['up_s']:.1f} s: {len(self.topo.switches)} "
            f"switches on the SDN app, {len(self.topo.nodes)} agents deployed in "
            f"{self.timings['deploy_s']:.1f} s and on the Master"
        )

    def _remote(self, node: str) -> Remote:
        if node not in self._remotes:
            self._remotes[node] = Remote(
                self.inv.host(node), self.inv.known_hosts, self.accept_new
            ).connect()
        return self._remotes[node]

    def _start_end(self, node: str, name: str, argv: list[str], cpu: float, mem_mb: int):
        try:
            return node, deploy.start_tool(
                self._remote(node),
                self.facts[node],
                self.prefix,
                f"{name}-{node}",
                self.image,
                argv,
                cpu,
                mem_mb,
            )
        except HostError as e:
            raise RunError(f"background: {e}") from None

    def _listens(self, node: str, port: int) -> bool:
        return self._remote(node).run(f"ss -ltn | grep -q ':{port} '")[0] == 0

    def _down(self) -> None:
        """The hosts' agents first (they stop their workers), then everything else of the run
        on the hosts, then the Master and the SDN app."""
        for i in list(self._traffic):
            self.stop_traffic(i)
        for r in self._remotes.values():
            r.__exit__()
        self._remotes.clear()
        if self.deployed:
            _, errors = deploy.each_host(
                self.inv,
                self.accept_new,
                lambda r: (
                    deploy.stop_agent(r, self.prefix, r.host.node),
                    deploy.cleanup(r, self.prefix),
                ),
            )
            for e in errors:
                log.warning(
                    "teardown: %s (clean up later: run.py --cleanup --hosts %s --prefix %s)",
                    e,
                    self.inv.path,
                    self.prefix,
                )
            self.deployed = False
        self._stop_processes()
