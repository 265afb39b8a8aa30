"""The lab inventory: what it accepts, its defaults, and one clear line for each mistake."""

from __future__ import annotations

import pytest
import yaml

from lab.inventory import (
    DEFAULT_AGENT_PORT,
    DEFAULT_MASTER_PORT,
    DEFAULT_OPENFLOW_PORT,
    InventoryError,
    load_inventory,
    parse_inventory,
)
from topologies import load_topology

STAR = load_topology("star")  # e1..e6 on one hub


@pytest.fixture
def key(tmp_path):
    path = tmp_path / "id"
    path.write_text("not checked here: only that the file exists\n")
    return path


def doc(key, **changes):
    hosts = [{"node": f"e{i}", "address": f"192.168.50.{10 + i}"} for i in range(1, 7)]
    return {
        "master": "192.168.50.1",
        "defaults": {"user": "ces", "key_file": str(key), "iface": "eth1"},
        "hosts": hosts,
        **changes,
    }


def test_a_good_inventory_with_defaults(key):
    inv = parse_inventory(doc(key), STAR)
    assert inv.master == "192.168.50.1" and inv.agent_port == DEFAULT_AGENT_PORT
    assert (inv.master_port, inv.openflow_port) == (DEFAULT_MASTER_PORT, DEFAULT_OPENFLOW_PORT)
    h = inv.host("e3")
    assert (h.address, h.port, h.user, h.iface, h.ip) == (
        "192.168.50.13",
        22,
        "ces",
        "eth1",
        STAR.node("e3").ip,
    )
    assert h.label() == "e3 (ces@192.168.50.13:22)"


def test_a_host_overrides_the_defaults(key):
    d = doc(key)
    d["hosts"][0] |= {"port": 2222, "iface": "enp3s0", "ip": STAR.node("e1").ip}
    h = parse_inventory(d, STAR).host("e1")
    assert (h.port, h.iface) == (2222, "enp3s0")


def mutate(key, fn):
    d = doc(key)
    fn(d)
    return d


CASES = {
    "top is a list": (lambda d: None, "(top): expected a mapping"),
    "unknown top field": (lambda d: d.update(agents=1), "agents: unknown field"),
    "master not an address": (lambda d: d.update(master="ctl"), "master: expected an IP address"),
    "master missing": (lambda d: d.pop("master"), "master: expected an IP address"),
    "bad agent port": (lambda d: d.update(agent_port=70000), "agent_port: expected a port"),
    "bad master port": (lambda d: d.update(master_port=0), "master_port: expected a port"),
    "bad openflow port": (lambda d: d.update(openflow_port="of"), "openflow_port: expected a port"),
    "node in defaults": (
        lambda d: d["defaults"].update(node="e1"),
        "defaults.node: not a field every host can share",
    ),
    "no hosts": (lambda d: d.update(hosts=[]), "hosts: expected a list of hosts"),
    "unknown host field": (lambda d: d["hosts"][2].update(cpu=4), "hosts[2].cpu: unknown field"),
    "missing address": (lambda d: d["hosts"][1].pop("address"), "hosts[1].address: missing"),
    "unknown node": (
        lambda d: d["hosts"][0].update(node="hub"),
        "hosts[0].node: 'hub' is not a compute node of topology 'star'",
    ),
    "duplicate node": (
        lambda d: d["hosts"][1].update(node="e1"),
        "hosts[1].node: 'e1' is given twice",
    ),
    "duplicate address": (
        lambda d: d["hosts"][1].update(address="192.168.50.11"),
        "hosts[1].address: 192.168.50.11:22 is another host's too",
    ),
    "ip disagrees": (
        lambda d: d["hosts"][0].update(ip="10.9.9.9"),
        "hosts[0].ip: 10.9.9.9 differs from node e1's address in the topology",
    ),
    "bad port": (lambda d: d["hosts"][0].update(port="ssh"), "hosts[0].port: expected a port"),
    "node without a host": (lambda d: d["hosts"].pop(), "no host for compute node(s) e6"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_mistake_is_one_line_naming_the_field(key, tmp_path, case):
    change, expected = CASES[case]
    d = [] if case == "top is a list" else mutate(key, change)
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(d))
    with pytest.raises(InventoryError) as e:
        load_inventory(path, STAR)
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value)
    assert "\n" not in str(e.value)


def test_a_missing_key_file_and_unreadable_files(key, tmp_path):
    d = doc(key)
    d["hosts"][3]["key_file"] = str(tmp_path / "absent")
    with pytest.raises(InventoryError, match=r"hosts\[3\].key_file: .*absent is not a readable"):
        parse_inventory(d, STAR)
    with pytest.raises(InventoryError, match="cannot read it"):
        load_inventory(tmp_path / "none.yaml", STAR)
    (tmp_path / "bad.yaml").write_text("hosts: [\n")
    with pytest.raises(InventoryError, match="not valid YAML"):
        load_inventory(tmp_path / "bad.yaml", STAR)
