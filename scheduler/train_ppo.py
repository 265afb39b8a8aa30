"""Train CES-PPO: `python -m scheduler.train_ppo --seed 0 --out scheduler/checkpoints/ces_ppo.pt`.

Trains on random instances (`env.TrainingInstances`: generated and topohub networks kept apart from
the benchmarks, plain CPU edge nodes or the Alibaba machine table, background load, jobs that fit
on a node and jobs no node can hold): imitation of the teacher, then PPO, then the first node from
rollouts begun on many (`ppo.train`). Shows
progress; writes the learning curve as CSV and PNG (default `results/ppo/learning_curve.{csv,png}`)
with the validation figure — the greedy policy's iteration time over network-aware's, geometric
mean over instances drawn apart from training — and the checkpoint the `ces-ppo` algorithm loads.
Bad arguments exit with code 2 and a one-line reason.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from .config import add_options, from_args
from .env import EnvConfig, TrainingInstances
from .model import Cluster, Job
from .ppo import CHECKPOINT, PPOConfig, save, train
from .trace import MACHINE_TABLE, load_machine_spec

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results" / "ppo"
COLUMNS = (
    "phase",
    "instances",
    "seconds",
    "cpu_seconds",
    "loss",
    "entropy",
    "ret",
    "anchor",
    "vs_network_aware",
)
VALIDATION_SEED = 10_000  # + the training seed: instances training never draws


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, PPOConfig, EnvConfig]:
    """The command line: a flag for every field of PPOConfig and EnvConfig (`config`), and where
    to read and write; bad values exit with code 2."""
    p = argparse.ArgumentParser(
        prog="python -m scheduler.train_ppo",
        usage="%(prog)s [options]",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument(
        "--machines",
        type=Path,
        default=MACHINE_TABLE,
        help="machine table (Alibaba PAI format) for GPU clusters",
    )
    p.add_argument("--out", type=Path, default=CHECKPOINT, help="checkpoint to write")
    p.add_argument("--csv", type=Path, default=RESULTS / "learning_curve.csv")
    p.add_argument("--png", type=Path, default=RESULTS / "learning_curve.png")
    add_options(p, PPOConfig())
    add_options(p, EnvConfig())
    args = p.parse_args(argv)
    cfg, env_cfg = from_args(args, PPOConfig()), from_args(args, EnvConfig())
    problems = []
    for opt, low in (
        ("imitation", 0),
        ("ppo", 0),
        ("first_nodes", 0),
        ("layers", 1),
        ("hidden", 4),
        ("threads", 1),
        ("validation", 0),
    ):
        if getattr(cfg, opt) < low:
            flag = "--" + opt.replace("_", "-")
            problems.append(f"{flag} must be ≥ {low}, got {getattr(cfg, opt)}")
    if cfg.imitation + cfg.ppo + cfg.first_nodes < 1:
        problems.append("--imitation, --ppo and --first-nodes are all 0: nothing to train")
    if not args.machines.is_file():
        problems.append(f"--machines: {args.machines} is not a file")
    for opt in ("out", "csv", "png"):
        parent = getattr(args, opt).resolve().parent
        if parent.exists() and not parent.is_dir():
            problems.append(f"--{opt}: {parent} is not a directory")
    if problems:
        p.error("; ".join(problems))  # exit code 2
    return args, cfg, env_cfg


def validation_instances(
    env_cfg: EnvConfig, seed: int, n: int, machines: list
) -> list[tuple[Cluster, Job]]:
    """n instances of jobs no node can hold, drawn apart from training (another seed)."""
    draw = TrainingInstances(
        replace(env_cfg, spread_share=1.0, episodes_per_topology=1),
        VALIDATION_SEED + seed,
        machines,
    )
    return [draw.next() for _ in range(n)]


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Training loss per phase, and the validation figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_val) = plt.subplots(1, 2, figsize=(11, 3.6))
    for phase, color in (
        ("imitation", "tab:blue"),
        ("ppo", "tab:orange"),
        ("first node", "tab:green"),
    ):
        pts = [(r["instances"], r["loss"]) for r in rows if r["phase"] == phase]
        if pts:
            ax_loss.plot(*zip(*pts), lw=1, color=color, label=phase)
    ax_loss.set_title(
        "loss — imitation: −log p of the teacher's node; ppo: clipped "
        "objective;\nfirst node: cross-entropy to the target from the rollouts",
        fontsize=9,
    )
    ax_loss.legend(fontsize=8)
    val = [
        (r["instances"], r["vs_network_aware"])
        for r in rows
        if r.get("vs_network_aware") is not None
    ]
    if val:
        ax_val.plot(*zip(*val), marker="o", ms=3, lw=1.4)
    ax_val.axhline(1.0, color="grey", ls="--", lw=1)
    ax_val.set_title(
        "validation: greedy policy's iteration time / network-aware's (geometric mean)", fontsize=9
    )
    for ax in (ax_loss, ax_val):
        ax.set_xlabel("training instances")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args, cfg, env_cfg = parse_args(argv)
    machines = load_machine_spec(args.machines)
    validation = validation_instances(env_cfg, cfg.seed, cfg.validation, machines)
    for path in (args.out, args.csv, args.png):
        path.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    total = cfg.imitation + cfg.ppo + cfg.first_nodes
    with (
        args.csv.open("w", newline="") as fh,
        Progress(
            TextColumn("[bold]CES-PPO[/] seed {task.fields[seed]} {task.fields[phase]:10}"),
            BarColumn(),
            TextColumn("{task.completed:>5.0f}/{task.total:.0f} instances"),
            TextColumn("loss {task.fields[loss]:>6.3f}  validation {task.fields[val]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        ) as progress,
    ):
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        bar = progress.add_task("train", total=total, seed=cfg.seed, phase="", loss=0.0, val="–")

        def log(row: dict) -> None:
            rows.append(row)
            writer.writerow(row)
            fh.flush()
            val = row.get("vs_network_aware")
            progress.update(
                bar,
                completed=row["instances"],
                phase=row["phase"],
                loss=row["loss"],
                **({"val": f"{val:.3f}"} if val else {}),
            )

        agent = train(cfg, env_cfg, machines, log, validation)
    # train() returns the weights of the best validation figure
    final = min((r["vs_network_aware"] for r in rows if "vs_network_aware" in r), default=None)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {cfg.threads} thread(s), "
        f"load average {os.getloadavg()[2]:.1f} (15 min) at the end",
        "seconds": rows[-1]["seconds"] if rows else 0.0,
        "cpu_seconds": rows[-1]["cpu_seconds"] if rows else 0.0,
        "validation_vs_network_aware": final,
        "command": "python -m scheduler.train_ppo "
        + " ".join(sys.argv[1:] if argv is None else argv),
    }
    save(agent, cfg, env_cfg, args.out, meta)
    minutes = meta["seconds"] / 60
    plot(
        rows,
        args.png,
        f"CES-PPO ({cfg.encoder} encoder, seed {cfg.seed}): {minutes:.1f} min on {meta['machine']}",
    )
    print(
        f"checkpoint {args.out} ({minutes:.1f} min, validation {final}); learning curve "
        f"{args.csv}, {args.png}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
