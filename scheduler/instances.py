"""Random and randomised instances: the jobs, networks and busy clusters that training, the
benchmarks and the tests draw from (all seeded through a numpy Generator).

  random_job / JobDistribution   a job of any collective, sized from a distribution
  random_topology                a router graph or a campus-like tiered network, random sizes
  background_load / make_instance  a cluster made busy with background tasks and flows
  fill_with_jobs                 a cluster made busy with random jobs (training's other kind)
  random_spread_jobs             jobs no node of a cluster holds whole: each must span nodes
  random_instance                a small random (cluster, job): the exact reference's playground
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import networkx as nx
import numpy as np

from topologies import ComputeNode, GraphDefaults, Topology, from_graph, parse_topology

from .baselines import make_algorithm
from .jobs import BUILDERS, BYTES_PER_PARAM, custom_job, flows_between, worker_tasks
from .model import CannotPlace, Cluster, Decision, FlowAssignment, Job, LogicalFlow, Resources, Task
from .paths import NoPath, shortest_path
from .trace import apply_machine_spec


# --- jobs ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobDistribution:
    """What `random_job` draws from, all independently: the collective (ring 50 %, star 20 %,
    tree 10 %, all-to-all 10 %, custom 10 %: a ring plus chords w_i -> w_{i+2}, a cyclic graph
    no DAG model expresses), the fields below, and a priority uniform in 0..2."""

    min_workers: int = 2  # workers: a uniform integer from min_workers to max_workers
    max_workers: int = 6
    log_workers: bool = False  # workers log-uniform instead
    cpu_choices: tuple[float, ...] = (0.25, 0.5, 1.0)  # each task's cpu, one of these
    mem_choices: tuple[float, ...] = (256.0, 512.0, 1024.0)  # its memory (MB), one of these
    gpu_choices: tuple[float, ...] = (0.0,)  # its GPUs (whole devices), one of these: drawn only
    #                                          where there is a choice, so that the draws of a
    #                                          GPU-less distribution stay what they were
    min_params: float = 1e5  # model parameters (4 bytes each), log-uniform from min to max
    max_params: float = 1e7
    min_compute_s: float = 0.01  # seconds of one reference core per iteration, log-uniform
    max_compute_s: float = 1.0
    min_mbps: float = 10.0  # each flow's demand, log-uniform
    max_mbps: float = 500.0
    min_iterations: int = 100  # iterations, a uniform integer
    max_iterations: int = 2000


COLLECTIVE_WEIGHTS = {"ring": 0.5, "star": 0.2, "tree": 0.1, "all-to-all": 0.1, "custom": 0.1}
# Jobs at the scale of a GPU cluster's (node capacities from the Alibaba machine table, scaled as
# `trace.apply_machine_spec` does): 2-32 tasks, up to two GPUs each, gradients from a small CNN's
# (0.4 MB) to BERT-base's (440 MB): many cannot run on one node, so the network decides.
GPU_CLUSTER_JOBS = JobDistribution(
    min_workers=2,
    max_workers=32,
    log_workers=True,
    cpu_choices=(0.25, 0.5, 1.0, 2.0),
    mem_choices=(512.0, 1024.0, 2048.0, 4096.0),
    gpu_choices=(0.0, 1.0, 1.0, 2.0),
    min_params=1e5,
    max_params=1.1e8,
    min_compute_s=0.01,
    max_compute_s=2.0,
    min_mbps=50.0,
    max_mbps=5000.0,
)


def random_spread_jobs(
    rng: np.random.Generator,
    cluster: Cluster,
    n: int,
    dist: JobDistribution = GPU_CLUSTER_JOBS,
    prefix: str = "spread",
    tries: int = 10_000,
) -> list[Job]:
    """`n` jobs of `dist` that no node of `cluster` can hold whole but the cluster can (by free
    resources, network aside): each must span nodes. `CannotPlace` when `tries` draws did not
    find them."""
    nodes = cluster.compute_nodes(online_only=True)
    total = sum((cluster.free(v) for v in nodes), Resources())
    jobs: list[Job] = []
    for _ in range(tries):
        if len(jobs) == n:
            return jobs
        job = random_job(rng, f"{prefix}{len(jobs)}", dist)
        need = job.total_demand()
        if (
            need.fits_in(total)
            and not any(need.fits_in(cluster.free(v)) for v in nodes)
            and all(any(t.demand.fits_in(cluster.free(v)) for v in nodes) for t in job.tasks)
        ):
            jobs.append(job)
    if len(jobs) == n:
        return jobs
    raise CannotPlace(
        f"no {n} jobs of the distribution that must span nodes fit the cluster "
        f"({len(jobs)} in {tries} draws)"
    )


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def random_job(
    rng: np.random.Generator,
    name: str = "job",
    dist: JobDistribution = JobDistribution(),
    collective: str | None = None,
) -> Job:
    """A job drawn from `dist` (see `JobDistribution`); `collective` forces one collective."""
    collective = collective or str(
        rng.choice(list(COLLECTIVE_WEIGHTS), p=list(COLLECTIVE_WEIGHTS.values()))
    )
    k = (
        round(_log_uniform(rng, dist.min_workers, dist.max_workers))
        if dist.log_workers
        else int(rng.integers(dist.min_workers, dist.max_workers + 1))
    )
    demand = Resources(
        float(rng.choice(dist.cpu_choices)),
        float(rng.choice(dist.mem_choices)),
        float(rng.choice(dist.gpu_choices)) if len(dist.gpu_choices) > 1 else dist.gpu_choices[0],
    )
    params = round(_log_uniform(rng, dist.min_params, dist.max_params))
    model_bytes = float(BYTES_PER_PARAM * params)
    mbps = round(_log_uniform(rng, dist.min_mbps, dist.max_mbps), 1)
    fields = dict(
        compute_s=round(_log_uniform(rng, dist.min_compute_s, dist.max_compute_s), 4),
        iterations=int(rng.integers(dist.min_iterations, dist.max_iterations + 1)),
        priority=int(rng.integers(0, 3)),
    )
    if collective == "custom":
        tasks = worker_tasks(k, demand)
        pairs = {(f"w{i}", f"w{(i + 1) % k}") for i in range(k)} | {
            (f"w{i}", f"w{(i + 2) % k}") for i in range(k)
        }
        pairs = sorted((a, b) for a, b in pairs if a != b)
        return custom_job(
            name, tasks, flows_between(pairs, mbps, model_bytes), model_bytes, **fields
        )
    return BUILDERS[collective](name, k, demand, model_bytes, mbps, **fields)


# --- networks ---------------------------------------------------------------------------------------
# Real networks (topohub keys) the benchmarks judge on, kept out of training together with every
# other version of them (the same network in another year or collection).
HELD_OUT = ["topozoo/Abilene", "sndlib/polska", "topozoo/Geant2012", "topozoo/Uninett2011"]
_HELD_OUT_FAMILIES = ("abilene", "polska", "geant", "uninett")


def held_out(key: str) -> bool:
    """Whether topohub network `key` (or another version of it) is kept out of training."""
    name = key.rsplit("/", 1)[-1].lower() if not key.startswith("gabriel/") else key
    return name.startswith(_HELD_OUT_FAMILIES) or key.startswith("gabriel/100/")


def random_topology(rng: np.random.Generator, sites: tuple[int, int]) -> Topology:
    """A random network for training: a router graph (Internet-AS-like, Waxman, Barabási–Albert;
    one edge site per router) or a campus-like tiered network with several nodes per access
    switch; random node sizes and speeds, link capacities and delays."""
    n = int(rng.integers(sites[0], sites[1] + 1))
    kind = rng.choice(["internet", "waxman", "ba", "tiered", "tiered"])
    seed = int(rng.integers(2**31))
    if kind == "tiered":
        topo = _tiered(rng, n)
    else:
        if kind == "internet":
            g = nx.random_internet_as_graph(max(n, 6), seed=seed)
        elif kind == "waxman":
            g = nx.waxman_graph(n, beta=0.6, alpha=0.4, seed=seed)
        else:
            g = nx.barabasi_albert_graph(n, int(rng.integers(1, min(3, n))), seed=seed)
        for u, v in g.edges:
            g.edges[u, v]["bw_mbps"] = _bandwidth(rng)
            g.edges[u, v]["delay_ms"] = round(float(rng.uniform(0.1, 5.0)), 3)
        topo = from_graph(g, f"random:{kind}", f"{kind}{n}", GraphDefaults())
    return _resize(rng, topo)


def _bandwidth(rng: np.random.Generator) -> float:
    return float(rng.choice([10, 20, 50, 100, 200, 500, 1000, 1000]))


def _tiered(rng: np.random.Generator, n: int) -> Topology:
    cores = int(rng.integers(1, 3))
    access = max(1, math.ceil(n / rng.integers(1, 5)))
    aggs = max(1, math.ceil(access / rng.integers(1, 4)))
    sw = (
        [f"c{i}" for i in range(cores)]
        + [f"g{i}" for i in range(aggs)]
        + [f"a{i}" for i in range(access)]
    )
    links = [{"ends": [f"c{i}", f"c{i + 1}"], "bw_mbps": 1000} for i in range(cores - 1)]
    for i in range(aggs):
        for c in rng.choice(cores, size=int(rng.integers(1, cores + 1)), replace=False):
            links.append({"ends": [f"c{c}", f"g{i}"], "bw_mbps": _bandwidth(rng)})
    for i in range(access):
        for a in rng.choice(aggs, size=int(rng.integers(1, min(aggs, 2) + 1)), replace=False):
            links.append(
                {
                    "ends": [f"g{a}", f"a{i}"],
                    "bw_mbps": _bandwidth(rng),
                    "delay_ms": round(float(rng.uniform(0.1, 2.0)), 3),
                }
            )
    nodes = []
    for i in range(n):
        nodes.append({"name": f"n{i}", "cpu": 1, "mem_mb": 1024})
        links.append({"ends": [f"n{i}", f"a{i % access}"], "bw_mbps": _bandwidth(rng)})
    doc = {
        "name": f"tiered{n}",
        "defaults": {"delay_ms": 0.2},
        "switches": [{"name": s} for s in sw],
        "nodes": nodes,
        "links": links,
    }
    return parse_topology(doc, "random:tiered")


def _resize(rng: np.random.Generator, topo: Topology) -> Topology:
    """Random node capacities: a scale for the whole network (edge boxes to servers) and a
    per-node spread, so that relative size and speed matter."""
    scale = float(rng.choice([0.5, 1.0, 4.0, 16.0]))
    nodes: list[ComputeNode] = []
    for nd in topo.nodes:
        cpu = round(scale * float(rng.choice([0.25, 0.5, 1.0, 1.5, 2.0])), 2)
        mem = int(cpu * float(rng.choice([1024, 2048, 4096])))
        gpu = int(rng.choice([0, 0, 0, 1, 2])) if scale >= 4 else 0
        nodes.append(
            replace(
                nd,
                cpu=cpu,
                mem_mb=max(mem, 256),
                gpu=gpu,
                speed=round(float(rng.uniform(0.5, 1.5)), 2),
            )
        )
    names = {nd.name for nd in topo.nodes}
    links = [
        replace(lk, bw_mbps=_bandwidth(rng)) if (lk.a in names or lk.b in names) else lk
        for lk in topo.links
    ]
    return Topology(topo.name, nodes, topo.switches, links, topo.source, topo.description)


def fill_with_jobs(
    rng: np.random.Generator,
    cluster: Cluster,
    share: float,
    jobs: JobDistribution = JobDistribution(),
) -> None:
    """Put the cluster in a busy state: random jobs placed by the `random` baseline until about
    `share` of the compute capacity is in use (jobs that do not fit are skipped)."""
    algo = make_algorithm("random", seed=int(rng.integers(2**31)))
    total = sum(cluster.capacity(n).cpu for n in cluster.compute_nodes())
    for i in range(50):
        used = sum(cluster.used[n].cpu for n in cluster.compute_nodes())
        if used >= share * total:
            break
        job = random_job(rng, name=f"bg{i}", dist=jobs)
        try:
            cluster.allocate(job, algo.place(cluster, job))
        except CannotPlace:
            continue


# --- busy clusters -----------------------------------------------------------------------------------
def background_load(cluster: Cluster, rng: np.random.Generator, level: float) -> Cluster:
    """A copy of `cluster` with background tasks and flows (see module doc), allocated as
    ordinary jobs named bg-*, so every algorithm sees them through the usual residuals."""
    out = cluster.copy()
    if level <= 0:
        return out
    nodes = out.compute_nodes(online_only=True)
    for n in nodes:
        free = out.free(n)
        demand = Resources(free.cpu * rng.uniform(0, level), free.mem_mb * rng.uniform(0, level))
        job = Job(f"bg-node-{n}", [Task("t", demand)], [], collective="custom")
        out.allocate(job, Decision(job.name, {"t": n}, []))
    for i in range(len(nodes) if len(nodes) > 1 else 0):
        a, b = (nodes[int(j)] for j in rng.choice(len(nodes), size=2, replace=False))
        try:
            path = shortest_path(out, a, b)
        except NoPath:
            continue
        rate = out.path_residual(path) * rng.uniform(0, level)
        if rate <= 0:
            continue
        job = Job(
            f"bg-flow-{i}",
            [Task("a", Resources()), Task("b", Resources())],
            [LogicalFlow("a", "b", rate, 0.0)],
            collective="custom",
        )
        out.allocate(
            job, Decision(job.name, {"a": a, "b": b}, [FlowAssignment("a", "b", path, rate)])
        )
    return out


def make_instance(
    base: Cluster, seed: int, background: float, machines: list | None = None
) -> Cluster:
    rng = np.random.default_rng(seed)
    cluster = apply_machine_spec(base, machines, rng) if machines else base
    return background_load(cluster, rng, background)


def random_instance(
    rng: np.random.Generator,
    max_switches: int = 4,
    max_nodes: int = 5,
    max_workers: int = 4,
    background: float = 0.5,
) -> tuple[Cluster, Job]:
    """A small random instance (the exact reference's playground, also used by the tests):
    2..max_switches switches joined by a random tree plus each other pair with probability 0.3
    (parallel paths), 2..max_nodes compute nodes on random switches (cpu 0.5-2, mem 1-2 GB,
    speed 0.5-1.5), switch links of 10-1000 Mbit/s and 0-2 ms, access links of 100 or 1000
    Mbit/s; background load at `background`; and one `instances.random_job` of up to `max_workers`
    workers with tasks of 0.25-1 cpu."""
    n_sw = int(rng.integers(2, max_switches + 1))
    n_nodes = int(rng.integers(2, max_nodes + 1))
    switches = [{"name": f"s{i}"} for i in range(n_sw)]
    pairs = {(int(rng.integers(i)), i) for i in range(1, n_sw)}
    pairs |= {(i, j) for i in range(n_sw) for j in range(i + 1, n_sw) if rng.random() < 0.3}
    links = [
        {
            "ends": [f"s{i}", f"s{j}"],
            "bw_mbps": float(rng.choice([10, 50, 100, 200, 1000])),
            "delay_ms": round(float(rng.uniform(0, 2)), 2),
        }
        for i, j in sorted(pairs)
    ]
    nodes = []
    for i in range(n_nodes):
        nodes.append(
            {
                "name": f"h{i}",
                "cpu": float(rng.choice([0.5, 1.0, 1.5, 2.0])),
                "mem_mb": int(rng.choice([1024, 2048])),
                "speed": float(rng.choice([0.5, 1.0, 1.5])),
            }
        )
        links.append(
            {
                "ends": [f"h{i}", f"s{int(rng.integers(n_sw))}"],
                "bw_mbps": float(rng.choice([100, 1000])),
            }
        )
    topo = parse_topology(
        {"name": "random", "switches": switches, "nodes": nodes, "links": links},
        "<random instance>",
    )
    cluster = background_load(Cluster.from_topology(topo), rng, background)
    dist = JobDistribution(
        max_workers=max_workers, cpu_choices=(0.25, 0.5, 1.0), mem_choices=(256.0, 512.0)
    )
    return cluster, random_job(rng, "job", dist)
