"""Seed 004's experiment: `python -m scheduler.eade train|evaluate|all [options]`.

  train     train the RL algorithms on every seed: checkpoints
            (scheduler/checkpoints/eade/<algorithm>_seed<s>.pt, with training time) and learning
            curves (results/eade/curves.{csv,png})
  evaluate  every algorithm on the held-out task streams, RL ones from their checkpoints:
            results/eade/results.{json,md}
  all       train, then evaluate
Shows which seed and algorithm run, with an ETA. Run it niced:
`nice -n 19 python -m scheduler.eade all --seeds 5`.
Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from ..config import add_options, from_args
from ..jobs import JobError
from ..trace import MACHINE_TABLE
from .agents import ALGORITHMS, AgentConfig
from .env import Setting, load_layout
from .experiment import (
    ALL,
    CHECKPOINTS,
    RESULTS,
    ExperimentConfig,
    checkpoint_path,
    evaluate_all,
    table,
    train_all,
    write,
    write_curves,
)


class UsageError(ValueError):
    pass


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m scheduler.eade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=("train", "evaluate", "all"))
    ap.add_argument(
        "--machines",
        type=Path,
        default=MACHINE_TABLE,
        help="the Alibaba machine table (pai_machine_spec.csv)",
    )
    ap.add_argument("--checkpoints", type=Path, default=CHECKPOINTS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    add_options(ap, ExperimentConfig())
    try:
        return ap.parse_args(argv)
    except SystemExit as e:  # argparse already printed its one-line error (status 2)
        raise SystemExit(e.code) from None


def config(args: argparse.Namespace) -> ExperimentConfig:
    cfg = from_args(args, ExperimentConfig())
    for opt in ("seeds", "episodes", "eval_episodes", "curve_every", "curve_streams"):
        if getattr(cfg, opt) < 1:
            raise UsageError(
                f"--{opt.replace('_', '-')}: expected an integer ≥ 1, got {getattr(cfg, opt)}"
            )
    unknown = [a for a in cfg.algorithms if a not in ALL]
    if unknown:
        raise UsageError(
            f"--algorithms: unknown algorithm '{unknown[0]}' (known: {', '.join(ALL)})"
        )
    if not args.machines.is_file():
        raise UsageError(
            f"--machines: {args.machines}: no such file (the Alibaba machine table, "
            "pai_machine_spec.csv)"
        )
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        cfg = config(args)
        training = args.command in ("train", "all")
        if not training:
            missing = [
                checkpoint_path(args.checkpoints, a, s)
                for a in cfg.algorithms
                if a in ALGORITHMS
                for s in range(cfg.seeds)
                if not checkpoint_path(args.checkpoints, a, s).exists()
            ]
            if missing:
                raise UsageError(
                    f"{missing[0]}: no checkpoint (train first: "
                    f"python -m scheduler.eade train --seeds {cfg.seeds})"
                )
        setting = Setting()
        layout_cache: dict = {}

        def layouts(seed: int):
            if seed not in layout_cache:
                layout_cache[seed] = load_layout(seed, setting, args.machines)
            return layout_cache[seed]

        layouts(0)  # a bad table fails here, before any training
        torch.set_num_threads(1)
        doc = _run(args.command, cfg, setting, layouts, args.checkpoints, args.out)
    except (UsageError, JobError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if doc is not None:
        print(table(doc))
        print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


def _run(
    command: str, cfg: ExperimentConfig, setting: Setting, layouts, checkpoints: Path, out: Path
) -> dict | None:
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    rl = [a for a in cfg.algorithms if a in ALGORITHMS]
    train_units = cfg.seeds * len(rl) * cfg.episodes if command != "evaluate" else 0
    eval_units = (
        cfg.seeds * (len(cfg.algorithms) + 1) * cfg.eval_episodes if command != "train" else 0
    )
    doc = None
    # A unit is an episode, trained or evaluated; training ones dominate the ETA, as they should.
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task("starting", total=train_units + eval_units)

        def progress(what: str, units: float) -> None:
            bar.update(task, advance=units, description=what)

        if train_units:
            curves = train_all(cfg, AgentConfig(), layouts, setting, checkpoints, progress)
            out.mkdir(parents=True, exist_ok=True)
            write_curves(curves, out)
        if eval_units:
            doc = evaluate_all(cfg, layouts, setting, checkpoints, progress)
            write(doc, out)
    return doc


if __name__ == "__main__":
    sys.exit(main())
