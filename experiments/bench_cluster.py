#!/usr/bin/env python3
"""One emulation over several hosts against one host (issue 50), on stand-in hosts.

    sudo python experiments/bench_cluster.py scenario [--scenario quick] [--hosts 2,3] [--seeds 3]
        # → results/cluster/<scenario>/{one,2-hosts,3-hosts}/results.json, compare.json
    sudo python experiments/bench_cluster.py bringup [--topo gen:internet:100] [--hosts 1,3]
        # → results/cluster/bringup.json

`scenario`: the scenario run by `run.py` on this machine (the one-host emulation), then by
`run.py --cluster` over 2, 3 … stand-in hosts (`testbed.standin.ClusterHosts`: containers with
sshd and an Open vSwitch of their own, a veth underlay, the cluster's certificates: mutual TLS,
OpenFlow over TLS), the same seeds. Per scheduler and job: the TTA over faithful runs, mean and
95 % interval, and whether each setting's mean lies in the one host's interval and the one
host's in its; per scheduler and seed, whether every job was placed on the same nodes. Stand-in
hosts share this machine's cores: the cluster budget pools them (the dilation K may differ from
the one host's; every time is emulated).

`bringup`: the topology built over 1, 3 … stand-in hosts (`lab.fabric.ClusterEmulation`, METIS
placement, every node at `NODE_MB`) with the SDN app on this machine, `--repeats` times: bring-up
(until the SDN app has every switch and a ping check passes) and teardown seconds.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from experiments import report
from experiments.bench_tunnel import Controller
from experiments.common import REPO, RESULTS, require_root
from experiments.machine import machine
from experiments.stats import mean_interval
from lab.cluster import load_cluster
from lab.fabric import ClusterEmulation
from testbed.image import ensure
from testbed.names import new_prefix
from testbed.standin import standin_cluster
from topologies import load_topology, topology_document

# Each node's memory in a bring-up: the topology's (gen:internet gives 8 GiB a node) would not
# pass the hosts' check of their free memory, and a bring-up runs nothing on the nodes.
NODE_MB = 128


def hosts_arg(text: str) -> list[int]:
    counts = [int(x) for x in text.split(",")]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected host counts >= 1, e.g. 2,3 (got {text!r})")
    return counts


def run_py(args: list[str], log: Path) -> None:
    with open(log, "ab") as out:
        done = subprocess.run(
            [sys.executable, "experiments/run.py", *args],
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONPATH": str(REPO)},
        )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"run.py {' '.join(args)} exited {done.returncode}: see {log}")


def scenario_over(n: int, a: argparse.Namespace, image: str, out: Path, work: Path) -> None:
    """run.py's scenario over `n` stand-in hosts (n = 0: this machine, no --cluster)."""
    common = ["--scenario", a.scenario, "--seeds", str(a.seeds), "--out", str(out)]
    common += ["--dilation", a.dilation, "--reruns", str(a.reruns)]
    if a.schedulers:
        common += ["--schedulers", a.schedulers]
    if n == 0:
        run_py(common, out.parent / "one.log")
        return
    hosts = tuple(f"h{i + 1}" for i in range(n))
    with standin_cluster(work / f"{n}", hosts, image, f"bc{secrets.token_hex(2)}") as (_, path):
        pki, token = work / f"{n}" / "pki", work / f"{n}" / "token"
        token.write_text(secrets.token_urlsafe(24) + "\n")
        token.chmod(0o600)
        topo = yaml.safe_load(Path(a.scenario).read_text()).get("topology", "campus")
        subprocess.run(
            [sys.executable, "-m", "lab", "certs", "--cluster", str(path), "--topo", topo,
             "--pki", str(pki)],
            cwd=REPO, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        run_py(
            [*common, "--cluster", str(path), "--token-file", str(token), "--pki", str(pki),
             "--accept-new-host-keys"],
            out.parent / f"{n}-hosts.log",
        )  # fmt: skip


def placements(results: dict) -> dict[tuple[str, int], dict[str, list[str]]]:
    """(scheduler, seed) -> job -> the multiset of its tasks' nodes, over faithful runs."""
    return {
        (r["scheduler"], r["seed"]): {j["job"]: sorted(j["placement"].values()) for j in r["jobs"]}
        for r in report.runs_judged(results)
    }


def inside(x: float, xs: list[float]) -> bool | None:
    mean, half = mean_interval(xs)
    return None if half is None else bool(abs(x - mean) <= half)


def compare(one: dict, other: dict) -> dict:
    """Each job's TTA on one host and over the hosts of `other`, and their placements."""
    a, b = report.job_ttas(one), report.job_ttas(other)
    jobs = []
    for key in sorted(set(a) & set(b)):
        ma, ha = mean_interval(a[key])
        mb, hb = mean_interval(b[key])
        jobs.append(
            {
                "scheduler": key[0],
                "job": key[1],
                "one_host": {"mean_s": ma, "half_s": ha, "runs": len(a[key])},
                "cluster": {"mean_s": mb, "half_s": hb, "runs": len(b[key])},
                "cluster_mean_in_one_host_interval": inside(statistics.fmean(b[key]), a[key]),
                "one_host_mean_in_cluster_interval": inside(statistics.fmean(a[key]), b[key]),
            }
        )
    pa, pb = placements(one), placements(other)
    both = sorted(set(pa) & set(pb))
    return {
        "dilation": {"one_host": one["dilation"]["factor"], "cluster": other["dilation"]["factor"]},
        "faithful_runs": {
            "one_host": f"{len(report.runs_judged(one))}/{len(one['runs'])}",
            "cluster": f"{len(report.runs_judged(other))}/{len(other['runs'])}",
        },
        "jobs": jobs,
        "same_placements": f"{sum(pa[k] == pb[k] for k in both)}/{len(both)}",
        "different": [list(k) for k in both if pa[k] != pb[k]],
    }


def scenario_main(a: argparse.Namespace) -> int:
    a.scenario = str(scenario_file(a.scenario))
    out = a.out or RESULTS / "cluster" / Path(a.scenario).stem
    out.mkdir(parents=True, exist_ok=True)
    image = ensure()
    with tempfile.TemporaryDirectory(prefix="bench_cluster-") as tmp:
        for n in [0, *a.hosts]:
            label = "one" if n == 0 else f"{n}-hosts"
            if (out / label / "results.json").exists():
                print(f"{label}: kept {out / label / 'results.json'}", flush=True)
                continue
            print(f"{label}: running {a.scenario} ({a.seeds} seeds)", flush=True)
            scenario_over(n, a, image, out / label, Path(tmp))
    one = json.loads((out / "one" / "results.json").read_text())
    doc: dict = {"machine": machine(), "scenario": a.scenario, "seeds": a.seeds, "clusters": {}}
    for n in a.hosts:
        other = json.loads((out / f"{n}-hosts" / "results.json").read_text())
        c = doc["clusters"][f"{n}-hosts"] = compare(one, other)
        print(f"{n} hosts vs one: K {c['dilation']}, faithful {c['faithful_runs']}, "
              f"same placements {c['same_placements']}")  # fmt: skip
        for j in c["jobs"]:
            print(f"  {j['scheduler']:<22} {j['job']:<8} one {fmt(j['one_host'])}  "
                  f"{n} hosts {fmt(j['cluster'])}  in each other's interval: "
                  f"{j['cluster_mean_in_one_host_interval']}/"
                  f"{j['one_host_mean_in_cluster_interval']}")  # fmt: skip
    (out / "compare.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out / 'compare.json'}", file=sys.stderr)
    return 0


def fmt(x: dict) -> str:
    half = "–" if x["half_s"] is None else f"{x['half_s']:.2f}"
    return f"{x['mean_s']:.2f} ± {half} s ({x['runs']})"


def scenario_file(name: str) -> Path:
    """A scenario's name (quick, contention, ...) or its file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return path.resolve()
    return REPO / "experiments" / "scenarios" / f"{name}.yaml"


def bringup_once(cluster_file: Path, topo_file: Path, work: Path, image: str) -> dict:
    topo = load_topology(str(topo_file))
    inv = load_cluster(cluster_file)
    sdn = Controller(topo_file, inv.master, work / "sdn_app.log")
    try:
        t0 = time.monotonic()
        net = ClusterEmulation(
            topo,
            servers=inv,
            placement="metis",
            prefix=new_prefix(),
            controller=(inv.master, sdn.of_port),
            image=image,
            accept_new_host_keys=True,
        )
        try:
            net.start()
            built_s = time.monotonic() - t0
            sdn.wait_switches(120)
            lost = net.ping_check()
            if lost:
                raise RuntimeError(f"no ping {lost[:5]}")
            up_s = time.monotonic() - t0
        finally:
            net.stop()
        return {
            "hosts": len(net.plans),
            "built_s": round(built_s, 2),
            "up_s": round(up_s, 2),
            "down_s": round(net.timings["down_s"], 2),
        }
    finally:
        sdn.stop()


def bringup_main(a: argparse.Namespace) -> int:
    out = a.out or RESULTS / "cluster" / "bringup.json"
    image = ensure()
    topo = load_topology(a.topo)
    doc: dict = {
        "machine": machine(),
        "topology": a.topo,
        "nodes": len(topo.nodes),
        "switches": len(topo.switches),
        "placement": "metis",
        "node_mb": NODE_MB,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench_cluster-") as tmp:
        work = Path(tmp)
        topo_file = work / "topology.yaml"
        document = topology_document(topo)
        for node in document["nodes"]:  # what the hosts' memory check asks: nothing runs on them
            node["mem_mb"] = NODE_MB
        topo_file.write_text(yaml.safe_dump(document, sort_keys=False))
        for n in a.hosts:
            hosts = tuple(f"h{i + 1}" for i in range(n))
            with standin_cluster(work / f"{n}", hosts, image, f"bc{secrets.token_hex(2)}") as (
                _,
                path,
            ):
                for i in range(a.repeats):
                    r = bringup_once(path, topo_file, work, image)
                    doc["runs"].append({"repeat": i, **r})
                    print(f"{n} hosts: up {r['up_s']:.1f} s (built {r['built_s']:.1f}), "
                          f"down {r['down_s']:.1f} s", flush=True)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("scenario", help="a scenario on one host and over 2, 3 … hosts")
    s.add_argument("--scenario", default="quick", help="a scenario name or file (default quick)")
    s.add_argument("--hosts", type=hosts_arg, default=[2, 3], help="host counts (default 2,3)")
    s.add_argument("--seeds", type=int, default=3)
    s.add_argument("--schedulers", help="run.py --schedulers (default: the scenario's)")
    s.add_argument("--dilation", default="auto", help="run.py --dilation (default auto)")
    s.add_argument("--reruns", type=int, default=2, help="run.py --reruns (default 2)")
    s.add_argument("--out", type=Path, help="default results/cluster/<scenario>")
    b = sub.add_parser("bringup", help="bring-up and teardown of a topology over 1, 3 … hosts")
    b.add_argument("--topo", default="gen:internet:100")
    b.add_argument("--hosts", type=hosts_arg, default=[1, 3], help="host counts (default 1,3)")
    b.add_argument("--repeats", type=int, default=2)
    b.add_argument("--out", type=Path, help="default results/cluster/bringup.json")
    a = p.parse_args(argv)
    require_root("stand-in hosts: containers, network namespaces, veths")
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: the hosts and the runs on them are removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return scenario_main(a) if a.what == "scenario" else bringup_main(a)


if __name__ == "__main__":
    raise SystemExit(main())
