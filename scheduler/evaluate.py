"""Compare scheduling algorithms on one topology and a set of jobs, over several seeds.

    python -m scheduler.evaluate --topo campus --jobs workloads/jobs --algos all --seeds 5 \
        --out results/eval_campus.json [--machines pai_machine_spec.csv] [--background 0.5]

An *instance* is the topology, made non-trivial per seed s (rng = numpy default_rng(s)):
  1. with --machines, node capacities sampled from the Alibaba machine table
     (`jobs.apply_machine_spec`);
  2. background load at level L (--background, default 0.5): every online node gets a
     pre-placed background task using U(0, L) of its cpu and of its memory, and as many
     background flows as there are compute nodes, each between two random nodes on the shortest
     path, reserving U(0, L) of that path's residual (`background_load`).
Every algorithm then places the jobs one after another, in file order, on its own copy of the same
instance: a placed job is allocated, so later jobs see earlier ones; a job that does not fit is a
"cannot place" and is skipped. Per seed: the per-job metrics (`metrics.DecisionMetrics`) averaged
over the placed jobs, the cluster metrics after the last job, the placed fraction of jobs and
seed 004's deployed count. The JSON holds, per algorithm and metric, mean and std (population)
over the seeds (null when no seed placed a job); its "algorithms" part is stable for scripts.
Exit code 2 with a one-line message on bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from topologies import TopologyError, load_topology, parse_topology

from .baselines import algorithm_names, make_algorithm
from .jobs import JobDistribution, JobError, apply_machine_spec, load_jobs, load_machine_spec, \
    random_job
from .metrics import cluster_metrics, decision_metrics, deployed_count, packable
from .model import CannotPlace, Cluster, Decision, FlowAssignment, Job, LogicalFlow, Resources, Task
from .paths import NoPath, shortest_path

JOB_METRICS = ("iteration_time_s", "job_completion_s", "bw_satisfaction", "flows_satisfied",
               "network_cost", "decision_ms")
CLUSTER_METRICS = ("balance_std", "balance_max_mean", "fragmentation", "load_variance",
                   "gpu_load_variance")
RUN_METRICS = ("placed_fraction", "deployed_count")


class EvaluationError(ValueError):
    """Bad input to the evaluation (unknown algorithm, bad option)."""


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": model or platform.processor(), "cores": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_average_1m": round(os.getloadavg()[0], 2)}  # other work sharing the cores


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
        job = Job(f"bg-flow-{i}", [Task("a", Resources()), Task("b", Resources())],
                  [LogicalFlow("a", "b", rate, 0.0)], collective="custom")
        out.allocate(job, Decision(job.name, {"a": a, "b": b},
                                   [FlowAssignment("a", "b", path, rate)]))
    return out


def make_instance(base: Cluster, seed: int, background: float,
                  machines: list | None = None) -> Cluster:
    rng = np.random.default_rng(seed)
    cluster = apply_machine_spec(base, machines, rng) if machines else base
    return background_load(cluster, rng, background)


def random_instance(rng: np.random.Generator, max_switches: int = 4, max_nodes: int = 5,
                    max_workers: int = 4, background: float = 0.5) -> tuple[Cluster, Job]:
    """A small random instance (the exact reference's playground, also used by the tests):
    2..max_switches switches joined by a random tree plus each other pair with probability 0.3
    (parallel paths), 2..max_nodes compute nodes on random switches (cpu 0.5-2, mem 1-2 GB,
    speed 0.5-1.5), switch links of 10-1000 Mbit/s and 0-2 ms, access links of 100 or 1000
    Mbit/s; background load at `background`; and one `jobs.random_job` of up to `max_workers`
    workers with tasks of 0.25-1 cpu."""
    n_sw = int(rng.integers(2, max_switches + 1))
    n_nodes = int(rng.integers(2, max_nodes + 1))
    switches = [{"name": f"s{i}"} for i in range(n_sw)]
    pairs = {(int(rng.integers(i)), i) for i in range(1, n_sw)}
    pairs |= {(i, j) for i in range(n_sw) for j in range(i + 1, n_sw) if rng.random() < 0.3}
    links = [{"ends": [f"s{i}", f"s{j}"], "bw_mbps": float(rng.choice([10, 50, 100, 200, 1000])),
              "delay_ms": round(float(rng.uniform(0, 2)), 2)} for i, j in sorted(pairs)]
    nodes = []
    for i in range(n_nodes):
        nodes.append({"name": f"h{i}", "cpu": float(rng.choice([0.5, 1.0, 1.5, 2.0])),
                      "mem_mb": int(rng.choice([1024, 2048])),
                      "speed": float(rng.choice([0.5, 1.0, 1.5]))})
        links.append({"ends": [f"h{i}", f"s{int(rng.integers(n_sw))}"],
                      "bw_mbps": float(rng.choice([100, 1000]))})
    topo = parse_topology({"name": "random", "switches": switches, "nodes": nodes,
                           "links": links}, "<random instance>")
    cluster = background_load(Cluster.from_topology(topo), rng, background)
    dist = JobDistribution(max_workers=max_workers, cpu_choices=(0.25, 0.5, 1.0),
                           mem_choices=(256.0, 512.0))
    return cluster, random_job(rng, "job", dist)


def _finite_mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else math.nan


def run_sequence(cluster: Cluster, jobs: list[Job], algo) -> dict[str, float]:
    """One algorithm, one instance: place the jobs in order; the per-seed figures (per-job
    metrics averaged over the placed jobs, NaN ones such as the completion time of a job without
    an iteration count left out; decision time over every attempt, rejections included)."""
    cluster = cluster.copy()
    per_job: dict[str, list[float]] = {m: [] for m in JOB_METRICS}
    placed = placed_tasks = rejected_ok = 0
    for job in jobs:
        start = time.perf_counter()
        try:
            decision = algo.place(cluster, job)
        except CannotPlace:
            per_job["decision_ms"].append((time.perf_counter() - start) * 1000)
            if packable(cluster, job) is False:
                rejected_ok += len(job.tasks)
            continue
        m = decision_metrics(cluster, job, decision).as_dict()
        for key in JOB_METRICS:
            per_job[key].append(m[key])
        cluster.allocate(job, decision)
        placed += 1
        placed_tasks += len(job.tasks)
    row = {k: _finite_mean(v) for k, v in per_job.items()}
    row.update(cluster_metrics(cluster).as_dict())
    row["placed_fraction"] = placed / len(jobs)
    row["deployed_count"] = deployed_count(placed_tasks, rejected_ok)
    return row


def _stats(values: list[float]) -> dict[str, float | None]:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"mean": None, "std": None}
    return {"mean": statistics.fmean(finite), "std": statistics.pstdev(finite)}


def evaluate(topo: str, jobs: list[Job], algos: list[str], seeds: int, background: float = 0.5,
             machines: list | None = None, explicit: bool = False) -> dict[str, Any]:
    """The comparison as the JSON document `main` writes. Algorithms that do not apply to the
    instance (size) or cannot be built (e.g. no checkpoint) are skipped with the reason, unless
    `explicit` (they were asked for by name): then the error propagates."""
    topology = load_topology(topo)
    base = Cluster.from_topology(topology)
    instances = [make_instance(base, s, background, machines) for s in range(seeds)]
    results: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in algos:
        try:
            probe = make_algorithm(name, seed=0)
            applies = getattr(probe, "applies", None)
            if applies and not all(applies(instances[0], j) for j in jobs):
                raise EvaluationError(f"algorithm {name}: the instance is too large for it "
                                      f"({len(topology.nodes)} nodes, up to "
                                      f"{max(len(j.tasks) for j in jobs)} tasks per job)")
        except (FileNotFoundError, ImportError, EvaluationError) as e:
            if explicit:
                raise EvaluationError(str(e)) from None
            skipped[name] = str(e)
            continue
        except ValueError as e:  # unknown name or path rule
            raise EvaluationError(str(e)) from None
        rows = [run_sequence(inst, jobs, make_algorithm(name, seed=s))
                for s, inst in enumerate(instances)]
        keys = JOB_METRICS + CLUSTER_METRICS + RUN_METRICS
        results[name] = {k: _stats([r[k] for r in rows]) for k in keys}
    return {"algorithms": results, "skipped": skipped,
            "instance": {"topology": topo, "nodes": len(topology.nodes),
                         "switches": len(topology.switches), "links": len(topology.links),
                         "jobs": [j.name for j in jobs], "seeds": seeds,
                         "background": background, "machines": bool(machines)},
            "machine": machine_info()}


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = {"iteration_time_s": "iter s", "bw_satisfaction": "bw sat", "balance_std": "bal std",
            "network_cost": "net cost", "fragmentation": "frag", "deployed_count": "deployed",
            "decision_ms": "decide ms", "placed_fraction": "placed"}
    inst = doc["instance"]
    table = Table(title=f"{inst['topology']}: {len(inst['jobs'])} jobs, {inst['seeds']} seeds, "
                        f"background {inst['background']} (mean ± std over seeds)")
    table.add_column("algorithm", no_wrap=True)
    for title in cols.values():
        table.add_column(title, justify="right", no_wrap=True)
    for name, row in doc["algorithms"].items():
        cells = []
        for c in cols:
            m, s = row[c]["mean"], row[c]["std"]
            cells.append("—" if m is None else f"{m:.3g} ± {s:.2g}")
        table.add_row(name, *cells)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    for name, why in doc["skipped"].items():
        console.print(f"skipped {name}: {why}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scheduler.evaluate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topo", required=True, help="topology name, .yaml/.gml/.graphml, "
                    "topohub key or gen:internet:N")
    ap.add_argument("--mode", choices=("single", "multi"), default="single",
                    help="single: place --jobs one after another; multi: queue scheduling of "
                    "--arrivals in the simulator (scheduler.multi.evaluate_multi)")
    ap.add_argument("--jobs", help="job YAML file or folder (single mode)")
    ap.add_argument("--arrivals", default="poisson:n=500,load=0.8",
                    help="multi mode: PROCESS[:key=value,...] (scheduler.arrivals)")
    ap.add_argument("--single", help="multi mode: the single-job algorithm of every queue policy "
                    "(default: CES-Multi's, ces-ppo once trained)")
    ap.add_argument("--algos", default="all", help="'all' or comma-separated names "
                    "(NAME or NAME:PATH_RULE)")
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (instances), ≥ 1")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--machines", help="Alibaba machine-spec CSV to sample node capacities from")
    ap.add_argument("--background", type=float, default=0.5,
                    help="background load level in [0, 1) (default 0.5)")
    args = ap.parse_args(argv)
    if args.mode == "multi":
        return _main_multi(args)
    try:
        if args.jobs is None:
            raise EvaluationError("--jobs: required in single mode (a job YAML file or folder)")
        if args.seeds < 1:
            raise EvaluationError(f"--seeds: expected an integer ≥ 1, got {args.seeds}")
        if not 0 <= args.background < 1:
            raise EvaluationError(f"--background: expected a number in [0, 1), "
                                  f"got {args.background}")
        jobs = load_jobs(args.jobs)
        machines = load_machine_spec(args.machines) if args.machines else None
        explicit = args.algos != "all"
        algos = algorithm_names() if not explicit else \
            [a.strip() for a in args.algos.split(",") if a.strip()]
        if not algos:
            raise EvaluationError("--algos: expected 'all' or a comma-separated list of names")
        doc = evaluate(args.topo, jobs, algos, args.seeds, args.background, machines, explicit)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=2) + "\n")
    except (TopologyError, JobError, EvaluationError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print_table(doc)
    return 0


def _main_multi(args: argparse.Namespace) -> int:
    from .multi import evaluate_multi, multi_table
    try:
        doc = evaluate_multi(args)
        if args.out:
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=2) + "\n")
    except (ValueError, OSError) as e:  # TopologyError, ArrivalError are ValueErrors
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(multi_table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
