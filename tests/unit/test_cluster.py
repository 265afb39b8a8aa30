"""A topology spread over several hosts, the pure parts: the cluster file (every mistake one line
naming the file and the field), the placement rules and what they cost (capacity crossing hosts,
CPU per host), the budget of a spread run (machines' cores, the underlay, the line naming the
link), the scripts a host runs (tunnels, shaping, MTU, keys), per-host usage and verdicts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from experiments.e2e.budget import (
    TUNNEL_SWITCHES,
    ClusterBudget,
    UnderlayLoad,
    cluster_budget,
    machine_switches,
    mean_switches,
)
from experiments.e2e.fidelity import verdict
from experiments.e2e.stack import usage
from lab import placement as placing
from lab.cluster import TUNNEL_OVERHEAD, Layout, parse_cluster
from lab.fabric import CLEANUP, ClusterEmulation, HostFacts, vni
from lab.inventory import InventoryError
from lab.pki import parties
from protocol.dilation import Dilation
from testbed.hostcost import HostCost
from topologies import load_topology

CAMPUS = load_topology("campus")


@pytest.fixture
def key(tmp_path: Path) -> Path:
    k = tmp_path / "id"
    k.write_text("not read here")
    return k


def doc(key: Path, **top) -> dict:
    return {
        "master": "192.168.50.1",
        "defaults": {"user": "root", "key_file": str(key), "underlay": "eth1"},
        "hosts": [
            {"name": "h1", "address": "192.168.50.11", "underlay_ip": "10.9.0.1"},
            {"name": "h2", "address": "192.168.50.12", "underlay_ip": "10.9.0.2"},
        ],
        **top,
    }


def test_a_cluster_file_with_its_defaults(key):
    inv = parse_cluster(doc(key), Path("c.yaml"))
    assert [h.name for h in inv.hosts] == ["h1", "h2"]
    assert inv.tunnel == "vxlan" and inv.placement == "metis"
    assert (inv.master_port, inv.openflow_port, inv.agent_port) == (7070, 6653, 7071)
    h = inv.host("h2")
    assert (h.user, h.port, h.underlay, h.underlay_ip, h.underlay_mbps) == (
        "root",
        22,
        "eth1",
        "10.9.0.2",
        None,
    )


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d.update(tunnels="vxlan"), "c.yaml: tunnels: unknown field"),
        (lambda d: d.update(tunnel="ipip"), "c.yaml: tunnel: expected one of vxlan, geneve, gre"),
        (lambda d: d.update(placement="random"), "c.yaml: placement: expected one of"),
        (lambda d: d["hosts"][1].update(name="h1"), "c.yaml: hosts[1].name: 'h1' is given twice"),
        (lambda d: d["hosts"][0].pop("underlay_ip"), "c.yaml: hosts[0].underlay_ip: expected"),
        (
            lambda d: d["hosts"][1].update(underlay_ip="10.9.0.1"),
            "c.yaml: hosts[1].underlay_ip: 10.9.0.1 is another host's too",
        ),
        (
            lambda d: d["hosts"][0].update(underlay_ip="192.168.50.11"),
            "c.yaml: hosts[0].underlay_ip: the management address",
        ),
        (
            lambda d: d["hosts"][0].update(underlay_mbps=0),
            "c.yaml: hosts[0].underlay_mbps: expected a positive number",
        ),
        (
            lambda d: d["hosts"][0].update(place=["core1"]),
            "c.yaml: hosts[0].place: only with 'placement: explicit'",
        ),
        (lambda d: d["defaults"].update(name="x"), "c.yaml: defaults.name: not a field"),
        (lambda d: d["hosts"][0].update(key_file="/nonexistent"), "c.yaml: hosts[0].key_file"),
        (lambda d: d["hosts"][1].pop("underlay_ip") and None, "c.yaml: hosts[1].underlay_ip"),
    ],
)
def test_a_mistake_is_one_line_naming_file_and_field(key, change, where):
    d = doc(key)
    change(d)
    with pytest.raises(InventoryError) as e:
        parse_cluster(d, Path("c.yaml"))
    assert str(e.value).startswith(where) and "\n" not in str(e.value)


def test_explicit_placement_is_checked_against_the_topology(key):
    explicit = doc(key, placement="explicit")
    explicit["hosts"][0]["place"] = ["core1", "core2", "agg1", "agg2", "acc1", "acc2", "acc3"]
    explicit["hosts"][1]["place"] = ["agg3", "acc4", "srv1"]
    lay = Layout.make(parse_cluster(explicit, Path("c.yaml")), CAMPUS)
    assert lay.placement["srv1"] == lay.placement["srv3"] == "h2"  # nodes follow their switch
    assert lay.placement["lab1"] == "h1"

    def refused(place: list[list[str]], where: str) -> None:
        d = doc(key, placement="explicit")
        for h, names in zip(d["hosts"], place, strict=True):
            h["place"] = names
        with pytest.raises(InventoryError) as e:
            Layout.make(parse_cluster(d, Path("c.yaml")), CAMPUS)
        assert str(e.value).startswith(where), e.value

    refused([["core1"], ["core2"]], "c.yaml: placement: explicit: no host's 'place' lists")
    refused([["core1", "nowhere"], []], "c.yaml: hosts[0].place: 'nowhere' is neither")
    refused(
        [[s.name for s in CAMPUS.switches], ["lab1"]],
        "c.yaml: hosts[1].place: compute node 'lab1' on h2 but its access switch 'acc1' on h1",
    )
    refused([["core1", "core1"], []], "c.yaml: hosts[0].place: 'core1' is placed twice")


# --- placement ---------------------------------------------------------------------------------
def test_block_and_round_robin_have_mininets_interface():
    switches = [f"s{i}" for i in range(7)]
    hosts = ["a", "b"]
    links = [("a", "s0"), ("b", "s6")] + [(f"s{i}", f"s{i + 1}") for i in range(6)]
    servers = ["x", "y", "z"]
    block = placing.SwitchBinPlacer(servers=servers, hosts=hosts, switches=switches, links=links)
    assert [block.place(s) for s in switches] == ["x", "x", "x", "y", "y", "z", "z"]
    assert (block.place("a"), block.place("b")) == ("x", "z")  # with their switches
    rr = placing.RoundRobinPlacer(servers=servers, hosts=hosts, switches=switches, links=links)
    assert [rr.place(s) for s in switches] == ["x", "y", "z", "x", "y", "z", "x"]
    assert rr.place("b") == rr.place("s6") == "x"


@pytest.mark.parametrize("n", [2, 3])
def test_metis_crosses_less_capacity_than_block_or_round_robin_and_balances_cpu(n):
    servers = [f"h{i}" for i in range(n)]
    cost = {
        rule: placing.crossing_mbps(CAMPUS, placing.place(CAMPUS, servers, rule))
        for rule in ("block", "round-robin", "metis")
    }
    assert cost["metis"] <= min(cost["block"], cost["round-robin"]), cost
    metis = placing.place(CAMPUS, servers, "metis")
    assert placing.place(CAMPUS, servers, "metis") == metis  # the same every time
    cpu = placing.cpu_by_server(CAMPUS, metis)
    assert len(cpu) == n  # every host gets nodes
    for node in CAMPUS.nodes:
        assert metis[node.name] == metis[CAMPUS.access_link(node.name).other(node.name)]


def test_metis_on_a_chain_cuts_its_thinnest_link():
    from topologies import parse_topology

    chain = parse_topology(
        {
            "name": "chain",
            "switches": [{"name": f"s{i}"} for i in range(4)],
            "nodes": [{"name": f"n{i}", "cpu": 1, "mem_mb": 512} for i in range(4)],
            "links": [{"ends": [f"n{i}", f"s{i}"], "bw_mbps": 100} for i in range(4)]
            + [
                {"ends": ["s0", "s1"], "bw_mbps": 1000},
                {"ends": ["s1", "s2"], "bw_mbps": 10},
                {"ends": ["s2", "s3"], "bw_mbps": 1000},
            ],
        },
        "chain",
    )
    p = placing.place(chain, ["a", "b"], "metis")
    assert placing.crossing(chain, p) == {("a", "b"): [chain.links[5]]}
    assert placing.summary(chain, p, ["a", "b"])["crossing_mbps"] == 10
    assert set(placing.place(chain, ["solo"], "metis").values()) == {"solo"}


def test_the_placement_summary_names_the_links_crossing_each_pair():
    p = placing.place(CAMPUS, ["h1", "h2"], "block")
    s = placing.summary(CAMPUS, p, ["h1", "h2"])
    assert s["crossing_links"] == len(s["pairs"]["h1-h2"]["links"]) > 0
    assert s["crossing_mbps"] == s["pairs"]["h1-h2"]["mbps"]
    assert sum(v["nodes"] for v in s["servers"].values()) == len(CAMPUS.nodes)


# --- budget --------------------------------------------------------------------------------------
COST = HostCost("k", 2, "netdev", (5.0, 25.0, 200.0), (0.8, 0.8, 0.8), 0.05, "now")


def test_an_underlay_line_names_the_links_and_the_least_dilation():
    u = UnderlayLoad("h1 ↔ h2", (("core1–agg3", 1000.0), ("core2–agg3", 1000.0)), 500.0)
    assert not u.fits(3.75) and u.fits(4.0) and u.least_k() == 4.0
    line = u.line(1.0)
    assert "core1–agg3 1000 + core2–agg3 1000 = 2000 Mbit/s" in line and "500" in line
    many = UnderlayLoad("a ↔ b", tuple((f"l{i}", 10.0) for i in range(7)), 100.0)
    assert "+ 3 more links" in many.line(1.0)


def cluster_of(placement, machines, underlay, flows=(50.0,)) -> ClusterBudget:
    return cluster_budget(
        CAMPUS,
        placement,
        machines,
        "m0",
        [0.3, 0.3, 0.3],
        [],
        list(flows),
        {n.name for n in CAMPUS.nodes},
        COST,
        underlay,
    )


def test_a_cluster_budget_pools_the_hosts_of_one_machine_and_checks_the_underlay():
    p = placing.place(CAMPUS, ["h1", "h2"], "block")
    crossing = placing.crossing_mbps(CAMPUS, p)
    # two stand-ins on one 2-core machine: one budget for both
    same = cluster_of(p, {"h1": ("m0", 2), "h2": ("m0", 2)}, {"h1": 1e5, "h2": 1e5})
    assert list(same.machines) == ["h1+h2"]
    # two machines: two budgets, the control plane on the first only
    apart = cluster_of(p, {"h1": ("m0", 2), "h2": ("m1", 2)}, {"h1": 1e5, "h2": 1e5})
    assert set(apart.machines) == {"h1", "h2"}
    assert apart.machines["h1"].control > apart.machines["h2"].control
    # an underlay carrying a quarter of the crossing: K = 4 at least, the line names the links
    tight = cluster_of(p, {"h1": ("m0", 2), "h2": ("m1", 2)}, {"h1": crossing / 4, "h2": 1e5})
    assert tight.dilation() is not None and tight.dilation() >= 4.0
    assert not tight.fits(3.0)
    line = tight.line(3.0)
    assert line.startswith("underlay h1 ↔ h2: ") and "–" in line and "\n" not in line
    hopeless = cluster_of(p, {"h1": ("m0", 2), "h2": ("m1", 2)}, {"h1": crossing / 20, "h2": 1e5})
    assert hopeless.dilation() is None


def test_a_machine_counts_the_switches_and_tunnels_on_its_hosts():
    one = dict.fromkeys(placing.place(CAMPUS, ["h1"], "block"), "h1")
    assert machine_switches(CAMPUS, one, {"h1"}) == pytest.approx(mean_switches(CAMPUS))
    two = placing.place(CAMPUS, ["h1", "h2"], "round-robin")
    both = machine_switches(CAMPUS, two, {"h1", "h2"})
    assert both > mean_switches(CAMPUS)  # each crossing costs TUNNEL_SWITCHES on each side
    assert machine_switches(CAMPUS, two, {"h1"}) + machine_switches(
        CAMPUS, two, {"h2"}
    ) == pytest.approx(both)
    assert TUNNEL_SWITCHES > 0


def test_a_cluster_run_is_judged_per_host():
    before = {
        "t": 0.0,
        "cpu_s": {"control": 0.0, "host": 0.0},
        "switch": {"rx_packets": 0, "rx_dropped": 0},
        "switch_wait_s": None,
        "hosts": {
            "h1": {
                "t": 100.0,
                "cpu_s": {"host": 10.0, "switch": 1.0, "nodes": 2.0},
                "switch_wait_s": 0.5,
                "busy": [0.2],
                "switch": {"rx_packets": 1000, "rx_dropped": 0},
            },
            "h2": {
                "t": 100.0,
                "cpu_s": {"host": 10.0, "switch": 1.0, "nodes": 2.0},
                "switch_wait_s": 0.5,
                "busy": [0.2],
                "switch": {"rx_packets": 1000, "rx_dropped": 0},
            },
        },
    }
    after = {
        "t": 10.0,
        "cpu_s": {"control": 1.0, "host": 5.0},
        "switch": {"rx_packets": 0, "rx_dropped": 0},
        "switch_wait_s": None,
        "hosts": {
            "h1": {
                "t": 110.0,
                "cpu_s": {"host": 20.0, "switch": 3.0, "nodes": 6.0},
                "switch_wait_s": 0.6,  # 1 % of the run
                "busy": [0.2] + [0.5] * 10,
                "switch": {"rx_packets": 11000, "rx_dropped": 0},
            },
            "h2": {
                "t": 110.0,
                "cpu_s": {"host": 30.0, "switch": 5.0, "nodes": 6.0},
                "switch_wait_s": 3.5,  # 30 % of the run
                "busy": [0.2] + [0.95] * 5 + [0.5] * 5,
                "switch": {"rx_packets": 11000, "rx_dropped": 100},
            },
        },
    }
    u = usage(before, after)
    h1, h2 = u["hosts"]["h1"], u["hosts"]["h2"]
    assert h1["cpu_cores"]["switch"] == 0.2 and h1["switch_wait_share"] == 0.01
    assert h2["host_busy"]["saturated_share"] == 0.5 and h2["switch_drops"]["rx_dropped"] == 100
    run = {"jobs": [], **u}
    v = verdict(run)
    assert not v["faithful"] and v["hosts"]["h1"]["faithful"] and not v["hosts"]["h2"]["faithful"]
    assert all(r.startswith("h2: ") for r in v["reasons"]) and len(v["reasons"]) == 3


# --- what a host runs ----------------------------------------------------------------------------
def facts(datapath: str = "netdev", mtu: int = 1500) -> HostFacts:
    return HostFacts(
        "20.10", "host", 2, 8000, 0.0, "ovs 3.1", datapath, "boot", "10.9.0.1/24", mtu, 500.0, 1,
        False, False,
    )  # fmt: skip


def emulation(key: Path, dilation: float = 1.0, tunnel: str = "vxlan") -> ClusterEmulation:
    inv = parse_cluster(doc(key, placement="block", tunnel=tunnel), Path("c.yaml"))
    return ClusterEmulation(
        CAMPUS,
        servers=inv,
        prefix="ces1a2b",
        controller=("192.168.50.1", 6653),
        image="ces-worker:x",
        dilation=Dilation(dilation),
        pki=Path("/pki"),
        facts={"h1": facts(), "h2": facts(mtu=9000)},
    )


def test_each_link_between_hosts_is_a_keyed_tunnel_pair_shaped_where_it_leaves(key):
    net = emulation(key, dilation=2.0)
    assert net.mtu == 1500 - TUNNEL_OVERHEAD["vxlan"]
    pairs = placing.crossing(CAMPUS, net.layout.placement)[("h1", "h2")]
    s1, s2 = net.fabric_script("h1"), net.fabric_script("h2")
    for i, lk in enumerate(pairs):
        key_ = f"options:key={vni('ces1a2b', i)}"
        assert s1.count(key_) == s2.count(key_) == 1  # one tunnel port at each end
        assert "options:remote_ip=10.9.0.2" in s1 and "options:remote_ip=10.9.0.1" in s2
        end1 = lk.a if net.layout.placement[lk.a] == "h1" else lk.b
        dev = net.names.interface(end1, lk.port_of(end1))
        rate = f"{lk.bw_mbps / 2 * 1000:.0f}kbit"  # the host's share at K = 2
        assert f"class add dev {dev} parent 1: classid 1:ffff htb rate {rate}" in s1
        assert f"ofport_request={lk.port_of(end1)}" in s1
    assert len({vni("ces1a2b", i) for i in range(len(pairs))}) == len(pairs)
    assert vni("ces1a2b", 0) != vni("ces1a2c", 0)  # two runs between the same hosts
    assert f"mtu {net.mtu} type veth" in s1
    # the userspace datapath: the underlay interface on a bridge of the run holding its address
    assert "add-port ces1a2bu eth1" in s1 and "ip addr add 10.9.0.1/24 dev ces1a2bu" in s1
    assert 'target="ssl:192.168.50.1:6653"' in s1 and "set-ssl $S/switch/key.pem" in s1
    assert "datapath-id=0000000000000001" in s1 + s2
    assert subprocess.run(["bash", "-n"], input=s1, text=True).returncode == 0


def test_a_node_is_its_container_with_its_address_limits_and_shaped_link(key):
    net = emulation(key, dilation=2.0)
    host = net.layout.placement["srv1"]
    script = net.nodes_script(host)
    assert "--name ces1a2b-srv1 --hostname srv1 --network none" in script
    assert "--cgroup-parent /ces1a2b-srv1" in script and "--memory 4096m" in script
    srv1 = CAMPUS.node("srv1")
    assert f"address {srv1.mac} netns" in script and f"addr add {srv1.ip}/16 dev eth0" in script
    # the node's cgroup parent: 1.5 cores at K = 2 over a 200 ms period
    assert "printf %s 150000 > /sys/fs/cgroup/cpu/ces1a2b-srv1/cpu.cfs_quota_us" in script
    assert "printf %s 200000 > /sys/fs/cgroup/cpu/ces1a2b-srv1/cpu.cfs_period_us" in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert f"mtu {net.mtu}" in script


def test_gre_and_a_kernel_datapath(key):
    net = emulation(key, tunnel="gre")
    net.facts = {"h1": facts("system"), "h2": facts("system")}
    net.plans = net._plans()
    s = net.fabric_script("h1")
    assert "type=gre" in s and "datapath_type=system" in s and "ces1a2bu" not in s
    assert net.mtu == 1500 - TUNNEL_OVERHEAD["gre"]


def test_the_cleanup_refuses_anything_but_one_runs_prefix():
    for bad in ("ces", "ces1a2", "ces1a2bc", "x*", "ces1a2g"):
        done = subprocess.run(
            ["bash", "-s", bad], input=CLEANUP, text=True, capture_output=True, timeout=10
        )
        assert done.returncode == 2 and "bad prefix" in done.stderr


def test_certificates_name_each_agents_host(key):
    lay = Layout.make(parse_cluster(doc(key, placement="block"), Path("c.yaml")), CAMPUS)
    names = parties(lay, CAMPUS)
    for n in CAMPUS.nodes:
        host = lay.inv.host(lay.placement[n.name])
        assert names[f"agent-{n.name}"] == [n.name, host.address]
    assert names["control"][0] == "192.168.50.1"
    ports = {lay.agent_port(n.name) for n in CAMPUS.nodes if lay.placement[n.name] == "h1"}
    assert len(ports) == len(lay.nodes_on("h1"))  # one port per agent on a host


# --- METIS against every placement of campus's switches ------------------------------------------
def _front(topo, n: int) -> list[tuple[float, float]]:
    """The placements of `topo`'s switches on `n` hosts no other beats on both the heaviest
    host's weight (`vertex_weights`) and the capacity crossing hosts: [(weight, Mbit/s)]."""
    import itertools

    switches = [s.name for s in topo.switches]
    index = {s: i for i, s in enumerate(switches)}
    vw = [placing.vertex_weights(topo)[s] for s in switches]
    edges = [(index[lk.a], index[lk.b], lk.bw_mbps) for lk in topo.links
             if lk.a in index and lk.b in index]  # fmt: skip
    best: dict[float, float] = {}
    for parts in itertools.product(range(n), repeat=len(switches)):
        if len(set(parts)) < n:
            continue
        load = [0.0] * n
        for i, p in enumerate(parts):
            load[p] += vw[i]
        heaviest = round(max(load), 6)
        cut = sum(w for a, b, w in edges if parts[a] != parts[b])
        best[heaviest] = min(cut, best.get(heaviest, float("inf")))
    front, least = [], float("inf")
    for heaviest in sorted(best):
        if best[heaviest] < least:
            least = best[heaviest]
            front.append((heaviest, least))
    return front


@pytest.mark.parametrize("n", [2, 3])
def test_no_placement_of_campus_beats_metis_on_both_crossing_and_balance(n):
    servers = [f"h{i}" for i in range(n)]
    p = placing.place(CAMPUS, servers, "metis")
    vw = placing.vertex_weights(CAMPUS)
    heaviest = max(sum(w for s, w in vw.items() if p[s] == h) for h in servers)
    cut = placing.crossing_mbps(CAMPUS, p)
    dominating = [
        (w, c) for w, c in _front(CAMPUS, n) if w <= heaviest + 1e-6 and c < cut - 1e-6
    ] + [(w, c) for w, c in _front(CAMPUS, n) if w < heaviest - 1e-6 and c <= cut + 1e-6]
    assert not dominating, (heaviest, cut, dominating)
    # and the least crossing of all is not bought with one host doing everything
    assert heaviest <= sum(vw.values()) / n + max(vw.values())


@pytest.mark.parametrize("spec", ["fattree", "topozoo/Abilene", "gen:internet:100"])
def test_metis_crosses_least_on_the_figures_topologies(spec):
    topo = load_topology(spec)
    for n in (2, 3):
        servers = [f"h{i}" for i in range(n)]
        cost = {
            rule: placing.crossing_mbps(topo, placing.place(topo, servers, rule))
            for rule in ("block", "round-robin", "metis")
        }
        assert cost["metis"] < min(cost["block"], cost["round-robin"]), (spec, n, cost)
        cpu = placing.cpu_by_server(topo, placing.place(topo, servers, "metis"))
        mean = sum(n_.cpu for n_ in topo.nodes) / n
        assert len(cpu) == n and max(cpu.values()) <= 1.1 * mean, (spec, n, cpu)


def test_explicit_placement_by_zone_as_the_figure_writes_it():
    from experiments.cluster_crossing import EXPLICIT

    for (name, n), hosts in EXPLICIT.items():
        topo = load_topology(name)
        given = {sw: h for h, sws in hosts.items() for sw in sws}
        p = placing.place(topo, [f"h{i}" for i in range(n)], "explicit", given)
        assert {p[s.name] for s in topo.switches} == set(hosts)
        assert p["srv1"] == given["acc4"]  # a node follows its access switch
    with pytest.raises(placing.PlacementError, match="no server for switch"):
        placing.place(CAMPUS, ["h0"], "explicit", {"core1": "h0"})


# --- a host checked before the run ----------------------------------------------------------------
class ScriptedHost:
    """A `lab.ssh.Remote` whose commands answer as a host with `probe` fields would: the decisions
    `lab.fabric.probe` takes on what a host says (the SSH path itself: tests/integration)."""

    def __init__(self, host, **fields: str):
        self.host = host
        self.fields = {
            "docker": "20.10.24",
            "ovs": "ovs-vsctl (Open vSwitch) 3.1.0",
            "ovs_up": "yes",
            "iface_types": "[erspan, geneve, gre, internal, vxlan]",
            "kmod": "0",
            "exists": "yes",
            "addrs": f"{host.underlay_ip}/24 ",
            "mgmt_dev": "eth0",
            "in_bridge": "",
            "mtu": "1500",
            "speed": "10000",
            "boot_id": "b00t",
            "cgroup2": "",
            "driver": "cgroupfs",
            "netem": "",
            "missing": "",
            **fields,
        }

    def ok(self, command: str, what: str, timeout_s: float = 60.0) -> str:
        import time as _time

        if "ovs_up=" in command:
            return "".join(f"{k}={v}\n" for k, v in self.fields.items())
        if command.startswith("date"):
            return f"{_time.time():.6f}\n"
        if "nproc" in command:
            return "cpus=2\nquota=max\navail_kb=8000000\nmem_max=max\n"
        if "mountinfo" in command:
            return "host\n"
        raise AssertionError(command)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"exists": ""}, "underlay interface eth1 does not exist"),
        ({"addrs": "10.9.9.9/24 "}, "underlay interface eth1 has 10.9.9.9/24, not 10.9.0.1"),
        ({"in_bridge": "ces1a2bu"}, "is a port of Open vSwitch bridge ces1a2bu (a killed run's?"),
        ({"mgmt_dev": "eth1"}, "also carries the management address"),
        ({"ovs_up": ""}, "Open vSwitch does not answer"),
        ({"docker": ""}, "no Docker engine answers"),
        ({"iface_types": "[internal, patch]"}, "this Open vSwitch has no vxlan ports"),
        ({"missing": "ethtool "}, "missing tools: ethtool"),
    ],
)
def test_a_host_that_cannot_take_its_part_is_one_line_naming_it(key, fields, problem):
    from lab.fabric import probe
    from lab.ssh import HostError

    inv = parse_cluster(doc(key), Path("c.yaml"))
    with pytest.raises(HostError) as e:
        probe(ScriptedHost(inv.host("h1"), **fields), inv.host("h1"), "vxlan", 512)  # type: ignore[arg-type]
    msg = str(e.value)
    assert msg.startswith("h1 (root@192.168.50.11:22): ") and problem in msg and "\n" not in msg


def test_a_host_that_can_take_its_part(key):
    from lab.fabric import probe

    inv = parse_cluster(doc(key), Path("c.yaml"))
    f = probe(ScriptedHost(inv.host("h1")), inv.host("h1"), "vxlan", 512)  # type: ignore[arg-type]
    assert (f.datapath, f.underlay_cidr, f.underlay_mtu, f.underlay_mbps) == (
        "netdev", "10.9.0.1/24", 1500, 10000.0,
    )  # fmt: skip
    # no speed from the kernel (a veth): the file must say it
    with pytest.raises(Exception, match="reports no speed: give the host's underlay_mbps"):
        probe(ScriptedHost(inv.host("h1"), speed="-1"), inv.host("h1"), "vxlan", 512)  # type: ignore[arg-type]
    # too little memory for its nodes
    with pytest.raises(Exception, match="too small for its nodes"):
        probe(ScriptedHost(inv.host("h1")), inv.host("h1"), "vxlan", 10**6)  # type: ignore[arg-type]


def test_run_refuses_an_unreachable_host_in_one_line_exit_2(key, tmp_path, capsys):
    """The real SSH path to a port nobody listens on: run.py --cluster exits 2 before building
    anything, one line per host."""
    from experiments import run
    from testbed.standin import new_key

    new_key(key)  # a real key: the connection is what fails
    d = doc(key)
    for h in d["hosts"]:
        h.update(address="127.0.0.1" if h["name"] == "h1" else "127.0.0.2", port=1)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(__import__("yaml").safe_dump(d))
    token = tmp_path / "token"
    token.write_text("x" * 32 + "\n")
    token.chmod(0o600)
    code = run.main(
        ["--quick", "--cluster", str(cluster), "--token-file", str(token), "--insecure",
         "--out", str(tmp_path / "out")]
    )  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 2 and all("unreachable over SSH" in line for line in err), err
    assert err[0].startswith("error: h1 (root@127.0.0.1:1): ")
    assert not (tmp_path / "out" / "results.json").exists()


def test_the_host_sampler_sums_nodes_cpu_beyond_32_bits(tmp_path):
    """A node's cgroup past 2^31 ns (2.1 s of CPU) counts in full: Debian's awk (mawk) caps
    printf %d there, and every host's nodes read 0 cores in a run before this was seen."""
    from lab.fabric import sampler_script

    for name, ns in (("ces1a2b-lab1", 3_000_000_000_000), ("ces1a2b_x.slice", 5)):
        (tmp_path / "cpuacct" / name).mkdir(parents=True)
        (tmp_path / "cpuacct" / name / "cpuacct.usage").write_text(f"{ns}\n")
    (tmp_path / "ces1a2b-v2").mkdir()  # cgroup v2: cpu.stat in microseconds
    (tmp_path / "ces1a2b-v2" / "cpu.stat").write_text("usage_usec 4000000000\nuser_usec 1\n")
    (tmp_path / "cpuacct" / "ces1a2c-other").mkdir()  # another run's: not counted
    (tmp_path / "cpuacct" / "ces1a2c-other" / "cpuacct.usage").write_text("7\n")
    proc = subprocess.Popen(
        ["bash", "-c", sampler_script("ces1a2b", str(tmp_path))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    head, _, _, nodes = line.split("|")
    assert int(nodes) == 3_000_000_000_000 + 5 + 4_000_000_000_000
    assert float(head.split()[0]) > 0 and len(head.split()) > 4


def test_the_host_sampler_judges_busy_windows_without_niced_processes():
    """A niced build beside a run yields its cores on demand: the host's busy windows leave its
    time out (as one host's verdict does), the host's cores used count it."""
    from lab.fabric import HostSampler

    tick = os.sysconf("SC_CLK_TCK")
    sampler = HostSampler(None, "ces1a2b", cores=2)  # type: ignore[arg-type]
    # cpu user nice system idle iowait irq softirq steal guest guest_nice; 1 s apart
    sampler.parse(
        [
            f"100.0 cpu {10 * tick} 0 {tick} 0 0 0 0 0 0 0 | 0 | 0 | 0\n",
            "garbage\n",
            f"101.0 cpu {int(10.5 * tick)} {int(1.5 * tick)} {tick} 0 0 0 0 0 0 0 | 0 | 0 | 0\n",
        ]
    )
    assert sampler.busy == [pytest.approx(0.25)]  # 0.5 of 2 cores; the niced 1.5 left out
    assert sampler.snapshot()["cpu_s"]["host"] == pytest.approx(13.0)  # 10.5 + 1.5 + 1
