"""The testbed for real: OVS bridges, Docker containers as nodes, HTB-shaped links, teardown.

A two-switch network with two (at times three) containers; the middle link is the bottleneck.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge import cgroups, tc
from testbed import Emulation, cleanup, leftovers, new_prefix
from testbed.ovs_sockets import RX_BUFFER_BYTES
from topologies import ComputeNode, Link, load_topology

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

TINY = """
name: tiny
switches: [{name: s1, dpid: 0x11}, {name: s2, dpid: 0x12}]
nodes:
  - {name: h1, cpu: 0.5, mem_mb: 384}
  - {name: h2, cpu: 0.5, mem_mb: 384}
links:
  - {ends: [s1, s2], bw_mbps: 10, ports: [7, 8]}
  - {ends: [h1, s1], bw_mbps: 1000}
  - {ends: [h2, s2], bw_mbps: 1000}
"""
BOTTLENECK = 10.0


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.fixture
def net(tiny: Path, prefix: str, worker_image: str):
    with Emulation(load_topology(tiny), prefix=prefix, image=worker_image) as emulation:
        yield emulation


def nothing_left(prefix: str) -> dict:
    return {kind: found for kind, found in leftovers(prefix).items() if found}


def vsctl(*args: str) -> str:
    return subprocess.run(
        ["ovs-vsctl", *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def vswitchd_receive_buffers() -> dict[str, int]:
    """{interface: receive buffer bytes} of ovs-vswitchd's packet sockets, as `ss` shows them."""
    out = subprocess.run(
        ["ss", "-0", "-m", "-n", "-p"], capture_output=True, text=True, check=True
    ).stdout
    found = re.findall(r"\*:(\S+)\s.*?\"ovs-vswitchd\".*?skmem:\(r\d+,rb(\d+),", out)
    return {intf: int(rb) for intf, rb in found}


def test_connectivity_addresses_and_port_numbers(net: Emulation) -> None:
    assert net.ping_all(timeout_s=1.0) == 0.0
    topo = net.topo
    for node in topo.nodes:
        code, out = net.exec(node.name, "ip -o addr show dev eth0; ip -o link show dev eth0")
        assert code == 0
        assert f"{node.ip}/16" in out and node.mac in out
    # The bridges carry the topology's dpids and OpenFlow port numbers.
    assert (
        vsctl("get", "Bridge", net.bridge_name("s1"), "other_config:datapath-id").strip('"')
        == f"{0x11:016x}"
    )
    assert vsctl("get", "Interface", net.interface_name("s1", 7), "ofport") == "7"
    assert vsctl("get", "Interface", net.interface_name("s2", 8), "ofport") == "8"
    h1_port = topo.access_link("h1").port_of("s1")
    assert vsctl("get", "Interface", net.interface_name("s1", h1_port), "ofport") == str(h1_port)
    assert vsctl("get", "Bridge", net.bridge_name("s1"), "fail_mode") == "standalone"


def test_switch_ports_have_large_receive_buffers(net: Emulation) -> None:
    # The userspace datapath drops on its ports' default 208 KiB buffers under CPU load.
    if net.datapath != "user":
        pytest.skip("the kernel datapath reads its ports without packet sockets")
    ports = [
        net.interface_name("s1", 7),
        net.interface_name("s2", 8),
        net.interface_name("s1", net.topo.access_link("h1").port_of("s1")),
    ]
    net.add_node(
        ComputeNode("h3", cpu=0.25, mem_mb=256, ip="10.0.0.3", mac="02:ce:00:00:00:03"),
        Link("h3", "s2", 100, port_a=0, port_b=5),
    )
    ports.append(net.interface_name("s2", 5))
    buffers = vswitchd_receive_buffers()
    assert all(buffers.get(p, 0) >= RX_BUFFER_BYTES for p in ports), (ports, buffers)


def test_remote_controller_mode(tiny: Path, prefix: str, worker_image: str) -> None:
    # Nothing listens on this port: secure switches then forward nothing at all.
    with Emulation(
        load_topology(tiny), prefix=prefix, image=worker_image, controller=("127.0.0.1", 6999)
    ) as net:
        bridge = net.bridge_name("s1")
        assert vsctl("get", "Bridge", bridge, "fail_mode") == "secure"
        assert vsctl("get", "Bridge", bridge, "protocols") == "[OpenFlow13]"
        assert "tcp:127.0.0.1:6999" in vsctl("get-controller", bridge)
        assert net.ping_all(timeout_s=1.0) == 1.0


def test_shaped_rate_and_node_limits(net: Emulation) -> None:
    rate = net.iperf("h1", "h2", seconds=3)
    assert 0.7 * BOTTLENECK <= rate <= 1.05 * BOTTLENECK, rate
    node = net.nodes["h1"]
    assert cgroups.limits(node.cgroup_parent) == (0.5, 384)
    # and it yields the host's cores to the switches: far below a process's weight outside it
    v = cgroups.version()
    weight = (
        cgroups.ROOT
        / ("" if v == 2 else "cpu")
        / node.cgroup_parent.strip("/")
        / ("cpu.weight" if v == 2 else "cpu.shares")
    )
    assert int(weight.read_text()) == cgroups.weight(0.5, v) < (100 if v == 2 else 1024) / 10
    node.container.reload()
    assert node.container.attrs["HostConfig"]["CpuQuota"] == 50_000


def _queue_bytes(dev: str, pid: int | None = None) -> float:
    """The default class's TBF queue on `dev`: tc shows its latency, (limit − burst) / rate."""
    [tbf] = [
        q for q in json.loads(tc.tc(pid, "-j", "qdisc", "show", "dev", dev)) if q["kind"] == "tbf"
    ]
    o = tbf["options"]
    return o["lat"] / 1e6 * o["rate"] + o["burst"]


def test_a_switch_port_queues_frames_and_a_node_its_tcps_largest_packets(net: Emulation) -> None:
    port, node = net.interface_name("s1", 7), net.nodes["h1"].container_pid
    assert _queue_bytes(port) == pytest.approx(tc.queue_bytes(10, switch_port=True), rel=0.01)
    assert _queue_bytes("eth0", node) == pytest.approx(tc.queue_bytes(1000), rel=0.01)
    net.set_link("s1", "s2", bw_mbps=5)
    assert _queue_bytes(port) == pytest.approx(tc.queue_bytes(5, switch_port=True), rel=0.01)


def test_link_change_at_run_time(net: Emulation) -> None:
    net.set_link("s1", "s2", bw_mbps=5)
    assert tc.link_rate(net.interface_name("s1", 7)) == 5.0
    assert tc.link_rate(net.interface_name("s2", 8)) == 5.0
    rate = net.iperf("h2", "h1", seconds=3)
    assert 0.7 * 5 <= rate <= 1.05 * 5, rate
    assert next(lk for lk in net.topo.links if {lk.a, lk.b} == {"s1", "s2"}).bw_mbps == 5


def test_per_destination_shaping_in_node_namespace(net: Emulation) -> None:
    h1, h2 = net.nodes["h1"], net.nodes["h2"]
    tc.set_destination("eth0", h2.ip, 3, pid=h1.container_pid)
    assert tc.destinations("eth0", pid=h1.container_pid) == {2: 3.0}
    rate = net.iperf("h1", "h2", seconds=3)
    assert 0.7 * 3 <= rate <= 1.05 * 3, rate
    tc.remove_destination("eth0", h2.ip, pid=h1.container_pid)
    assert tc.destinations("eth0", pid=h1.container_pid) == {}
    assert net.iperf("h1", "h2", seconds=2) > 2 * 3  # back to the 10 Mbit/s link


def test_add_and_remove_node_at_run_time(net: Emulation) -> None:
    h3 = ComputeNode("h3", cpu=0.25, mem_mb=256, ip="10.0.0.3", mac="02:ce:00:00:00:03")
    net.add_node(h3, Link("h3", "s2", 100, port_a=0, port_b=5))
    assert vsctl("get", "Interface", net.interface_name("s2", 5), "ofport") == "5"
    code, out = net.exec("h1", "ping -c3 -i0.2 -W2 10.0.0.3")
    assert code == 0, out
    assert [n.name for n in net.topo.nodes] == ["h1", "h2", "h3"]

    container = net.node_container_name("h3")
    net.remove_node("h3")
    assert "h3" not in net.nodes and all(n.name != "h3" for n in net.topo.nodes)
    assert net.interface_name("s2", 5) not in vsctl("list-ports", net.bridge_name("s2")).split()
    assert container not in [c.name for c in net.client.containers.list(all=True)]
    code, _ = net.exec("h1", "ping -c1 -W1 10.0.0.3")
    assert code != 0
    assert net.ping_all(timeout_s=1.0) == 0.0


def test_workers_share_node_namespace_and_cgroup(net: Emulation) -> None:
    worker = net.start_worker("h1", "w0", ["sleep", "60"], cpu=0.2, mem_mb=128, env={"TASK": "7"})
    code, out = worker.exec_run(
        [
            "bash",
            "-c",
            "ip -o addr show dev eth0; echo $TASK $GLOO_SOCKET_IFNAME;"
            " cat /proc/sys/net/ipv4/tcp_congestion_control",
        ]
    )
    assert code == 0
    assert f"{net.nodes['h1'].ip}/16" in out.decode() and "7 eth0" in out.decode()
    # the node's TCP is the emulation's choice, not the host's default (BBR on some kernels)
    assert out.decode().split()[-1] == "cubic"
    worker.reload()
    assert worker.attrs["HostConfig"]["CgroupParent"] == net.nodes["h1"].cgroup_parent
    net.update_node("h1", cpu=0.25, mem_mb=320)
    assert cgroups.limits(net.nodes["h1"].cgroup_parent) == (0.25, 320)


def test_teardown_leaves_nothing_also_on_exception(
    tiny: Path, prefix: str, worker_image: str
) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        Emulation(load_topology(tiny), prefix=prefix, image=worker_image) as emulation,
    ):
        emulation.start_worker("h2", "w0", ["sleep", "60"], cpu=0.1, mem_mb=64)
        assert leftovers(prefix)["containers"]
        raise RuntimeError("boom")
    assert nothing_left(prefix) == {}
    assert emulation.timings["down_s"] < 10


BRING_UP = """
import sys, time
from testbed import Emulation
from topologies import load_topology
with Emulation(load_topology(sys.argv[1]), prefix=sys.argv[2], image=sys.argv[3]) as net:
    print("UP", flush=True)
    time.sleep(120)
"""


def _bring_up_in_subprocess(tiny: Path, prefix: str, image: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", BRING_UP, str(tiny), prefix, image],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the network is up (or the child died)
    assert line.strip() == "UP", proc.stderr.read() if proc.stderr else line
    return proc


def test_cleanup_after_a_killed_run(tiny: Path, prefix: str, worker_image: str) -> None:
    proc = _bring_up_in_subprocess(tiny, prefix, worker_image)
    proc.kill()  # SIGKILL: no teardown runs
    proc.wait(timeout=10)
    left = nothing_left(prefix)
    assert left["containers"] and left["bridges"]
    done = subprocess.run(
        [sys.executable, "experiments/run.py", "--cleanup", "--prefix", prefix],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert nothing_left(prefix) == {}


def test_cleanup_without_prefix_keeps_live_runs(tiny: Path, prefix: str, worker_image: str) -> None:
    dead = new_prefix()
    try:
        proc = _bring_up_in_subprocess(tiny, dead, worker_image)
        proc.kill()
        proc.wait(timeout=10)
        with Emulation(load_topology(tiny), prefix=prefix, image=worker_image) as net:
            removed = cleanup()  # every run of the project that is not alive
            assert prefix in removed.live_runs_kept
            assert dead not in removed.live_runs_kept
            assert nothing_left(dead) == {}
            assert net.ping_all(timeout_s=1.0) == 0.0  # the live run still works
    finally:
        cleanup(dead)


def test_sigterm_during_run_tears_down(tiny: Path, prefix: str, worker_image: str) -> None:
    proc = _bring_up_in_subprocess(tiny, prefix, worker_image)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert nothing_left(prefix) == {}


def test_ctrl_c_during_bring_up_tears_down(tiny: Path, prefix: str, worker_image: str) -> None:
    # As from a terminal: a suite started in the background (`cmd &`) ignores SIGINT, and a child
    # that inherits SIG_IGN never gets Python's KeyboardInterrupt.
    proc = subprocess.Popen(
        [sys.executable, "-c", BRING_UP, str(tiny), prefix, worker_image],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not leftovers(prefix)["containers"]:  # the bring-up has started creating nodes
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    # communicate, not wait: the teardown's log must not fill an unread pipe and block the child
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"no exit 60 s after Ctrl-C; its stderr: {err[-3000:]}")
    assert proc.returncode != 0, err[-2000:]
    assert nothing_left(prefix) == {}


def test_run_rejects_malformed_topology(tmp_path: Path, prefix: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.replace("bw_mbps: 10,", "bw_mbps: fast,"))
    started = time.monotonic()
    done = subprocess.run(
        ["python3", "experiments/run.py", "--topo", str(bad), "--prefix", prefix],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "bw_mbps" in done.stderr and "links[0]" in done.stderr
    assert "Traceback" not in done.stderr
    assert nothing_left(prefix) == {}
    assert time.monotonic() - started < 60
