"""OpenFlow over TLS for real: the SDN app (`python -m sdn_app --tls`) listening on ssl with the
control machine's identity (os-ken's ctl_privkey / ctl_cert / ca_certs), an Open vSwitch bridge
(the physical-switch stand-in, `testbed.netns`) connecting with `ssl:IP:PORT` and a switch's
identity (`ovs-vsctl set-ssl`). A switch showing a certificate of another CA is refused; the
lab's switch connects, is synchronised, and its hosts ping over the entries it was sent."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from test_sdn_app import ControllerProcess, wait_for

from lab import pki
from protocol.tls import CONTROL, load_tls
from sdn_app.client import SdnClient
from testbed.netns import NetnsNetwork, sh
from topologies import load_topology

pytestmark = pytest.mark.integration

TOPOLOGY = """
name: oftls
switches:
  - {name: s1, dpid: 0x7101}
nodes:
  - {name: h1, cpu: 1, mem_mb: 256}
  - {name: h2, cpu: 1, mem_mb: 256}
links:
  - {ends: [h1, s1], bw_mbps: 100}
  - {ends: [h2, s1], bw_mbps: 100}
"""


class TlsController(ControllerProcess):
    def __init__(self, topo_file: Path, workdir: Path, identity: Path):
        super().__init__(topo_file, workdir)
        self.identity = identity
        self.client = SdnClient(
            f"https://127.0.0.1:{self.rest_port}", timeout_s=20, tls=load_tls(identity)
        )

    def command(self) -> list[str]:
        return [*super().command(), "--tls", str(self.identity)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, testbed_host):
    d = tmp_path_factory.mktemp("oftls")
    (d / "oftls.yaml").write_text(TOPOLOGY)
    ca_key, ca = pki.make_ca()
    pki.write_identity(d / CONTROL, *pki.issue(ca_key, ca, CONTROL, ["127.0.0.1"]), ca)
    pki.write_identity(d / "switch-s1", *pki.issue(ca_key, ca, "switch-s1", ["s1"]), ca)
    other_key, other = pki.make_ca("another CA")
    # a switch of someone else's: its own CA's certificate, though it trusts ours
    pki.write_identity(d / "foreign", *pki.issue(other_key, other, "switch-s1", ["s1"]), ca)
    ctl = TlsController(d / "oftls.yaml", d, d / CONTROL)
    ctl.start()
    yield {"dir": d, "topo": load_topology(d / "oftls.yaml"), "ctl": ctl}
    ctl.stop()


def controller_row(bridge: str) -> dict[str, str]:
    """The bridge's Controller row: target, is_connected, status (as ovs-vsctl prints them)."""
    row = sh("ovs-vsctl", "get", "Bridge", bridge, "controller").strip("[]\n ")
    return {
        column: sh("ovs-vsctl", "get", "Controller", row, column).strip()
        for column in ("target", "is_connected", "status")
    }


def test_a_switch_with_a_foreign_certificate_is_refused(setup):
    """Its handshakes are reset by the controller, attempt after attempt; it never connects."""
    ctl, d = setup["ctl"], setup["dir"]
    with NetnsNetwork(
        setup["topo"],
        "ot" + uuid.uuid4().hex[:4],
        ("127.0.0.1", ctl.of_port),
        tls=str(d / "foreign"),
    ) as net:
        row = wait_for(
            lambda: (r := controller_row(net.bridges["s1"]))["status"].count("last_error") and r,
            20,
            "a refused connection",
        )
        time.sleep(3)  # more attempts (max_backoff 1 s): none gets through
        again = controller_row(net.bridges["s1"])
        health = ctl.client.health()
    assert row["target"] == f'"ssl:127.0.0.1:{ctl.of_port}"'
    assert again["is_connected"] == "false" and "last_error" in again["status"], again
    assert health["connected"] == 0 and not health["ready"]
    print(f"foreign switch: {again['status']}")


def test_the_labs_switch_connects_over_ssl(setup):
    ctl, d = setup["ctl"], setup["dir"]
    before = sh("ovs-vsctl", "get-ssl")
    with NetnsNetwork(
        setup["topo"],
        "ot" + uuid.uuid4().hex[:4],
        ("127.0.0.1", ctl.of_port),
        tls=str(d / "switch-s1"),
    ) as net:
        health = ctl.client.wait_ready(30)
        row = wait_for(  # ovs-vswitchd writes the row's status a few seconds late
            lambda: (r := controller_row(net.bridges["s1"]))["is_connected"] == "true" and r,
            20,
            "the bridge's Controller row to say connected",
        )
        assert row["target"] == f'"ssl:127.0.0.1:{ctl.of_port}"'
        assert health["connected"] == 1
        assert str(d / "switch-s1" / "key.pem") in sh("ovs-vsctl", "get-ssl")
        assert net.ping("h1", "h2", count=3)  # the entries it was sent over TLS forward
    assert sh("ovs-vsctl", "get-ssl") == before  # the machine's SSL configuration put back
