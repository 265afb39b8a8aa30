"""`python -m topologies check SPEC...`: validate topologies and print a summary of each."""

from __future__ import annotations

import argparse
import sys

from . import TopologyError, available_topologies, load_topology


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m topologies", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate topologies (names, files or topohub keys)")
    check.add_argument("specs", nargs="*", help="default: every topology in topologies/")
    args = parser.parse_args(argv)
    for spec in args.specs or available_topologies():
        try:
            topo = load_topology(spec)
        except TopologyError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        caps = sorted({lk.bw_mbps for lk in topo.links})
        print(
            f"{topo.name}: {len(topo.nodes)} compute nodes, {len(topo.switches)} switches, "
            f"{len(topo.links)} links ({caps[0]:g}–{caps[-1]:g} Mbit/s) [{topo.source}]"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
