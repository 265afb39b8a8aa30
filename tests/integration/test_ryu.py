"""The SDN app under Ryu 4.34's own `ryu-manager` (the environment `make ryu` builds, with its
eventlet shim), against the OVS stand-in of test_sdn_app: default forwarding, then a job's path
and meter."""

from __future__ import annotations

import os
import uuid

import pytest
from test_sdn_app import DETOUR, REPO, TOPOLOGY, ControllerProcess, job_entries

from sdn_app.client import FlowRequest
from testbed.netns import NetnsNetwork
from topologies import load_topology

pytestmark = pytest.mark.integration
RYU_MANAGER = REPO / ".venv-ryu" / "bin" / "ryu-manager"


class RyuController(ControllerProcess):
    def command(self) -> list[str]:
        conf = self.state.with_name("ces.conf")
        conf.write_text(
            f"[ces_sdn]\ntopo = {self.topo_file}\nrest = 127.0.0.1:{self.rest_port}\n"
            f"stats_interval = 0.5\nstate = {self.state}\n"
        )
        return [
            str(RYU_MANAGER),
            "--config-file",
            str(conf),
            "--ofp-listen-host",
            "127.0.0.1",
            "--ofp-tcp-listen-port",
            str(self.of_port),
            "sdn_app.app",
        ]


@pytest.fixture(scope="module")
def ryu(tmp_path_factory, testbed_host: None):
    if not RYU_MANAGER.exists():
        if os.environ.get("CI"):
            pytest.fail("no Ryu environment: `make test` builds it (make ryu)")
        pytest.skip("no Ryu environment: `make ryu` (needs a Python 3.8-3.11)")
    workdir = tmp_path_factory.mktemp("ryu")
    (workdir / "sdntest.yaml").write_text(TOPOLOGY)
    ctl = RyuController(workdir / "sdntest.yaml", workdir)
    ctl.start()
    yield ctl
    ctl.stop()


def test_sdn_app_under_ryu_manager(ryu: RyuController) -> None:
    topo = load_topology(ryu.topo_file)
    assert "ryu.controller.ofp_handler" in ryu.log.read_text()  # Ryu, not os-ken, runs the app
    with NetnsNetwork(topo, "ry" + uuid.uuid4().hex[:4], ("127.0.0.1", ryu.of_port)) as net:
        ryu.client.wait_ready(30)
        for a in topo.nodes:
            for b in topo.nodes:
                if a != b:
                    assert net.ping(a.name, b.name), f"{a.name} cannot ping {b.name}"
        reply = ryu.client.put_job_flows("ryu", [FlowRequest("h1", "h2", DETOUR, 20)])
        meter_id = reply["flows"][0]["meter"]["meter_id"]
        for sw, out in (("s1", 2), ("s2", 2), ("s3", 7)):
            [entry] = job_entries(net, sw)
            assert entry["actions"].endswith(f"output:{out}")
        assert job_entries(net, "s1")[0]["actions"].startswith(f"meter:{meter_id}")
        assert net.dump_meters("s1") == {meter_id: {"rate": 20_000, "burst": 10_000}}
        # Metered (the path is ~1 Gbit/s): at most 20 Mbit/s plus the 0.5 s burst over 2 s.
        rate = net.iperf("h1", "h2", seconds=2)
        assert 0.6 * 20 < rate <= 1.3 * 20, rate
