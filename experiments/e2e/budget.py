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

from dataclasses import asdict, dataclass, field

import networkx as nx

from testbed.hostcost import HostCost
from topologies import Topology

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
