#!/usr/bin/env python3
"""CES-PPO where the network decides (issue 20): jobs that no node can hold, on topologies
never used in training.

    python experiments/bench_spread.py --seeds 5        # → results/ppo/spread.{json,png}

Instances: per topology and seed s, the topology with its nodes' capacities sampled from the
Alibaba machine table (`trace.apply_machine_spec`) and background load 0.5
(`instances.make_instance`). Topologies: the topohub networks of `instances.HELD_OUT` (never
drawn in training) and generated Internet-like graphs of 100 and 1000 nodes (seeds training
does not draw).
Jobs: experiments/jobs/spread.yaml (a 16-GPU ResNet-50 ring, a parameter server with eight GPU
workers, an all-to-all of six 2-GPU BERT tasks) and --random-jobs jobs of
`instances.GPU_CLUSTER_JOBS` that no node of the instance holds (`instances.random_spread_jobs`). Every
algorithm places every job alone on the instance.
Figures:
  - per job placed by both, CES-PPO's predicted iteration time over each other algorithm's:
    geometric mean and worst, per topology and over all; and over the lower bound
    (`bounds.iteration_lower_bound`), for every algorithm;
  - jobs placed per algorithm;
  - balance: per topology, mean iteration time against the mean std of node utilisation after
    the job (`metrics.load_balance`): which algorithms no other beats on both (non-dominance);
  - decision latency, p50/p99: the 16-GPU ring on the 100-node graph, an 8-task ring on the
    1000-node one (torch on one thread, warm: the topology's routes known);
  - where the policy alone loses: on each job it places more than 10 % slower than
    network-aware (the issue's worst-job bound), its own greedy rollout begun on network-aware's
    first node and the best of those begun on its 64 highest-rated first nodes.
CES-PPO runs as the registry builds it (`ces-ppo`, its default decoding), as the policy alone
(`ces-ppo:greedy`: one greedy rollout, no comparison with network-aware) and with its own
decoding (`ces-ppo:own`: the default budget without network-aware's placement among the
candidates: what comparing with the heuristic adds); `network-aware/ces` is
network-aware's placement with CES's paths and rates (what the placement alone contributes).
The plot: per topology, CES-PPO's geometric-mean ratio to each other algorithm.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from experiments.common import REPO, RESULTS, Stopwatch
from scheduler.baselines import make_algorithm
from scheduler.bounds import iteration_lower_bound
from scheduler.compose import build
from scheduler.env import PlacementEpisode
from scheduler.evaluate import machine_info
from scheduler.instances import HELD_OUT, make_instance, random_spread_jobs
from scheduler.jobs import load_jobs, ring_job
from scheduler.metrics import load_balance, predicted_iteration_s
from scheduler.model import CannotPlace, Cluster, Job, Resources
from scheduler.ppo import CHECKPOINT, Agent, CesPPO, Policy, greedy_from, network_aware_first
from scheduler.trace import MACHINE_TABLE, load_machine_spec
from topologies import load_topology

JOBS = REPO / "experiments" / "jobs" / "spread.yaml"
# the 8-task ring timed on 1000 nodes: 1 GB tasks, 1000 Mbit/s per flow (common.RING8's are
# 512 MB and 100 Mbit/s)
WIDE_RING8 = ring_job("ring8", 8, Resources(0.5, 1024), 4e7, 1000.0, iterations=100)
GENERATED = ["gen:internet:100:7", "gen:internet:1000:7"]
BASELINES = ["network-aware", "k8s-spread", "first-fit", "best-fit", "utilization", "random"]
OURS = "ces-ppo"
TAIL = 1.10  # the bound on the worst job: the policy alone's jobs above it are diagnosed
TAIL_FIRST_NODES = 64  # its highest-rated first nodes rolled out on such a job


def algorithms(seed: int, checkpoint: Path) -> dict:
    algos = {
        OURS: CesPPO(seed=seed, checkpoint=checkpoint),
        f"{OURS}:greedy": CesPPO(seed=seed, checkpoint=checkpoint, decode_budget=0, compare=False),
        f"{OURS}:own": CesPPO(seed=seed, checkpoint=checkpoint, compare=False),
        "network-aware/ces": build("network-aware/ces", seed=seed),
    }
    return algos | {name: make_algorithm(name, seed=seed) for name in BASELINES}


def run_topology(
    topo: str, seeds: int, random_jobs: int, machines: list, checkpoint: Path
) -> list[dict]:
    """One row per (seed, job, algorithm): placed, iteration time, balance after, decision ms,
    and the job's lower bound on the instance."""
    base = Cluster.from_topology(load_topology(topo))
    rows = []
    for seed in range(seeds):
        cluster = make_instance(base, seed, 0.5, machines)
        rng = np.random.default_rng(1000 + seed)
        jobs = load_jobs(JOBS) + random_spread_jobs(rng, cluster, random_jobs)
        for job in jobs:
            bound = iteration_lower_bound(cluster, job)
            algos = algorithms(seed, checkpoint)
            for name, algo in algos.items():
                start = time.perf_counter()
                try:
                    d = algo.place(cluster, job)
                except CannotPlace:
                    rows.append(
                        {
                            "seed": seed,
                            "job": job.name,
                            "algorithm": name,
                            "placed": False,
                            "bound_s": bound,
                        }
                    )
                    continue
                ms = (time.perf_counter() - start) * 1000
                after = cluster.copy(share_graph=True)
                after.allocate(job, d)
                rows.append(
                    {
                        "seed": seed,
                        "job": job.name,
                        "algorithm": name,
                        "placed": True,
                        "iteration_s": predicted_iteration_s(cluster, job, d),
                        "balance_std": load_balance(after)[0],
                        "decision_ms": ms,
                        "nodes": len(set(d.placement.values())),
                        "bound_s": bound,
                    }
                )
            by = {r["algorithm"]: r for r in rows[-len(algos) :] if r["placed"]}
            greedy, na = by.get(f"{OURS}:greedy"), by.get("network-aware")
            if greedy and na and greedy["iteration_s"] > TAIL * na["iteration_s"]:
                greedy |= first_nodes(algos[f"{OURS}:greedy"].agent, cluster, job)
        print(f"  {topo} seed {seed}: {len(jobs)} jobs", file=sys.stderr, flush=True)
    return rows


def first_nodes(agent: Agent, cluster: Cluster, job: Job) -> dict:
    """The policy's greedy rollout begun on network-aware's first node, and the fastest of those
    begun on its `TAIL_FIRST_NODES` highest-rated first nodes (iteration s; None: none placed the
    job, or network-aware's first node is masked for the policy)."""
    ep0 = PlacementEpisode(cluster, job)
    policy = Policy(agent, ep0.graph_input())
    times = [
        greedy_from(policy, ep0, int(v)) for v in policy.ranked(ep0.observe())[:TAIL_FIRST_NODES]
    ]
    na_first = network_aware_first(ep0)
    return {
        "from_na_first_s": None if na_first is None else greedy_from(policy, ep0, na_first),
        "best_first_s": min((t for t in times if t is not None), default=None),
    }


def ratios(rows: list[dict], a: str, b: str) -> list[float]:
    """a's iteration time over b's, per (seed, job) both placed."""
    by = {(r["seed"], r["job"], r["algorithm"]): r for r in rows if r["placed"]}
    return [
        by[k + (a,)]["iteration_s"] / by[k + (b,)]["iteration_s"]
        for k in {(s, j) for s, j, _ in by}
        if k + (a,) in by and k + (b,) in by
    ]


def summary(rows: list[dict]) -> dict:
    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    out: dict = {
        "placed": {n: sum(r["placed"] for r in rows if r["algorithm"] == n) for n in names},
        "jobs": len({(r["seed"], r["job"]) for r in rows}),
    }
    for ours in (OURS, f"{OURS}:greedy", f"{OURS}:own"):
        out[ours] = {}
        for other in names:
            if other == ours:
                continue
            x = ratios(rows, ours, other)
            out[ours][other] = {
                "geomean": math.exp(statistics.fmean(map(math.log, x))) if x else None,
                "worst": max(x, default=None),
                "jobs": len(x),
            }
    # where the policy alone loses: its jobs more than TAIL slower than network-aware's
    na = {
        (r["seed"], r["job"]): r["iteration_s"]
        for r in rows
        if r["algorithm"] == "network-aware" and r["placed"]
    }
    tail = [r for r in rows if "best_first_s" in r]
    out["tail"] = {
        "jobs": len(tail),
        "from_na_first_within": sum(
            r["from_na_first_s"] is not None
            and r["from_na_first_s"] <= TAIL * na[r["seed"], r["job"]]
            for r in tail
        ),
        "best_first_below_1": sum(
            r["best_first_s"] is not None and r["best_first_s"] < na[r["seed"], r["job"]]
            for r in tail
        ),
        "best_first_worst": max(
            (
                r["best_first_s"] / na[r["seed"], r["job"]]
                for r in tail
                if r["best_first_s"] is not None
            ),
            default=None,
        ),
    }
    out["over_bound"] = {}
    for n in names:
        x = [
            r["iteration_s"] / r["bound_s"]
            for r in rows
            if r["algorithm"] == n and r["placed"] and 0 < r["bound_s"] < math.inf
        ]
        out["over_bound"][n] = {
            "geomean": math.exp(statistics.fmean(map(math.log, x))) if x else None,
            "worst": max(x, default=None),
        }
    # non-dominance on (mean iteration time, mean balance std) over the jobs every one placed
    common = {(r["seed"], r["job"]) for r in rows}
    for n in names:
        common &= {(r["seed"], r["job"]) for r in rows if r["algorithm"] == n and r["placed"]}
    point = {
        n: (
            statistics.fmean(
                r["iteration_s"]
                for r in rows
                if r["algorithm"] == n and (r["seed"], r["job"]) in common
            ),
            statistics.fmean(
                r["balance_std"]
                for r in rows
                if r["algorithm"] == n and (r["seed"], r["job"]) in common
            ),
        )
        if common
        else None
        for n in names
    }
    out["balance"] = {
        n: {"iteration_s": p[0], "balance_std": p[1]} if p else None for n, p in point.items()
    }
    out["dominated_by"] = {
        n: [
            m
            for m in names
            if point[n]
            and point[m]
            and m != n
            and point[m][0] < point[n][0]
            and point[m][1] < point[n][1]
        ]
        for n in names
    }
    return out


def latency(reps: int, machines: list, checkpoint: Path) -> dict:
    """p50/p99 ms (wall; and the process's CPU time, what a decision costs on a shared machine)
    of CES-PPO's decisions: the 16-GPU ring on gen:internet:100, an 8-task ring on
    gen:internet:1000 (warm, torch on one thread)."""
    torch.set_num_threads(1)
    cases = {
        "16 tasks, 100 nodes": ("gen:internet:100:7", load_jobs(JOBS)[0]),
        "8 tasks, 1000 nodes": ("gen:internet:1000:7", WIDE_RING8),
    }
    out = {}
    algo = CesPPO(checkpoint=checkpoint)
    for label, (topo, job) in cases.items():
        cluster = make_instance(Cluster.from_topology(load_topology(topo)), 0, 0.5, machines)
        algo.place(cluster, job)  # warm: routes and layout known
        watch = Stopwatch()
        for _ in range(reps):
            with watch:
                algo.place(cluster, job)
        out[label] = watch.latency() | {"loadavg_1m": os.getloadavg()[0]}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--random-jobs", type=int, default=5, help="random spread jobs per instance")
    ap.add_argument("--topologies", default=",".join(HELD_OUT + GENERATED))
    ap.add_argument(
        "--reps",
        type=int,
        default=30,
        help="decisions timed per latency case (0: no latency figure)",
    )
    ap.add_argument(
        "--checkpoint",
        type=Path,
        default=CHECKPOINT,
        help="CES-PPO checkpoint (default: the committed one)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "ppo" / "spread.json")
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.random_jobs < 0 or args.reps < 0:
        ap.error("--seeds must be ≥ 1, --random-jobs and --reps ≥ 0")
    if not args.checkpoint.is_file():
        ap.error(f"--checkpoint: {args.checkpoint} is not a file")
    machines = load_machine_spec(MACHINE_TABLE)
    doc: dict = {
        "command": " ".join(sys.argv),
        "seeds": args.seeds,
        "checkpoint": str(args.checkpoint),
        "random_jobs": args.random_jobs,
        "machine": machine_info(),
        "topologies": {},
    }
    t0 = time.perf_counter()
    everything = []
    for topo in args.topologies.split(","):
        rows = run_topology(topo, args.seeds, args.random_jobs, machines, args.checkpoint)
        everything += [{**r, "topology": topo} for r in rows]
        doc["topologies"][topo] = summary(rows)
    doc["all"] = summary([{**r, "seed": (r["topology"], r["seed"])} for r in everything])
    doc["latency"] = latency(args.reps, machines, args.checkpoint) if args.reps else {}
    doc["wall_s"] = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    plot(doc, args.out.with_suffix(".png"))
    report(doc)
    return 0


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    where = [*doc["topologies"], "all"]
    summaries = [*doc["topologies"].values(), doc["all"]]
    others = list(summaries[-1][OURS])
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(where)), 4))
    width = 0.8 / len(others)
    for i, other in enumerate(others):
        ys = [s[OURS].get(other, {}).get("geomean") or math.nan for s in summaries]
        ax.bar(np.arange(len(where)) + i * width, ys, width, label=other)
    ax.axhline(1.0, color="grey", ls="--", lw=1)
    ax.set_xticks(np.arange(len(where)) + 0.4 - width / 2, where, fontsize=8, rotation=15)
    ax.set_ylabel("CES-PPO iteration time / other's\n(geometric mean, jobs both placed)")
    ax.set_yscale("log")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Jobs no node can hold, {doc['seeds']} seeds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(doc: dict) -> None:
    for where, s in [*doc["topologies"].items(), ("all", doc["all"])]:
        na = s[OURS]["network-aware"]
        greedy = s[f"{OURS}:greedy"]["network-aware"]
        own = s[f"{OURS}:own"]["network-aware"]
        print(
            f"{where:>22}: ces-ppo/network-aware geomean {na['geomean']:.3f} worst "
            f"{na['worst']:.2f} ({na['jobs']} jobs); policy alone {greedy['geomean']:.3f} / "
            f"{greedy['worst']:.2f}; own decoding {own['geomean']:.3f} / {own['worst']:.2f}; "
            f"placed {s['placed']}; dominated: "
            f"{ {k: v for k, v in s['dominated_by'].items() if v} }"
        )
    t = doc["all"]["tail"]
    worst = "–" if t["best_first_worst"] is None else f"{t['best_first_worst']:.2f}"
    print(
        f"the policy alone > {TAIL} × network-aware on {t['jobs']} jobs: from network-aware's "
        f"first node within {TAIL} on {t['from_na_first_within']}; the best of its "
        f"{TAIL_FIRST_NODES} highest-rated first nodes faster than network-aware on "
        f"{t['best_first_below_1']} (worst {worst})"
    )
    print("latency:", doc["latency"])


if __name__ == "__main__":
    sys.exit(main())
