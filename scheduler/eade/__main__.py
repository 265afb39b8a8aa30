"""Seed 004's experiment: `python -m scheduler.eade train|evaluate|all [options]`.

  train     train the RL algorithms on every seed: checkpoints
            (scheduler/checkpoints/eade/<algorithm>_seed<s>.pt, with training time) and learning
            curves (results/eade/curves.{csv,png})
  evaluate  every algorithm on the held-out task streams, RL ones from their checkpoints:
            results/eade/results.{json,md}
  all       train, then evaluate
  diagnose  the rules that need no training (heuristics, both experts) on the settings between
            ours and the faithful one: results/eade/diagnostics.json
--setting faithful and --fixed-stream choose the variant (docs/eade.md); its checkpoints and
results go to a sub-folder of the defaults (fixed/, faithful/, faithful-streams/). A long
training runs in pieces: --stop-after-s S stops the trainings at their next episode after S
seconds (state in --states, the checkpoints with the best weights so far; exit status 3:
unfinished) and --resume goes on from there. Shows which seed and algorithm run, with an ETA.
Run it niced: `nice -n 19 python -m scheduler.eade all --seeds 5`.
Bad input: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from ..config import add_options, add_resume_options, from_args
from ..jobs import JobError
from ..trace import MACHINE_TABLE, load_machine_spec
from .agents import ALGORITHMS, AgentConfig
from .env import Setting, build_layout, load_layout
from .experiment import (
    ALL,
    CHECKPOINTS,
    DIAGNOSED,
    REFERENCES,
    RESULTS,
    STATES,
    ExperimentConfig,
    checkpoint_path,
    curves_of,
    diagnose,
    evaluate_all,
    table,
    train_all,
    write,
    write_curves,
)
from .heuristics import HEURISTICS


class UsageError(ValueError):
    pass


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m scheduler.eade",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("command", choices=("train", "evaluate", "all", "diagnose"))
    ap.add_argument(
        "--machines",
        type=Path,
        default=MACHINE_TABLE,
        help="the Alibaba machine table (pai_machine_spec.csv)",
    )
    ap.add_argument(
        "--checkpoints", type=Path, default=None, help=f"default {CHECKPOINTS}[/variant]"
    )
    ap.add_argument("--out", type=Path, default=None, help=f"default {RESULTS}[/variant]")
    ap.add_argument("--states", type=Path, default=None, help=f"default {STATES}/<variant>")
    add_resume_options(
        ap,
        "go on from the training states",
        "stop training at the next episode after this many seconds (exit status 3)",
    )
    ap.add_argument(
        "--only-seed",
        type=int,
        default=None,
        help="train this one of the --seeds only (one process per seed, side by side; train only)",
    )
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
    if args.only_seed is not None and (
        args.command != "train" or not 0 <= args.only_seed < cfg.seeds
    ):
        raise UsageError(
            f"--only-seed: expected a seed in 0..{cfg.seeds - 1} with the train command, got "
            f"{args.only_seed} with {args.command}"
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
        args.checkpoints = args.checkpoints or CHECKPOINTS / cfg.variant
        args.out = args.out or RESULTS / cfg.variant
        args.states = args.states or STATES / (cfg.variant or "ours")
        if args.command == "diagnose":
            torch.set_num_threads(1)
            return _diagnose(args, cfg)
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
        setting = cfg.make_setting()
        layout_cache: dict = {}

        def layouts(seed: int):
            if seed not in layout_cache:
                layout_cache[seed] = load_layout(seed, setting, args.machines)
            return layout_cache[seed]

        layouts(0)  # a bad table fails here, before any training
        torch.set_num_threads(1)
        doc, finished = _run(args, cfg, setting, layouts)
    except (UsageError, JobError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not finished:
        print(
            f"stopped after {args.stop_after_s:.0f} s: continue with --resume (states in "
            f"{args.states})",
            file=sys.stderr,
        )
        return 3
    if doc is not None:
        print(table(doc))
        print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


def _diagnose(args: argparse.Namespace, cfg: ExperimentConfig) -> int:
    import json

    from rich.progress import Progress

    machines = load_machine_spec(args.machines)
    units = cfg.seeds * len(DIAGNOSED) * (len(HEURISTICS) + len(REFERENCES)) * cfg.eval_episodes
    with Progress() as bar:
        task = bar.add_task("diagnostics", total=units)
        doc = diagnose(
            cfg.seeds,
            cfg.eval_episodes,
            lambda setting, seed: build_layout(machines, np.random.default_rng(seed), setting),
            lambda what, n: bar.update(task, advance=n, description=what),
        )
    path = (args.out or RESULTS) / "diagnostics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


def _run(args: argparse.Namespace, cfg: ExperimentConfig, setting: Setting, layouts):
    """(the results document or None, whether every training is done)."""
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    command, checkpoints, out = args.command, args.checkpoints, args.out
    rl = [a for a in cfg.algorithms if a in ALGORITHMS]
    seeds = 1 if args.only_seed is not None else cfg.seeds
    train_units = seeds * len(rl) * cfg.episodes if command != "evaluate" else 0
    eval_units = (
        cfg.seeds * (len(cfg.algorithms) + len(REFERENCES)) * cfg.eval_episodes
        if command != "train"
        else 0
    )
    doc, finished = None, True
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
            finished = train_all(
                cfg,
                AgentConfig(),
                layouts,
                setting,
                checkpoints,
                progress,
                args.states,
                args.resume,
                args.stop_after_s,
                args.only_seed,
            )
            if finished and args.only_seed is None:  # the other seeds' may still be training
                out.mkdir(parents=True, exist_ok=True)
                write_curves(curves_of(cfg, checkpoints), out)
        if eval_units and finished:
            doc = evaluate_all(cfg, layouts, setting, checkpoints, progress)
            write(doc, out)
    return doc, finished


if __name__ == "__main__":
    sys.exit(main())
