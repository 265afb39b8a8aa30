#!/usr/bin/env python3
"""Build an emulated topology, check it, tear it down (the interim end-to-end run).

    sudo python experiments/run.py --topo campus     # build, ping all, one shaped rate, teardown
    sudo python experiments/run.py --cleanup [--prefix cesXXXX]   # remove what a killed run left

Exit codes: 0 ok, 1 a check failed or the testbed broke, 2 bad input (e.g. a malformed topology).
"""
from __future__ import annotations

import _venv  # noqa: F401  (re-exec under .venv)

import argparse
import logging
import os
import platform
import sys
from dataclasses import dataclass

from docker.errors import DockerException

from topologies import Topology, TopologyError, load_topology

from testbed import Emulation, EmulationError, cleanup
from testbed.names import check_prefix

log = logging.getLogger("run")


@dataclass
class Checks:
    loss: float
    src: str
    dst: str
    path: list[str]
    bottleneck_mbps: float
    measured_mbps: float

    @property
    def ok(self) -> bool:
        ratio = self.measured_mbps / self.bottleneck_mbps
        return self.loss == 0.0 and 0.7 <= ratio <= 1.05


def shaped_pair(net: Emulation) -> tuple[str, str]:
    """Two nodes on the same switch whose access links bound their rate below 1 Gbit/s
    (the userspace datapath does not reach much more), else the first two nodes."""
    topo = net.topo
    by_switch: dict[str, list] = {}
    for n in topo.nodes:
        by_switch.setdefault(topo.access_link(n.name).other(n.name), []).append(n.name)
    pairs = [(a, b) for names in by_switch.values() for a in names for b in names if a != b]
    if not pairs:
        return topo.nodes[0].name, topo.nodes[1].name
    return min(pairs, key=lambda p: topo.access_link(p[0]).bw_mbps)


def check(net: Emulation) -> Checks:
    loss = net.ping_all(timeout_s=1.0)
    src, dst = shaped_pair(net)
    path = net.forwarding_path(src, dst)
    return Checks(loss, src, dst, path, net.bottleneck_mbps(path), net.iperf(src, dst, 5))


def report(topo: Topology, net: Emulation, c: Checks) -> None:
    print(f"\n== {topo.name}: {len(topo.nodes)} nodes, {len(topo.switches)} switches, "
          f"{len(topo.links)} links ({net.datapath} datapath, prefix {net.prefix})")
    print(f"bring-up         {net.timings['converged_s']:.1f} s")
    print(f"ping all         {100 * (1 - c.loss):.1f}% delivered")
    print(f"shaped rate      {c.src} → {c.dst} via {' → '.join(c.path[1:-1])}: "
          f"{c.measured_mbps:.1f} Mbit/s of a {c.bottleneck_mbps:g} Mbit/s bottleneck "
          f"({c.measured_mbps / c.bottleneck_mbps:.0%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topo", default="campus", help="topology name or file (default campus)")
    parser.add_argument("--cleanup", action="store_true",
                        help="remove what killed runs left (all runs, or --prefix)")
    parser.add_argument("--prefix", help="run prefix: 'ces' + 4 hex digits")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.prefix:
        try:
            check_prefix(args.prefix)
        except ValueError as e:
            parser.error(str(e))  # exit code 2
    if os.geteuid() != 0:
        print("error: run as root (sudo): the testbed creates bridges, veths and containers",
              file=sys.stderr)
        return 2
    if args.cleanup:
        removed = cleanup(args.prefix)
        print(f"cleanup{f' of {args.prefix}' if args.prefix else ''}: removed {removed.summary()}")
        return 0
    try:
        topo = load_topology(args.topo)
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        with Emulation(topo, prefix=args.prefix) as net:
            result = check(net)
            report(topo, net, result)
    except (EmulationError, DockerException) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: torn down", file=sys.stderr)
        return 130
    print(f"teardown         {net.timings['down_s']:.1f} s   ({platform.node()}, "
          f"{os.cpu_count()} cpus, kernel {platform.release()})")
    print("OK" if result.ok else "FAILED: a check is out of bounds")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
