#!/usr/bin/env python3
"""How full may grants fill a link before TCP stops carrying them? Streams at a share of a link,
with nothing else running.

    sudo python experiments/bench_headroom.py --seed 0 [--dilation 1.75] [--link 100]
        [--loads 0.8,0.85,0.9,0.95] [--seconds 10] [--repeats 2]

A run's binding flows are judged by what their sender put on the wire while busy against their
grant (`experiments.e2e.rows.wire_ratio`, band `fidelity.WIRE_BAND`). On the star, in the set
made before the grantable share (git history of results/e2e/contention-star), the flows into
links their grants filled to 90-104 % read 0.76-0.96, against 0.91-1.05 at most 60 % loaded.
This isolates that: three nodes on one switch of the testbed's datapath, every link `--link`
emulated Mbit/s (shaped on the switch's ports as the emulation shapes links), each sender held
by the per-destination class a grant installs (`edge.tc.set_destination`), no meter. At each load x:
- `one`: na → nb granted x × the link;
- `both`: na → nb and nb → na, each x × the link, at once (a two-node ring: each link carries
  one flow's data and the other's acknowledgements);
- `merge`: na → nc and nb → nc, each x / 2 × the link, with nc → na at x × the link (two
  senders into one node's link, which also carries the acknowledgements of its own flow).
A sender streams for `--seconds` (emulated); its figure is `bench_wire.ratio` of its kernel
counters (bits on the wire / busy time / its grant), with its retransmitted share. Beside them,
the packets the link's shaping dropped on the switch's ports. Prints a table and writes
results/bench_headroom.json.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from edge import tc
from experiments.bench_wire import SOCKET_SINK, in_node, ratio
from experiments.common import REPO, RESULTS, require_root, write_results
from protocol.dilation import Dilation
from testbed import Emulation
from topologies import parse_topology

NODES = ("na", "nb", "nc")
BASE_PORT = 29700

# A streaming sender: sends for `seconds` (host), prints its counters' difference for `dst`.
STREAM = """
import json, socket, sys, time
sys.path.insert(0, @REPO@)
from workloads.metrics import tcp_send_counters
dst, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((dst, port))
chunk = bytes(1 << 16)
for _ in range(32):  # past slow start before counting
    s.sendall(chunk)
before = tcp_send_counters()["peers"][dst]
end = time.monotonic() + seconds
while time.monotonic() < end:
    s.sendall(chunk)
after = tcp_send_counters()["peers"][dst]
print(json.dumps({k: v - before.get(k, 0) if k != "options" else v for k, v in after.items()}))
"""


def topology(link_mbps: float) -> dict:
    return {
        "name": "headroom",
        "defaults": {"bw_mbps": link_mbps},
        "switches": [{"name": "sw"}],
        "nodes": [{"name": n, "cpu": 1.0, "mem_mb": 1024} for n in NODES],
        "links": [{"ends": [n, "sw"]} for n in NODES],
    }


def cases(load: float) -> dict[str, list[tuple[str, str, float]]]:
    """Per case, its flows: (source, destination, share of the link granted)."""
    return {
        "one": [("na", "nb", load)],
        "both": [("na", "nb", load), ("nb", "na", load)],
        "merge": [("na", "nc", load / 2), ("nb", "nc", load / 2), ("nc", "na", load)],
    }


def switch_drops(net: Emulation) -> int:
    """Packets the qdiscs on the switch's ports dropped so far (the links' shaping)."""
    total = 0
    for (switch, _), name in net.names.interfaces.items():
        if switch != "sw":
            continue
        out = subprocess.run(
            ["tc", "-s", "qdisc", "show", "dev", name], capture_output=True, text=True
        ).stdout
        total += sum(int(d) for d in re.findall(r"dropped (\d+)", out))
    return total


def run_case(
    net: Emulation, flows: list[tuple[str, str, float]], link: float, seconds: float
) -> list[dict]:
    """Every flow of a case at once; per flow its grant, wire/grant and retransmitted share."""
    dilation = net.dilation
    for src, dst, share in flows:
        node = net.nodes[src]
        tc.set_destination(
            node.defaultIntf().name,
            net.topo.node(dst).ip,
            share * link,
            pid=node.pid,
            dilation=dilation,
        )
    program = STREAM.replace("@REPO@", repr(str(REPO)))
    sinks, senders = [], []
    try:
        for i, (_, dst, _) in enumerate(flows):
            port = BASE_PORT + i
            sinks.append(
                subprocess.Popen(
                    in_node(net, dst) + [SOCKET_SINK, net.topo.node(dst).ip, str(port)]
                )
            )
            net.wait_listening(dst, port, "bench_headroom: a sink")
        host_s = str(dilation.host_seconds(seconds))
        for i, (src, dst, _) in enumerate(flows):
            senders.append(
                subprocess.Popen(
                    in_node(net, src)
                    + [program, net.topo.node(dst).ip, str(BASE_PORT + i), host_s],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        rows = []
        for (src, dst, share), proc in zip(flows, senders):
            out, err = proc.communicate(timeout=dilation.host_seconds(seconds) + 120)
            if proc.returncode != 0:
                raise RuntimeError(f"bench_headroom: sender {src} → {dst}: {err.strip()[-300:]}")
            c = json.loads(out)
            rows.append(
                {
                    "flow": f"{src}>{dst}",
                    "grant_share": round(share, 4),
                    "wire_ratio": ratio(c, share * link, dilation),
                    "retrans_share": round(c.get("bytes_retrans", 0) / max(c["bytes_sent"], 1), 4),
                }
            )
        return rows
    finally:
        for p in sinks + senders:
            p.kill()
            p.wait()


def measure(args: argparse.Namespace, dilation: Dilation, loads: list[float]) -> list[dict]:
    topo = parse_topology(topology(args.link), "bench_headroom")
    rows = []
    with Emulation(topo, dilation=dilation) as net:
        for repeat in range(args.repeats):
            for load in loads:
                for case, flows in cases(load).items():
                    before = switch_drops(net)
                    found = run_case(net, flows, args.link, args.seconds)
                    row = {
                        "dilation": dilation.factor,
                        "load": load,
                        "case": case,
                        "repeat": repeat,
                        "flows": found,
                        "switch_drops": switch_drops(net) - before,
                    }
                    rows.append(row)
                    print(
                        f"  K {dilation.factor:<4} load {load:.2f} {case:5} "
                        + "  ".join(
                            f"{f['flow']} {f['wire_ratio']:.3f} (re {f['retrans_share']:.1%})"
                            for f in found
                        )
                        + f"  switch drops {row['switch_drops']}",
                        flush=True,
                    )
    return rows


def summary(rows: list[dict]) -> list[str]:
    """Per (K, load, case): the lowest and the median wire/grant over flows and repeats."""
    out = []
    keys = sorted({(r["dilation"], r["load"], r["case"]) for r in rows})
    for k, load, case in keys:
        got = [
            f["wire_ratio"]
            for r in rows
            if (r["dilation"], r["load"], r["case"]) == (k, load, case)
            for f in r["flows"]
        ]
        out.append(
            f"K {k:<4} load {load:.2f} {case:5}  wire/grant min {min(got):.3f} "
            f"median {statistics.median(got):.3f}"
        )
    return out


def _shares(text: str) -> list[float]:
    values = [float(x) for x in text.split(",")]
    if not values or not all(0 < v <= 1.0 for v in values):
        raise ValueError(f"expected shares within (0, 1], got {text}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="recorded; the streams are zeros")
    parser.add_argument("--dilation", default="1.75", help="K, or several (comma-separated)")
    parser.add_argument("--link", type=float, default=100.0, help="every link, emulated Mbit/s")
    parser.add_argument(
        "--loads", default="0.8,0.85,0.9,0.95", help="shares of the link the grants fill"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="a case, emulated seconds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_headroom.json")
    args = parser.parse_args(argv)
    try:
        loads = _shares(args.loads)
        dilations = [Dilation(float(k)) for k in args.dilation.split(",")]
    except ValueError as e:
        print(f"bench_headroom: --loads/--dilation: {e}", file=sys.stderr)
        return 2
    if args.link <= 0 or args.seconds <= 0 or args.repeats < 1:
        print(
            "bench_headroom: --link and --seconds must be above 0, --repeats at least 1",
            file=sys.stderr,
        )
        return 2
    require_root("it brings up an emulation")
    started = time.monotonic()
    rows = [r for d in dilations for r in measure(args, d, loads)]
    lines = summary(rows)
    print("\n".join(lines))
    write_results(args, started, rows=rows, summary=lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
