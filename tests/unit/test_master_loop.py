"""The Master's control loop with in-process simulated agents (the real Messenger over HTTP, no
containers) and a fake SDN app: launch, success, worker death and retry, heartbeat loss, cancel,
and heartbeats that stay fast while the SDN app stalls."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from two_paths import TWO_PATHS

from edge.simulated import SimulatedAgent
from master import Master, MasterConfig
from master.client import MasterClient
from master.network import NetworkController
from topologies import load_topology, parse_topology

GRANTABLE = NetworkController.GRANTABLE

STAR = load_topology("star")  # e1, e2: 1 core; e3 0.75; e4, e5 0.5; e6 0.25


class FakeSdn:
    """Records what the Network Controller asks of the SDN app; can stall every change."""

    def __init__(self, stall_s: float = 0.0):
        self.stall_s = stall_s
        self.puts: list[list[dict]] = []
        self.deletes = 0
        self.lock = threading.Lock()
        self.measured: list = []  # what links() reports (the switches' counters and ports)
        self.carried: dict = {}  # (src, dst) -> Mbit/s a pair's flow entries count

    def put_job_flows(self, job_id: str, flows: list[dict]) -> dict:
        time.sleep(self.stall_s)
        with self.lock:
            self.puts.append(list(flows))
        return {}

    def delete_job_flows(self, job_id: str) -> dict:
        time.sleep(self.stall_s)
        with self.lock:
            self.deletes += 1
        return {}

    def links(self) -> list:
        return list(self.measured)

    def job_flows(self, job_id: str) -> list[dict]:
        """The last flows put, each counting what `carried` says it carries."""
        with self.lock:
            flows = self.puts[-1] if self.puts else []
        return [{**f, "hops": [{"mbps": self.carried.get((f["src"], f["dst"]))}]} for f in flows]

    def report(self, src: str, dst: str, mbps: float, up: bool = True) -> None:
        self.measured = [SimpleNamespace(src=src, dst=dst, mbps=mbps, up=up)]


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


class Cluster:
    def __init__(self, sdn: FakeSdn, heartbeat_s: float = 0.2, topo=STAR, **config):
        cfg = MasterConfig(**{"heartbeat_timeout_s": 1.0, "tick_s": 0.05, **config})
        self.sdn = sdn
        self.master = Master(topo, cfg, sdn).start()
        self.client = MasterClient(self.master.url)
        self.agents = {
            n.name: SimulatedAgent(
                n.name, self.master.url, n.ip, n.cpu, n.mem_mb, heartbeat_s
            ).start()
            for n in topo.nodes
        }
        self.client.wait_ready(len(topo.nodes), timeout_s=10)

    def stop(self) -> None:
        for a in self.agents.values():
            a.stop()
        self.master.stop()

    def job(self, name: str) -> dict:
        return self.client.job(name)

    def workers(self, job: str) -> dict[str, tuple[str, object]]:
        """worker name -> (node, spec) of the job's live workers."""
        return {
            w: (node, a.compute.specs[w])
            for node, a in self.agents.items()
            for w in a.compute.workers
            if a.compute.specs[w].job == job
        }


@pytest.fixture
def cluster():
    c = Cluster(FakeSdn())
    yield c
    c.stop()


def spread_job(name: str, **more) -> dict:
    """Two 1-core tasks: on the star only e1 and e2 can hold one each."""
    return {
        "name": name,
        "collective": "ring",
        "workers": 2,
        "task": {"cpu": 1.0, "mem_mb": 512},
        "model_params": 1e6,
        "demand_mbps": 50,
        "iterations": 10,
        **more,
    }


def running(c: Cluster, name: str, attempt: int = 1):
    return lambda: c.job(name)["state"] == "running" and len(c.job(name)["attempts"]) == attempt


def test_launch_starts_each_worker_with_its_rendezvous_and_enforces_the_flows(cluster):
    c = cluster
    c.client.submit(spread_job("j"))
    wait_for(running(c, "j"), what="j running")
    workers = c.workers("j")
    assert sorted(node for node, _ in workers.values()) == ["e1", "e2"]
    att = c.job("j")["attempts"][0]
    rank0_node = att["placement"]["w0"]
    for node, spec in workers.values():
        argv = spec.command
        flag = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
        assert flag["--rank"] == ("0" if node == rank0_node else "1")
        assert flag["--world-size"] == "2"
        assert flag["--master-addr"] == STAR.node(rank0_node).ip
        assert flag["--master-port"] == str(att["master_port"])
        assert spec.cpu == 1.0 and spec.mem_mb == 512
    pairs = {(f["src"], f["dst"]): f for f in c.sdn.puts[-1]}
    assert set(pairs) == {("e1", "e2"), ("e2", "e1")} and pairs[("e1", "e2")]["path"] == ["hub"]
    rules = wait_for(lambda: c.agents["e1"].network.rules, what="shaping on e1")
    assert [(r.dst_ip, r.rate_mbps) for r in rules] == [
        (STAR.node("e2").ip, pairs[("e1", "e2")]["rate_mbps"])
    ]


def test_a_job_finishes_when_every_worker_exits_0_and_frees_what_it_held(cluster):
    c = cluster
    c.client.submit(spread_job("j"))
    wait_for(running(c, "j"), what="j running")
    for w, (node, _) in c.workers("j").items():
        c.agents[node].finish(w, 0)
    wait_for(lambda: c.job("j")["state"] == "finished", what="j finished")
    wait_for(lambda: c.sdn.deletes == 1, what="the flows removed from the SDN app")
    wait_for(lambda: not c.agents["e1"].network.rules, what="e1's shaping removed")
    assert all(n["allocated"]["cpu"] == 0 for n in c.client.nodes())
    wait_for(lambda: not c.workers("j"), what="the workers removed")


def test_a_dead_worker_is_retried_then_the_job_fails_with_the_reason(cluster):
    c = cluster
    c.client.submit(spread_job("j"))
    for attempt in (1, 2):
        wait_for(running(c, "j", attempt), what=f"attempt {attempt} running")
        name, (node, _) = sorted(c.workers("j").items())[0]
        assert name.endswith(f"-a{attempt}")
        c.agents[node].finish(name, 1, "boom")
    view = wait_for(lambda: (v := c.job("j"))["state"] == "failed" and v, what="j failed")
    assert "exited with code 1 (boom)" in view["reason"] and "after 2 attempts" in view["reason"]
    assert [a["outcome"] != "" for a in view["attempts"]] == [True, True]
    wait_for(lambda: not c.workers("j"), what="the other workers stopped")


def test_bad_parameters_fail_at_once_without_a_retry(cluster):
    c = cluster
    c.client.submit(spread_job("j"))
    wait_for(running(c, "j"), what="j running")
    name, (node, _) = sorted(c.workers("j").items())[0]
    c.agents[node].finish(name, 2, "bad option")
    view = wait_for(lambda: (v := c.job("j"))["state"] == "failed" and v, what="j failed")
    assert len(view["attempts"]) == 1 and "not retryable" in view["reason"]


def test_a_silent_node_goes_offline_and_its_job_is_placed_again(cluster):
    c = cluster
    job = spread_job("j", task={"cpu": 0.5, "mem_mb": 512})
    c.client.submit(job)
    wait_for(running(c, "j"), what="j running")
    node = c.job("j")["attempts"][0]["placement"]["w1"]
    t0 = time.monotonic()
    c.agents[node].stop()
    wait_for(
        lambda: not next(n for n in c.client.nodes() if n["node"] == node)["online"],
        timeout_s=5,
        what=f"{node} offline",
    )
    assert time.monotonic() - t0 < 3.0  # heartbeat timeout 1 s
    wait_for(running(c, "j", 2), what="attempt 2 running")
    view = c.job("j")
    assert "stopped heartbeating" in view["attempts"][0]["outcome"]
    assert node not in view["attempts"][1]["placement"].values()


def test_cancel_stops_the_workers_and_removes_the_flows(cluster):
    c = cluster
    c.client.submit(spread_job("j"))
    wait_for(running(c, "j"), what="j running")
    assert c.client.cancel("j")["state"] == "cancelled"
    wait_for(lambda: not c.workers("j"), what="the workers stopped")
    assert c.sdn.deletes == 1
    assert all(n["allocated"]["cpu"] == 0 for n in c.client.nodes())


def test_heartbeats_stay_fast_and_no_node_goes_offline_while_the_sdn_app_stalls():
    """Every SDN change takes 5 s; the Master talks to the SDN app outside its lock, so the
    heartbeats of all six agents (every 0.2 s, timeout 1 s) are answered as fast as ever."""
    c = Cluster(FakeSdn(stall_s=5.0))
    try:
        for a in c.agents.values():
            a.messenger.round_trips.clear()
        c.client.submit(spread_job("j"))
        offline = []
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline:  # the stall of the launch's SDN change
            offline.append(6 - c.client.health()["nodes_online"])
            time.sleep(0.1)
        trips = sorted(t for a in c.agents.values() for t in a.messenger.round_trips)
        assert len(trips) > 100
        p99 = trips[int(0.99 * (len(trips) - 1))]
        assert p99 <= 0.1, f"heartbeat reply p99 {p99 * 1000:.0f} ms during the stall"
        assert max(offline) == 0
        wait_for(running(c, "j"), timeout_s=10, what="j running after the stall")
    finally:
        c.stop()


def test_a_best_effort_job_installs_nothing_and_holds_no_bandwidth(cluster):
    c = cluster
    c.client.submit(spread_job("j"), algorithm="k8s-spread")  # network-blind: best-effort
    wait_for(running(c, "j"), what="j running")
    att = c.job("j")["attempts"][0]
    assert att["network"] == "best-effort" and att["adjustable"] is False
    assert c.sdn.puts == [] and all(not a.network.rules for a in c.agents.values())
    assert all(lk["granted_mbps"] == 0 for lk in c.client.links())
    assert sum(n["allocated"]["cpu"] for n in c.client.nodes()) == 2.0


def two_paths(**config) -> Cluster:
    return Cluster(FakeSdn(), topo=TWO_PATHS, links_poll_s=0.1, **config)


def direct_then(c: Cluster) -> list[str]:
    """Start a 50 Mbit/s job (on the direct path) and return its a->b path."""
    c.client.submit(spread_job("j", demand_mbps=50), algorithm="network-aware")
    wait_for(running(c, "j"), what="j running")
    flows = {(f["src_node"], f["dst_node"]): f for f in c.job("j")["attempts"][0]["flows"]}
    return flows[("a", "b")]["path"]


@pytest.mark.parametrize("trouble", ["traffic", "down"])
def test_a_job_is_re_routed_when_its_link_is_taken(trouble):
    c = two_paths()
    try:
        assert direct_then(c) == ["a", "s1", "s2", "b"]
        t0 = time.monotonic()
        if trouble == "traffic":
            c.sdn.carried[("a", "b")] = 50.0  # our flow's entries count 50 Mbit/s ...
            c.sdn.report("s1", "s2", 99.0)  # ... beside 49 Mbit/s of another tenant's
        else:
            c.sdn.report("s1", "s2", 0.0, up=False)
        wait_for(
            lambda: any(f["path"] == ["s1", "s3", "s2"] for f in c.sdn.puts[-1]),
            timeout_s=3,
            what="the a->b flow re-installed around",
        )
        assert time.monotonic() - t0 < 2.0
        att = c.job("j")["attempts"][0]
        path = {(f["src_node"], f["dst_node"]): f["path"] for f in att["flows"]}
        assert path[("a", "b")] == ["a", "s1", "s3", "s2", "b"]
        assert len(att["adjustments"]) == 1 and "s1>s2" in att["adjustments"][0]["links"]
        assert any("re-routed" in e["event"] for e in c.job("j")["events"])
        assert c.job("j")["state"] == "running"
        # noted contended from the reading before the one that saw it, until one after the move
        wait_for(
            lambda: c.job("j")["attempts"][0]["contended"][-1][2] == [],
            timeout_s=3,
            what="the contention noted over",
        )
        (since, seen, flows), (_, over, _after) = c.job("j")["attempts"][0]["contended"]
        assert since < seen <= att["adjustments"][0]["at"] <= over and flows == ["w0>w1"]
    finally:
        c.stop()


def test_without_runtime_adjustment_the_paths_stay():
    c = two_paths(adjust=False)
    try:
        direct_then(c)
        # grant 50 + the spare: the link's grantable share (room left for acknowledgements)
        [both] = {f["rate_mbps"] for f in c.sdn.puts[-1]}
        assert both == pytest.approx(GRANTABLE * 100, abs=0.01)
        c.sdn.carried[("a", "b")] = 50.0
        c.sdn.report("s1", "s2", 99.0)
        time.sleep(0.6)  # several link polls: the paths stay, the spare goes to the tenant
        assert all(f["path"] == ["s1", "s2"] for f in c.sdn.puts[-1] if f["src"] == "a")
        assert not c.job("j")["attempts"][0]["adjustments"]
        rates = {(f["src"], f["dst"]): f["rate_mbps"] for f in c.sdn.puts[-1]}
        assert rates == {("a", "b"): 50.0, ("b", "a"): pytest.approx(GRANTABLE * 100, abs=0.01)}
        # the job stays on the contended link, and the notes say so from then on
        assert [flows for *_, flows in c.job("j")["attempts"][0]["contended"]] == [["w0>w1"]]
    finally:
        c.stop()


def test_a_job_stays_on_a_contended_link_when_the_detour_is_thinner():
    """The way round through s3 has 10 Mbit/s: beside the tenant's 49 Mbit/s the 50 Mbit/s job
    keeps the direct link at its grantable share less the tenant's (100 × 0.91 - 49 = 42)
    instead of crawling around — once: it does not flap at the next polls."""
    doc = {
        "name": "thin",
        "switches": [{"name": s} for s in ("s1", "s2", "s3")],
        "nodes": [{"name": n, "cpu": 1, "mem_mb": 2048} for n in ("a", "b")],
        "links": [
            {"ends": ["a", "s1"], "bw_mbps": 1000},
            {"ends": ["b", "s2"], "bw_mbps": 1000},
            {"ends": ["s1", "s2"], "bw_mbps": 100},
            {"ends": ["s1", "s3"], "bw_mbps": 10},
            {"ends": ["s3", "s2"], "bw_mbps": 10},
        ],
    }
    c = Cluster(FakeSdn(), topo=parse_topology(doc, "thin"), links_poll_s=0.1)
    try:
        assert direct_then(c) == ["a", "s1", "s2", "b"]
        c.sdn.carried[("a", "b")] = 46.0
        c.sdn.report("s1", "s2", 95.0)
        wait_for(
            lambda: c.job("j")["attempts"][0]["adjustments"],
            timeout_s=3,
            what="the job's grant cut",
        )
        time.sleep(0.6)  # several link polls
        att = c.job("j")["attempts"][0]
        [flow] = [f for f in att["flows"] if f["src_node"] == "a"]
        assert flow["path"] == ["a", "s1", "s2", "b"]
        assert flow["rate_mbps"] == pytest.approx(GRANTABLE * 100 - 49, abs=0.01)
        assert len(att["adjustments"]) == 1
        assert all(f["path"] == ["s1", "s2"] for f in c.sdn.puts[-1] if f["src"] == "a")
    finally:
        c.stop()


def test_a_job_waiting_for_bandwidth_starts_once_the_traffic_that_filled_the_link_is_gone():
    """Another tenant's traffic (or a finished job's, still on the counters) fills a's only
    link: the job waits for a path with bandwidth; when the next readings show the link free it
    starts, with no other event to wake the queue."""
    c = two_paths()
    try:
        c.sdn.report("a", "s1", 1000.0)
        wait_for(
            lambda: any(lk["unscheduled_mbps"] > 0 for lk in c.client.links()),
            what="the traffic in the Master's view",
        )
        c.client.submit(spread_job("j", demand_mbps=50), algorithm="network-aware")
        wait_for(
            lambda: "residual bandwidth" in (c.job("j").get("reason") or ""),
            what="j waiting for bandwidth",
        )
        c.sdn.measured = []
        wait_for(running(c, "j"), timeout_s=3, what="j running once the link is free")
    finally:
        c.stop()
