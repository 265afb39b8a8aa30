#!/usr/bin/env python3
"""Simulator speed: simulated job events per second, 1000 jobs on a 100-node topology.

    python experiments/bench_simulator.py --seed 0      # → results/bench_simulator.json

The scenario: `gen:internet:100:SEED` (100 routers, one 4-core edge node each), --jobs jobs of
`arrivals.JobMix` arriving as a Poisson process at nominal load --load (`arrivals`), plus
seed 001's tidal availability (nodes leaving and joining) and background flows (max-min shared),
scheduled by the fifo-backfill queue policy with each single-job algorithm of --algos. A *job
event* is an arrival, a start, a completion, a failure or a re-queue. Two rates per algorithm:
  end-to-end  events / wall time of `Simulator.run` (includes the algorithm's decisions);
  simulator   events / (wall time - the algorithm's decision time): the simulator's own speed —
              event handling, queue rounds, max-min sharing, progress, metrics.
The target (issue 5) is ≥ 1000 events/s. Reproducible with --seed (wall times are this
machine's; the JSON states it).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import sys
import time
from pathlib import Path

from experiments.common import RESULTS
from scheduler.arrivals import make_scenario, parse_arrivals
from scheduler.evaluate import machine_info
from scheduler.model import Cluster
from scheduler.multi import make_policy
from scheduler.simulator import Simulator
from topologies import load_topology

TARGET = 1000.0


def bench(algo: str, cluster: Cluster, scenario, seed: int) -> dict:
    policy = make_policy("fifo-backfill", algo, seed)
    start = time.perf_counter()
    result = Simulator(cluster.copy(), policy).run(scenario.jobs, scenario.events)
    wall = time.perf_counter() - start
    decide = sum(sum(js.decision_s) for js in result.jobs)
    summary = result.summary()
    return {
        "algorithm": algo,
        "job_events": result.job_events,
        "wall_s": wall,
        "decision_s": decide,
        "placements": sum(len(js.decision_s) for js in result.jobs),
        "end_to_end_events_per_s": result.job_events / wall,
        "simulator_events_per_s": result.job_events / max(wall - decide, 1e-9),
        "simulated_s": result.end_time,
        "finished": summary["finished"],
        "avg_wait_s": summary["avg_wait_s"],
        "utilisation": summary["utilisation"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--load", type=float, default=0.3, help="nominal offered cpu load")
    ap.add_argument("--algos", default="first-fit,network-aware")
    ap.add_argument("--out", default=str(RESULTS / "bench_simulator.json"))
    args = ap.parse_args(argv)
    if args.jobs < 1 or args.nodes < 2 or args.load <= 0:
        print(
            "bench_simulator: --jobs ≥ 1, --nodes ≥ 2 and --load > 0 are required", file=sys.stderr
        )
        return 2
    topo = load_topology(f"gen:internet:{args.nodes}:{args.seed}")
    cluster = Cluster.from_topology(topo)
    spec = parse_arrivals(f"poisson:n={args.jobs},load={args.load},tidal=1,background=60")
    scenario = make_scenario(spec, cluster, args.seed)
    rows = [bench(a.strip(), cluster, scenario, args.seed) for a in args.algos.split(",")]
    out = {
        "topology": topo.source,
        "nodes": len(topo.nodes),
        "jobs": args.jobs,
        "arrivals": f"poisson:n={args.jobs},load={args.load},tidal=1,background=60",
        "scenario_events": len(scenario.events),
        "seed": args.seed,
        "target_events_per_s": TARGET,
        "machine": machine_info(),
        "runs": rows,
    }
    print(
        f"{topo.source}: {len(topo.nodes)} nodes, {args.jobs} jobs, "
        f"{len(scenario.events)} node/background events, seed {args.seed}"
    )
    print(
        f"{'algorithm':<15}{'events':>8}{'wall s':>9}{'decide s':>10}{'e2e ev/s':>10}"
        f"{'sim ev/s':>10}{'finished':>10}"
    )
    for r in rows:
        print(
            f"{r['algorithm']:<15}{r['job_events']:>8}{r['wall_s']:>9.2f}{r['decision_s']:>10.2f}"
            f"{r['end_to_end_events_per_s']:>10.0f}{r['simulator_events_per_s']:>10.0f}"
            f"{r['finished']:>10.0f}"
        )
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
