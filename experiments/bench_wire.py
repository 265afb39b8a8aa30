#!/usr/bin/env python3
"""How a message flow reads on the wire against its grant, with nothing else running.

    sudo python experiments/bench_wire.py --seed 0 [--dilation 1.75,3.5,7] [--rate 150]
        [--cpus 1.0,0.2] [--compute] [--pause-ms 2] [--delay-ms 0]

A point-to-point collective (all-to-all, custom, the star) sends one message per flow and
iteration, where a ring streams. The run's verdict judges a ring's binding flows by what the
sender put on the wire while busy against its installed rate (`experiments.e2e.rows.wire_ratio`,
band `fidelity.WIRE_BAND`); in the mixed scenario the cycle's flows read 0.79-0.86 of their
grant, and what this measures is why it judges messages no more (`fidelity.STREAMING`,
docs/workloads.md). It isolates the path those flows take: two nodes on one switch of the
testbed's datapath, each node's traffic to the other held by the per-destination class a grant
installs (`edge.tc.set_destination`), at each `--dilation` K. Over it, `--messages` messages
of `--bytes` each, `--pause-ms` (emulated) between them:
- `socket`: a plain TCP sender in the node's namespace, no CPU quota;
- `gloo`: two ranks of torch.distributed gloo, isend/irecv as `workloads.collectives` does, in
  worker containers of the node (its cgroup, each `--cpus` emulated cores), one way and both
  ways at once; with `--compute`, each rank also runs a training thread that spends its quota,
  as a run's workers do.
Each figure is the sender's kernel counters over the messages (`workloads.metrics`): bits on the
wire / busy time / the class's rate; beside it, the nodes' kernel TCP events in the gloo case
(/proc/PID/net/netstat: loss probes, delayed ACKs, drops). Prints a table and writes
results/bench_wire.json.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from edge import tc
from experiments.common import REPO, RESULTS, require_root, write_results
from protocol.dilation import Dilation
from scheduler.config import positive_int
from testbed import Emulation
from topologies import parse_topology
from workloads.metrics import wire_rate_mbps


def topology(link_mbps: float, delay_ms: float) -> dict:
    """Two nodes on one switch."""
    return {
        "name": "wire",
        "defaults": {"bw_mbps": link_mbps, "delay_ms": delay_ms},
        "switches": [{"name": "sw"}],
        "nodes": [{"name": n, "cpu": 1.0, "mem_mb": 2048} for n in ("na", "nb")],
        "links": [{"ends": ["na", "sw"]}, {"ends": ["nb", "sw"]}],
    }


PAUSE_S = 0.002  # emulated, between a sender's messages
PORT = 29611

# Rank 0 sends to rank 1 (and rank 1 to rank 0 when both ways), one message per round, as
# `workloads.collectives._PointToPoint._exchange` posts them; prints its counters' difference.
GLOO_PAIR = """
import json, sys, time
import torch, torch.distributed as dist
from workloads.metrics import tcp_send_counters
rank, master, nbytes, n, both, pause, seed, compute = sys.argv[1:9]
rank, nbytes, n, pause = int(rank), int(nbytes), int(n), float(pause)
if compute == "1":  # a training thread beside the messages: the worker spends its quota
    import threading
    torch.set_num_threads(1)
    def train():
        a = torch.randn(256, 256)
        while True:
            a = torch.tanh(a @ a)
    threading.Thread(target=train, daemon=True).start()
dist.init_process_group("gloo", init_method=f"tcp://{master}:@PORT@", rank=rank, world_size=2)
torch.manual_seed(int(seed))
out, inc, peer = torch.randint(0, 255, (nbytes,), dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8), 1 - rank
def round_():
    reqs = []
    if rank == 1 or both == "1":
        reqs.append(dist.irecv(inc, src=peer))
    if rank == 0 or both == "1":
        reqs.append(dist.isend(out, dst=peer))
    for r in reqs:
        r.wait()
for _ in range(3):
    round_()
dist.barrier()
before = tcp_send_counters()["peers"]
for _ in range(n):
    round_()
    time.sleep(pause)
dist.barrier()  # the peer has received every message: they are all on the wire
after = tcp_send_counters()["peers"]
for ip, c in after.items():
    if c.get("bytes_sent", 0) - before.get(ip, {}).get("bytes_sent", 0) >= n * nbytes:
        print(json.dumps({k: v - before.get(ip, {}).get(k, 0) if k != "options" else v
                          for k, v in c.items()}))
sys.stdout.flush()
import os
os._exit(0)  # not waiting for the training thread
""".replace("@PORT@", str(PORT))

# A plain sender: `n` messages, each sent whole, the next after the last byte is acknowledged
# and the pause; prints its counters' difference.
SOCKET_SENDER = """
import json, socket, sys, time
sys.path.insert(0, @REPO@)
from workloads.metrics import tcp_send_counters
dst, nbytes, n, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.create_connection((dst, @PORT@))
def acknowledged():
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)
    return int.from_bytes(info[24:28], "little") == 0  # tcpi_unacked
msg = bytes(nbytes)
before = tcp_send_counters()["peers"][dst]
for _ in range(n):
    s.sendall(msg)
    while not acknowledged():
        time.sleep(0.0005)
    time.sleep(pause)
after = tcp_send_counters()["peers"][dst]
print(json.dumps({k: v - before.get(k, 0) if k != "options" else v for k, v in after.items()}))
"""
# A sink: accepts one connection on (address, port) and reads it to its end.
SOCKET_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
c, _ = s.accept()
while c.recv(1 << 20):
    pass
"""


def in_node(net: Emulation, node: str) -> list[str]:
    """The command prefix that runs a Python program (`-c`) in `node`'s network namespace."""
    return ["nsenter", "-t", str(net.nodes[node].pid), "-n", sys.executable, "-c"]


def ratio(counters: dict, rate_mbps: float, dilation: Dilation) -> float:
    """The sender's wire rate while busy (emulated Mbit/s) against the class's rate."""
    busy_emulated = {**counters, "busy_us": dilation.emulated_seconds(counters["busy_us"])}
    wire = wire_rate_mbps(busy_emulated)
    if wire is None:  # a kernel without bytes_sent (< 4.19), or nothing sent
        raise RuntimeError("bench_wire: the sender's counters have no busy time or bytes_sent")
    return round(wire / rate_mbps, 3)


def socket_case(net: Emulation, args: argparse.Namespace) -> dict:
    dst = net.topo.node("nb").ip
    sink = subprocess.Popen(in_node(net, "nb") + [SOCKET_SINK, dst, str(PORT)])
    try:
        net.wait_listening("nb", PORT, "bench_wire: the sink")
        program = SOCKET_SENDER.replace("@REPO@", repr(str(REPO))).replace("@PORT@", str(PORT))
        done = subprocess.run(
            in_node(net, "na")
            + [
                program,
                dst,
                str(args.bytes),
                str(args.messages),
                str(net.dilation.host_seconds(args.pause_ms / 1e3)),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise RuntimeError(f"bench_wire: socket sender: {done.stderr.strip()[-300:]}")
        counters = json.loads(done.stdout)
        return {
            "case": "socket",
            "both_ways": False,
            "cpus": None,
            "ratios": [ratio(counters, args.rate, net.dilation)],
            "counters": [counters],
        }
    finally:
        sink.terminate()
        sink.wait()


def gloo_case(net: Emulation, args: argparse.Namespace, cpus: float, both: bool, tag: str) -> dict:
    master = net.topo.node("na").ip
    pause = str(net.dilation.host_seconds(args.pause_ms / 1e3))
    workers = [
        net.start_worker(
            node,
            f"wire{tag}r{rank}",
            [
                "python",
                "-c",
                GLOO_PAIR,
                str(rank),
                master,
                str(args.bytes),
                str(args.messages),
                "1" if both else "0",
                pause,
                str(args.seed),
                "1" if args.compute else "0",
            ],
            cpus,
            768,
        )
        for rank, node in ((0, "na"), (1, "nb"))
    ]
    ratios: list[float] = []
    counters: list[dict] = []
    try:
        for w in workers:
            code = w.wait(timeout=600)["StatusCode"]
            logs = w.logs().decode()
            if code != 0:
                raise RuntimeError(f"bench_wire: gloo worker {w.name} exited {code}: {logs[-300:]}")
            found = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
            counters += found
            ratios += [ratio(c, args.rate, net.dilation) for c in found]
    finally:
        for w in workers:
            w.remove(force=True)
    return {
        "case": "gloo",
        "both_ways": both,
        "cpus": cpus,
        "ratios": ratios,
        "counters": counters,
    }


def tcp_events(net: Emulation) -> dict[str, int]:
    """The nodes' kernel TCP event counters (/proc/PID/net/netstat, TcpExt), summed over nodes."""
    out: dict[str, int] = {}
    for node in ("na", "nb"):
        lines = Path(f"/proc/{net.nodes[node].pid}/net/netstat").read_text().splitlines()
        for names, values in zip(lines[::2], lines[1::2]):
            if names.startswith("TcpExt:"):
                for k, v in zip(names.split()[1:], values.split()[1:]):
                    out[k] = out.get(k, 0) + int(v)
    return out


def measure(args: argparse.Namespace, dilation: Dilation, cpus: list[float]) -> list[dict]:
    """Every case, `--repeats` times, in one emulation at `dilation`."""
    topo = parse_topology(topology(args.link, args.delay_ms), "bench_wire")
    rows: list[dict] = []
    with Emulation(topo, dilation=dilation) as net:
        for a, b in (("na", "nb"), ("nb", "na")):
            node = net.nodes[a]
            tc.set_destination(
                node.defaultIntf().name,
                net.topo.node(b).ip,
                args.rate,
                pid=node.pid,
                dilation=dilation,
            )
        for repeat in range(args.repeats):
            rows.append({**socket_case(net, args), "repeat": repeat})
            for cpu in cpus:
                for both in (False, True):
                    tag = f"{repeat}{cpus.index(cpu)}{int(both)}"
                    before = tcp_events(net)
                    rows.append({**gloo_case(net, args, cpu, both, tag), "repeat": repeat})
                    after = tcp_events(net)
                    rows[-1]["tcp_events"] = {
                        k: after[k] - before.get(k, 0)
                        for k in after
                        if after[k] != before.get(k, 0)
                    }
            for r in rows[-1 - 2 * len(cpus) :]:
                print(
                    f"  K {dilation.factor:<4} {r['case']:6} cpus {r['cpus'] or '–':>4} both ways "
                    f"{r['both_ways']!s:5} wire/grant {', '.join(f'{x:.3f}' for x in r['ratios'])}",
                    flush=True,
                )
    return [{**r, "dilation": dilation.factor} for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="the messages' content")
    parser.add_argument(
        "--dilation",
        default="3.5",
        help="K, or several (comma-separated), one emulation each (3.5: the mixed scenario's on "
        "ring)",
    )
    parser.add_argument(
        "--rate", type=float, default=150.0, help="each class's grant, emulated Mbit/s"
    )
    parser.add_argument(
        "--link", type=float, default=200.0, help="the nodes' links, emulated Mbit/s"
    )
    parser.add_argument(
        "--delay-ms", type=float, default=0.0, help="each link's delay, emulated ms (netem)"
    )
    parser.add_argument(
        "--pause-ms",
        type=float,
        default=PAUSE_S * 1e3,
        help="between a sender's messages, emulated ms",
    )
    parser.add_argument(
        "--compute",
        action="store_true",
        help="a training thread in each gloo worker, spending its quota as a run's workers do",
    )
    parser.add_argument(
        "--bytes", type=positive_int, default=340_008, help="a message (the cycle's)"
    )
    parser.add_argument("--messages", type=positive_int, default=30)
    parser.add_argument(
        "--cpus", default="1.0,0.2", help="the gloo workers' quotas, emulated cores"
    )
    parser.add_argument("--repeats", type=positive_int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_wire.json")
    args = parser.parse_args(argv)
    try:
        cpus = [float(c) for c in args.cpus.split(",")]
        dilations = [Dilation(float(k)) for k in args.dilation.split(",")]
    except ValueError as e:
        print(f"bench_wire: --cpus/--dilation: {e}", file=sys.stderr)
        return 2
    if (
        not 0 < args.rate <= args.link
        or min(cpus) <= 0
        or max(cpus) > 1.0
        or args.pause_ms < 0
        or args.delay_ms < 0
    ):
        print(
            "bench_wire: --rate must be above 0 and at most --link, --cpus within (0, 1] (the "
            "nodes' cores), --pause-ms and --delay-ms at least 0",
            file=sys.stderr,
        )
        return 2
    require_root("it brings up an emulation")
    started = time.monotonic()
    rows = [r for dilation in dilations for r in measure(args, dilation, cpus)]
    write_results(args, started, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
