#!/usr/bin/env python3
"""eade-ddpg (seed 004's ideas in CES, `scheduler/eade/ces.py`) against ces-ppo, issue 23.

    nice -n 19 python experiments/bench_eade.py --seeds 5     # → results/eade/ces.json

Both learned algorithms train only on random networks; every topology here is held out: our
`campus` and the topohub networks `topozoo/Abilene`, `sndlib/polska` and `gabriel/100/0`.
1. Per topology, `scheduler.evaluate.evaluate` with eade-ddpg, ces-ppo and the heuristics EADE
   learns from and is judged against (network-aware, its expert; k8s-spread, the balance
   yardstick) over --seeds instances (background load 0.5); the jobs are workloads/jobs plus
   --random-jobs `instances.random_job` jobs (seeded), placed one after another. Mean ± std over
   seeds of predicted iteration time, load-balance std, placed fraction and decision time; and
   eade-ddpg's mean iteration time over ces-ppo's on the jobs both placed (per seed, then mean ±
   std: `eade_vs_ces_ppo_iteration`, < 1: eade-ddpg faster) — a mean over each algorithm's own
   placed jobs favours the one that fails on the slow jobs.
2. Decision latency of both: bench_ppo's (`place()` of an 8-task ring job on `gabriel/100/0`,
   background 0.5, warm and cold, p50/p99 wall and CPU ms over --reps calls).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import os
import sys
import time
from pathlib import Path

from experiments.bench_ppo import TOPOLOGIES, _pairwise, benchmark_jobs, job_times, latency
from experiments.common import RESULTS
from scheduler.baselines import make_algorithm
from scheduler.eade.ces import CHECKPOINT
from scheduler.evaluate import evaluate, machine_info, mean_std
from scheduler.ppo import CHECKPOINT as PPO_CHECKPOINT

ALGOS = ["eade-ddpg", "ces-ppo", "network-aware", "k8s-spread"]
FIGURES = ("iteration_time_s", "balance_std", "placed_fraction", "decision_ms")


def compare(topo: str, jobs: list, seeds: int) -> dict:
    doc = evaluate(topo, jobs, ALGOS, seeds, background=0.5, explicit=True)
    rows = {name: {k: r[k] for k in FIGURES} for name, r in doc["algorithms"].items()}
    times = job_times(
        topo, jobs, seeds, {n: (lambda s, n=n: make_algorithm(n, seed=s)) for n in ALGOS}
    )
    return {
        "algorithms": rows,
        "eade_vs_ces_ppo_iteration": mean_std(
            [_pairwise(t, "eade-ddpg", "ces-ppo") for t in times]
        ),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="random jobs and the latency instance")
    ap.add_argument("--random-jobs", type=int, default=10)
    ap.add_argument("--reps", type=int, default=50, help="latency repetitions")
    ap.add_argument("--topos", default=",".join(TOPOLOGIES), help="comma-separated topologies")
    ap.add_argument("--out", type=Path, default=RESULTS / "eade" / "ces.json")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.reps < 1 or args.random_jobs < 0:
        ap.error("--seeds and --reps must be ≥ 1, --random-jobs ≥ 0")
    for path, how in (
        (CHECKPOINT, "python -m scheduler.eade.ces"),
        (PPO_CHECKPOINT, "python -m scheduler.train_ppo"),
    ):
        if not path.exists():
            print(f"error: {path} missing (train it: {how})", file=sys.stderr)
            return 2
    import torch

    torch.set_num_threads(1)
    jobs = benchmark_jobs(args.seed, args.random_jobs)
    t0 = time.time()
    doc = {
        "seeds": args.seeds,
        "seed": args.seed,
        "jobs": [j.name for j in jobs],
        "comparison": {},
        "machine": machine_info(),
    }
    for topo in [t.strip() for t in args.topos.split(",") if t.strip()]:
        doc["comparison"][topo] = compare(topo, jobs, args.seeds)
        print(f"{topo}: " + json.dumps(doc["comparison"][topo]), flush=True)
    doc["latency"] = {
        name: latency(args.reps, args.seed, name) for name in ("eade-ddpg", "ces-ppo")
    }
    print("latency: " + json.dumps(doc["latency"]), flush=True)
    doc["machine"]["loadavg_after"] = os.getloadavg()
    doc["seconds"] = time.time() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    _table(doc)
    return 0


def _table(doc: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    for topo, res in doc["comparison"].items():
        r = res["eade_vs_ces_ppo_iteration"]
        t = Table(
            title=f"{topo} ({doc['seeds']} seeds); eade-ddpg / ces-ppo iteration time on "
            f"jobs both placed: {r['mean']:.3f} ± {r['std']:.3f}"
            if r["mean"] is not None
            else topo
        )
        t.add_column("algorithm")
        for k in FIGURES:
            t.add_column(k, justify="right")
        for name, row in res["algorithms"].items():
            t.add_row(
                name,
                *(
                    "—" if row[k]["mean"] is None else f"{row[k]['mean']:.4g} ± {row[k]['std']:.2g}"
                    for k in FIGURES
                ),
            )
        console.print(t)
    console.print("latency: " + json.dumps(doc["latency"]))


if __name__ == "__main__":
    sys.exit(main())
