"""Train TapFinger's networks (scheduler/checkpoints/tapfinger.pt): MAPPO in TapFinger's own
setting (`paper`) or in CES's simulator (`ces`), seeded, one thread a process (--workers
processes roll the episodes out, to the same result); each writes its part of the checkpoint and
keeps the other.

    nice -n 19 python -m scheduler.train_tapfinger paper|ces [--resume] [--stop-after-s S] [options]

A long training runs in pieces: the training state (weights, optimizer, random generators, the
history) goes to --state every `checkpoint_every` episodes and when --stop-after-s has passed
(at the next update); the checkpoint then holds the best weights so far. `--resume` goes on from
--state, exactly as if it had not stopped; --episodes may be raised to train further. --smoke
trains a few short episodes (tests, CI). Every field of `mappo.Hyper` is a flag (`config.add_options`),
over the setting's defaults (`mappo.DEFAULTS`) or --smoke's. Bad input: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch

from .config import add_options, add_resume_options, from_args, positive_int
from .tapfinger import mappo
from .tapfinger.policy import CHECKPOINT

STATES = Path(__file__).resolve().parent.parent / "results" / "runs"
SMOKE = dict(
    episodes=2,
    paper_tasks=12,
    epochs=1,
    episodes_per_update=1,
    ces_arrivals="poisson:n=6,load=0.8",
    validation_episodes=1,
    validate_every=1,
    checkpoint_every=1,
)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m scheduler.train_tapfinger",
        description=__doc__.split("\n\n")[0],
    )
    sub = ap.add_subparsers(dest="setting", required=True, metavar="paper|ces")
    for setting, base in mappo.DEFAULTS.items():
        p = sub.add_parser(setting, help=f"train the network of the {setting} setting")
        p.add_argument("--out", default=str(CHECKPOINT), help="the checkpoint to write into")
        p.add_argument(
            "--state",
            default=None,
            help=f"the training state (default {STATES}/tapfinger-{setting}.state.pt)",
        )
        add_resume_options(
            p, "go on from --state", "stop at the first update after this many seconds of wall time"
        )
        p.add_argument("--smoke", action="store_true", help="a few short episodes (tests, CI)")
        p.add_argument(
            "--workers",
            type=positive_int,
            default=1,
            help="processes rolling out the episodes (the result is the same for any number)",
        )
        add_options(p, base)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out)
    state = Path(args.state or STATES / f"tapfinger-{args.setting}.state.pt")
    for flag, path in (("--out", out), ("--state", state)):
        if not path.parent.is_dir() and not (flag == "--state" and args.state is None):
            print(f"error: {flag}: no directory {path.parent}", file=sys.stderr)
            return 2
    if args.resume and not state.exists():
        print(f"error: --resume: no training state {state}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    hp = mappo.DEFAULTS[args.setting]
    if args.smoke:
        hp = replace(hp, **SMOKE)
    hp = from_args(args, hp)
    training = mappo.Training(args.setting, hp, workers=args.workers)
    if args.resume:
        try:
            training.restore(torch.load(state, weights_only=False))
        except ValueError as e:
            print(f"error: --resume: {e}", file=sys.stderr)
            return 2

    def save(t: mappo.Training) -> None:
        state.parent.mkdir(parents=True, exist_ok=True)
        torch.save(t.state(), state)
        mappo.write_checkpoint(out, t)

    log = lambda line: print(line, file=sys.stderr, flush=True)
    log(
        f"training TapFinger in the {args.setting} setting: episodes {training.done}..{hp.episodes}"
    )
    finished = training.run(log, args.stop_after_s, save)
    print(
        json.dumps(
            training.summary() | {"finished": finished, "out": str(out), "state": str(state)}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
