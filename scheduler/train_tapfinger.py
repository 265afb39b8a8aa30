"""Re-create TapFinger's checkpoint (scheduler/checkpoints/tapfinger.pt): MAPPO in TapFinger's own
setting and in CES's simulator (`tapfinger.mappo`), seeded, one thread.

    nice -n 19 python -m scheduler.train_tapfinger [--out PATH] [--smoke] [options]

--smoke trains a few episodes only (tests, CI); every field of `mappo.Hyper` is a flag as well
(`config.add_options`), over the defaults or --smoke's. Bad input: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from .config import add_options, from_args
from .tapfinger import mappo
from .tapfinger.policy import CHECKPOINT


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scheduler.train_tapfinger",
        usage="%(prog)s [options]",
        description=__doc__.split("\n\n")[0],
    )
    ap.add_argument("--out", default=str(CHECKPOINT), help="where to write the checkpoint")
    ap.add_argument("--smoke", action="store_true", help="a few short episodes (tests, CI)")
    add_options(ap, mappo.Hyper())
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not out.parent.is_dir():
        print(f"error: --out: no directory {out.parent}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    hp = mappo.Hyper()
    if args.smoke:
        hp = replace(
            hp,
            paper_episodes=1,
            paper_tasks=12,
            ces_episodes=1,
            epochs=1,
            episodes_per_update=1,
            ces_arrivals="poisson:n=6,load=0.8",
            validation_episodes=1,
        )
    hp = from_args(args, hp)
    start = time.perf_counter()
    saved = mappo.train_all(hp, lambda line: print(line, file=sys.stderr, flush=True))
    saved["wall_s"] = time.perf_counter() - start
    torch.save(saved, out)
    print(
        json.dumps(
            {k: saved[k]["training"] for k in ("paper", "ces")}
            | {"wall_s": round(saved["wall_s"], 1), "out": str(out)}
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
