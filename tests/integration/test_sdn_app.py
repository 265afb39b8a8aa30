"""The SDN app for real: the controller as its own process (`python -m sdn_app`), Open vSwitch
bridges made with ovs-vsctl outside Mininet (the physical-switch stand-in), namespaces as hosts.

Topology (written by the test): three switches in a triangle, so h1 → h2 has a direct path
(s1-s3, the default) and a detour (s1-s2-s3) a job can be put on.

    h1 - s1 ----- s3 - h2
           \\     /
             s2 - h3
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from protocol.http import free_port
from sdn_app.client import FlowRequest, SdnClient, SdnError
from sdn_app.flows import COOKIE_JOB, COOKIE_RETURN
from testbed.netns import NetnsNetwork, sh
from topologies import Topology, load_topology

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

TOPOLOGY = """
name: sdntest
switches:
  - {name: s1, dpid: "00:00:00:00:00:00:0c:01"}
  - {name: s2, dpid: 0xc02}
  - {name: s3, dpid: 0xc03}
nodes:
  - {name: h1, cpu: 1, mem_mb: 256}
  - {name: h2, cpu: 1, mem_mb: 256}
  - {name: h3, cpu: 1, mem_mb: 256}
links:
  - {ends: [s1, s3], bw_mbps: 1000, ports: [1, 1]}
  - {ends: [s1, s2], bw_mbps: 1000, ports: [2, 1]}
  - {ends: [s2, s3], bw_mbps: 1000, ports: [2, 2]}
  - {ends: [h1, s1], bw_mbps: 1000, ports: [null, 7]}
  - {ends: [h2, s3], bw_mbps: 1000, ports: [null, 7]}
  - {ends: [h3, s2], bw_mbps: 1000, ports: [null, 7]}
"""
DETOUR = ["s1", "s2", "s3"]
DIRECT = ["s1", "s3"]


def wait_for(condition: Callable[[], Any], timeout_s: float = 15, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what or condition}")


class ControllerProcess:
    """`python -m sdn_app` as a child process, restartable with the same ports and state file."""

    def __init__(self, topo_file: Path, workdir: Path):
        self.topo_file = topo_file
        self.of_port, self.rest_port = free_port(), free_port()
        self.state = workdir / "state.json"
        self.log = workdir / "controller.log"
        self.client = SdnClient(f"http://127.0.0.1:{self.rest_port}", timeout_s=20)
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "sdn_app",
            "--topo",
            str(self.topo_file),
            "--of-port",
            str(self.of_port),
            "--of-host",
            "127.0.0.1",
            "--rest",
            f"127.0.0.1:{self.rest_port}",
            "--stats-interval",
            "0.5",
            "--state",
            str(self.state),
            "--lldp",
        ]

    def start(self) -> None:
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)},
            )

        def answering() -> bool:
            assert self.proc.poll() is None, f"controller exited:\n{self.log.read_text()}"
            try:
                return bool(self.client.health())
            except SdnError:
                return False

        wait_for(answering, 30, "the controller's REST API")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module", autouse=True)
def requirements() -> None:
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    elif subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode:
        missing.append("a running Open vSwitch")
    missing += [tool for tool in ("iperf3", "ethtool", "ping") if shutil.which(tool) is None]
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"the SDN integration tests need {', '.join(missing)}")
        pytest.skip(f"needs {', '.join(missing)}")


@pytest.fixture(scope="module")
def topo(tmp_path_factory) -> Topology:
    path = tmp_path_factory.mktemp("sdn") / "sdntest.yaml"
    path.write_text(TOPOLOGY)
    return load_topology(path)


@pytest.fixture(scope="module")
def controller(topo, tmp_path_factory):
    ctl = ControllerProcess(Path(topo.source), tmp_path_factory.mktemp("ctl"))
    ctl.start()
    yield ctl
    ctl.stop()


@pytest.fixture(scope="module")
def net(topo, controller):
    prefix = "sd" + uuid.uuid4().hex[:4]
    with NetnsNetwork(topo, prefix, ("127.0.0.1", controller.of_port)) as network:
        controller.client.wait_ready(30)
        yield network


@pytest.fixture()
def sdn(net, controller) -> SdnClient:
    """The client; every job a test leaves behind is removed after it."""
    yield controller.client
    if controller.proc is None:  # a test stopped it
        controller.start()
    controller.client.wait_ready(30)
    for job in controller.client.jobs():
        controller.client.delete_job_flows(job["job"])


def job_entries(net: NetnsNetwork, switch: str) -> list[dict]:
    return [f for f in net.dump_flows(switch) if f["cookie"] >> 48 == COOKIE_JOB >> 48]


def snapshot(net: NetnsNetwork) -> dict:
    """Every switch's entries (without counters) and meters."""
    return {
        sw: (
            sorted(
                (f["cookie"], f["priority"], f["match"], f["actions"]) for f in net.dump_flows(sw)
            ),
            net.dump_meters(sw),
        )
        for sw in net.bridges
    }


def test_fresh_network_pings_with_no_job(net, sdn, topo):
    health = sdn.health()
    assert health["ready"] and health["connected"] == 3 and health["jobs"] == 0
    for a in topo.nodes:
        for b in topo.nodes:
            if a != b:
                assert net.ping(a.name, b.name), f"{a.name} cannot ping {b.name}"
    for sw in net.bridges:  # per-destination IPv4 + ARP entries and LLDP to the controller
        assert len(net.dump_flows(sw)) == 2 * len(topo.nodes) + 1
    # LLDP sees exactly the cabling the topology file describes
    lldp = wait_for(
        lambda: (r := sdn.switches()["lldp"])["discovered"] and not r["missing"] and r,
        15,
        "LLDP to discover every link",
    )
    assert len(lldp["discovered"]) == 6 and lldp["unexpected"] == []
    assert {"src": "s1", "src_port": 2, "dst": "s2", "dst_port": 1} in lldp["discovered"]
    switches = sdn.switches()
    assert [s["connected"] and s["synced"] for s in switches["switches"]] == [True] * 3
    assert switches["unknown"] == []
    assert {e["switch"] for e in switches["events"] if e["event"] == "connect"} == {
        "s1",
        "s2",
        "s3",
    }


def test_job_flows_follow_the_requested_path(net, sdn, topo):
    reply = sdn.put_job_flows("detour", [FlowRequest("h1", "h2", DETOUR, 500)])
    assert reply["install_ms"] < 1000
    cookie = int(reply["flows"][0]["cookie"], 16)
    for sw, out in (("s1", 2), ("s2", 2), ("s3", 7)):  # ports from the topology file
        [entry] = job_entries(net, sw)
        assert entry["cookie"] == cookie
        assert "nw_src=10.0.0.1,nw_dst=10.0.0.2" in entry["match"]
        assert entry["actions"].endswith(f"output:{out}")
    assert job_entries(net, "s1")[0]["actions"].startswith("meter:")

    before = {sw: net.port_tx_bytes(sw) for sw in ("s1", "s2")}
    goodput = net.iperf("h1", "h2", seconds=2)
    after = {sw: net.port_tx_bytes(sw) for sw in ("s1", "s2")}
    sent = goodput * 1e6 / 8 * 2
    assert after["s1"][2] - before["s1"][2] > 0.8 * sent  # s1 → s2: the detour carries it
    assert after["s2"][2] - before["s2"][2] > 0.8 * sent  # s2 → s3
    assert after["s1"][1] - before["s1"][1] < 0.05 * sent  # s1 → s3: the default path does not
    # a flow entry's counters trail the port's: OVS's revalidators fold the datapath's counts
    # in every ~0.5 s (CI read 48 of 64 MB right after a 2 s iperf), so poll
    wait_for(
        lambda: job_entries(net, "s2")[0]["n_bytes"] > 0.8 * sent,
        5,
        "s2's job entry to count the detoured bytes",
    )

    def hop_counters():
        hops = sdn.job_flows("detour")[0]["hops"]
        return hops if all((h["bytes"] or 0) > 0.8 * sent for h in hops) else None

    hops = wait_for(hop_counters, 10, "per-hop counters in GET /jobs/detour/flows")
    assert [h["switch"] for h in hops] == DETOUR


def test_a_symmetric_flows_answers_come_back_along_its_path(net, sdn, topo):
    """h2's acknowledgements to h1 take the detour back (unmetered, their own cookie) rather
    than the default s3 -> s1; the flow's hops still count only its own packets."""
    reply = sdn.put_job_flows("both", [FlowRequest("h1", "h2", DETOUR, 500, symmetric=True)])
    entries = {
        sw: [f for f in net.dump_flows(sw) if f["cookie"] >> 48 == COOKIE_RETURN >> 48]
        for sw in DETOUR
    }
    for sw, out in (("s3", 2), ("s2", 1), ("s1", 7)):  # ports from the topology file
        [entry] = entries[sw]
        assert "nw_src=10.0.0.2,nw_dst=10.0.0.1" in entry["match"]
        assert entry["actions"] == f"output:{out}"  # no meter
    before = net.port_tx_bytes("s3")
    net.iperf("h1", "h2", seconds=2)
    after = net.port_tx_bytes("s3")
    back, default = after[2] - before[2], after[1] - before[1]  # s3 -> s2, s3 -> s1
    assert back > 100_000 and default < 0.1 * back, (back, default)
    assert reply["flows"][0]["symmetric"] is True
    # the flow's hops count its packets, the way back's hops the acknowledgements (the Master
    # takes both for its own traffic)
    flow = wait_for(
        lambda: (
            ((f := sdn.job_flows("both")[0])["return_hops"][-1]["bytes"] or 0) > 0.5 * back and f
        ),
        10,
        "the way back's counters",
    )
    assert [h["switch"] for h in flow["hops"]] == DETOUR
    assert [h["switch"] for h in flow["return_hops"]] == DETOUR[::-1]
    assert flow["return_hops"][-1]["bytes"] < 0.2 * flow["hops"][-1]["bytes"]


def test_meter_limits_the_rate_and_links_show_it(net, sdn):
    free = net.iperf("h1", "h2", seconds=2)
    rate = 10.0
    assert free > 3 * rate, f"the unmetered path must be much faster than {rate} Mbit/s"
    reply = sdn.put_job_flows("metered", [FlowRequest("h1", "h2", DIRECT, rate)])
    meter_id = reply["flows"][0]["meter"]["meter_id"]
    assert net.dump_meters("s1") == {meter_id: {"rate": 10_000, "burst": 5_000}}

    seen: list[float] = []

    def sample_link():
        usage = {(u.src, u.dst): u for u in sdn.links()}
        if usage[("s1", "s3")].mbps:
            seen.append(usage[("s1", "s3")].mbps)

    server = net.popen("h2", "iperf3 -s -1 -p 5301")
    wait_for(lambda: ":5301 " in net.run("h2", "ss -ltn"), 5, "iperf3 server")
    client = net.popen("h1", "iperf3 -c 10.0.0.2 -p 5301 -t 5 -J")
    while client.poll() is None:
        sample_link()
        time.sleep(0.3)
    out, _ = client.communicate()
    server.wait(10)
    goodput = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    assert 0.7 * rate <= goodput <= 1.15 * rate
    # the port counters of s1 → s3 saw the metered rate (a few samples at the ramp-up differ)
    middle = sorted(seen)[len(seen) // 2]
    assert 0.6 * rate <= middle <= 1.3 * rate, seen
    meter = sdn.job_flows("metered")[0]["meter"]
    assert meter["rate_kbps"] == 10_000 and meter["in_mbps"] is not None


def test_reroute_and_rate_update_happen_in_place(net, sdn):
    first = sdn.put_job_flows("move", [FlowRequest("h1", "h2", DETOUR, 50)])
    meter_id = first["flows"][0]["meter"]["meter_id"]
    cookie = first["flows"][0]["cookie"]
    pinger = net.popen("h1", "ping -i 0.01 -c 300 -W 1 10.0.0.2")
    wait_for(
        lambda: job_entries(net, "s2")[0]["n_bytes"] > 10 * 98,
        10,
        "the pings to cross s2, the detour",
    )
    second = sdn.put_job_flows("move", [FlowRequest("h1", "h2", DIRECT, 10)])
    out, _ = pinger.communicate(timeout=30)
    assert " 0% packet loss" in out, out  # make before break: no packet without an entry

    assert second["flows"][0]["meter"]["meter_id"] == meter_id  # same meter, modified
    assert second["flows"][0]["cookie"] == cookie
    assert net.dump_meters("s1") == {meter_id: {"rate": 10_000, "burst": 5_000}}
    assert job_entries(net, "s2") == []  # left the detour
    [s1] = job_entries(net, "s1")
    assert s1["actions"] == f"meter:{meter_id},output:1"
    goodput = net.iperf("h1", "h2", seconds=4)
    assert 0.6 * 10 <= goodput <= 1.2 * 10  # ≤ 1 + burst/duration = 1.125 in theory


def test_delete_leaves_no_entries_or_meters(net, sdn):
    sdn.put_job_flows(
        "gone",
        [
            FlowRequest("h1", "h2", DETOUR, 30),
            FlowRequest("h3", "h1", ["s2", "s1"], 30, tcp_dst=80),
            FlowRequest("h2", "h3", ["s3", "s1", "s2"], 30),
        ],
    )
    assert sum(len(job_entries(net, sw)) for sw in net.bridges) == 3 + 2 + 3
    assert sdn.delete_job_flows("gone") == {"job": "gone", "removed_flows": 3}
    for sw in net.bridges:
        assert job_entries(net, sw) == []
        assert net.dump_meters(sw) == {}
    with pytest.raises(SdnError) as e:
        sdn.job_flows("gone")
    assert e.value.status == 404
    with pytest.raises(SdnError) as e:
        sdn.delete_job_flows("gone")
    assert e.value.status == 404
    assert net.ping("h1", "h2") and net.ping("h3", "h1")


BAD_REQUESTS = [
    ("PUT", "/jobs/bad/flows", b"{not json", 400, "not valid JSON"),
    ("PUT", "/jobs/bad/flows", b'{"flows": [{"src": "h1"}]}', 400, "missing"),
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h1", "dst": "h2", "path": ["s1", "s9", "s3"], "rate_mbps": 5}]}',
        400,
        "unknown switch",
    ),
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h1", "dst": "h3", "path": ["s1", "s3", "s1", "s2"], "rate_mbps": 5}]}',
        400,
        "twice",
    ),
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h1", "dst": "h2", "path": ["s2", "s3"], "rate_mbps": 5}]}',
        400,
        "must start at 's1'",
    ),
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h1", "dst": "h2", "path": ["s1", "s2"], "rate_mbps": 5}]}',
        400,
        "must end at 's3'",
    ),
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h1", "dst": "h2", "path": ["s1", "s3"], "rate_mbps": 0}]}',
        400,
        "rate_mbps",
    ),
    # the first flow is fine, the second is not: nothing of the job may be installed
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h3", "dst": "h2", "path": ["s2", "s3"], "rate_mbps": 5},'
        b' {"src": "h3", "dst": "h1", "path": ["s2", "s3"], "rate_mbps": 5}]}',
        400,
        "must end",
    ),
    # h1 -> h2 belongs to job "keep"
    (
        "PUT",
        "/jobs/bad/flows",
        b'{"flows": [{"src": "h1", "dst": "h2", "path": ["s1", "s3"], "rate_mbps": 5}]}',
        409,
        "job 'keep'",
    ),
    ("PUT", "/jobs/bad%20id/flows", b'{"flows": []}', 400, "job id"),
    ("POST", "/jobs", b"{}", 405, "not allowed"),
    ("GET", "/nosuch", None, 404, "no such resource"),
    ("GET", "/jobs/nosuch/flows", None, 404, "no job"),
    ("DELETE", "/jobs/nosuch/flows", None, 404, "no job"),
]


def test_malformed_requests_get_4xx_and_change_nothing(net, sdn):
    sdn.put_job_flows("keep", [FlowRequest("h1", "h2", DETOUR, 40)])
    before, jobs_before = snapshot(net), sdn.jobs()
    for method, path, body, status, words in BAD_REQUESTS:
        req = urllib.request.Request(sdn.url + path, data=body, method=method)
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        text = e.value.read().decode()
        assert e.value.code == status and words in text, (method, path, body, text)
        assert e.value.headers["Content-Type"].startswith("application/json")
    assert snapshot(net) == before
    assert sdn.jobs() == jobs_before


def test_controller_restart_restores_jobs(net, sdn, controller):
    sdn.put_job_flows("survivor", [FlowRequest("h1", "h2", DETOUR, 25)])
    expected = snapshot(net)
    controller.stop(signal.SIGKILL)  # a crash: nothing is saved at exit
    for bridge in net.bridges.values():  # and the switches lost their tables (a reboot)
        sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", bridge)
        sh("ovs-ofctl", "-O", "OpenFlow13", "del-meters", bridge)
    assert not net.ping("h1", "h2", timeout_s=1)
    controller.start()
    sdn.wait_ready(30)
    assert [j["job"] for j in sdn.jobs()] == ["survivor"]
    assert snapshot(net) == expected
    assert net.ping("h1", "h2")


def test_switch_reconnect_restores_its_entries(net, sdn):
    sdn.put_job_flows("recon", [FlowRequest("h1", "h2", DETOUR, 25)])
    expected = snapshot(net)["s2"]
    net.disconnect(net.bridges["s2"])
    sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", net.bridges["s2"])
    wait_for(lambda: not sdn.health()["ready"], 10, "the app to notice s2 left")
    with pytest.raises(SdnError) as e:  # a change that needs s2 is refused, not half-done
        sdn.put_job_flows("other", [FlowRequest("h3", "h1", ["s2", "s1"], 5)])
    assert e.value.status == 503 and "s2" in e.value.message
    net.connect(net.bridges["s2"])
    sdn.wait_ready(30)
    assert snapshot(net)["s2"] == expected
    events = [
        (e["event"], e["switch"])
        for e in sdn.switches()["events"]
        if e["event"] in ("connect", "disconnect")
    ]
    assert events[-2:] == [("disconnect", "s2"), ("connect", "s2")]
    assert [j["job"] for j in sdn.jobs()] == ["recon"]
