#!/usr/bin/env python3
"""CES-Multi against the queue baselines in the simulator (issue 8's figures), and the sweep that
chose CES-Multi's defaults.

    python experiments/bench_multi.py --seeds 5            # → results/multi/*.json + tables
    python experiments/bench_multi.py --sweep --seeds 3    # → results/multi/sweep.json
    python experiments/bench_multi.py --seed-systems --seeds 5   # → results/multi/seeds.json
    python experiments/bench_multi.py --policies ces-multi --set delay_lookahead=3 --out DIR
                                                           # one policy, a knob changed

Figures: on each topology of --topos (default campus, fattree and the real Abilene backbone from
topohub), --jobs jobs per seed (`arrivals.JobMix`) under --arrivals (default: bursty arrivals at
nominal load 0.7 on seed 001's tidal edge nodes), every policy (`multi.POLICIES`) placing jobs
with the same single-job algorithm (--single, default `multi.default_algorithm()`), seeds
0..N-1. Per topology `evaluate_multi`'s JSON goes to results/multi/<topology>.json; the tables
and the issue's targets (CES-Multi best or within 5 % of the best on balance, bandwidth
satisfaction and average wait; its maximum wait below fifo-backfill's) are printed and saved in
results/multi/summary.json.

Seed systems (issue 24, docs/seeds-multi.md): TapFinger against Tiresias (LAS), Optimus-like,
Random, Min, the paper's elastic Tiresias and a kind-aware rule in TapFinger's own setting (average
JCT in slots over --episodes episodes, TapFinger greedy and sampled, paired ratios with their 95 %
intervals; `tapfinger.paper.compare`, the checkpoint's "paper" network); EdgeFlow against EDF and ElasticFlow-like admission on tidal edge
nodes (`SEED_ARRIVALS` on --seed-topos: every job with a deadline, as in seed 001), the deadline
satisfaction ratio and migrations per job.

Sweep: coordinate descent over CES-Multi's knobs (`SWEEP`, in that order), starting from the
MultiConfig defaults; each value is scored on --sweep-topos × seeds by
  J = mean((avg_wait + 60) / (avg_wait_fb + 60) + (max_wait + 60) / (max_wait_fb + 60)
           + balance_std / balance_std_fb + bw_satisfaction_fb / bw_satisfaction)
(fb: fifo-backfill on the same scenario, J = 4 for it; lower is better; 60 s keeps waits of a few
seconds on a lightly loaded network from dominating), the best value is kept before the next
knob is swept. The priority weight b stays 0.5: J has no priority term, so the sweep would
happily ignore priorities. The defaults in `MultiConfig` are the result (docs/multi.md).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import yaml

from experiments.common import RESULTS
from scheduler.arrivals import ArrivalError, parse_arrivals
from scheduler.evaluate import evaluate_multi, machine_info, multi_table, run_policy
from scheduler.model import Cluster
from scheduler.multi import MultiConfig, default_algorithm, policy_names
from topologies import TopologyError, load_topology

TOPOS = "campus,fattree,topozoo/Abilene"
ARRIVALS = "bursty:load=0.7,tidal=1"
SWEEP: list[tuple[str, list]] = [
    ("min_bw_share", [0.0, 0.25, 0.5, 0.75, 0.9]),
    ("window", [8, 16, 32, 64, 128, 1000]),
    ("fit", ["align", "headroom"]),
    (
        "weights",
        [
            (1.0, 0.5, 1.0),
            (0.0, 0.5, 1.0),
            (1.0, 0.5, 0.0),
            (2.0, 0.5, 1.0),
            (1.0, 0.5, 2.0),
            (0.5, 0.5, 1.0),
        ],
    ),
    ("reserve_after_s", [1800.0, 3600.0, 7200.0, 14400.0, 28800.0]),
    ("age_every_s", [900.0, 3600.0, 14400.0]),
    ("max_reservations", [1, 2, 4]),
]
SEED_ARRIVALS = "bursty:n=500,load=0.7,tidal=1,deadline_share=1"
SEED_POLICIES = "edgeflow,elasticflow,edf"
WAIT_FLOOR_S = 60.0  # keeps waits of seconds on a lightly loaded network from dominating J
TARGET_BETTER = {"balance_std": min, "bw_satisfaction": max, "avg_wait_s": min}


def with_knob(cfg: MultiConfig, knob: str, value) -> MultiConfig:
    if knob == "weights":
        a, b, c = value
        return replace(cfg, a_fit=a, b_priority=b, c_wait=c)
    return replace(cfg, **{knob: value})


def knobs(settings: list[str]) -> MultiConfig:
    """MultiConfig with `KNOB=VALUE` overrides (VALUE parsed as YAML)."""
    known = {f.name for f in fields(MultiConfig)}
    changes = {}
    for item in settings:
        knob, sep, text = item.partition("=")
        if not sep or knob not in known:
            raise ValueError(
                f"'{item}': expected KNOB=VALUE with KNOB one of {', '.join(sorted(known))}"
            )
        try:
            changes[knob] = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"'{item}': the value is not YAML ({e})") from None
    return replace(MultiConfig(), **changes)


def sweep(topos: list[str], arrivals: str, seeds: int, single: str) -> dict:
    spec = parse_arrivals(arrivals)
    clusters = {t: Cluster.from_topology(load_topology(t)) for t in topos}
    cases = [(t, s) for t in topos for s in range(seeds)]
    ref = {c: run_policy("fifo-backfill", clusters[c[0]], spec, c[1], single) for c in cases}

    def score(cfg: MultiConfig) -> tuple[float, dict]:
        runs = {c: run_policy("ces-multi", clusters[c[0]], spec, c[1], single, cfg) for c in cases}
        js = [
            (r["avg_wait_s"] + WAIT_FLOOR_S) / (ref[c]["avg_wait_s"] + WAIT_FLOOR_S)
            + (r["max_wait_s"] + WAIT_FLOOR_S) / (ref[c]["max_wait_s"] + WAIT_FLOOR_S)
            + r["balance_std"] / max(ref[c]["balance_std"], 1e-9)
            + ref[c]["bw_satisfaction"] / max(r["bw_satisfaction"], 1e-9)
            for c, r in runs.items()
        ]
        keys = ("avg_wait_s", "max_wait_s", "balance_std", "bw_satisfaction")
        return statistics.fmean(js), {
            k: statistics.fmean(r[k] for r in runs.values()) for k in keys
        }

    cfg, steps = MultiConfig(), []
    for knob, values in SWEEP:
        rows = []
        for value in values:
            start = time.perf_counter()
            j, means = score(with_knob(cfg, knob, value))
            rows.append({"value": value, "J": j, **means})
            print(
                f"  {knob:<20} {value!s:<18} J={j:.3f}  avg wait {means['avg_wait_s']:8.0f} s"
                f"  max wait {means['max_wait_s']:8.0f} s  util std {means['balance_std']:.3f}"
                f"  bw sat {means['bw_satisfaction']:.3f}  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        best = min(rows, key=lambda r: r["J"])
        cfg = with_knob(cfg, knob, best["value"])
        steps.append({"knob": knob, "chosen": best["value"], "rows": rows})
        print(f"{knob}: {best['value']}", flush=True)
    fb = {
        k: statistics.fmean(r[k] for r in ref.values())
        for k in ("avg_wait_s", "max_wait_s", "balance_std", "bw_satisfaction")
    }
    return {
        "topologies": topos,
        "arrivals": arrivals,
        "seeds": seeds,
        "single": single,
        "fifo_backfill": fb,
        "steps": steps,
        "chosen": asdict(cfg),
    }


def versus_best(algos: dict, metric: str, better=min) -> dict:
    """CES-Multi's mean of `metric` against the best policy's; met: best or within 5 %."""
    best = better(m[metric]["mean"] for m in algos.values() if m[metric]["mean"] is not None)
    mine = algos["ces-multi"][metric]["mean"]
    ok = mine is not None and (
        mine <= best * 1.05 + 1e-9 if better is min else mine >= best * 0.95 - 1e-9
    )
    return {"ces_multi": mine, "best": best, "met": ok}


def targets(result: dict) -> dict:
    """Issue 8's targets for one topology's evaluate_multi result."""
    algos = result["algorithms"]
    out = {metric: versus_best(algos, metric, better) for metric, better in TARGET_BETTER.items()}
    mine, fb = (
        algos["ces-multi"]["max_wait_s"]["mean"],
        algos["fifo-backfill"]["max_wait_s"]["mean"],
    )
    out["max_wait_below_fifo_backfill"] = {"ces_multi": mine, "fifo_backfill": fb, "met": mine < fb}
    return out


def tapfinger_paper_setting(episodes: int, others: dict[str, Path]) -> dict:
    """TapFinger (greedy and sampled) and the baselines in TapFinger's own setting: average JCT
    per episode (1000, 1001, ...), mean ± sd, and TapFinger over each policy paired by episode
    (`stats.paired_ratio`: geometric mean and 95 % interval); the checkpoint's training record;
    `others` (name: checkpoint) evaluated beside it as tapfinger@name."""
    import torch

    from experiments.stats import paired_ratio
    from scheduler.evaluate import RunProgress, mean_std
    from scheduler.tapfinger import paper
    from scheduler.tapfinger.net import load
    from scheduler.tapfinger.policy import CHECKPOINT

    def record(path: Path) -> dict:
        """The paper part's training record with its hyper-parameters (session 22's file keeps
        one record of them for both parts) and its history (per update: return, losses,
        validation)."""
        data = torch.load(path, weights_only=True)
        part = data["paper"]
        return part["training"] | {
            "hyper": part.get("hyper") or data.get("hyper"),
            "history": part.get("history", []),
        }

    torch.set_num_threads(1)
    start = time.perf_counter()
    net = load(CHECKPOINT, "paper", paper.DIMS, paper.GRID)
    nets = {k: load(v, "paper", paper.DIMS, paper.GRID) for k, v in others.items()}
    with RunProgress((2 + 2 * len(nets) + len(paper.BASELINES)) * episodes) as progress:
        jct = paper.compare(net, episodes, progress=progress.start, others=nets)
    return {
        "setting": asdict(paper.PaperSetting()),
        "episodes": episodes,
        "avg_jct_slots": {k: mean_std(v) | {"runs": v} for k, v in jct.items()},
        # every TapFinger (the checkpoint's, greedy and sampled, and each other one's) over every
        # other policy, the checkpoint's two modes not over each other
        "tapfinger_vs": {
            mode: {
                k: paired_ratio(jct[mode], v).to_json()
                for k, v in jct.items()
                if k != mode and not {k, mode} <= {"tapfinger", "tapfinger-sampled"}
            }
            for mode in jct
            if mode.startswith("tapfinger")
        },
        "other_checkpoints": {k: record(v) for k, v in others.items()},
        "allocations_episode_1000": {
            name: paper.allocations(n, 1000) for name, n in {"tapfinger": net, **nets}.items()
        },
        "paper_claim_vs_tiresias": -0.549,
        "training": record(CHECKPOINT),
        "wall_s": time.perf_counter() - start,
    }


def seed_systems(
    seeds: int, topos: list[str], single: str, episodes: int, others: dict[str, Path]
) -> dict:
    """The seed systems' figures (module doc): TapFinger's setting over `episodes` episodes,
    EdgeFlow's mean ± sd over seeds 0..seeds-1."""
    out = {
        "machine": machine_info(),
        "seeds": seeds,
        "tapfinger_paper_setting": tapfinger_paper_setting(episodes, others),
    }
    out["edgeflow"] = {}
    for topo in topos:
        start = time.perf_counter()
        result = evaluate_multi(
            argparse.Namespace(
                topo=topo, arrivals=SEED_ARRIVALS, algos=SEED_POLICIES, seeds=seeds, single=single
            )
        )
        out["edgeflow"][topo] = {
            "arrivals": SEED_ARRIVALS,
            "single": single,
            "wall_s": time.perf_counter() - start,
            **{
                k: {
                    m: result["algorithms"][k][m]
                    for m in ("deadline_satisfaction", "migrations_per_job", "avg_wait_s", "jct_s")
                }
                for k in SEED_POLICIES.split(",")
            },
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--topos", default=TOPOS)
    ap.add_argument("--arrivals", default=ARRIVALS, help="spec without n (set by --jobs)")
    ap.add_argument("--single", default=None, help="single-job algorithm of every policy")
    ap.add_argument(
        "--policies",
        default="all",
        help="comma-separated queue policies (default all; the targets need all)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="evaluate CES-Multi with this MultiConfig knob changed (repeatable; "
        "VALUE in YAML: 4, 1.2, null, false, align)",
    )
    ap.add_argument("--out", default=str(RESULTS / "multi"))
    ap.add_argument("--sweep", action="store_true", help="run the sweep of CES-Multi's knobs")
    ap.add_argument("--sweep-topos", default="campus,topozoo/Abilene")
    ap.add_argument(
        "--seed-systems",
        action="store_true",
        help="TapFinger's and EdgeFlow's figures (results/multi/seeds.json)",
    )
    ap.add_argument("--seed-topos", default="campus")
    ap.add_argument(
        "--episodes",
        type=int,
        default=20,
        help="evaluation episodes of TapFinger's setting (--seed-systems)",
    )
    ap.add_argument(
        "--other-tapfinger",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also evaluate the paper network of this TapFinger checkpoint, as tapfinger@NAME "
        "(--seed-systems; repeatable)",
    )
    args = ap.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        print("bench_multi: --seeds and --jobs must be ≥ 1", file=sys.stderr)
        return 2
    try:
        config = knobs(args.set)
    except ValueError as e:
        print(f"bench_multi: --set: {e}", file=sys.stderr)
        return 2
    try:
        policy_names(args.policies)
    except ValueError as e:
        print(f"bench_multi: --policies: {e}", file=sys.stderr)
        return 2
    others: dict[str, Path] = {}
    for item in args.other_tapfinger:
        name, _, path = item.partition("=")
        others[name] = Path(path)
        if not name or not others[name].is_file():
            print(
                f"bench_multi: --other-tapfinger: expected NAME=PATH of a checkpoint, got '{item}'",
                file=sys.stderr,
            )
            return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    single = args.single or default_algorithm()
    arrivals = f"{args.arrivals.split(':')[0]}:n={args.jobs}" + (
        f",{args.arrivals.split(':', 1)[1]}" if ":" in args.arrivals else ""
    )
    try:
        parse_arrivals(arrivals)
        if args.seed_systems:
            for topo in args.seed_topos.split(","):  # a typo fails now, not after the paper runs
                load_topology(topo)
            result = seed_systems(
                args.seeds,
                args.seed_topos.split(","),
                single,
                args.episodes,
                others,
            )
            (out / "seeds.json").write_text(json.dumps(result, indent=2) + "\n")
            print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))
            return 0
        if args.sweep:
            result = sweep(args.sweep_topos.split(","), arrivals, args.seeds, single)
            result["machine"] = machine_info()
            (out / "sweep.json").write_text(json.dumps(result, indent=2) + "\n")
            print(f"chosen: {result['chosen']}\nwrote {out / 'sweep.json'}")
            return 0
        summary = {
            "arrivals": arrivals,
            "seeds": args.seeds,
            "single": single,
            "machine": machine_info(),
            "topologies": {},
        }
        for topo in args.topos.split(","):
            start = time.perf_counter()
            result = evaluate_multi(
                argparse.Namespace(
                    topo=topo,
                    arrivals=arrivals,
                    algos=args.policies,
                    seeds=args.seeds,
                    single=single,
                    config=config,
                )
            )
            result["wall_s"] = time.perf_counter() - start
            name = topo.replace("/", "-")
            (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
            if args.policies != "all":  # a comparison of a few: the table only
                print(multi_table(result), f"({result['wall_s']:.0f} s)\n", flush=True)
                continue
            checks = targets(result)
            # Not targets: the balance while jobs still arrive and while jobs wait
            # (`SimResult.balance_std_arrivals`, `balance_std_queued`).
            arriving = versus_best(result["algorithms"], "balance_std_arrivals")
            queued = versus_best(result["algorithms"], "balance_std_queued")
            summary["topologies"][topo] = {
                "file": f"{name}.json",
                "targets": checks,
                "balance_std_arrivals": arriving,
                "balance_std_queued": queued,
            }
            print(multi_table(result))
            print(
                "targets: "
                + ", ".join(f"{k} {'met' if v['met'] else 'MISSED'}" for k, v in checks.items())
                + "; util std "
                + ", ".join(
                    f"{what} {v['ces_multi'] / v['best']:.2f} × the best"
                    for what, v in (("while jobs arrive", arriving), ("while jobs wait", queued))
                    if v["ces_multi"] is not None
                )
                + f"  ({result['wall_s']:.0f} s)\n",
                flush=True,
            )
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {out}/")
    except (ArrivalError, TopologyError, ValueError, FileNotFoundError) as e:
        print(f"bench_multi: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
