#!/usr/bin/env python3
"""A link between hosts holding its shaped rate (issue 50): wire/grant of one emulated link that
is a tunnel between two stand-in hosts, at 10, 50 and 200 Mbit/s.

    sudo python experiments/bench_tunnel.py [--seconds 8] [--rates 10,50,200] [--tunnel vxlan]
        # → results/cluster/tunnel.json (VXLAN), tunnel-geneve.json, tunnel-gre.json

Two stand-in hosts (`testbed.standin.ClusterHosts`: containers with sshd and an Open vSwitch of
their own, a veth underlay between them) and the SDN app on this machine; per rate R a topology
n1 — s1 —R— s2 — n2 (access links 1000 Mbit/s) built over SSH by `lab.fabric.ClusterEmulation`
with s1 (and n1) on one host and s2 (and n2) on the other: the s1–s2 link is a tunnel port pair,
HTB-shaped at R where it leaves each host, every data interface at the inner MTU. An iperf3 TCP
transfer n1 → n2 (receiver side, its first second omitted) gives the wire rate; wire/grant is it
over R. The same topology on one host (both switches on it: the link a veth pair) is measured
beside it (--no-one-host: not), and so is the tunnel unshaped (the link at 10 Gbit/s: what the
two userspace datapaths carry on this machine's cores, the ceiling).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from experiments.common import REPO, RESULTS, require_root
from experiments.machine import machine
from lab.cluster import TUNNELS, load_cluster
from lab.fabric import ClusterEmulation
from protocol.http import free_port
from sdn_app.client import SdnClient, SdnError
from testbed.image import ensure
from testbed.names import new_prefix
from testbed.standin import standin_cluster
from topologies import parse_topology, topology_document

RATES = (10.0, 50.0, 200.0)
CEILING_MBPS = 10000.0


def chain(rate: float) -> dict:
    return {
        "name": f"tunnel{rate:g}",
        "switches": [{"name": "s1"}, {"name": "s2"}],
        "nodes": [
            {"name": "n1", "cpu": 1.0, "mem_mb": 512},
            {"name": "n2", "cpu": 1.0, "mem_mb": 512},
        ],
        "links": [
            {"ends": ["n1", "s1"], "bw_mbps": 1000},
            {"ends": ["s1", "s2"], "bw_mbps": rate},
            {"ends": ["n2", "s2"], "bw_mbps": 1000},
        ],
    }


class Controller:
    """`python -m sdn_app` on this machine, its OpenFlow port on the management network."""

    def __init__(self, topo_file: Path, of_host: str, log: Path):
        self.of_port, rest = free_port(), free_port()
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sdn_app", "--topo", str(topo_file), "--of-host", of_host,
                 "--of-port", str(self.of_port), "--rest", f"127.0.0.1:{rest}"],
                cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                env=os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)},
            )  # fmt: skip
        self.client = SdnClient(f"http://127.0.0.1:{rest}", timeout_s=10)

    def wait_switches(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the SDN app exited: {self.log.read_text()[-500:]}")
            try:
                self.client.wait_ready(timeout_s=max(0.5, deadline - time.monotonic()))
                return
            except SdnError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the SDN app did not get both switches: {e.message}"
                    ) from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def iperf(net: ClusterEmulation, seconds: float) -> dict:
    """iperf3 TCP n1 -> n2: Mbit/s received (first second omitted), retransmits."""
    code, out = net.exec("n2", "iperf3 -s -1 -D -p 5201")
    if code != 0:
        raise RuntimeError(f"iperf3 server on n2: {out.strip()}")
    deadline = time.monotonic() + 10
    while ":5201 " not in net.exec("n2", "ss -ltnH")[1]:
        if time.monotonic() > deadline:
            raise RuntimeError("iperf3 server on n2 does not listen")
        time.sleep(0.1)
    ip = net.topo.node("n2").ip
    code, out = net.exec("n1", f"iperf3 -c {ip} -p 5201 -t {seconds + 1:g} -O 1 -J", seconds + 30)
    try:
        end = json.loads(out)["end"]
        return {
            "mbps": round(end["sum_received"]["bits_per_second"] / 1e6, 2),
            "retransmits": end["sum_sent"].get("retransmits"),
        }
    except (json.JSONDecodeError, KeyError):
        raise RuntimeError(f"iperf3 n1 -> n2 failed: {out[-300:]}") from None


def measure(cluster_file: Path, work: Path, rate: float, seconds: float, image: str) -> dict:
    """One topology at `rate` over the hosts of `cluster_file` (block: s1 on the first, s2 on
    the last), built, measured, removed."""
    topo = parse_topology(chain(rate), f"tunnel{rate:g}")
    topo_file = work / f"{topo.name}.yaml"
    topo_file.write_text(yaml.safe_dump(topology_document(topo), sort_keys=False))
    inv = load_cluster(cluster_file)
    sdn = Controller(topo_file, inv.master, work / "sdn_app.log")
    try:
        net = ClusterEmulation(
            topo,
            servers=inv,
            placement="block",
            prefix=new_prefix(),
            controller=(inv.master, sdn.of_port),
            image=image,
            accept_new_host_keys=True,
        )
        with net:
            sdn.wait_switches(30)
            lost = net.ping_check()
            if lost:
                raise RuntimeError(f"{rate:g} Mbit/s: no ping {lost}")
            got = iperf(net, seconds)
            return {
                "grant_mbps": rate,
                **got,
                "wire_over_grant": round(got["mbps"] / rate, 3),
                "hosts": len(net.plans),
                "inner_mtu": net.mtu,
                "up_s": round(net.timings["up_s"], 2),
            }
    finally:
        sdn.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    p.add_argument("--seconds", type=float, default=8.0, help="iperf3 duration (after 1 s omitted)")
    p.add_argument("--no-one-host", action="store_true", help="only the tunnel, not one host")
    p.add_argument("--tunnel", choices=TUNNELS, default=TUNNELS[0], help="the cluster's tunnel")
    p.add_argument("--out", type=Path, help="default results/cluster/tunnel[-TUNNEL].json")
    a = p.parse_args(argv)
    require_root("stand-in hosts: containers, network namespaces, veths")
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: the hosts and the runs on them are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rates = [float(r) for r in a.rates.split(",")]
    out = a.out or RESULTS / "cluster" / (
        "tunnel.json" if a.tunnel == "vxlan" else f"tunnel-{a.tunnel}.json"
    )
    image = ensure()
    doc: dict = {
        "machine": machine(),
        "seconds": a.seconds,
        "tunnel": a.tunnel,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "tunnel_link": [],
        "one_host": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench_tunnel-") as tmp:
        work = Path(tmp)
        with standin_cluster(
            work, ("h1", "h2"), image, f"tn{secrets.token_hex(2)}", tunnel=a.tunnel
        ) as (
            _,
            path,
        ):
            one = work / "one-host.yaml"
            d = yaml.safe_load(path.read_text())
            one.write_text(yaml.safe_dump({**d, "hosts": d["hosts"][:1]}, sort_keys=False))
            for rate in [*rates, CEILING_MBPS]:
                r = measure(path, work, rate, a.seconds, image)
                doc["tunnel_link"].append(r)
                print(f"tunnel   {rate:>6g} Mbit/s: {r['mbps']:>7.1f} received "
                      f"(wire/grant {r['wire_over_grant']:.3f}, {r['retransmits']} retransmits, "
                      f"inner MTU {r['inner_mtu']})", flush=True)  # fmt: skip
                if not a.no_one_host:
                    r = measure(one, work, rate, a.seconds, image)
                    doc["one_host"].append(r)
                    print(f"one host {rate:>6g} Mbit/s: {r['mbps']:>7.1f} received "
                          f"(wire/grant {r['wire_over_grant']:.3f}, {r['retransmits']} "
                          "retransmits)", flush=True)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
