"""What the benchmark scripts share: where the repository and its results are, the refusal to run
a testbed benchmark without root, how a testbed benchmark writes its results file, and how a
decision's latency is measured and summarised (the 8-task ring the scheduler benchmarks time,
percentiles on one scale)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from scheduler.jobs import ring_job
from scheduler.model import Resources

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"  # every script's default output lies below it, wherever it runs from

# The job whose placement bench_scheduler, bench_ppo and bench_eade time: 8 tasks of 0.5 cpu and
# 512 MB, 10 M parameters, 100 Mbit/s per flow.
RING8 = ring_job("ring8", 8, Resources(0.5, 512), 4e7, 100.0, compute_s=0.05, iterations=100)


def require_root(why: str) -> None:
    """Exit with status 2 and one line on stderr unless this process runs as root; `why` says
    what needs it."""
    if os.geteuid() != 0:
        print(f"error: run as root (sudo): {why}", file=sys.stderr)
        raise SystemExit(2)


def write_results(args: argparse.Namespace, started: float, **fields: object) -> None:
    """`args.out`: the machine, the settings (the script's arguments), `fields` and the wall time
    since `started` (time.monotonic()); says where it wrote."""
    # here, not at the top: experiments.machine imports the testbed, which the scheduler
    # benchmarks that share this module do not need
    from experiments.machine import machine

    doc = {
        "machine": machine(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        **fields,
        "wall_s": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100) of `values`, linearly interpolated (numpy's default);
    None when there are none."""
    return float(np.percentile(values, q)) if len(values) else None


class Stopwatch:
    """The wall and CPU milliseconds of every block run under it (`with watch: ...`), also when
    the block raises. CPU time is this process's: what a decision costs when the machine is
    shared, where wall time also counts waiting for a core."""

    def __init__(self) -> None:
        self.wall_ms: list[float] = []
        self.cpu_ms: list[float] = []

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_ms.append((time.perf_counter() - self._wall) * 1000)
        self.cpu_ms.append((time.process_time() - self._cpu) * 1000)

    def latency(self, prefix: str = "") -> dict[str, float | None]:
        """p50 and p99 of the wall and CPU times, keyed `{prefix}p50_ms`, `{prefix}cpu_p50_ms`,
        ..."""
        return {
            f"{prefix}{kind}p{q}_ms": percentile(times, q)
            for kind, times in (("", self.wall_ms), ("cpu_", self.cpu_ms))
            for q in (50, 99)
        }
