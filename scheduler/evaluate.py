"""The benchmark harness: compare scheduling algorithms on one topology over several seeds.

    python -m scheduler.evaluate --topo campus --jobs workloads/jobs --algos all --seeds 5 \
        --out results/runs/eval_campus.json [--machines pai_machine_spec.csv] [--background 0.5]
    python -m scheduler.evaluate --mode multi --topo campus --arrivals poisson:n=500,load=0.8

Single mode (below); multi mode runs every queue policy of `multi.py` on arrivals of
`arrivals.py` in the simulator (`evaluate_multi`). Both report mean and std over seeds
(`mean_std`) and the machine measured on (`machine_info`), as every benchmark does.


An *instance* is the topology, made non-trivial per seed s (rng = numpy default_rng(s)):
  1. with --machines, node capacities sampled from the Alibaba machine table
     (`trace.apply_machine_spec`);
  2. background load at level L (--background, default 0.5): every online node gets a
     pre-placed background task using U(0, L) of its cpu and of its memory, and as many
     background flows as there are compute nodes, each between two random nodes on the shortest
     path, reserving U(0, L) of that path's residual (`instances.background_load`).
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
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from topologies import TopologyError, load_topology

from .arrivals import ArrivalSpec, make_scenario, parse_arrivals
from .baselines import algorithm_names, make_algorithm
from .instances import make_instance
from .jobs import JobError, load_jobs
from .metrics import cluster_metrics, decision_metrics, deployed_count, packable
from .model import CannotPlace, Cluster, Job
from .multi import MultiConfig, default_algorithm, make_policy, policy_names
from .simulator import SimResult, Simulator
from .trace import load_machine_spec

JOB_METRICS = (
    "iteration_time_s",
    "job_completion_s",
    "bw_satisfaction",
    "flows_satisfied",
    "network_cost",
    "decision_ms",
)
CLUSTER_METRICS = (
    "balance_std",
    "balance_max_mean",
    "fragmentation",
    "load_variance",
    "gpu_load_variance",
)
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
    return {
        "cpu_model": model or platform.processor(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }  # other work sharing the cores


def mean_std(values: list) -> dict[str, float | None]:
    """Mean and population std over seeds of the values that are numbers (None and NaN left
    out); both None when there are none. The one summary every benchmark reports."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return {"mean": None, "std": None}
    return {"mean": statistics.fmean(xs), "std": statistics.pstdev(xs)}


# --- single mode: jobs placed one after another ----------------------------------------------------
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


def evaluate(
    topo: str,
    jobs: list[Job],
    algos: list[str],
    seeds: int,
    background: float = 0.5,
    machines: list | None = None,
    explicit: bool = False,
) -> dict[str, Any]:
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
                raise EvaluationError(
                    f"algorithm {name}: the instance is too large for it "
                    f"({len(topology.nodes)} nodes, up to "
                    f"{max(len(j.tasks) for j in jobs)} tasks per job)"
                )
        except (FileNotFoundError, ImportError, EvaluationError) as e:
            if explicit:
                raise EvaluationError(str(e)) from None
            skipped[name] = str(e)
            continue
        except ValueError as e:  # unknown name or path rule
            raise EvaluationError(str(e)) from None
        rows = [
            run_sequence(inst, jobs, make_algorithm(name, seed=s))
            for s, inst in enumerate(instances)
        ]
        keys = JOB_METRICS + CLUSTER_METRICS + RUN_METRICS
        results[name] = {k: mean_std([r[k] for r in rows]) for k in keys}
    return {
        "algorithms": results,
        "skipped": skipped,
        "instance": {
            "topology": topo,
            "nodes": len(topology.nodes),
            "switches": len(topology.switches),
            "links": len(topology.links),
            "jobs": [j.name for j in jobs],
            "seeds": seeds,
            "background": background,
            "machines": bool(machines),
        },
        "machine": machine_info(),
    }


def print_table(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cols = {
        "iteration_time_s": "iter s",
        "bw_satisfaction": "bw sat",
        "balance_std": "bal std",
        "network_cost": "net cost",
        "fragmentation": "frag",
        "deployed_count": "deployed",
        "decision_ms": "decide ms",
        "placed_fraction": "placed",
    }
    inst = doc["instance"]
    table = Table(
        title=f"{inst['topology']}: {len(inst['jobs'])} jobs, {inst['seeds']} seeds, "
        f"background {inst['background']} (mean ± std over seeds)"
    )
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


# --- multi mode: queue policies in the simulator ---------------------------------------------------
MULTI_METRICS = (
    "avg_wait_s",
    "p95_wait_s",
    "max_wait_s",
    "jct_s",
    "bw_satisfaction",
    "balance_std",
    "balance_std_arrivals",
    "balance_std_queued",
    "queued_share",
    "fairness",
    "deadline_hit_rate",
    "utilisation",
    "finished",
    "unfinished",
    "preemptions",
    "decision_ms",
    "events_per_s",
    "deadline_satisfaction",
    "migrations_per_job",
)


def run_policy(
    name: str,
    cluster: Cluster,
    spec: ArrivalSpec,
    seed: int,
    algorithm: str | None = None,
    config: MultiConfig = MultiConfig(),
) -> dict:
    """One simulated run of a queue policy on a scenario; its `SimResult.summary()` and the
    schedule's digest."""
    scenario = make_scenario(spec, cluster, seed)
    policy = make_policy(name, algorithm, seed, config)
    result = Simulator(cluster.copy(), policy).run(scenario.jobs, scenario.events)
    return result.summary() | {"schedule_digest": schedule_digest(result)}


def schedule_digest(result: SimResult) -> str:
    """A fingerprint of the schedule (who started when, where): equal runs give equal digests."""
    return hashlib.sha256(repr(result.starts).encode()).hexdigest()[:16]


def evaluate_multi(args: argparse.Namespace) -> dict:
    """The `--mode multi` evaluation: every policy in `args.algos` ("all" or comma-separated) on
    `args.topo` (any spec the topology loader takes) under `args.arrivals` (a spec string of
    `arrivals.parse_arrivals`) for seeds 0..args.seeds-1; metrics as mean and std over seeds.
    Optional: `args.single` (the single-job algorithm of every policy; default CES-Multi's),
    `args.config` (CES-Multi's `MultiConfig`; default the defaults).
    Raises ValueError (incl. TopologyError, ArrivalError) on bad input."""
    topo = load_topology(args.topo)
    cluster = Cluster.from_topology(topo)
    spec = parse_arrivals(args.arrivals)
    try:
        names = policy_names(args.algos)
    except ValueError as e:
        raise ValueError(f"--algos: {e}") from None
    if args.seeds < 1:
        raise ValueError(f"--seeds must be ≥ 1, got {args.seeds}")
    single = getattr(args, "single", None) or default_algorithm()
    config = getattr(args, "config", None) or MultiConfig()
    out: dict = {
        "mode": "multi",
        "topology": topo.name,
        "nodes": len(topo.nodes),
        "arrivals": asdict(spec),
        "single_job_algorithm": single,
        "seeds": args.seeds,
        "ces_multi_config": asdict(config),
        "machine": machine_info(),
        "algorithms": {},
    }
    with RunProgress(len(names) * args.seeds) as progress:
        for name in names:
            runs = []
            for seed in range(args.seeds):
                progress.start(f"{topo.name}: {name}, seed {seed + 1}/{args.seeds}")
                runs.append(run_policy(name, cluster, spec, seed, single, config))
            out["algorithms"][name] = {m: mean_std([r[m] for r in runs]) for m in MULTI_METRICS}
    return out


class RunProgress:
    """Which run of a long evaluation is under way, on stderr: a rich progress bar on a terminal,
    a line per run (with the previous one's time) in a log."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import Progress, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.bar = (
            Progress(
                *Progress.get_default_columns(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            if self.console.is_terminal
            else None
        )
        self.total, self.done, self.since = total, -1, time.perf_counter()

    def __enter__(self) -> RunProgress:
        if self.bar:
            self.bar.start()
            self.task = self.bar.add_task("", total=self.total)
        return self

    def start(self, what: str) -> None:
        """Run number done + 1 begins: `what` names it (topology, policy, seed)."""
        self.done += 1
        if self.bar:
            self.bar.update(self.task, completed=self.done, description=what)
        else:
            took = f" (last {time.perf_counter() - self.since:.0f} s)" if self.done else ""
            print(f"[{self.done + 1}/{self.total}] {what}{took}", file=sys.stderr, flush=True)
        self.since = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.bar:
            self.bar.stop()


def multi_table(result: dict) -> str:
    """A readable table of `evaluate_multi`'s result."""
    cols = [
        ("avg_wait_s", "avg wait s"),
        ("p95_wait_s", "p95 wait s"),
        ("max_wait_s", "max wait s"),
        ("jct_s", "JCT s"),
        ("bw_satisfaction", "bw sat"),
        ("balance_std", "util std"),
        ("balance_std_arrivals", "std arriving"),
        ("balance_std_queued", "std queued"),
        ("queued_share", "queued"),
        ("fairness", "Jain"),
        ("deadline_hit_rate", "deadline hit"),
        ("migrations_per_job", "migr/job"),
    ]
    head = f"{'policy':<14}" + "".join(f"{h:>14}" for _, h in cols)
    lines = [
        f"{result['topology']} ({result['nodes']} nodes), {result['arrivals']['n']} jobs, "
        f"{result['seeds']} seeds, single-job algorithm {result['single_job_algorithm']}",
        head,
        "-" * len(head),
    ]
    for name, m in result["algorithms"].items():
        cells = []
        for key, _ in cols:
            v = m[key]["mean"]
            cells.append(
                f"{'-':>14}"
                if v is None
                else f"{v:>14.0f}"
                if key.endswith("_s")
                else f"{v:>14.3f}"
            )
        lines.append(f"{name:<14}" + "".join(cells))
    return "\n".join(lines)


# --- the command line ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scheduler.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--topo",
        required=True,
        help="topology name, .yaml/.gml/.graphml, topohub key or gen:internet:N",
    )
    ap.add_argument(
        "--mode",
        choices=("single", "multi"),
        default="single",
        help="single: place --jobs one after another; multi: queue scheduling of "
        "--arrivals in the simulator (evaluate_multi)",
    )
    ap.add_argument("--jobs", help="job YAML file or folder (single mode)")
    ap.add_argument(
        "--arrivals",
        default="poisson:n=500,load=0.8",
        help="multi mode: PROCESS[:key=value,...] (scheduler.arrivals)",
    )
    ap.add_argument(
        "--single",
        help="multi mode: the single-job algorithm of every queue policy "
        "(default: CES-Multi's, ces-ppo once trained)",
    )
    ap.add_argument(
        "--algos", default="all", help="'all' or comma-separated names (NAME or NAME:PATH_RULE)"
    )
    ap.add_argument("--seeds", type=int, default=5, help="number of seeds (instances), ≥ 1")
    ap.add_argument("--out", help="write the JSON here")
    ap.add_argument("--machines", help="Alibaba machine-spec CSV to sample node capacities from")
    ap.add_argument(
        "--background",
        type=float,
        default=0.5,
        help="background load level in [0, 1) (default 0.5)",
    )
    args = ap.parse_args(argv)
    if args.mode == "multi":
        return _main_multi(args)
    try:
        if args.jobs is None:
            raise EvaluationError("--jobs: required in single mode (a job YAML file or folder)")
        if args.seeds < 1:
            raise EvaluationError(f"--seeds: expected an integer ≥ 1, got {args.seeds}")
        if not 0 <= args.background < 1:
            raise EvaluationError(
                f"--background: expected a number in [0, 1), got {args.background}"
            )
        jobs = load_jobs(args.jobs)
        machines = load_machine_spec(args.machines) if args.machines else None
        explicit = args.algos != "all"
        algos = (
            algorithm_names()
            if not explicit
            else [a.strip() for a in args.algos.split(",") if a.strip()]
        )
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
