"""One emulated topology over two stand-in hosts, for real (issue 50): containers running sshd and
an Open vSwitch of their own (`testbed.standin.ClusterHosts`, a veth underlay between them), the
topology built on them over SSH by `lab.fabric.ClusterEmulation` with VXLAN tunnel port pairs for
the links between hosts, the real SDN app on this machine controlling both hosts' bridges. A bad
host is refused in one line with exit 2; the nodes reach each other across the tunnel with
full-size frames at the inner MTU; a tunnel link holds its shaped rate; after a kill -9,
`run.py --cleanup --cluster F --prefix P` leaves nothing of the run on either host."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from polling import wait_for

from experiments.bench_tunnel import Controller
from lab.cluster import TUNNEL_OVERHEAD, load_cluster
from lab.fabric import ClusterEmulation
from testbed.names import new_prefix
from testbed.standin import standin_cluster
from topologies import parse_topology, topology_document

REPO = Path(__file__).resolve().parents[2]
RATE = 50.0


def chain(rate: float) -> dict:
    """n1 — s1 —rate— s2 — n2 and n3 on s1: block placement puts s1 on h1, s2 on h2."""
    return {
        "name": "chain",
        "switches": [{"name": "s1"}, {"name": "s2"}],
        "nodes": [
            {"name": "n1", "cpu": 1.0, "mem_mb": 512},
            {"name": "n2", "cpu": 1.0, "mem_mb": 512},
            {"name": "n3", "cpu": 0.5, "mem_mb": 256},
        ],
        "links": [
            {"ends": ["n1", "s1"], "bw_mbps": 1000},
            {"ends": ["n3", "s1"], "bw_mbps": 1000},
            {"ends": ["s1", "s2"], "bw_mbps": rate},
            {"ends": ["n2", "s2"], "bw_mbps": 1000},
        ],
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, worker_image, testbed_host):
    d = tmp_path_factory.mktemp("cluster")
    topo = parse_topology(chain(RATE), "chain")
    (d / "chain.yaml").write_text(yaml.safe_dump(topology_document(topo), sort_keys=False))
    with standin_cluster(d, ("h1", "h2"), worker_image, f"cl{secrets.token_hex(2)}") as (
        hosts,
        path,
    ):
        yield {"dir": d, "hosts": hosts, "file": path, "topo": topo, "image": worker_image}


def left_of(cluster, prefix: str) -> dict[str, list[str]]:
    """What still carries `prefix`: containers (one engine), and per host its bridges and
    interfaces. A docker or host command that fails is an error, never "nothing left"."""
    ps = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name=^{prefix}-", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    )
    assert ps.returncode == 0, ps.stderr
    out = {"containers": ps.stdout.split()}
    for h in ("h1", "h2"):
        done = cluster["hosts"].exec(
            h, f"ovs-vsctl list-br && ls /sys/class/net && {{ ls -d /var/lib/ces/{prefix} || :; }}"
        )
        assert done.returncode == 0, (h, done.stderr)
        out[h] = [w for w in done.stdout.split() if prefix in w]
    return out


def run_py(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "experiments/run.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )


def tcp_mbps(net: ClusterEmulation, src: str, dst: str, seconds: int) -> float:
    """One iperf3 TCP transfer `src` -> `dst`, its first second omitted: received Mbit/s."""
    assert net.exec(dst, "iperf3 -s -1 -D -p 5201")[0] == 0
    wait_for(lambda: ":5201 " in net.exec(dst, "ss -ltnH")[1], 10, f"iperf3 on {dst}")
    ip = net.topo.node(dst).ip
    code, out = net.exec(src, f"iperf3 -c {ip} -p 5201 -t {seconds} -O 1 -J", 60)
    assert code == 0, out
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def test_a_host_without_its_underlay_or_unreachable_is_one_line_exit_2(cluster, tmp_path):
    token = tmp_path / "token"
    token.write_text(secrets.token_urlsafe(24) + "\n")
    token.chmod(0o600)
    for change, expected in (
        ({"underlay": "eth9"}, "h2 (root@{h2}:22): underlay interface eth9 does not exist"),
        ({"address": "127.0.0.1", "port": 1}, "h2 (root@127.0.0.1:1): unreachable over SSH"),
    ):
        doc = yaml.safe_load(cluster["file"].read_text())
        doc["hosts"][1].update(change)
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(doc))
        done = run_py(
            "--quick", "--cluster", str(bad), "--token-file", str(token), "--insecure",
            "--accept-new-host-keys", "--out", str(tmp_path / "out"),
        )  # fmt: skip
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        want = expected.format(h2=cluster["hosts"].mgmt["h2"])
        assert lines[0].startswith("error: " + want), lines[0]
        assert not (tmp_path / "out" / "results.json").exists()


def test_a_topology_over_two_hosts_at_the_inner_mtu_with_its_tunnel_shaped(cluster, tmp_path):
    inv = load_cluster(cluster["file"])
    sdn = Controller(cluster["dir"] / "chain.yaml", inv.master, tmp_path / "sdn.log")
    prefix = new_prefix()
    try:
        net = ClusterEmulation(
            cluster["topo"],
            servers=inv,
            placement="block",
            prefix=prefix,
            controller=(inv.master, sdn.of_port),
            image=cluster["image"],
            accept_new_host_keys=True,
        )
        with net:
            assert net.layout.placement["s1"] == "h1" and net.layout.placement["s2"] == "h2"
            assert net.mtu == 1500 - TUNNEL_OVERHEAD["vxlan"] == 1450
            sdn.wait_switches(30)
            assert net.ping_check() == []
            # one tunnel port at each end, keyed, to the other host's underlay address
            for h, peer in (("h1", "h2"), ("h2", "h1")):
                ports = (
                    cluster["hosts"]
                    .exec(h, "ovs-vsctl --columns=type,options find Interface type=vxlan")
                    .stdout
                )
                assert ports.count("vxlan") == 1, ports
                assert f'remote_ip="{cluster["hosts"].underlay[peer]}"' in ports, ports
            # a full-size frame crosses (DF set): 1450 - 20 (IP) - 8 (ICMP)
            code, out = net.exec("n1", f"ping -c 2 -W 2 -M do -s 1422 {net.topo.node('n2').ip}")
            assert code == 0, out
            code, out = net.exec("n1", "cat /sys/class/net/eth0/mtu")
            assert out.strip() == "1450"
            # the tunnel link holds its rate. The bench reads 0.95 of a 50 Mbit/s grant
            # (docs/cluster.md), one CI runner read 0.81 (two userspace datapaths on two shared
            # cores); a link left unshaped reads the tunnel's ceiling (~400), one shaped twice
            # or at a dilated rate half of the grant or less.
            mbps = tcp_mbps(net, "n1", "n2", 6)
            assert 0.7 * RATE <= mbps <= 1.05 * RATE, mbps
            # n1 and n3 on one host, over their 1000 Mbit/s links: not held by the tunnel link
            mbps = tcp_mbps(net, "n1", "n3", 3)
            assert mbps > 2 * RATE, mbps
            assert left_of(cluster, prefix)["h1"], "the run's bridges exist while it runs"
    finally:
        sdn.stop()
    assert left_of(cluster, prefix) == {"containers": [], "h1": [], "h2": []}
    # the underlay has its address back
    addr = cluster["hosts"].exec("h1", "ip -4 -o addr show dev eth1").stdout
    assert cluster["hosts"].underlay["h1"] + "/" in addr, addr


BUILD = """
import sys, time
from lab.cluster import load_cluster
from lab.fabric import ClusterEmulation
from topologies import load_topology
net = ClusterEmulation(load_topology(sys.argv[1]), servers=load_cluster(sys.argv[2]),
                       placement="block", prefix=sys.argv[3], image=sys.argv[4],
                       controller=("127.0.0.1", 1), accept_new_host_keys=True)
net.start()
print("up", flush=True)
time.sleep(600)
"""


def test_cleanup_after_kill_9_leaves_nothing_on_either_host(cluster, tmp_path):
    prefix = new_prefix()
    proc = subprocess.Popen(
        [sys.executable, "-c", BUILD, str(cluster["dir"] / "chain.yaml"), str(cluster["file"]),
         prefix, cluster["image"]],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "up", proc.stderr.read() if proc.stderr else ""
        left = left_of(cluster, prefix)
        assert len(left["containers"]) == 3 and left["h1"] and left["h2"], left
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # nothing ran the teardown: the kill -9 left it all
    assert left_of(cluster, prefix)["containers"]
    done = run_py("--cleanup", "--cluster", str(cluster["file"]), "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert left_of(cluster, prefix) == {"containers": [], "h1": [], "h2": []}
    for h in ("h1", "h2"):
        addr = cluster["hosts"].exec(h, "ip -4 -o addr show dev eth1").stdout
        assert cluster["hosts"].underlay[h] + "/" in addr, (h, addr)
    # the other run's prefix, and a malformed one, are refused by the hosts' own script
    done = run_py("--cleanup", "--cluster", str(cluster["file"]), "--prefix", "ces")
    assert done.returncode == 2


def _token(tmp_path: Path) -> Path:
    token = tmp_path / "token"
    token.write_text(secrets.token_urlsafe(24) + "\n")
    token.chmod(0o600)
    return token


def test_the_quick_scenario_end_to_end_over_two_hosts(cluster, tmp_path):
    """run.py --quick --cluster: certificates for the cluster, every host checked, the budget,
    the campus spread by METIS over both hosts, both schedulers' jobs trained to their target,
    one results.json with a verdict per host, and nothing of the run left anywhere."""
    pki = tmp_path / "pki"
    certs = subprocess.run(
        [sys.executable, "-m", "lab", "certs", "--cluster", str(cluster["file"]),
         "--topo", "campus", "--pki", str(pki)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert certs.returncode == 0, certs.stderr
    prefix, out = new_prefix(), tmp_path / "out"
    try:
        done = run_py(
            "--quick", "--cluster", str(cluster["file"]), "--token-file", str(_token(tmp_path)),
            "--pki", str(pki), "--accept-new-host-keys", "--prefix", prefix, "--out", str(out),
            timeout=900,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        # the timeout kills run.py alone: its stack would hold the hosts' underlays, and every
        # later test of the module would fail on it (seen on a machine running trainings beside)
        run_py("--cleanup", "--cluster", str(cluster["file"]), "--prefix", prefix)
        raise
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["mode"] == "cluster"
    c = results["cluster"]
    assert c["placement"] == "metis" and c["tunnel"] == "vxlan" and c["inner_mtu"] == 1450
    assert set(c["hosts"]) == {"h1", "h2"} and c["crossing"]["crossing_links"] > 0
    assert {r["scheduler"] for r in results["runs"]} == {"network-aware", "k8s-spread"}
    for run in results["runs"]:
        assert run["jobs"] and all(j["state"] == "finished" for j in run["jobs"]), run["jobs"]
        assert set(run["fidelity"]["hosts"]) == {"h1", "h2"}, run["fidelity"]
        # each host's nodes did work (the tenant's ends are on both: lab3 and srv3)
        assert all(run["hosts"][h]["cpu_cores"]["nodes"] > 0 for h in ("h1", "h2")), run["hosts"]
    assert left_of(cluster, prefix) == {"containers": [], "h1": [], "h2": []}


def test_run_py_killed_9_then_cleanup_cluster_leaves_nothing(cluster, tmp_path):
    prefix = new_prefix()
    proc = subprocess.Popen(
        [sys.executable, "experiments/run.py", "--quick", "--cluster", str(cluster["file"]),
         "--token-file", str(_token(tmp_path)), "--insecure", "--accept-new-host-keys",
         "--prefix", prefix, "--out", str(tmp_path / "out")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=os.environ | {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
    )  # fmt: skip
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # until the stack is up: agents on the Master
            seen.append(line)
            if line.startswith("  up in "):
                break
        else:
            raise AssertionError("run.py ended before its stack was up:\n" + "".join(seen))
        # the kill must find the run up: still running, its nodes and both hosts' bridges there
        up = left_of(cluster, prefix)
        assert proc.poll() is None, "run.py ended on its own:\n" + "".join(seen)
        assert up["containers"] and up["h1"] and up["h2"], (up, "".join(seen))
    finally:
        proc.kill()
        proc.wait()
    left = left_of(cluster, prefix)  # nothing ran the teardown: the kill -9 left it all
    assert left["containers"] and left["h1"] and left["h2"], (left, "".join(seen))
    done = run_py("--cleanup", "--cluster", str(cluster["file"]), "--prefix", prefix)
    assert done.returncode == 0, done.stdout + done.stderr
    assert left_of(cluster, prefix) == {"containers": [], "h1": [], "h2": []}
    # its SDN app and Master, sessions of their own that outlived run.py, are gone too
    procs = subprocess.run(["pgrep", "-f", prefix], capture_output=True, text=True).stdout
    assert procs.split() == [], procs
