"""The inventory of a lab: which real host is which compute node of the topology, and how to
reach it. YAML, checked like topology files: every problem is one `InventoryError` naming the
file, the field and what was expected.

    master: 192.168.50.1            # the Master's address on the management network (required)
    known_hosts: ~/.ssh/known_hosts # SSH host keys to trust (default: this one)
    agent_port: 7071                # where each agent listens on its host's address (default)
    master_port: 7070               # where `run.py --hosts` runs the Master (default)
    openflow_port: 6653             # where it runs the SDN app for the switches (default)
    defaults: {user: ces, port: 22, key_file: ~/.ssh/id_ed25519, iface: eth1}
    hosts:
      - {node: lab1, address: 192.168.50.11}
      - {node: lab2, address: 192.168.50.12, iface: enp3s0, ip: 10.0.0.2}

Per host: `node` (a compute node of the topology), `address` (SSH and the agent's command
channel), `port`, `user`, `key_file`, `iface` (the data interface) and `ip` (its address: the
topology's, which the SDN app's flows match on, unless given — and then it must agree). Every
compute node of the topology needs a host: the Master schedules on all of them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from topologies import Topology

HOST_FIELDS = ("node", "address", "port", "user", "key_file", "iface", "ip")
SHARED_FIELDS = tuple(f for f in HOST_FIELDS if f not in ("node", "address", "ip"))  # defaults
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_AGENT_PORT = 7071
DEFAULT_MASTER_PORT = 7070
DEFAULT_OPENFLOW_PORT = 6653
DEFAULT_PORTS = {
    "agent_port": DEFAULT_AGENT_PORT,
    "master_port": DEFAULT_MASTER_PORT,
    "openflow_port": DEFAULT_OPENFLOW_PORT,
}
TOP_FIELDS = (
    "master",
    "known_hosts",
    "agent_port",
    "master_port",
    "openflow_port",
    "defaults",
    "hosts",
)


class InventoryError(ValueError):
    """An inventory that cannot be used; the message says where and why."""


@dataclass(frozen=True)
class Host:
    node: str
    address: str
    port: int
    user: str
    key_file: Path
    iface: str
    ip: str

    def label(self) -> str:
        return f"{self.node} ({self.user}@{self.address}:{self.port})"


@dataclass(frozen=True)
class Inventory:
    path: Path
    master: str
    known_hosts: Path
    agent_port: int
    master_port: int
    openflow_port: int
    hosts: tuple[Host, ...]

    def host(self, node: str) -> Host:
        return next(h for h in self.hosts if h.node == node)

    def agent_addresses(self) -> dict[str, str]:
        """{compute node: the address its agent listens on} (`lab.pki` names it there)."""
        return {h.node: h.address for h in self.hosts}


def load_inventory(path: str | Path, topo: Topology) -> Inventory:
    path = Path(path)
    return parse_inventory(read_document(path), topo, path)


def parse_inventory(doc: Any, topo: Topology, path: Path = Path("<inventory>")) -> Inventory:
    fail = partial(field_error, path)
    master, ports, known_hosts = parse_top(doc, fail, TOP_FIELDS)
    compute = {n.name: n for n in topo.nodes}
    hosts: list[Host] = []
    for where, h in host_entries(
        doc, fail, HOST_FIELDS, SHARED_FIELDS, ("node", "address", "user", "key_file", "iface")
    ):
        node = h["node"]
        if node not in compute:
            raise fail(
                f"{where}.node",
                f"'{node}' is not a compute node of topology "
                f"'{topo.name}' ({', '.join(sorted(compute))})",
            )
        if any(o.node == node for o in hosts):
            raise fail(f"{where}.node", f"'{node}' is given twice")
        ip = h.get("ip", compute[node].ip)
        _address(ip, lambda m, where=where: fail(f"{where}.ip", m))
        if ip != compute[node].ip:
            raise fail(
                f"{where}.ip",
                f"{ip} differs from node {node}'s address in the topology "
                f"({compute[node].ip}), which the SDN app's flows match",
            )
        host = Host(
            node,
            h["address"],
            _port(h["port"], lambda m, where=where: fail(f"{where}.port", m)),
            h["user"],
            Path(h["key_file"]).expanduser(),
            h["iface"],
            ip,
        )
        check_address_free(host, hosts, where, fail)
        check_key_file(host, where, fail)
        hosts.append(host)
    missing = sorted(set(compute) - {h.node for h in hosts})
    if missing:
        raise fail(
            "hosts", f"no host for compute node(s) {', '.join(missing)} of topology '{topo.name}'"
        )
    return Inventory(
        path,
        master,
        known_hosts,
        ports["agent_port"],
        ports["master_port"],
        ports["openflow_port"],
        tuple(hosts),
    )


# --- what a lab's inventory and a cluster file (`lab.cluster`) check alike ------------------------
Fail = Callable[[str, str], InventoryError]  # (field, what is wrong) -> the error to raise


def field_error(path: Path, field: str, message: str) -> InventoryError:
    return InventoryError(f"{path}: {field}: {message}")


def read_document(path: Path) -> Any:
    """The YAML document of an inventory file; an InventoryError when it cannot be read."""
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise InventoryError(f"{path}: cannot read it ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise InventoryError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def parse_top(
    doc: Any, fail: Fail, top_fields: tuple[str, ...]
) -> tuple[str, dict[str, int], Path]:
    """(the master's address, {port field: its number or its default}, known_hosts) of a
    document whose top fields are only `top_fields`; the port fields checked in their order."""
    if not isinstance(doc, dict):
        raise fail("(top)", "expected a mapping with 'master' and 'hosts'")
    unknown = sorted(map(str, set(doc) - set(top_fields)))
    if unknown:
        raise fail(unknown[0], f"unknown field (allowed: {', '.join(top_fields)})")
    master = _address(doc.get("master"), lambda m: fail("master", m))
    numbers = {
        key: _port(doc.get(key, DEFAULT_PORTS[key]), lambda m, key=key: fail(key, m))
        for key in top_fields
        if key in DEFAULT_PORTS
    }
    known = doc.get("known_hosts", DEFAULT_KNOWN_HOSTS)
    if not isinstance(known, str) or not known:
        raise fail("known_hosts", "expected a file path")
    return master, numbers, Path(known).expanduser()


def host_entries(
    doc: dict,
    fail: Fail,
    host_fields: tuple[str, ...],
    shared_fields: tuple[str, ...],
    required: tuple[str, ...],
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each host of the document as ("hosts[i]", its fields over the `defaults` and port 22):
    the defaults only of `shared_fields`, a host only of `host_fields`, its `required` ones
    non-empty strings. One at a time, so that the caller's checks of a host come before the
    next host's: the first problem of the file is the one reported."""
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise fail("defaults", "expected a mapping of host fields")
    for key in defaults:
        if key not in shared_fields:
            raise fail(
                f"defaults.{key}",
                f"not a field every host can share (allowed: {', '.join(shared_fields)})",
            )
    entries = doc.get("hosts")
    if not isinstance(entries, list) or not entries:
        raise fail("hosts", "expected a list of hosts")
    for i, entry in enumerate(entries):
        where = f"hosts[{i}]"
        if not isinstance(entry, dict):
            raise fail(where, "expected a mapping")
        for key in entry:
            if key not in host_fields:
                raise fail(f"{where}.{key}", f"unknown field (allowed: {', '.join(host_fields)})")
        h = {"port": 22, **defaults, **entry}
        for key in required:
            if not isinstance(h.get(key), str) or not h[key]:
                raise fail(f"{where}.{key}", "missing (a non-empty string)")
        yield where, h


def check_address_free(host: Any, hosts: list, where: str, fail: Fail) -> None:
    """`host` (its `address` and `port`) is reached where none of `hosts` is."""
    if any((o.address, o.port) == (host.address, host.port) for o in hosts):
        raise fail(f"{where}.address", f"{host.address}:{host.port} is another host's too")


def check_key_file(host: Any, where: str, fail: Fail) -> None:
    if not host.key_file.is_file():
        raise fail(f"{where}.key_file", f"{host.key_file} is not a readable file")


def _address(value: Any, fail) -> str:
    if not isinstance(value, str):
        raise fail(f"expected an IP address, got {value!r}")
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise fail(f"expected an IP address, got {value!r}") from None


def _port(value: Any, fail) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise fail(f"expected a port number 1-65535, got {value!r}")
    return value
