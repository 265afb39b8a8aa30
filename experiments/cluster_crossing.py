#!/usr/bin/env python3
"""The capacity crossing hosts under each placement rule (issue 50's figure): how much of a
topology's link capacity becomes tunnels between hosts, and how the compute nodes' cores spread
over the hosts, when it is spread over 2 and 3 hosts (`lab.placement`; nothing is built).

    python experiments/cluster_crossing.py        # → results/cluster/crossing.json

Topologies: campus, fattree, topozoo/Abilene (topohub) and gen:internet:100. Rules: block,
round-robin, metis (pymetis, links weighted by capacity, switches by the cores behind them) and,
on campus, an explicit placement by zone as a user would write it (`EXPLICIT`; the other
topologies have no zones to write one from). Per topology, host count and rule: the capacity of
the links crossing hosts (Mbit/s, and its share of all the topology's capacity), how many links
cross, each host's cores, and the imbalance max/mean of the hosts' cores.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import sys
import time
from pathlib import Path

from experiments.common import RESULTS
from lab import placement as placing
from topologies import load_topology

TOPOLOGIES = ("campus", "fattree", "topozoo/Abilene", "gen:internet:100")
HOSTS = (2, 3)
RULES = ("block", "round-robin", "metis")
# campus by zone (topologies/campus.yaml): the core with the teaching buildings, the library and
# dormitories, the server room
EXPLICIT = {
    ("campus", 2): {
        "h0": ["core1", "core2", "agg1", "acc1", "agg2", "acc2", "acc3"],
        "h1": ["agg3", "acc4"],
    },
    ("campus", 3): {
        "h0": ["core1", "core2", "agg1", "acc1"],
        "h1": ["agg2", "acc2", "acc3"],
        "h2": ["agg3", "acc4"],
    },
}


def one(topo, servers: list[str], rule: str, given: dict[str, str] | None = None) -> dict:
    t0 = time.perf_counter()
    placement = placing.place(topo, servers, rule, given)
    elapsed_ms = (time.perf_counter() - t0) * 1000
    s = placing.summary(topo, placement, servers)
    cpu = [v["cpu"] for v in s["servers"].values()]
    mean = sum(cpu) / len(cpu)
    return {
        "crossing_mbps": s["crossing_mbps"],
        "crossing_share": round(s["crossing_mbps"] / s["total_mbps"], 4),
        "crossing_links": s["crossing_links"],
        "cpu_by_host": {h: v["cpu"] for h, v in s["servers"].items()},
        "cpu_imbalance": round(max(cpu) / mean, 3) if mean else None,
        "place_ms": round(elapsed_ms, 2),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=RESULTS / "cluster" / "crossing.json")
    a = p.parse_args(argv)
    doc: dict = {"hosts": list(HOSTS), "rules": [*RULES, "explicit"], "topologies": {}}
    for name in TOPOLOGIES:
        topo = load_topology(name)
        entry: dict = {
            "switches": len(topo.switches),
            "nodes": len(topo.nodes),
            "links": len(topo.links),
            "total_mbps": round(sum(lk.bw_mbps for lk in topo.links), 3),
            "cpu": round(sum(n.cpu for n in topo.nodes), 3),
        }
        for n in HOSTS:
            servers = [f"h{i}" for i in range(n)]
            by_rule = {rule: one(topo, servers, rule) for rule in RULES}
            if (name, n) in EXPLICIT:
                given = {sw: h for h, sws in EXPLICIT[(name, n)].items() for sw in sws}
                by_rule["explicit"] = {**one(topo, servers, "explicit", given), "given": given}
            entry[f"{n} hosts"] = by_rule
        doc["topologies"][name] = entry
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    # the table, as the closing note shows it
    print("| topology | hosts | " + " | ".join(doc["rules"]) + " |")
    print("| --- | --- |" + " --- |" * len(doc["rules"]))
    for name, entry in doc["topologies"].items():
        for n in HOSTS:
            cells = []
            for rule in doc["rules"]:
                r = entry[f"{n} hosts"].get(rule)
                cells.append(
                    "—"
                    if r is None
                    else f"{r['crossing_mbps']:g} ({r['crossing_share']:.0%}; cpu ×{r['cpu_imbalance']})"
                )
            print(f"| {name} | {n} | " + " | ".join(cells) + " |")
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
