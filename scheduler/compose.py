"""Schedulers composed from parts: one algorithm's placement with a network decision, so that a
comparison can show what placement, paths and rates each contribute.

    NAME[:PATH_RULE][/NETWORK]       e.g. ces-ppo, k8s-spread, k8s-spread/ces, ces-ppo/best-effort

NETWORK is how the job's flows are carried:
  enforced     the algorithm's own paths and rates, installed (meters, sender shaping) and
               reserved; the Master may re-route them at run time when the network changes;
  static       the same, never re-routed (the runtime adjustment switched off for this job);
  ces          CES's paths and rates for the algorithm's placement (`paths.route_placement`),
               enforced;
  best-effort  nothing installed or reserved: the traffic takes the network's default paths
               (`topologies.routes`) and TCP shares the links, as on a plain network.
The default is best-effort for network-blind algorithms (`network_blind`: the baselines that
place by resources only, as Kubernetes' scheduler does) and enforced for the others. A
network-blind placement decides on a plain network: it sees no reservations.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from topologies.routes import default_path

from .baselines import Algorithm, algorithm_factory, make_algorithm
from .model import BEST_EFFORT, Cluster, Decision, FlowAssignment, Job
from .paths import fair_rates, route_placement

NETWORKS = ("enforced", "static", "ces", "best-effort")


def parse(spec: str) -> tuple[str, str | None]:
    """(algorithm name, NETWORK or None for the default); ValueError for an unknown NETWORK."""
    name, _, network = spec.partition("/")
    if network and network not in NETWORKS:
        raise ValueError(
            f"unknown network '{network}' in '{spec}' (expected one of {', '.join(NETWORKS)})"
        )
    return name, network or None


def network_of(spec: str) -> str:
    """The NETWORK a spec runs with (the default from its algorithm's `network_blind`)."""
    name, network = parse(spec)
    if network:
        return network
    blind = getattr(algorithm_factory(name), "network_blind", False)
    return "best-effort" if blind else "enforced"


def adjustable(spec: str) -> bool:
    """Whether the Master may re-route the spec's jobs when the network changes."""
    return network_of(spec) in ("enforced", "ces")


def build(spec: str, seed: int = 0) -> Algorithm:
    """The algorithm a spec names, its network part composed in (named `spec`)."""
    placer = make_algorithm(parse(spec)[0], seed=seed)
    network = network_of(spec)
    if network == "best-effort":
        return BestEffort(spec, placer)
    if network == "ces":
        return CesNetwork(spec, placer)
    return Enforced(spec, placer)


def placement_of(placer: Algorithm, cluster: Cluster, job: Job) -> dict[str, str]:
    """The placer's placement without routing it its own way (a task-by-task placer's paths may
    find no bandwidth where another network decision would)."""
    positions = getattr(placer, "positions", None)
    return positions(cluster, job) if positions else placer.place(cluster, job).placement


@dataclass
class Enforced:
    """The algorithm's own decision, enforced."""

    name: str
    placer: Algorithm

    def place(self, cluster: Cluster, job: Job) -> Decision:
        return self.placer.place(cluster, job)


@dataclass
class CesNetwork:
    """The algorithm's placement; CES's paths and rates for it."""

    name: str
    placer: Algorithm

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        placement = placement_of(self.placer, cluster, job)
        flows = route_placement(cluster, job, placement)
        return Decision(job.name, placement, flows, time.perf_counter() - start)


@dataclass
class BestEffort:
    """The algorithm's placement on a plain network: the flows take the default paths, at the
    rates TCP would share out if nothing else ran (what the decision expects; nothing is
    reserved). A network-blind placement sees no reservations."""

    name: str
    placer: Algorithm

    def place(self, cluster: Cluster, job: Job) -> Decision:
        start = time.perf_counter()
        seen = cluster
        if getattr(self.placer, "network_blind", False):
            seen = cluster.copy(share_graph=True)
            seen.reserved = {}
        placement = placement_of(self.placer, seen, job)
        decision = Decision(
            job.name, placement, best_effort_flows(cluster, job, placement), network=BEST_EFFORT
        )
        decision.decision_s = time.perf_counter() - start
        return decision


def best_effort_flows(
    cluster: Cluster, job: Job, placement: dict[str, str]
) -> list[FlowAssignment]:
    """The job's inter-node flows on the network's default paths, each at the equal share of the
    links' capacity it would get among the job's own flows (TCP's, with nothing else running)."""
    crossing = [f for f in job.flows if placement[f.src] != placement[f.dst]]
    paths = {}
    for f in crossing:
        a, b = placement[f.src], placement[f.dst]
        paths[(f.src, f.dst)] = (a, *default_path(cluster.graph, a, b), b)
    bare = cluster.copy(share_graph=True)
    bare.reserved = {}
    rates = fair_rates(bare, paths, {fl: float("inf") for fl in paths})
    return [
        FlowAssignment(f.src, f.dst, paths[(f.src, f.dst)], rates[(f.src, f.dst)]) for f in crossing
    ]
