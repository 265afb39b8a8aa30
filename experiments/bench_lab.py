#!/usr/bin/env python3
"""Real-hosts mode measured on stand-in hosts: deploy time, and the quick scenario's
time-to-accuracy on hosts vs the emulation of the same topology. As root.

    sudo python experiments/bench_lab.py [--nodes 4] [--seeds 5] [--out results/bench_lab.json]
                                         [--deploy-only]

Deploy: `--nodes` stand-in hosts (`testbed.standin`: sshd containers, one OVS switch) and the
bring-up of `run.py --hosts`'s stack (`LabStack`) on them, `--seeds` times each way; `deploy_s` is
`lab.deploy.deploy_agents` (install the worker image where needed, start the agents),
`register_s` until every agent is on the Master. The stack runs as a lab does: its certificates
made by `python -m lab certs`, each agent given its identity, the Master, the agents and the
switches speaking TLS (`--deploy-only`: this figure alone).
- cold: the worker image copied to every host, in full (`docker save | ssh | docker load`, as
  `python -m lab install --force-copy`). The stand-in hosts share this machine's Docker engine,
  where the image always is: "absent" cannot be staged without a second engine, so the copy is
  forced. Every byte of the image crosses SSH and is read by `docker load`; what a host with
  its own empty engine would add — unpacking the layers to disk — is NOT in the figure (the
  engine finds the layers present).
- warm: the hosts' image has the id of this machine's: nothing is copied.

TTA: `run.py --quick --seeds K` in the emulation, then `run.py --quick --seeds K --hosts` on
stand-in hosts of the same (scaled) campus topology, its links shaped as the emulation shapes
them; per scheduler and job, time-to-accuracy mean ± sd over the seeds in each mode, and whether
the means are within the seeds' spread of each other (|difference| <= sd_hosts + sd_emulation).

Writes --out (JSON) and prints the figures; the runs' own results folders stay in a temporary
folder named at the end. Exit code 0, 1 when a bring-up or run failed, 2 on bad arguments.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker
from rich.console import Console

from experiments.common import REPO, RESULTS, require_root
from experiments.e2e.lab_stack import HostsRefused, LabStack
from experiments.e2e.scenario import SCENARIOS, ScenarioError, load_scenario, results_folder, scaled
from experiments.e2e.stack import RunError
from experiments.machine import machine
from lab.inventory import load_inventory
from protocol.http import free_port, read_token
from testbed import cleanup
from testbed.image import ImageError, ensure
from testbed.names import new_prefix
from testbed.standin import standin_lab
from topologies import load_topology, parse_topology

RUN = [sys.executable, str(REPO / "experiments" / "run.py")]


def star(n: int) -> dict:
    """`n` small nodes on one switch: the deploy figure is about hosts, not the network."""
    return {
        "name": f"star{n}",
        "switches": [{"name": "s1"}],
        "nodes": [{"name": f"h{i}", "cpu": 0.25, "mem_mb": 256} for i in range(1, n + 1)],
        "links": [{"ends": [f"h{i}", "s1"], "bw_mbps": 100} for i in range(1, n + 1)],
    }


def spread(xs: list[float]) -> dict:
    return {
        "mean": round(statistics.mean(xs), 2) if xs else None,
        "sd": round(statistics.stdev(xs), 2) if len(xs) > 1 else 0.0 if xs else None,
        "samples": [round(x, 2) for x in xs],
    }


def deploy_times(n: int, reps: int, image: str, work: Path) -> dict:
    topo = parse_topology(star(n), "bench_lab")
    times: dict[str, dict[str, list[float]]] = {
        way: {"deploy_s": [], "register_s": []} for way in ("cold", "warm")
    }
    with standin_lab(
        work, topo, image, f"bl{secrets.token_hex(2)}", free_port(), free_port(), shape=False
    ) as (_, inventory, token, pki):
        inv = load_inventory(inventory, topo)
        for rep in range(reps):
            for way in ("cold", "warm"):
                prefix = new_prefix()
                stack = LabStack(
                    topo,
                    prefix,
                    work / f"{way}{rep}",
                    Console(quiet=True),
                    inv,
                    str(token),
                    read_token(token),
                    image,
                    accept_new_host_keys=True,
                    force_copy=way == "cold",
                    pki=pki,
                )
                try:
                    with stack:
                        pass
                finally:
                    cleanup(prefix)
                for key in times[way]:
                    times[way][key].append(stack.timings[key])
                print(
                    f"deploy {way} {rep + 1}/{reps}: {stack.timings['deploy_s']:.1f} s, "
                    f"registered {stack.timings['register_s']:.1f} s",
                    flush=True,
                )
    return {way: {key: spread(xs) for key, xs in keys.items()} for way, keys in times.items()}


def quick(seeds: int, out: Path, *extra: str) -> dict:
    done = subprocess.run(
        RUN + ["--quick", "--seeds", str(seeds), "--out", str(out), *extra],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RunError(
            f"run.py {' '.join(extra[:2])} exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    return json.loads((out / "results.json").read_text())


def tta_table(runs: dict[str, dict]) -> list[dict]:
    """Per scheduler and job: TTA over the seeds in each mode, and whether they agree."""
    by: dict[tuple[str, str], dict[str, list[float]]] = {}
    for mode, res in runs.items():
        for r in res["runs"]:
            for row in r["jobs"]:
                cell = by.setdefault((row["scheduler"], row["job"]), {m: [] for m in runs})
                if row["reached_target"]:
                    cell[mode].append(row["tta_s"])
    table = []
    for (scheduler, job), cell in by.items():
        s = {mode: spread(xs) for mode, xs in cell.items()}
        h, e = s["hosts"], s["emulation"]
        agree = (
            None
            if h["mean"] is None or e["mean"] is None
            else abs(h["mean"] - e["mean"]) <= h["sd"] + e["sd"]
        )
        table.append({"scheduler": scheduler, "job": job, **s, "within_spread": agree})
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=4, help="stand-in hosts of the deploy figure")
    p.add_argument("--seeds", type=int, default=5, help="repetitions / seeds 0..K-1")
    p.add_argument("--out", default=str(RESULTS / "bench_lab.json"))
    p.add_argument("--deploy-only", action="store_true", help="the deploy figure alone")
    a = p.parse_args(argv)
    if a.nodes < 1 or a.seeds < 1:
        p.error("--nodes and --seeds: expected integers >= 1")
    out = Path(a.out)
    try:
        results_folder(out.parent, "--out")
    except ScenarioError as e:
        p.error(str(e))
    require_root("the stand-in hosts and the emulation need bridges and containers")
    try:
        image = ensure()
    except ImageError as e:
        print(f"error: worker image: {e}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="ces-bench-lab-"))
    t0 = time.monotonic()
    size_mb = docker.from_env().images.get(image).attrs["Size"] / 2**20
    try:
        deploy = deploy_times(a.nodes, a.seeds, image, work / "deploy")
        if a.deploy_only:
            out.write_text(
                json.dumps(
                    {
                        "machine": machine(),
                        "wall_s": round(time.monotonic() - t0, 1),
                        "settings": {"nodes": a.nodes, "seeds": a.seeds, "image": image},
                        "deploy": deploy,
                    },
                    indent=1,
                )
                + "\n"
            )
            print(f"wrote {out} (the deploy figure alone; runs in {work})")
            return 0
        scenario = load_scenario(SCENARIOS / "quick.yaml")
        topo = scaled(load_topology(scenario.topology), scenario.link_scale)
        runs = {"emulation": quick(a.seeds, work / "emulation")}
        print(f"emulation: {runs['emulation']['wall_s']:.0f} s", flush=True)
        with standin_lab(
            work / "hosts", topo, image, f"bl{secrets.token_hex(2)}", free_port(), free_port()
        ) as (_, inventory, token, pki):
            runs["hosts"] = quick(
                a.seeds,
                work / "hosts" / "run",
                "--hosts",
                str(inventory),
                "--token-file",
                str(token),
                "--accept-new-host-keys",
                "--pki",
                str(pki),
            )
        print(f"hosts: {runs['hosts']['wall_s']:.0f} s", flush=True)
    except (RunError, HostsRefused) as e:
        print(f"error: {e} (logs in {work})", file=sys.stderr)
        return 1
    table = tta_table(runs)
    result = {
        "machine": machine(),
        "wall_s": round(time.monotonic() - t0, 1),
        "settings": {
            "nodes": a.nodes,
            "seeds": a.seeds,
            "image": image,
            "image_mb": round(size_mb),
            "scenario": "quick",
            "topology": f"{topo.name} (links x {scenario.link_scale:g})",
        },
        "deploy": deploy,
        "deploy_note": "cold: the image forced through `docker save | ssh | docker load` to every "
        "host (the stand-in hosts share this machine's engine, which already "
        "holds the layers: unpacking them is not included); warm: nothing copied",
        "bringup_s": {mode: res.get("bringup_s") for mode, res in runs.items()},
        "tta": table,
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\ndeploy of {a.nodes} hosts ({size_mb:.0f} MB image), {a.seeds} times:")
    for way in ("cold", "warm"):
        d = deploy[way]
        print(
            f"  {way}: deploy {d['deploy_s']['mean']:.1f} ± {d['deploy_s']['sd']:.1f} s, "
            f"agents registered {d['register_s']['mean']:.1f} ± {d['register_s']['sd']:.1f} s"
        )
    print(f"quick scenario TTA (s), {a.seeds} seeds: hosts vs emulation")
    verdict = {True: "within spread", False: "APART", None: "-"}
    for row in table:
        print(
            f"  {row['scheduler']:<14} {row['job']:<6} {_pm(row['hosts'])} vs "
            f"{_pm(row['emulation'])}  {verdict[row['within_spread']]}"
        )
    print(f"wrote {out} (runs in {work})")
    return 0


def _pm(s: dict) -> str:
    n = len(s["samples"])
    return "-" if s["mean"] is None else f"{s['mean']:.1f} ± {s['sd']:.1f} (n={n})"


if __name__ == "__main__":
    sys.exit(main())
