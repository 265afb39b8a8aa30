"""Running one training job as worker containers on an emulated network.

`net` is a running `testbed.Emulation` (duck-typed here, so this package does not depend on the
testbed): `net.start_worker(node, name, argv, cpu, mem_mb, env)` starts a container that joins
`node`'s network namespace (its `eth0` carries the topology's address) and `net.nodes[node].ip`
is that address. Each task writes its JSON lines to stdout; they are collected from the
container's log, so no volume is needed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from protocol.worker import METRICS_OUT, RENDEZVOUS_PORT, START_ENV

from .launch import train_argv

WORKER_PYTHON = "python3"  # the worker image's interpreter (workloads/ is on its PYTHONPATH)


class TestbedJobError(RuntimeError):
    pass


class EmulatedNetwork(Protocol):
    nodes: dict[str, Any]

    def start_worker(
        self,
        node: str,
        name: str,
        command: str | list[str],
        cpu: float,
        mem_mb: int,
        env: dict[str, str] | None = None,
    ) -> Any: ...


def run_job(
    net: EmulatedNetwork,
    placement: Sequence[str],
    out_dir: str | Path,
    job: str = "job",
    cpu: float = 0.6,
    mem_mb: int = 768,
    deadline_s: float = 1800.0,
    **options: Any,
) -> list[Path]:
    """Start rank r on node placement[r] (rendezvous at rank 0's node), wait for every rank,
    write out_dir/rank<r>.jsonl (+ .stderr) and return the JSONL paths.

    Raises TestbedJobError if a rank fails or the job overruns `deadline_s`. The job's
    containers are removed in every case (also on Ctrl-C)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    k = len(placement)
    options = {
        "master_addr": net.nodes[placement[0]].ip,
        "master_port": RENDEZVOUS_PORT,
        "iface": "eth0",
        **options,
        "out": METRICS_OUT,
    }
    containers = []
    try:
        for rank, node in enumerate(placement):
            argv = train_argv(rank, k, python=WORKER_PYTHON, **options)
            env = {START_ENV: repr(time.time())}
            containers.append(net.start_worker(node, f"{job}-r{rank}", argv, cpu, mem_mb, env))
        codes = _wait(containers, deadline_s)
        paths = []
        for rank, c in enumerate(containers):
            paths.append(out_dir / f"rank{rank}.jsonl")
            paths[-1].write_bytes(c.logs(stdout=True, stderr=False))
            (out_dir / f"rank{rank}.stderr").write_bytes(c.logs(stdout=False, stderr=True))
        failed = [r for r, code in enumerate(codes) if code != 0]
        if failed:
            tails = "; ".join(
                f"rank {r} ({placement[r]}) exit {codes[r]}: "
                f"{(out_dir / f'rank{r}.stderr').read_text(errors='replace')[-1500:]}"
                for r in failed
            )
            raise TestbedJobError(f"job {job} failed: {tails}")
        return paths
    finally:
        for c in containers:
            # already gone (node removed, cleanup ran): nothing to undo
            with contextlib.suppress(Exception):
                c.remove(force=True)


def _wait(containers: list, deadline_s: float) -> list[int | None]:
    """Exit codes once all ranks exited, or as soon as one failed (the others would only wait
    for it until gloo's timeout); None for a rank still running then."""
    deadline = time.monotonic() + deadline_s
    while True:
        codes: list[int | None] = []
        for c in containers:
            c.reload()
            codes.append(c.attrs["State"]["ExitCode"] if c.status == "exited" else None)
        if all(code is not None for code in codes) or any(code for code in codes):
            return codes
        if time.monotonic() > deadline:
            raise TestbedJobError(f"job did not finish within {deadline_s:.0f} s")
        time.sleep(0.5)
