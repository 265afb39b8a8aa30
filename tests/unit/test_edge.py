"""The edge agent on its own: it starts where neither the scheduler nor Mininet can be imported,
and its Messenger and Network Manager behave (against a small fake Master over real HTTP).

These tests import only `edge` and `protocol`: `test_the_agent_stands_alone` runs the rest of
this file again in a subprocess where the project's other packages cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edge import network as edge_network
from edge import tc
from edge.simulated import SimulatedAgent
from protocol.dilation import Dilation
from protocol.http import ApiError, JsonApp, Server, call
from protocol.messages import ShapingRule, WorkerSpec

REPO = Path(__file__).resolve().parents[2]
# What an edge host does not have: the rest of the project and its heavy dependencies.
ABSENT = (
    "mininet",
    "scheduler",
    "testbed",
    "master",
    "sdn_app",
    "topologies",
    "workloads",
    "networkx",
    "torch",
)
BLOCK = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on an edge host)")
sys.meta_path.insert(0, Absent())
"""


def run_isolated(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_the_agent_stands_alone():
    done = run_isolated(
        "import runpy; sys.argv = ['edge', '--help']; runpy.run_module('edge', run_name='__main__')"
    )
    assert done.returncode == 0, done.stderr
    assert "--node" in done.stdout and "--master" in done.stdout
    loaded = run_isolated("import edge.agent, json; print(json.dumps(sorted(sys.modules)))")
    assert loaded.returncode == 0, loaded.stderr
    modules = json.loads(loaded.stdout)
    assert not [m for m in modules if m.split(".")[0] in ABSENT]
    tests = run_isolated(
        f"import pytest; sys.exit(pytest.main([{__file__!r}, '-q', '-p', "
        "'no:cacheprovider', '-k', 'not stands_alone']))"
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]


class FakeMaster:
    """Registrations and heartbeats as the Master receives them; it can forget agents (409)."""

    def __init__(self, expected: list[str] | None = None, port: int = 0):
        self.registrations, self.heartbeats = [], []
        self.expected = expected or []
        self.stop: list[str] = []
        self.forget = False
        self.hold_reply: threading.Event | None = None  # set: the registration's reply waits
        self.replying = threading.Event()
        app = JsonApp()
        app.route("POST", "/agents", self._register)
        app.route("POST", "/agents/(?P<node>[^/]+)/heartbeat", self._heartbeat)
        self.server = Server(app, "127.0.0.1", port)

    def _register(self, req) -> dict:
        self.registrations.append(req.json())
        self.forget = False
        self.replying.set()
        if self.hold_reply is not None:
            self.hold_reply.wait(5)
        return {"expected_workers": self.expected}

    def _heartbeat(self, req, node: str) -> dict:
        if self.forget:
            raise ApiError(409, f"node '{node}' has not registered")
        self.heartbeats.append(req.json())
        stop, self.stop = self.stop, []
        return {"stop": stop}


def wait_for(predicate, timeout_s: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def master():
    m = FakeMaster()
    m.server.start()
    yield m
    m.server.stop()


def spec(name: str) -> dict:
    return {
        "name": name,
        "job": "j",
        "task": "w0",
        "image": "ces-worker",
        "command": ["python3", "-m", "workloads.train"],
        "cpu": 0.5,
        "mem_mb": 256,
    }


def test_messenger_registers_heartbeats_and_obeys_the_reply(master):
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=0.1).start()
    try:
        wait_for(lambda: master.registrations, what="registration")
        reg = master.registrations[0]
        assert reg["node"] == "n1" and reg["url"] == agent.server.url and reg["ip"] == "10.0.0.1"
        assert call("POST", agent.server.url + "/workers", spec("w-a1"))["state"] == "running"
        wait_for(lambda: any(hb["workers"] for hb in master.heartbeats), what="worker reported")
        master.stop = ["w-a1"]  # the Master no longer wants it
        wait_for(lambda: not agent.compute.workers, what="worker stopped")
        seqs = [hb["seq"] for hb in master.heartbeats]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    finally:
        agent.stop()


def test_heartbeats_are_jittered_so_agents_started_together_drift_apart():
    agents = [
        SimulatedAgent(f"n{i}", "http://127.0.0.1:9", f"10.0.0.{i}", heartbeat_s=1.0)
        for i in (1, 2)
    ]
    waits = [[a.messenger.next_wait_s() for _ in range(200)] for a in agents]
    for a in agents:
        a.stop()
    assert all(0.9 <= w <= 1.1 for ws in waits for w in ws)
    assert all(max(ws) - min(ws) > 0.1 for ws in waits)  # drawn each time, not once
    assert waits[0] != waits[1]  # not in step with each other


def test_a_worker_that_ends_is_reported_at_once_with_its_last_lines(master):
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=30).start()
    try:
        wait_for(lambda: master.heartbeats, what="first heartbeat")
        call("POST", agent.server.url + "/workers", spec("w-a1"))
        t0 = time.monotonic()
        agent.compute.finish("w-a1", 3, "oops", lines=[{"type": "end", "iters": 7}])
        wait_for(
            lambda: any(w["state"] == "exited" for hb in master.heartbeats for w in hb["workers"]),
            timeout_s=3,
            what="exit reported",
        )
        assert time.monotonic() - t0 < 2  # not the 30 s heartbeat period
        hb = next(hb for hb in master.heartbeats if hb["records"])
        assert hb["records"] == [{"type": "end", "iters": 7, "worker": "w-a1"}]
        assert hb["workers"] == [
            {
                "name": "w-a1",
                "job": "j",
                "task": "w0",
                "state": "exited",
                "exit_code": 3,
                "detail": "oops",
            }
        ]
    finally:
        agent.stop()


def test_a_master_that_forgot_the_agent_gets_a_new_registration(master):
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=0.05).start()
    try:
        wait_for(lambda: master.heartbeats, what="first heartbeat")
        master.forget = True
        wait_for(lambda: len(master.registrations) == 2, what="registration again")
    finally:
        agent.stop()


def test_an_unreachable_master_is_retried_until_it_answers():
    gone = FakeMaster()
    port = gone.server.port
    gone.server.stop()  # the port is free again: connections are refused
    agent = SimulatedAgent("n1", f"http://127.0.0.1:{port}", "10.0.0.1", heartbeat_s=0.05).start()
    try:
        time.sleep(0.3)
        assert not agent.messenger.registered
        back = FakeMaster(port=port)
        back.server.start()
        try:
            wait_for(lambda: back.registrations and back.heartbeats, what="registration")
        finally:
            back.server.stop()
    finally:
        agent.stop()


def test_registration_reply_decides_which_workers_are_kept(master):
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=30)
    for name in ("keep", "drop"):  # left by the agent's earlier life
        agent.compute.start(WorkerSpec(**spec(name)))
    master.expected = ["keep"]
    agent.start()
    try:
        wait_for(lambda: master.registrations, what="registration")
        wait_for(lambda: set(agent.compute.workers) == {"keep"}, what="reconciled")
    finally:
        agent.stop()


def test_a_worker_started_while_the_registration_reply_is_on_the_way_is_kept(master):
    master.hold_reply = reply = threading.Event()
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=30)
    agent.compute.start(WorkerSpec(**spec("old")))  # left by the agent's earlier life
    agent.start()
    try:
        assert master.replying.wait(5)
        call("POST", agent.server.url + "/workers", spec("new"))  # the Master placed it
        reply.set()
        wait_for(lambda: master.heartbeats, what="first heartbeat")
        assert set(agent.compute.workers) == {"new"}
    finally:
        reply.set()
        agent.stop()


def test_command_channel_refuses_malformed_commands_with_the_field(master):
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=30).start()
    url = agent.server.url
    try:
        for body, field in (
            ({**spec("w"), "cpu": "lots"}, "WorkerSpec.cpu"),
            ({**spec("w"), "extra": 1}, "unknown field"),
            ({k: v for k, v in spec("w").items() if k != "image"}, "image"),
            ([1, 2], "expected a JSON object"),
        ):
            with pytest.raises(ApiError) as e:
                call("POST", url + "/workers", body)
            assert e.value.status == 400 and field in e.value.message
        for rules in ([{"dst_ip": "10.0.0.2", "rate_mbps": "fast"}], "all", [{"dst_ip": 7}]):
            with pytest.raises(ApiError) as e:
                call("PUT", url + "/shaping", {"rules": rules})
            assert e.value.status == 400
        assert not agent.compute.workers and agent.network.updates == 0
        call("PUT", url + "/shaping", {"rules": [{"dst_ip": "10.0.0.2", "rate_mbps": 20}]})
        assert agent.network.rules == [ShapingRule("10.0.0.2", 20.0)]
        health = call("GET", url + "/health")
        assert health["node"] == "n1" and health["workers"] == 0
    finally:
        agent.stop()


def test_network_manager_changes_only_what_differs(monkeypatch):
    """The per-destination classes follow the complete set of rules: added, changed, removed;
    a bad rule refuses the whole set before tc is touched."""
    kernel = {2: 10.0, 3: 5.0}  # class minor -> Mbit/s, as `tc class show` would list them
    calls = []
    monkeypatch.setattr(edge_network.tc, "link_rate", lambda dev, pid, dilation: 100.0)
    monkeypatch.setattr(edge_network.tc, "destinations", lambda dev, pid, dilation: dict(kernel))

    def set_destination(dev, ip, rate, pid, dilation):
        calls.append(("set", ip, rate))
        kernel[int(ip.rsplit(".", 1)[1])] = rate

    def remove_class(dev, minor, pid):
        calls.append(("remove", minor))
        del kernel[minor]

    monkeypatch.setattr(edge_network.tc, "set_destination", set_destination)
    monkeypatch.setattr(edge_network.tc, "remove_class", remove_class)
    nm = edge_network.NetworkManager("eth0", pid=None)
    assert nm.apply([ShapingRule("10.0.0.2", 10.0), ShapingRule("10.0.0.4", 7.0)]) == {"classes": 2}
    assert sorted(calls, key=str) == [("remove", 3), ("set", "10.0.0.4", 7.0)]
    for bad in (
        [ShapingRule("10.0.0.2", 0.0)],
        [ShapingRule("nonsense", 1.0)],
        [ShapingRule("10.0.0.2", 1.0), ShapingRule("10.1.0.2", 1.0)],
    ):
        calls.clear()
        with pytest.raises(ValueError):
            nm.apply(bad)
        assert calls == []
    nm.clear()
    assert kernel == {}


class FakeKernelTc:
    """`tc` against one shaped interface whose link has a delay (3.5 ms on the host): answers
    `class show` and `qdisc show` as the kernel does, each class's leaf a TBF with netem below
    it, and records every netem placed (`placed`)."""

    def __init__(self) -> None:
        self.classes = {0xFFFE: "100Mbit"}
        # parent -> (handle, kind, args): the default class's TBF and its netem
        self.qdiscs = {
            "1:fffe": ("8001:", "tbf", ("rate", "100Mbit")),
            "8001:1": ("8002:", "netem", ("limit", "32", "delay", "3.5ms")),
        }
        self.placed: list[tuple[str, ...]] = []  # (class, netem's args) in order
        self.handles = iter(range(0x8003, 0x9000))  # the kernel's: each new qdisc its own

    def _class_of(self, parent: str) -> str:
        return next((p for p, (h, _, _) in self.qdiscs.items() if f"{h}1" == parent), parent)

    def tc(self, pid, *args, check=True):
        if args[:2] == ("class", "show"):
            return "class htb 1:ffff root rate 100Mbit ceil 100Mbit burst 50000b\n" + "".join(
                f"class htb 1:{m:x} parent 1:ffff leaf 80{m % 100:02d}: prio 0 rate {r} ceil {r}\n"
                for m, r in self.classes.items()
            )
        if args[:2] == ("qdisc", "show"):
            return "qdisc htb 1: root refcnt 2 r2q 10 default 0xfffe\n" + "".join(
                f"qdisc {kind} {handle} parent {parent} {' '.join(rest)}\n"
                for parent, (handle, kind, rest) in self.qdiscs.items()
            )
        if args[:2] == ("qdisc", "del"):
            parent = args[args.index("parent") + 1]
            handle = self.qdiscs.pop(parent, ("", "", ()))[0]
            self.qdiscs.pop(f"{handle}1", None)
        elif args[:2] in (("qdisc", "add"), ("qdisc", "replace")):
            at = args.index("parent") + 1
            parent, kind, rest = args[at], args[at + 1], args[at + 2 :]
            handle = self.qdiscs.get(parent, (f"{next(self.handles):x}:",))[0]
            self.qdiscs[parent] = (handle, kind, rest)
            if kind == "netem":
                self.placed.append((self._class_of(parent), *rest))
        return ""

    def batch(self, pid, lines):
        for line in lines:
            words = line.split()
            if words[:2] == ["class", "add"]:
                self.classes[int(words[words.index("classid") + 1].split(":")[1], 16)] = "10Mbit"


def test_a_grant_keeps_its_links_delay(monkeypatch):
    """A per-destination class shapes the rate of a node's traffic, not its wire: its leaf has
    the link's delay (it had none, so granted flows skipped the node's link delay), and a new
    delay for the link reaches the granted classes too."""
    kernel = FakeKernelTc()
    monkeypatch.setattr(tc, "tc", kernel.tc)
    monkeypatch.setattr(tc, "_batch", kernel.batch)
    monkeypatch.setattr(tc, "_netem", True)
    k = Dilation(3.5)
    assert tc.link_delay_ms("eth0", 1, k) == pytest.approx(1.0)
    tc.set_destination("eth0", "10.0.0.2", 10.0, pid=1, dilation=k)
    acks, leaf = kernel.placed  # the first grant brings the acknowledgements' class
    assert leaf == ("1:2", "delay", "3.5ms", "limit", str(tc.netem_limit(10.0, 1.0)))
    link = 100.0 * 3.5  # the link's emulated rate
    assert acks == ("1:fffd", "delay", "3.5ms", "limit", str(tc.netem_limit(link, 1.0)))
    assert kernel.qdiscs["1:2"][1] == "tbf"  # netem sits below the class's TBF
    kernel.placed.clear()
    tc.set_destination("eth0", "10.0.0.2", 190.0, pid=1, dilation=k)  # the grant is raised
    assert kernel.placed == []  # its leaf stays: a TBF changed under load stalls its flow
    tbf = kernel.qdiscs["1:2"][2]
    assert (
        tbf[tbf.index("rate") + 1] == "100000kbit"
    )  # the link's rate (350 / 3.5), not the grant's
    kernel.placed.clear()
    tc.change("eth0", 100.0, delay_ms=2.0, pid=1, dilation=k)
    assert sorted(leaf[:3] for leaf in kernel.placed) == [
        ("1:2", "delay", "7.0ms"),
        ("1:fffd", "delay", "7.0ms"),
        ("1:fffe", "delay", "7.0ms"),
    ]
    assert tc.link_delay_ms("eth0", 1, k) == pytest.approx(2.0)


def test_netem_holds_the_packets_in_their_delay_beside_its_queue():
    """netem counts the packets it delays in its limit: a limit of the queue alone would cap a
    190 Mbit/s link of 20 ms at what the queue's packets per 20 ms carry. Below the TBF, which
    has cut TCP's large packets, the queue is its bytes in full-size packets."""
    assert tc.queue_pkts(190.0) == 79 and tc.queue_bytes(190.0) == 79 * 65_536
    assert tc.netem_limit(190.0, 0.0) == 3420  # 79 × 65 536 / 1514 = 3419.6
    assert tc.netem_limit(190.0, 20.0) == 3420 + 317  # 190e6/8 × 0.020 / 1500 = 316.7
    assert tc.netem_limit(10.0, 1.0) == 1386 + 1  # 32 × 65 536 / 1514 = 1385.2
    [*_, tbf, leaf] = tc.shape_lines("eth0", 190.0, delay_ms=20.0, dilation=Dilation(4), netem=True)
    assert "parent 1:fffe handle 2: tbf rate 47500kbit" in tbf
    assert leaf.endswith("parent 2:1 netem delay 80.0ms limit 3737")  # dilated delay, not limit
    [*_, leaf] = tc.shape_lines("eth0", 190.0, delay_ms=20.0, netem=False)
    assert leaf.endswith(f"tbf rate 190000kbit burst 95000 limit {79 * 65_536}")


def test_a_switch_port_queues_frames_and_a_node_its_tcps_largest_packets():
    """A node's TCP hands its qdisc packets of up to 64 KB, a switch its port full-size frames:
    the same number of either (the pfifo leaf's count), so that a node's queue holds a message's
    window and a switch's does not fill the socket its datapath sends through."""
    assert tc.queue_bytes(10.0) == 32 * 65_536
    assert tc.queue_bytes(10.0, switch_port=True) == 32 * 1514
    assert tc.netem_limit(190.0, 20.0, switch_port=True) == 79 + 317
    [*_, tbf, leaf] = tc.shape_lines("s1-eth2", 190.0, 20.0, Dilation(4), True, switch_port=True)
    assert tbf.endswith(f"limit {79 * 1514}") and leaf.endswith("limit 396")


def test_threads_are_not_left_behind(master):
    def agent_side() -> set[threading.Thread]:  # the Master's server keeps its pool of threads
        return {t for t in threading.enumerate() if t.name != f"http-{master.server.port}"}

    before = agent_side()
    agent = SimulatedAgent("n1", master.server.url, "10.0.0.1", heartbeat_s=0.05).start()
    wait_for(lambda: master.heartbeats, what="heartbeat")
    assert len(agent_side()) > len(before)
    agent.stop()
    wait_for(lambda: agent_side() <= before, what="threads gone")
