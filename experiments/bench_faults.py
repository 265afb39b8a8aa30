#!/usr/bin/env python3
"""The fault table: each fault of `e2e.faults` injected into the real stack, as root.

    sudo python experiments/bench_faults.py --seed 0 [--out results/faults.json] [--overwrite]

One bring-up of the stack (the SDN app, the emulated network, the Master, an agent per node) for
master_kill, agent_kill, ovs_restart (restarts the host's ovs-vswitchd: no other testbed may run),
oom_kill and node_stop, one job each; then out_unwritable and orchestrator_kill, which run
`experiments/run.py`. The seed is the Master's scheduler seed (placements, the workers' seeds).
Prints and writes the table: fault, time to detect, recovered, jobs lost, jobs duplicated, what
happened, and the command that re-runs the fault alone. An existing --out is kept unless
--overwrite. Exit code 0 when every fault recovered with nothing lost or duplicated, 1 otherwise,
2 on bad arguments.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from experiments.common import RESULTS, require_root
from experiments.e2e import faults
from experiments.e2e.scenario import ScenarioError, results_folder
from experiments.machine import machine
from testbed import cleanup
from testbed.image import ImageError, ensure
from testbed.names import new_prefix

RERUN = "sudo .venv/bin/python -m pytest tests/integration/test_faults.py -k {fault}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS / "faults.json"))
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    a = p.parse_args(argv)
    out = Path(a.out)
    if out.exists() and not a.overwrite:
        p.error(f"--out {out} exists: give --overwrite to replace it, or another --out")
    try:
        results_folder(out.parent, "--out")
    except ScenarioError as e:
        p.error(str(e))
    require_root("the faults need bridges, containers and ovs-vswitchd")
    try:
        ensure()  # the worker image of the current inputs (built once)
    except ImageError as e:
        print(f"error: worker image: {e}", file=sys.stderr)
        return 1
    rows = []
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="ces-faults-"))  # kept: the processes' logs
    prefix = new_prefix()
    try:
        with faults.bring_up(prefix, work / "stack", a.seed) as stack:
            for fault in faults.ON_STACK:
                rows.append(faults.run(fault, stack))
                print(_line(rows[-1]), flush=True)
    finally:
        cleanup(prefix)
    for fault in (faults.out_unwritable, faults.orchestrator_kill):
        prefix = new_prefix()
        (work / fault.__name__).mkdir()
        try:
            rows.append(faults.run(fault, work / fault.__name__, prefix))
        finally:
            cleanup(prefix)
        print(_line(rows[-1]), flush=True)
    bad = [r.fault for r in rows if not r.recovered or r.lost or r.duplicated]
    print(f"\n{'fault':<18} {'detect s':>8}  recovered  lost  duplicated")
    for r in rows:
        print(
            f"{r.fault:<18} {_num(r.detect_s):>8}  {'yes' if r.recovered else 'NO':<9}  "
            f"{_num(r.lost):>4}  {_num(r.duplicated):>10}"
        )
    print("all recovered, nothing lost or duplicated" if not bad else f"FAILED: {', '.join(bad)}")
    out.write_text(
        json.dumps(
            {
                "seed": a.seed,
                "machine": machine(),
                "wall_s": round(time.monotonic() - t0, 1),
                "detect_limit_s": faults.DETECT_S,
                "failed": bad,
                "faults": [
                    {
                        **asdict(r),
                        "detect_s": None if r.detect_s is None else round(r.detect_s, 2),
                        "rerun": RERUN.format(fault=r.fault),
                    }
                    for r in rows
                ],
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {out} (logs in {work})")
    return 1 if bad else 0


def _num(x) -> str:
    return "-" if x is None else f"{x:.1f}" if isinstance(x, float) else str(x)


def _line(r: faults.Row) -> str:
    return (
        f"{r.fault}: detect {_num(r.detect_s)} s, recovered {'yes' if r.recovered else 'NO'}"
        f", lost {_num(r.lost)}, duplicated {_num(r.duplicated)} — {r.what}"
    )


if __name__ == "__main__":
    sys.exit(main())
