"""Train CES-PPO: `python -m scheduler.train_ppo --seed 0 --steps 120000
--out scheduler/checkpoints/ces_ppo.pt`.

Trains on random topologies and jobs (`scheduler.env.PlacementEnv`), shows progress, writes the
learning curve as CSV and PNG (default `results/ppo/learning_curve.{csv,png}`) and the checkpoint
that the `ces-ppo` algorithm loads. Bad arguments exit with code 2 and a one-line reason.
"""
from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .env import EnvConfig
from .ppo import CHECKPOINT, PPOConfig, save, train

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "ppo"
COLUMNS = ("steps", "episodes", "seconds", "cpu_seconds", "return", "placed", "iter_vs_heuristic",
           "guide", "pg_loss", "v_loss", "entropy", "guide_loss", "clip_frac")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scheduler.train_ppo",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=PPOConfig.total_steps,
                   help="environment steps (task placements) to train for")
    p.add_argument("--encoder", choices=("gnn", "mlp"), default=PPOConfig.encoder)
    p.add_argument("--layers", type=int, default=PPOConfig.layers,
                   help="message-passing rounds of the gnn encoder")
    p.add_argument("--guide-until", type=float, default=PPOConfig.guide_until,
                   help="fraction of training over which the teacher's guidance fades (0: none)")
    p.add_argument("--threads", type=int, default=PPOConfig.threads)
    p.add_argument("--out", type=Path, default=CHECKPOINT, help="checkpoint to write")
    p.add_argument("--csv", type=Path, default=RESULTS / "learning_curve.csv")
    p.add_argument("--png", type=Path, default=RESULTS / "learning_curve.png")
    args = p.parse_args(argv)
    problems = []
    if args.steps < 1:
        problems.append(f"--steps must be ≥ 1, got {args.steps}")
    if args.layers < 1:
        problems.append(f"--layers must be ≥ 1, got {args.layers}")
    if not 0 <= args.guide_until <= 1:
        problems.append(f"--guide-until must be in [0, 1], got {args.guide_until}")
    if args.threads < 1:
        problems.append(f"--threads must be ≥ 1, got {args.threads}")
    for opt in ("out", "csv", "png"):
        parent = getattr(args, opt).resolve().parent
        if parent.exists() and not parent.is_dir():
            problems.append(f"--{opt}: {parent} is not a directory")
    if problems:
        p.error("; ".join(problems))  # exit code 2
    return args


def plot(curves: dict[str, list[dict]], path: Path, title: str) -> None:
    """Learning curves (one line per label; a rolling mean of 5 updates over the raw values)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for label, rows in curves.items():
        steps = np.array([r["steps"] for r in rows]) / 1000
        for ax, key in zip(axes, ("return", "iter_vs_heuristic", "placed")):
            y = np.array([r[key] for r in rows], float)
            smooth = np.convolve(y, np.ones(5) / 5, mode="valid") if len(y) >= 5 else y
            line, = ax.plot(steps[len(steps) - len(smooth):], smooth, lw=1.6, label=label)
            ax.plot(steps, y, lw=0.6, alpha=0.3, color=line.get_color())
    for ax, name in zip(axes, ("mean episode return", "iteration time / network-aware's "
                                                      "(geometric mean)", "jobs placed")):
        ax.set_xlabel("environment steps (thousands)")
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[1].axhline(1.0, color="grey", ls="--", lw=1)
    if len(curves) > 1:
        axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = replace(PPOConfig(), seed=args.seed, total_steps=args.steps, encoder=args.encoder,
                  layers=args.layers, guide_until=args.guide_until, threads=args.threads)
    env_cfg = EnvConfig()
    for path in (args.out, args.csv, args.png):
        path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with args.csv.open("w", newline="") as fh, Progress(
            TextColumn("[bold]CES-PPO[/] seed {task.fields[seed]}"), BarColumn(),
            TextColumn("{task.completed:>7.0f}/{task.total:.0f} steps"),
            TextColumn("return {task.fields[ret]:>6.3f}  iter/heuristic {task.fields[ratio]:>5.2f}"
                       "  placed {task.fields[placed]:>4.0%}"),
            TimeElapsedColumn(), TimeRemainingColumn()) as progress:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        bar = progress.add_task("train", total=cfg.total_steps, seed=cfg.seed, ret=0.0,
                                ratio=float("nan"), placed=0.0)

        def log(row: dict) -> None:
            rows.append(row)
            writer.writerow({k: row[k] for k in COLUMNS})
            fh.flush()
            progress.update(bar, completed=row["steps"], ret=row["return"],
                            ratio=row["iter_vs_heuristic"], placed=row["placed"])

        agent = train(cfg, env_cfg, log)
    meta = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                       f"{torch.get_num_threads()} torch thread(s), load average "
                       f"{os.getloadavg()[2]:.1f} (15 min) at the end",
            "seconds": rows[-1]["seconds"] if rows else 0.0,
            "command": "python -m scheduler.train_ppo " + " ".join(argv or sys.argv[1:])}
    save(agent, cfg, env_cfg, args.out, meta)
    plot({cfg.encoder: rows}, args.png, f"CES-PPO ({cfg.encoder} encoder, seed {cfg.seed}): "
         f"{rows[-1]['seconds'] / 60:.1f} min on {meta['machine']}" if rows else "CES-PPO")
    print(f"checkpoint {args.out}; learning curve {args.csv}, {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
