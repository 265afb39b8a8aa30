#!/usr/bin/env python3
"""Testbed benchmark: bring-up/teardown time of a topology, and shaping fidelity.

    sudo python experiments/bench_testbed.py --seed 1 [--topo campus] [--repeats 3]

1. Bring-up (until RSTP has converged, i.e. the network forwards) and teardown time, `--repeats`
   times (targets: ≤ 30 s up, ≤ 10 s down for campus).
2. Shaping fidelity: iperf3 TCP between two node containers over a path whose bottleneck is
   set to B ∈ {10, 50, 200} Mbit/s (target 0.85·B … 1.05·B), in two scenarios: the sender's
   access link (one switch on the path; HTB in the sender's namespace) and an inter-switch link
   (two switches; HTB on a switch-side veth). The seed picks the pairs among those whose paths
   have only links ≥ 500 Mbit/s; iperf3 omits its first second (slow start). The two end nodes
   get 2 CPUs, and each scenario first measures its ceiling (the link at 1 Gbit/s): where the
   ceiling is below B, the machine's CPU limits the figure, not the shaper.
Prints a table and writes results/bench_testbed.json (with the machine it ran on).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from experiments.common import RESULTS, require_root
from experiments.machine import machine
from testbed import Emulation
from topologies import TopologyError, load_topology

RATES = (10.0, 50.0, 200.0)
FAST_LINK_MBPS = 500.0


def bring_up_down(topo_spec: str, repeats: int) -> list[dict]:
    runs = []
    for i in range(repeats):
        net = Emulation(load_topology(topo_spec))
        with net:
            loss = net.ping_all(timeout_s=1.0)
        runs.append(
            {
                "up_s": round(net.timings["converged_s"], 2),
                "built_s": round(net.timings["up_s"], 2),
                "down_s": round(net.timings["down_s"], 2),
                "ping_loss": loss,
            }
        )
        print(
            f"  run {i + 1}: up {runs[-1]['up_s']:.1f} s (built {runs[-1]['built_s']:.1f} s, "
            f"then RSTP), down {runs[-1]['down_s']:.1f} s, "
            f"ping loss {loss:.0%}",
            flush=True,
        )
    return runs


def _candidates(net: Emulation, switches_on_path: int) -> list[tuple[str, str, list[str]]]:
    """Node pairs whose forwarding path crosses `switches_on_path` switches over fast links."""
    found = []
    names = sorted(net.nodes)
    for a in names:
        for b in names:
            if a != b:
                path = net.forwarding_path(a, b)
                if (
                    len(path) - 2 == switches_on_path
                    and net.bottleneck_mbps(path) >= FAST_LINK_MBPS
                ):
                    found.append((a, b, path))
    return found


def shaping(topo_spec: str, seed: int, repeats: int, seconds: float) -> dict:
    """Two scenarios: the bottleneck is the sender's access link (shaped in the sender's
    namespace, one switch on the path) or an inter-switch link (shaped on a switch-side veth)."""
    rng = random.Random(seed)
    scenarios = []
    with Emulation(load_topology(topo_spec)) as net:
        for name, switches in (("access link", 1), ("inter-switch link", 2)):
            candidates = _candidates(net, switches)
            if not candidates:
                print(
                    f"  {name}: no pair with a {switches}-switch path of links ≥ "
                    f"{FAST_LINK_MBPS:g} Mbit/s in {topo_spec}; skipped"
                )
                continue
            src, dst, path = rng.choice(candidates)
            u, v = (src, path[1]) if switches == 1 else (path[1], path[2])
            for node in (src, dst):  # the figure should be the shaper's, not a CPU quota's
                net.update_node(node, cpu=2.0)
            print(f"  {name}: {' → '.join(path)}; bottleneck {u}–{v}", flush=True)
            # What the path carries with the link at 1 Gbit/s: when this ceiling is below B the
            # machine (the userspace datapath's CPU), not the shaper, limits the figure.
            net.set_link(u, v, 1000.0)
            ceiling = [net.iperf(src, dst, seconds=seconds, omit_s=1) for _ in range(repeats)]
            print(
                "    ceiling (1 Gbit/s link): " + ", ".join(f"{g:.1f}" for g in ceiling), flush=True
            )
            rows = []
            for rate in RATES:
                net.set_link(u, v, rate)
                goodputs = [net.iperf(src, dst, seconds=seconds, omit_s=1) for _ in range(repeats)]
                rows.append(
                    {
                        "bottleneck_mbps": rate,
                        "goodput_mbps": [round(g, 2) for g in goodputs],
                        "median_ratio": round(statistics.median(goodputs) / rate, 3),
                        "min_ratio": round(min(goodputs) / rate, 3),
                        "max_ratio": round(max(goodputs) / rate, 3),
                    }
                )
                print(
                    f"    B = {rate:>5g} Mbit/s: " + ", ".join(f"{g:.1f}" for g in goodputs),
                    flush=True,
                )
            net.set_link(
                u,
                v,
                next(lk.bw_mbps for lk in load_topology(topo_spec).links if {lk.a, lk.b} == {u, v}),
            )
            scenarios.append(
                {
                    "scenario": name,
                    "src": src,
                    "dst": dst,
                    "path": path,
                    "bottleneck_link": [u, v],
                    "rows": rows,
                    "ceiling_mbps": [round(g, 2) for g in ceiling],
                }
            )
        return {"seconds": seconds, "omit_s": 1, "scenarios": scenarios, "datapath": net.datapath}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--topo", default="campus")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="iperf3 duration")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_testbed.json")
    args = parser.parse_args(argv)
    require_root("the emulation needs bridges, containers and ovs-vswitchd")
    try:
        load_topology(args.topo)
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    started = time.time()
    load_before = [round(x, 2) for x in os.getloadavg()]
    print(f"bring-up / teardown of {args.topo} ×{args.repeats}", flush=True)
    runs = bring_up_down(args.topo, args.repeats)
    print("shaping fidelity (iperf3 TCP, receiver side)", flush=True)
    fidelity = shaping(args.topo, args.seed, args.repeats, args.seconds)
    result = {
        "topology": args.topo,
        "seed": args.seed,
        "repeats": args.repeats,
        "machine": machine(),
        "bring_up_teardown": runs,
        "loadavg_before": load_before,
        "shaping": fidelity,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    up = [r["up_s"] for r in runs]
    down = [r["down_s"] for r in runs]
    print(
        f"\n{args.topo} on {result['machine']['cores']} cores, kernel "
        f"{result['machine']['kernel']}, {result['machine']['datapath']} datapath; load average "
        f"{load_before[0]:.1f} before, {result['machine']['load_average_1m']:.1f} after"
    )
    print(f"{'metric':<28}{'median':>10}{'max':>10}{'target':>12}")
    print(f"{'bring-up (s)':<28}{statistics.median(up):>10.1f}{max(up):>10.1f}{'≤ 30':>12}")
    print(f"{'teardown (s)':<28}{statistics.median(down):>10.1f}{max(down):>10.1f}{'≤ 10':>12}")
    for sc in fidelity["scenarios"]:
        print(
            f"{'ceiling ' + sc['scenario'].split()[0] + ' (Mbit/s)':<28}"
            f"{statistics.median(sc['ceiling_mbps']):>10.1f}{max(sc['ceiling_mbps']):>10.1f}"
        )
        for row in sc["rows"]:
            label = f"goodput/B {sc['scenario'].split()[0]} {row['bottleneck_mbps']:g}"
            print(
                f"{label:<28}{row['median_ratio']:>10.2f}{row['max_ratio']:>10.2f}"
                f"{'0.85–1.05':>12}  (min {row['min_ratio']:.2f})"
            )
    print(f"written {args.out}")
    ok = (
        max(up) <= 30
        and max(down) <= 10
        and all(
            r["min_ratio"] >= 0.85 and r["max_ratio"] <= 1.05
            for sc in fidelity["scenarios"]
            for r in sc["rows"]
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
