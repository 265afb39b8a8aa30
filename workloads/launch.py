"""Building a task's command line, and running a whole job as local processes (loopback).

The testbed starts the same command in worker containers; tests and calibration baselines run it
here with `run_local`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from protocol.http import free_port
from protocol.worker import option_flags

from .train import TrainConfig

PACKAGE_ROOT = Path(__file__).resolve().parent.parent  # where `workloads` is importable from
_FIELDS = {f.name for f in fields(TrainConfig)}


def train_argv(
    rank: int, world_size: int, python: str = sys.executable, **options: Any
) -> list[str]:
    """argv of `python -m workloads.train` for one task; `options` are TrainConfig fields."""
    unknown = set(options) - _FIELDS
    if unknown:
        raise ValueError(f"unknown training option(s): {', '.join(sorted(unknown))}")
    # TrainConfig.timeout_s is the program's --timeout
    flags = {"timeout" if k == "timeout_s" else k: v for k, v in options.items()}
    return [
        python,
        "-m",
        "workloads.train",
        *option_flags({"rank": rank, "world_size": world_size, **flags}),
    ]


class LocalJobError(RuntimeError):
    pass


def run_local(
    world_size: int, out_dir: str | Path, deadline_s: float = 300.0, **options: Any
) -> list[Path]:
    """Run every rank of a job as a local process over loopback; return the JSONL paths.

    Raises LocalJobError (with the failing ranks' stderr) if a rank fails or the job overruns
    `deadline_s`; every process is stopped before returning, also on Ctrl-C."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    options = {"master_addr": "127.0.0.1", "master_port": free_port(), "iface": "lo", **options}
    paths = [out_dir / f"rank{r}.jsonl" for r in range(world_size)]
    errs = [open(out_dir / f"rank{r}.stderr", "w+") for r in range(world_size)]  # noqa: SIM115  (closed below, after the ranks)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    procs = [
        subprocess.Popen(
            train_argv(r, world_size, out=paths[r], **options),
            stdout=subprocess.DEVNULL,
            stderr=errs[r],
            env=env,
        )
        for r in range(world_size)
    ]
    try:
        deadline = time.monotonic() + deadline_s
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise LocalJobError(f"job did not finish within {deadline_s:.0f} s")
            if any(p.returncode not in (None, 0) for p in procs):
                break  # one rank failed: the others would wait for it until gloo's timeout
            time.sleep(0.1)
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
        if failed:
            details = []
            for r, code in failed:
                errs[r].seek(0)
                status = "still running" if code is None else f"exit {code}"
                details.append(f"rank {r} {status}: {errs[r].read()[-2000:]}")
            raise LocalJobError("; ".join(details))
        return paths
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in errs:
            f.close()
