#!/usr/bin/env python3
"""Scheduler core figures: decision latency and each baseline's gap to the exact reference.

    python experiments/bench_scheduler.py --seed 0      # → results/bench_scheduler.{json,png}

1. Decision latency: wall time of `place()` for an 8-task ring job (0.5 cpu, 512 MB per task,
   10 M parameters, 100 Mbit/s per flow) on `gen:internet:N:SEED` topologies (N = 16, 100, 1000
   routers, one compute node each, 4 cores) with background load 0.5 (`scheduler.evaluate`);
   p50/p99 over --reps placements per algorithm (one warm-up call first). The exact reference
   runs where it applies by size (≤ 16 nodes, here with max_tasks raised to 8), with fewer reps.
2. Gap to optimal: on --instances random small instances (`instances.random_instance`: ≤ 5
   switches, ≤ 6 nodes, ≤ 5 workers, background 0.5) where a placement exists, each baseline's
   predicted iteration time / the exact reference's (exact with enough candidate paths to cover
   every loop-free path, proven optimal). A baseline that cannot place is counted, not averaged.
Reproducible with --seed (placements and instances; wall times are this machine's).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

from experiments.common import RESULTS, RING8, Stopwatch, percentile
from scheduler.baselines import algorithm_names, make_algorithm
from scheduler.evaluate import machine_info
from scheduler.instances import make_instance, random_instance
from scheduler.metrics import predicted_iteration_s
from scheduler.model import CannotPlace, Cluster
from topologies import load_topology

BASELINES = ["random", "first-fit", "best-fit", "utilization", "k8s-spread", "network-aware"]


def buildable(names: list[str]) -> tuple[list[str], dict[str, str]]:
    ok, skipped = [], {}
    for name in names:
        try:
            make_algorithm(name)
            ok.append(name)
        except (FileNotFoundError, ImportError) as e:
            skipped[name] = str(e)
    return ok, skipped


def latency(sizes: list[int], reps: int, seed: int, names: list[str]) -> dict:
    out: dict = {}
    for n in sizes:
        topo = f"gen:internet:{n}:{seed}"
        cluster = make_instance(Cluster.from_topology(load_topology(topo)), seed, 0.5)
        row: dict = {}
        for name in names + ["exact"]:
            kw, runs = {}, reps
            if name == "exact":
                kw = {"max_tasks": len(RING8.tasks), "time_limit_s": 120}
                if not make_algorithm(name, **kw).applies(cluster, RING8):
                    continue
                runs = max(3, reps // 10)
            else:
                make_algorithm(name, seed=seed).place(cluster, RING8)  # warm-up
            watch, iters = Stopwatch(), []
            for r in range(runs):
                algo = make_algorithm(name, seed=seed + r, **kw)
                with watch:
                    try:
                        d = algo.place(cluster, RING8)
                        iters.append(predicted_iteration_s(cluster, RING8, d))
                    except CannotPlace:
                        pass
            row[name] = watch.latency() | {
                "mean_ms": statistics.fmean(watch.wall_ms),
                "reps": runs,
                "placed": len(iters) / runs,
                "iteration_time_s": statistics.fmean(iters) if iters else None,
            }
            print(
                f"  {topo:>22} {name:>14}: p50 {row[name]['p50_ms']:9.2f} ms   "
                f"p99 {row[name]['p99_ms']:9.2f} ms",
                flush=True,
            )
        out[str(n)] = {
            "topology": topo,
            "nodes": len(cluster.compute_nodes()),
            "vertices": cluster.graph.number_of_nodes(),
            "algorithms": row,
        }
    return out


def gap(instances: int, seed: int, names: list[str]) -> dict:
    rng = np.random.default_rng(seed)
    exact = make_algorithm("exact", max_paths=64, time_limit_s=300)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    failed = dict.fromkeys(names, 0)
    tried = unplaceable = 0
    exact_ms: list[float] = []
    while len(exact_ms) < instances:
        tried += 1
        cluster, job = random_instance(rng, max_switches=5, max_nodes=6, max_workers=5)
        try:
            best = exact.place(cluster, job)
        except CannotPlace:
            unplaceable += 1
            continue
        if not exact.last_optimal:
            raise RuntimeError("exact timed out on a small instance; raise time_limit_s")
        exact_ms.append(best.decision_s * 1000)
        opt = predicted_iteration_s(cluster, job, best)
        for name in names:
            try:
                d = make_algorithm(name, seed=seed + tried).place(cluster, job)
            except CannotPlace:
                failed[name] += 1
                continue
            ratios[name].append(predicted_iteration_s(cluster, job, d) / opt)
    out = {}
    for name in names:
        r = ratios[name]
        out[name] = {
            "instances": len(r) + failed[name],
            "cannot_place": failed[name],
            "mean_ratio": statistics.fmean(r) if r else None,
            "median_ratio": statistics.median(r) if r else None,
            "p90_ratio": percentile(r, 90),
            "max_ratio": max(r) if r else None,
            "optimal_fraction": sum(x <= 1 + 1e-6 for x in r) / len(r) if r else None,
            "ratios": r,
        }
        print(
            f"  {name:>14}: mean {out[name]['mean_ratio']:.3f}  median "
            f"{out[name]['median_ratio']:.3f}  p90 {out[name]['p90_ratio']:.3f}  max "
            f"{out[name]['max_ratio']:.3f}  optimal {out[name]['optimal_fraction']:.0%}  "
            f"cannot place {failed[name]}",
            flush=True,
        )
    return {
        "algorithms": out,
        "instances_generated": tried,
        "unplaceable": unplaceable,
        "exact_decision_ms": {"p50": percentile(exact_ms, 50), "p99": percentile(exact_ms, 99)},
    }


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    sizes = list(doc["latency"])
    names = sorted({a for s in sizes for a in doc["latency"][s]["algorithms"]})
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j + i * width for j, s in enumerate(sizes) if name in doc["latency"][s]["algorithms"]]
        rows = [
            doc["latency"][s]["algorithms"][name]
            for s in sizes
            if name in doc["latency"][s]["algorithms"]
        ]
        ax1.bar(xs, [r["p50_ms"] for r in rows], width, label=name)
        ax1.scatter(xs, [r["p99_ms"] for r in rows], marker="_", color="black", s=60)
    ax1.set_xticks([j + 0.4 - width / 2 for j in range(len(sizes))], [f"{s} nodes" for s in sizes])
    ax1.set_yscale("log")
    ax1.set_ylabel("decision time, ms (bar p50, tick p99)")
    ax1.set_title("8-task ring job, gen:internet topologies")
    ax1.legend(fontsize=7)
    gaps = doc["gap"]["algorithms"]
    ax2.boxplot([gaps[n]["ratios"] for n in gaps], tick_labels=list(gaps), showfliers=True)
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set_yscale("log")
    ax2.set_ylabel("predicted iteration time / optimal")
    ax2.set_title(
        f"gap to exact on {doc['gap']['algorithms'][next(iter(gaps))]['instances']} small instances"
    )
    ax2.tick_params(axis="x", labelsize=7, rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=50, help="placements per algorithm and size")
    ap.add_argument("--sizes", default="16,100,1000", help="topology sizes (routers)")
    ap.add_argument("--instances", type=int, default=60, help="small instances for the gap")
    ap.add_argument("--out", default=str(RESULTS / "bench_scheduler.json"))
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        if args.reps < 1 or args.instances < 1 or any(s < 2 for s in sizes):
            raise ValueError
    except ValueError:
        print(
            "error: --reps and --instances must be ≥ 1 and --sizes a comma-separated list of "
            "integers ≥ 2",
            file=sys.stderr,
        )
        return 2
    names, skipped = buildable([n for n in algorithm_names() if n != "exact"])
    print(f"decision latency ({args.reps} reps):", flush=True)
    doc = {
        "machine": machine_info(),
        "seed": args.seed,
        "command": " ".join(sys.argv),
        "skipped": skipped,
        "latency": latency(sizes, args.reps, args.seed, names),
    }
    print(f"gap to exact ({args.instances} instances):", flush=True)
    doc["gap"] = gap(
        args.instances,
        args.seed,
        [n for n in names if n in BASELINES] + [n for n in names if n not in BASELINES],
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot(doc, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
