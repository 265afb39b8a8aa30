#!/usr/bin/env python3
"""Time-to-accuracy of each model at each bottleneck bandwidth, on the emulated network.

    sudo python experiments/bench_tta.py --seeds 3 [--seed 0] [--mbps 10,50,200]
        [--models mlp-small,cnn,mlp-large] [--dataset digits] [--target 0.95] [--collective ring]

k = 3 worker containers on one switch (`--cpu` cores each), every access link shaped to B; real
DDP training until the first evaluation (every `--eval-every` iterations, inside the clock)
reaches the target. A run that does not reach it within `--max-seconds` counts as not
converged: it has no time, and the cell reports how many seeds converged. Seeds change the model
initialisation and the data order (the held-out split is fixed). Writes results/bench_tta.json
(every run, mean ± std and min–max per cell, the machine and its load) and bench_tta.png.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from experiments.calibrate_perfmodel import (
    bottleneck_topology,
    mbps_list,
    measured_run,
    names_of,
    set_bottleneck,
)
from experiments.common import RESULTS, require_root
from experiments.machine import machine
from testbed import Emulation, EmulationError
from workloads.collectives import COLLECTIVES
from workloads.data import DATASETS
from workloads.job import TestbedJobError
from workloads.models import MODELS


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = ("mlp-small", "cnn", "mlp-large")
    mbps: tuple[float, ...] = (10.0, 50.0, 200.0)
    seeds: int = 3
    seed: int = 0  # first seed; runs use seed .. seed + seeds - 1
    dataset: str = "digits"
    target: float = 0.95
    collective: str = "ring"
    workers: int = 3
    cpu: float = 0.6
    mem_mb: int = 1024
    batch_size: int = 32
    lr: float = 0.05
    eval_every: int = 10
    max_iters: int = 3000
    max_seconds: float = 1800.0


def spread(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def cells(runs: list[dict], s: Settings) -> list[dict]:
    out = []
    for model in s.models:
        for mbps in s.mbps:
            mine = [r for r in runs if r["model"] == model and r["mbps"] == mbps]
            done = [r for r in mine if r["reached_target"]]
            out.append(
                {
                    "model": model,
                    "mbps": mbps,
                    "runs": len(mine),
                    "converged": len(done),
                    "tta_s": spread([r["tta_s"] for r in done]),
                    "tta_iter": spread([r["tta_iter"] for r in done]),
                    "iter_s": spread([r["iter_s"] for r in mine]),
                    "jct_s": spread([r["jct_s"] for r in mine]),
                    "container_startup_s": spread(
                        [
                            r["container_startup_s"]
                            for r in mine
                            if r["container_startup_s"] is not None
                        ]
                    ),
                }
            )
    return out


def print_table(console: Console, rows: list[dict], s: Settings) -> None:
    table = Table(
        title=f"time to {s.target:.0%} on {s.dataset}, k={s.workers} "
        f"({s.collective}), {s.cpu} cores/worker, seeds {s.seed}..{s.seed + s.seeds - 1}"
    )
    for col in (
        "model",
        "B Mbit/s",
        "converged",
        "TTA s (mean ± std)",
        "min–max s",
        "iters",
        "iter s",
        "startup s",
    ):
        table.add_column(col, justify="right")
    for c in rows:
        t = c["tta_s"]
        tta = f"{t['mean']:.1f} ± {t['std']:.1f}" if t["n"] else "not reached"
        rng = f"{t['min']:.1f}–{t['max']:.1f}" if t["n"] else "-"
        iters = f"{c['tta_iter']['mean']:.0f}" if c["tta_iter"]["n"] else "-"
        start = c["container_startup_s"]
        table.add_row(
            c["model"],
            f"{c['mbps']:g}",
            f"{c['converged']}/{c['runs']}",
            tta,
            rng,
            iters,
            f"{c['iter_s']['mean']:.3f}" if c["iter_s"]["n"] else "-",
            f"{start['mean']:.1f}" if start["n"] else "-",
        )
    console.print(table)


def plot(rows: list[dict], s: Settings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for model in s.models:
        mine = [c for c in rows if c["model"] == model and c["tta_s"]["n"]]
        ax.errorbar(
            [c["mbps"] for c in mine],
            [c["tta_s"]["mean"] for c in mine],
            yerr=[c["tta_s"]["std"] for c in mine],
            marker="o",
            capsize=3,
            label=model,
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="bottleneck bandwidth (Mbit/s)",
        ylabel=f"time to {s.target:.0%} accuracy (s)",
        title=f"{s.dataset}, {s.workers} workers, {s.collective}, {s.seeds} seeds (mean ± std)",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> tuple[Settings, Path]:
    d = Settings()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])

    p.add_argument("--models", type=names_of(tuple(MODELS)), default=d.models)
    p.add_argument("--mbps", type=mbps_list, default=d.mbps)
    p.add_argument("--seeds", type=int, default=d.seeds, help="runs per cell")
    p.add_argument("--seed", type=int, default=d.seed, help="first seed")
    p.add_argument("--dataset", choices=DATASETS, default=d.dataset)
    p.add_argument("--target", type=float, default=d.target)
    p.add_argument("--collective", choices=COLLECTIVES, default=d.collective)
    p.add_argument("--cpu", type=float, default=d.cpu, help="cores per worker")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--max-seconds", type=float, default=d.max_seconds)
    p.add_argument("--out", type=Path, default=RESULTS / "bench_tta.json")
    a = p.parse_args(argv)
    if a.seeds < 1:
        p.error(f"--seeds must be ≥ 1, got {a.seeds}")
    if not 0 < a.target <= 1:
        p.error(f"--target must be in (0, 1], got {a.target}")
    if not 0.05 <= a.cpu <= (os.cpu_count() or 1):
        p.error(f"--cpu must be in [0.05, {os.cpu_count()}], got {a.cpu}")
    if a.max_seconds <= 0 or a.lr <= 0:
        p.error("--max-seconds and --lr must be > 0")
    return replace(
        d,
        models=a.models,
        mbps=a.mbps,
        seeds=a.seeds,
        seed=a.seed,
        dataset=a.dataset,
        target=a.target,
        collective=a.collective,
        cpu=a.cpu,
        lr=a.lr,
        max_seconds=a.max_seconds,
    ), a.out


def main(argv: list[str] | None = None) -> int:
    s, out = parse_args(argv)
    require_root("the testbed creates bridges, namespaces, containers")
    console = Console(width=None if sys.stdout.isatty() else 130)
    info = machine()
    runs: list[dict] = []
    t0 = time.monotonic()

    def save() -> list[dict]:
        """Written after every run, so an interrupted benchmark keeps what it measured."""
        rows = cells(runs, s)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "machine": info,
                    "settings": asdict(s),
                    "cells": rows,
                    "runs": runs,
                    "complete": len(runs) == total,
                    "elapsed_min": round((time.monotonic() - t0) / 60, 1),
                },
                indent=1,
            )
        )
        return rows

    total = len(s.mbps) * len(s.models) * s.seeds
    try:
        topo = bottleneck_topology(s.workers, s.cpu, s.mem_mb, max(s.mbps))
        with Emulation(topo) as net, tempfile.TemporaryDirectory(prefix="tta-") as tmp:
            for mbps in s.mbps:
                set_bottleneck(net, mbps)
                for model in s.models:
                    for seed in range(s.seed, s.seed + s.seeds):
                        name = f"{model}-{mbps:g}-{seed}".replace(".", "_")
                        summary, load = measured_run(
                            net,
                            Path(tmp),
                            name,
                            s.cpu,
                            s.mem_mb,
                            deadline_s=s.max_seconds + 600,
                            model=model,
                            dataset=s.dataset,
                            collective=s.collective,
                            target_acc=s.target,
                            eval_every=s.eval_every,
                            max_iters=s.max_iters,
                            max_seconds=s.max_seconds,
                            batch_size=s.batch_size,
                            lr=s.lr,
                            seed=seed,
                            threads=1,
                            timeout_s=300,
                        )
                        runs.append(
                            {
                                "model": model,
                                "mbps": mbps,
                                "seed": seed,
                                **summary.as_dict(),
                                **load,
                            }
                        )
                        save()
                        tta = (
                            f"{summary.tta_s:.1f} s ({summary.iters} iters)"
                            if summary.reached_target
                            else "not reached"
                        )
                        console.print(
                            f"B={mbps:g} {model} seed {seed}: TTA {tta}, iter "
                            f"{summary.iter_s:.3f} s; others' load "
                            f"{load['cpu_busy_background']:.0%}"
                        )
    except (EmulationError, TestbedJobError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the emulation was torn down", file=sys.stderr)
        return 130
    rows = save()
    print_table(console, rows, s)
    plot(rows, s, out.with_suffix(".png"))
    console.print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
