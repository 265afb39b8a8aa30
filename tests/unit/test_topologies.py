"""The topology loader: bundled topologies, our YAML format's validation, graph formats."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest
import yaml

from topologies import GraphDefaults, TopologyError, available_topologies, load_topology

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, doc: dict | str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def small() -> dict:
    return {
        "name": "small",
        "switches": [{"name": "s1"}, {"name": "s2"}],
        "nodes": [
            {"name": "h1", "cpu": 1, "mem_mb": 512},
            {"name": "h2", "cpu": 0.5, "mem_mb": 256},
        ],
        "links": [
            {"ends": ["s1", "s2"], "bw_mbps": 100},
            {"ends": ["h1", "s1"], "bw_mbps": 50, "delay_ms": 1},
            {"ends": ["h2", "s2"], "bw_mbps": 50},
        ],
    }


def test_bundled_topologies_load():
    assert set(available_topologies()) >= {"campus", "star", "ring", "fattree"}
    for name in available_topologies():
        topo = load_topology(name)
        assert nx.is_connected(topo.graph())


def test_campus_meets_its_specification():
    topo = load_topology("campus")
    assert len(topo.nodes) >= 8
    assert len({(n.cpu, n.mem_mb) for n in topo.nodes}) > 1
    assert len(topo.switches) >= 6
    assert {s.tier for s in topo.switches} >= {"core", "aggregation", "access"}
    assert all(10 <= lk.bw_mbps <= 1000 for lk in topo.links)
    # Redundant paths: the switch fabric survives the loss of any single switch-to-switch link.
    fabric = topo.graph().subgraph(s.name for s in topo.switches)
    assert nx.edge_connectivity(fabric) >= 2


def test_ports_and_addresses_are_fixed_and_unique():
    topo = load_topology("campus")
    for s in topo.switches:
        ports = [lk.port_of(s.name) for lk in topo.links_of(s.name)]
        assert sorted(ports) == list(range(1, len(ports) + 1))
    assert len({n.ip for n in topo.nodes}) == len(topo.nodes)
    assert len({n.mac for n in topo.nodes}) == len(topo.nodes)
    assert len({s.dpid for s in topo.switches}) == len(topo.switches)
    assert load_topology("campus").links == topo.links  # deterministic


def test_explicit_ports_and_dpids_for_a_physical_switch(tmp_path):
    doc = small()
    doc["switches"][0]["dpid"] = "00:00:00:00:00:00:0a:01"
    doc["switches"][1]["dpid"] = "0x20"
    doc["links"][0]["ports"] = [48, 47]
    doc["links"][1]["ports"] = [None, 1]
    topo = load_topology(write(tmp_path, doc))
    assert topo.switch("s1").dpid == 0xA01 and topo.switch("s2").dpid == 0x20
    assert (topo.links[0].port_a, topo.links[0].port_b) == (48, 47)
    assert topo.links[1].port_b == 1 and topo.links[2].port_b == 1
    assert topo.access_link("h1").delay_ms == 1.0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.pop("links"), "'links' is missing"),
        (lambda d: d["nodes"][0].pop("cpu"), "nodes[0] 'h1': 'cpu' is missing"),
        (lambda d: d["nodes"][0].update(cpu="two"), "'cpu' must be a number, got 'two'"),
        (lambda d: d["nodes"][1].update(mem_mb=-5), "nodes[1] 'h2': 'mem_mb' must be ≥"),
        (lambda d: d["nodes"][1].update(name="h1"), "name 'h1' is used twice"),
        (lambda d: d["nodes"][1].update(name="bad name"), "'name' must be a letter"),
        (lambda d: d["nodes"][0].update(cores=2), "unknown field 'cores'"),
        (lambda d: d["links"][0].update(ends=["s1", "s9"]), "links[0]: unknown endpoint 's9'"),
        (lambda d: d["links"][0].update(ends=["s1"]), "'ends' must be a list of two names"),
        (lambda d: d["links"][0].update(bw_mbps=0), "links[0]: 'bw_mbps' must be ≥"),
        (lambda d: d["links"][0].pop("bw_mbps"), "links[0]: 'bw_mbps' is missing"),
        (
            lambda d: (
                d["links"][0].update(ports=[1, 1], ends=["s1", "s2"])
                or d["links"][1].update(ports=[None, 1])
            ),
            "port 1 of switch 's1' is already used",
        ),
        (lambda d: d["links"].pop(0), "not connected"),
        (lambda d: d["links"].append({"ends": ["h1", "s2"], "bw_mbps": 1}), "exactly one link"),
        (lambda d: d["switches"][1].update(dpid=1), "dpid 1 is used by more than one switch"),
        (lambda d: d["switches"][1].update(dpid="zz"), "'dpid' must be an integer"),
    ],
)
def test_malformed_yaml_is_rejected_with_file_element_and_problem(tmp_path, mutate, message):
    doc = small()
    mutate(doc)
    path = write(tmp_path, doc)
    with pytest.raises(TopologyError) as err:
        load_topology(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(write(tmp_path, "nodes: [\n"))
    with pytest.raises(TopologyError, match="expected a mapping"):
        load_topology(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(TopologyError, match="unknown topology format"):
        load_topology(write(tmp_path, "x", "t.txt"))
    with pytest.raises(TopologyError, match="no such topology"):
        load_topology("no-such-topology")


def test_link_defaults_apply(tmp_path):
    doc = small()
    doc["defaults"] = {"bw_mbps": 77, "delay_ms": 3}
    del doc["links"][2]["bw_mbps"]
    topo = load_topology(write(tmp_path, doc))
    assert (topo.links[2].bw_mbps, topo.links[2].delay_ms) == (77, 3)
    assert topo.links[1].delay_ms == 1  # an explicit value wins


def test_gml_and_graphml_become_switches_with_edge_sites(tmp_path):
    g = nx.Graph()
    g.add_node("a", Longitude=0.0, Latitude=0.0)
    g.add_node("b", Longitude=1.0, Latitude=0.0)  # ~111 km east
    g.add_node("c")
    g.add_edge("a", "b", LinkSpeedRaw=1e8)
    g.add_edge("b", "c")
    nx.write_gml(g, tmp_path / "net.gml")
    nx.write_graphml(g, tmp_path / "net.graphml")
    for path in (tmp_path / "net.gml", tmp_path / "net.graphml"):
        topo = load_topology(path, GraphDefaults(node_cpu=2, backbone_bw_mbps=300))
        assert len(topo.switches) == len(topo.nodes) == 3
        assert all(n.cpu == 2 for n in topo.nodes)
        ab = next(lk for lk in topo.links if {lk.a, lk.b} == {"s0", "s1"})
        assert ab.bw_mbps == pytest.approx(100)  # from LinkSpeedRaw (bit/s)
        assert ab.delay_ms == pytest.approx(111.2 / 200, rel=0.01)  # distance / light in fibre
        bc = next(lk for lk in topo.links if {lk.a, lk.b} == {"s1", "s2"})
        assert bc.bw_mbps == 300 and bc.delay_ms == 0.0
        assert [n.label for n in topo.nodes] == ["a", "b", "c"]


def test_broken_graph_file(tmp_path):
    path = write(tmp_path, "graph [ node [ id 0 ", "bad.gml")
    with pytest.raises(TopologyError, match=r"bad.gml: cannot read GML"):
        load_topology(path)


def test_topohub_and_generated_topologies():
    abilene = load_topology("topozoo/Abilene")
    assert len(abilene.nodes) == 11 and abilene.source == "topohub:topozoo/Abilene"
    assert any(lk.delay_ms > 1 for lk in abilene.links)  # continental distances
    big = load_topology("gen:internet:200:3")
    assert len(big.nodes) == 200 and nx.is_connected(big.graph())
    with pytest.raises(TopologyError, match="not a topohub topology"):
        load_topology("topozoo/Atlantis")
    with pytest.raises(TopologyError, match="gen:internet:N"):
        load_topology("gen:mesh:5")


def test_cli_exits_2_with_a_clear_message_and_no_traceback(tmp_path):
    doc = small()
    doc["links"][0]["ends"] = ["s1", "nowhere"]
    path = write(tmp_path, doc)
    run = subprocess.run(
        [sys.executable, "-m", "topologies", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2
    assert f"{path}: links[0]: unknown endpoint 'nowhere'" in run.stderr
    assert "Traceback" not in run.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "topologies", "check", "campus"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert ok.returncode == 0 and "10 compute nodes" in ok.stdout
