"""A run's CPU budget, before anything is built: what the scenario asks of the host's cores — its
workers' and tenants' quotas (within which the nodes also do their TCP work), the switching of
its traffic on this host's datapath, the control plane — against what the host has, less a
headroom. What does not fit runs time-dilated: at dilation K the quotas and the control plane's
periods shrink K times, every flow runs at 1/K of its rate — where a Gbit costs the switches
more, the packets coming one a wake-up (`HostCost.switching_cores`) — and what the host burns
regardless does not shrink (protocol.dilation). Mininet-HiFi's lesson: an emulation is only as good as its host's headroom.

`need(K)` = (workers + tenants + control) / K + switching at the flows' rates ÷ K + idle + fixed;
the
smallest K (in steps of K_STEP) with need(K) ≤ the host's cores × (1 − HEADROOM) is the run's
`--dilation auto`.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass, field

import networkx as nx
from rich.console import Console

from protocol.dilation import Dilation
from testbed.hostcost import HostCost
from topologies import Topology

from .scenario import ScenarioError

# The share of the host's cores a run leaves free. The budget counts upper bounds — every quota
# and every flow's demand — so it needs little more: the contention scenario at the K it chose
# (3) used 52-54 % of the host's cores on average and 83-85 % in its busiest second, every
# binding flow in band (development VM, docs/testbed.md).
HEADROOM = 0.10
K_STEP = 0.25
K_MAX = 8.0  # beyond this a run takes too long to be worth it: refused
# The control plane at K = 1, host cores: the Master, the SDN app and run.py together, and each
# edge agent (a heartbeat every 2 s, its worker logs followed). And what a run costs the host
# beyond every process's own time whatever K — the Docker engine following the workers' logs,
# the kernel's softirqs — measured as `other` on campus: 0.13-0.17 cores at K = 3 and at K = 6.
CONTROL_BASE_CORES = 0.10
CONTROL_PER_NODE_CORES = 0.01
FIXED_CORES = 0.15


@dataclass(frozen=True)
class Budget:
    cores: int  # the host's
    workers: float  # cores at K = 1: the jobs' task quotas, as many as the nodes can run at once
    tenants: float  # cores at K = 1: the quotas of the tenants' traffic ends
    flows_mbps: tuple[float, ...]  # the jobs' flow demands and the tenants' rates
    switches: float  # switches a packet crosses on average between compute nodes
    cost: HostCost = field(repr=False)  # what traffic costs this host, by flow rate
    control: float = 0.0  # cores at K = 1
    idle: float = 0.0  # cores the host burns with nothing running (not dilated)
    fixed: float = FIXED_CORES  # cores a run costs beyond its processes' time (not dilated)

    @property
    def usable(self) -> float:
        return self.cores * (1 - HEADROOM)

    def switching(self, k: float) -> float:
        """Host cores the switches take at dilation `k` (every flow at 1/k of its rate)."""
        return self.cost.switching_cores([f / k for f in self.flows_mbps], self.switches)

    def need(self, k: float) -> float:
        """Host cores the run takes at dilation `k`."""
        quotas = self.workers + self.tenants + self.control
        return quotas / k + self.switching(k) + self.idle + self.fixed

    def fits(self, k: float) -> bool:
        return self.need(k) <= self.usable + 1e-9

    def dilation(self) -> float | None:
        """The smallest K (a multiple of K_STEP, ≥ 1) at which the run fits; None when it does
        not fit even at K_MAX."""
        steps = round((K_MAX - 1) / K_STEP)
        return next((k for k in (1 + i * K_STEP for i in range(steps + 1)) if self.fits(k)), None)

    def line(self, k: float) -> str:
        """What the run needs of the host at `k`, in one line."""
        return (
            f"(workers {self.workers:.2f} + tenants {self.tenants:.2f} + control "
            f"{self.control:.2f}) ÷ K + switching {self.switching(k):.2f} "
            f"({sum(self.flows_mbps):.0f} Mbit/s ÷ K over "
            f"{self.switches:.1f} switches) + idle {self.idle:.2f} + fixed {self.fixed:.2f} "
            f"cores = {self.need(k):.2f} at K = {k:g}, of {self.usable:.2f} usable "
            f"({self.cores} cores less {HEADROOM:.0%} headroom)"
        )

    def to_json(self, k: float) -> dict:
        doc = {key: value for key, value in asdict(self).items() if key != "cost"}
        return {
            **doc,
            "switching": round(self.switching(k), 3),
            "usable": self.usable,
            "need": round(self.need(k), 3),
            "line": self.line(k),
        }


def mean_switches(topo: Topology) -> float:
    """Switches on a shortest path between two compute nodes, averaged over every pair."""
    g = topo.graph()
    nodes = [n.name for n in topo.nodes]
    counts = []
    for i, a in enumerate(nodes):
        lengths = nx.single_source_shortest_path_length(g, a)
        counts += [lengths[b] - 1 for b in nodes[i + 1 :] if b in lengths]
    return sum(counts) / len(counts) if counts else 0.0


def budget(
    topo: Topology,
    task_cpus: list[float],
    tenant_cpus: list[float],
    flow_mbps: list[float],
    schedulable: set[str],
    cost: HostCost,
) -> Budget:
    """The budget of a run on `topo` whose jobs' tasks ask `task_cpus` cores (on the
    `schedulable` nodes), whose tenants' traffic ends ask `tenant_cpus`, and whose jobs' flows and
    tenants ask `flow_mbps`, with this host's `cost`."""
    capacity = sum(n.cpu for n in topo.nodes if n.name in schedulable)
    return Budget(
        cost.cores,
        round(min(sum(task_cpus), capacity), 3),
        round(sum(tenant_cpus), 3),
        tuple(flow_mbps),
        round(mean_switches(topo), 2),
        cost,
        round(CONTROL_BASE_CORES + CONTROL_PER_NODE_CORES * len(topo.nodes), 3),
        cost.idle_cores,
    )


# --- a run spread over several hosts (run.py --cluster, lab.fabric) ------------------------------
# What one crossing of hosts costs each side, in switches crossed: the link's veth into the tunnel
# bridge, the tunnel port's encapsulation and (userspace datapath) the underlay bridge. Two OVS
# instances joined by VXLAN carried ~550 Mbit/s of TCP where one bridge between two veths carried
# ~1.2 Gbit/s (ENVIRONMENT.md, development VM): about two switches' work more on each side.
TUNNEL_SWITCHES = 2.0
UNDERLAY_LINKS_SHOWN = 4  # links a refusal names before "+N more"


@dataclass(frozen=True)
class UnderlayLoad:
    """The capacity of the topology's links that cross between `hosts` (a pair, or one host and
    all its peers) against what their underlay carries; at dilation K the hosts carry it ÷ K."""

    hosts: str  # "h1 ↔ h2", or "h1 ↔ h2, h3" for everything leaving h1
    links: tuple[tuple[str, float], ...]  # ("a–b", Mbit/s)
    underlay_mbps: float

    @property
    def mbps(self) -> float:
        return sum(m for _, m in self.links)

    def fits(self, k: float) -> bool:
        return self.mbps / k <= self.underlay_mbps + 1e-9

    def least_k(self) -> float:
        need = max(1.0, self.mbps / self.underlay_mbps)
        return math.ceil(need / K_STEP - 1e-9) * K_STEP

    def line(self, k: float) -> str:
        shown = " + ".join(f"{name} {m:g}" for name, m in self.links[:UNDERLAY_LINKS_SHOWN])
        more = len(self.links) - UNDERLAY_LINKS_SHOWN
        return (
            f"underlay {self.hosts}: {shown}{f' + {more} more links' if more > 0 else ''} = "
            f"{self.mbps:g} Mbit/s cross hosts, {self.mbps / k:.0f} at K = {k:g}, over the "
            f"underlay's {self.underlay_mbps:g} Mbit/s"
        )


@dataclass(frozen=True)
class ClusterBudget:
    """A spread run's budget: one `Budget` per machine (hosts that share a kernel — stand-in
    hosts on one machine — share its cores) and the capacity crossing hosts against their
    underlay. It fits at K when every machine and every underlay does."""

    machines: dict[str, Budget]  # "h1+h2" -> that machine's budget
    underlay: tuple[UnderlayLoad, ...]

    def fits(self, k: float) -> bool:
        return all(b.fits(k) for b in self.machines.values()) and all(
            u.fits(k) for u in self.underlay
        )

    def dilation(self) -> float | None:
        steps = round((K_MAX - 1) / K_STEP)
        return next((k for k in (1 + i * K_STEP for i in range(steps + 1)) if self.fits(k)), None)

    def line(self, k: float) -> str:
        """What binds at `k`, in one line: the first underlay or machine that does not fit
        (an underlay names its links), else the busiest machine and underlay."""
        for u in self.underlay:
            if not u.fits(k):
                return u.line(k)
        for name, b in self.machines.items():
            if not b.fits(k):
                return f"{name}: {b.line(k)}"
        name, b = max(self.machines.items(), key=lambda kv: kv[1].need(k) / kv[1].usable)
        busiest = max(self.underlay, key=lambda u: u.mbps / u.underlay_mbps, default=None)
        return f"{name}: {b.line(k)}" + (f"; {busiest.line(k)}" if busiest else "")

    def to_json(self, k: float) -> dict:
        return {
            "machines": {name: b.to_json(k) for name, b in self.machines.items()},
            "underlay": [
                {**asdict(u), "mbps": u.mbps, "fits": u.fits(k), "line": u.line(k)}
                for u in self.underlay
            ],
            "line": self.line(k),
        }


def underlay_loads(
    crossing: dict[tuple[str, str], list[tuple[str, float]]], underlay_mbps: dict[str, float]
) -> tuple[UnderlayLoad, ...]:
    """The loads to check: every pair of hosts with links between them (against the smaller of
    their underlays), and every host with several peers (all it sends, against its own)."""
    out = [
        UnderlayLoad(f"{a} ↔ {b}", tuple(links), min(underlay_mbps[a], underlay_mbps[b]))
        for (a, b), links in sorted(crossing.items())
    ]
    for h in sorted(underlay_mbps):
        peers = sorted({b if a == h else a for a, b in crossing if h in (a, b)})
        if len(peers) > 1:
            links = [lk for (a, b), ls in sorted(crossing.items()) if h in (a, b) for lk in ls]
            out.append(UnderlayLoad(f"{h} ↔ {', '.join(peers)}", tuple(links), underlay_mbps[h]))
    return tuple(out)


def machine_switches(topo: Topology, placement: dict[str, str], hosts: set[str]) -> float:
    """Switches of `hosts` a packet crosses on average between two compute nodes (shortest
    paths), each crossing of hosts counting `TUNNEL_SWITCHES` more on each side in `hosts`."""
    g = topo.graph()
    nodes = [n.name for n in topo.nodes]
    counts = []
    for i, a in enumerate(nodes):
        paths = nx.single_source_shortest_path(g, a)
        for b in nodes[i + 1 :]:
            if b not in paths:
                continue
            path = paths[b]
            count = sum(1.0 for v in path[1:-1] if placement[v] in hosts)
            for u, v in itertools.pairwise(path):
                if placement[u] != placement[v]:
                    count += TUNNEL_SWITCHES * ((placement[u] in hosts) + (placement[v] in hosts))
            counts.append(count)
    return sum(counts) / len(counts) if counts else 0.0


def cluster_budget(
    topo: Topology,
    placement: dict[str, str],
    machines: dict[str, tuple[str, int]],
    control_machine: str,
    task_cpus: list[float],
    tenant_cpus: list[tuple[str, float]],
    flow_mbps: list[float],
    schedulable: set[str],
    cost: HostCost,
    underlay_mbps: dict[str, float],
) -> ClusterBudget:
    """The budget of a run of `topo` spread by `placement` ({switch or node: host}) over hosts
    on `machines` ({host: (machine id, its cores)}; the control plane runs on `control_machine`),
    whose jobs' tasks ask `task_cpus` (anywhere on the `schedulable` nodes), whose tenants' ends
    ask `tenant_cpus` ((node, cores)), whose flows ask `flow_mbps`, with this machine's `cost` of
    forwarding (the only one measured) and each host's `underlay_mbps`."""
    by_machine: dict[str, list[str]] = {}
    for host, (machine_id, _) in machines.items():
        by_machine.setdefault(machine_id, []).append(host)
    budgets = {}
    for machine_id, hosts in by_machine.items():
        on = set(hosts)
        nodes = [n for n in topo.nodes if placement[n.name] in on]
        capacity = sum(n.cpu for n in nodes if n.name in schedulable)
        control = CONTROL_PER_NODE_CORES * len(nodes) + (
            CONTROL_BASE_CORES if machine_id == control_machine else 0.0
        )
        budgets["+".join(hosts)] = Budget(
            machines[hosts[0]][1],
            round(min(sum(task_cpus), capacity), 3),
            round(sum(c for v, c in tenant_cpus if placement[v] in on), 3),
            tuple(flow_mbps),
            round(machine_switches(topo, placement, on), 2),
            cost,
            round(control, 3),
            round(cost.idle_cores * len(hosts), 4),  # each host its own ovs-vswitchd
        )
    crossing: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for lk in topo.links:
        a, b = placement[lk.a], placement[lk.b]
        if a != b:
            crossing.setdefault((min(a, b), max(a, b)), []).append((f"{lk.a}–{lk.b}", lk.bw_mbps))
    return ClusterBudget(budgets, underlay_loads(crossing, underlay_mbps))


# --- the run's dilation (run.choose_dilation, cluster_stack.cluster_dilation) --------------------
def chosen_dilation(
    need: Budget | ClusterBudget,
    cost: HostCost,
    asked: float | None,
    over_budget: bool,
    console: Console,
    where: str,
    unfit: str,
) -> tuple[Dilation, dict]:
    """The run's time dilation by what it `need`s: `asked` (a number), or the least K at which it
    fits when None ("auto"); and what results.json records of the choice (with the `cost` the
    budget was made with). A ScenarioError (one line) when no K fits (`unfit`, then what K_MAX
    needs), or when `asked` is below what the budget needs and not `over_budget` (the scenario
    does not fit `where`)."""
    least = need.dilation()
    if asked is None and least is None:
        raise ScenarioError(f"{unfit}: {need.line(K_MAX)}")
    k = least if asked is None else asked
    if asked is not None and not need.fits(k) and not over_budget:
        raise ScenarioError(
            f"--dilation {asked:g}: the scenario does not fit {where} ({need.line(k)}); "
            + (
                f"it fits at no K up to {K_MAX:g} (or give --over-budget)"
                if least is None
                else f"it needs K >= {least:g} (or give --over-budget)"
            )
        )
    console.print(
        f"[bold]budget[/] {need.line(k)}: dilation K = {k:g} "
        f"({'auto' if asked is None else 'given'})"
    )
    return Dilation(k, time.time()), {
        "factor": k,
        "chosen": "auto" if asked is None else "given",
        "budget": need.to_json(k),
        "host_cost": asdict(cost),
    }
