"""Containernet's API on our testbed (testbed.containernet), with real OVS, Docker and a controller.

Three of Containernet's own example scripts (containernet_examples/, unmodified copies from
containernet/containernet at c0689423) run with only their import lines changed and the image
replaced by one available offline; then our own checks of what the examples only print.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from mininet.link import TCLink
from mininet.node import Controller

from edge import tc
from testbed.containernet import Containernet, Docker

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).with_name("containernet_examples")
IMPORTS = [  # what a user changes: Containernet and Docker come from testbed.containernet
    (r"^from mininet\.net import Containernet$", "from testbed.containernet import Containernet"),
    (
        r"^from mininet\.node import Controller, Docker, OVSSwitch$",
        "from mininet.node import Controller, OVSSwitch\nfrom testbed.containernet import Docker",
    ),
]
IMAGES = r'"(ubuntu:trusty|mpeuster/stress)"'  # Docker Hub images: not reachable offline


def run_example(name: str, image: str, tmp_path: Path) -> str:
    text = (EXAMPLES / f"{name}.py").read_text()
    for pattern, replacement in IMPORTS:
        text = re.sub(pattern, replacement, text, flags=re.M)
    text = re.sub(IMAGES, f'"{image}"', text)
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    # stdin at EOF: the example's CLI(net) returns at once, as if the user typed exit.
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return out


def containernet_containers() -> list[str]:
    return [
        c.name
        for c in docker.from_env().containers.list(all=True, filters={"label": "com.containernet"})
    ]


@pytest.fixture
def no_leftovers(testbed_host: None):
    assert containernet_containers() == []
    yield
    assert containernet_containers() == []
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout
    assert not re.search(r"^s\d+$", bridges, re.M), bridges


def test_basic_example(worker_image: str, tmp_path: Path, no_leftovers: None) -> None:
    out = run_example("containernet_example", worker_image, tmp_path)
    assert "Results: 0% dropped (2/2 received)" in out
    # The example's s1–s2 TCLink asks for 100 ms of delay: said plainly where netem is missing.
    assert ("no sch_netem" in out) == (not tc.probe_netem())


def test_dockerhosts_example(worker_image: str, tmp_path: Path, no_leftovers: None) -> None:
    """Plain and Docker hosts, CFS quota and shares, volumes, ports, a second interface, and a
    container added while the network runs."""
    out = run_example("dockerhosts", worker_image, tmp_path)
    assert out.count("0% dropped") == 4, out
    assert "d1 -> 10.0.0.254" in out  # d4, added at run time
    assert "Stopping 7 hosts" in out


def test_cpuset_example(worker_image: str, tmp_path: Path, no_leftovers: None) -> None:
    out = run_example("docker_cpuset", worker_image, tmp_path)
    assert "Done" in out


@pytest.fixture
def net(testbed_host: None, no_leftovers: None):
    n = Containernet(controller=Controller)
    yield n
    if not n.stopped:
        n.stop()


def inspect(node: Docker) -> dict:
    node.container.reload()
    return node.container.attrs["HostConfig"]


def test_containers_at_run_time(worker_image: str, net: Containernet, tmp_path: Path) -> None:
    """What the examples only print: limits applied and changed, commands run inside the
    container, TCP through a shaped userspace-datapath link, removal at run time."""
    (tmp_path / "marker").write_text("ok")
    net.addController("c0")
    s1, s2 = net.addSwitch("s1"), net.addSwitch("s2")
    d0 = net.addDocker(
        "d0",
        ip="10.0.0.1",
        dimage=worker_image,
        cpu_period=50000,
        cpu_quota=25000,
        mem_limit="256m",
        volumes=[f"{tmp_path}:/mnt/vol1:ro"],
    )
    d1 = net.addDocker("d1", ip="10.0.0.2", dimage=worker_image)
    net.addLink(d0, s1)
    net.addLink(s1, s2, cls=TCLink, bw=10)
    net.addLink(s2, d1)
    net.start()
    assert net.ping([d0, d1]) == 0.0
    assert (inspect(d0)["CpuPeriod"], inspect(d0)["CpuQuota"]) == (50000, 25000)
    assert inspect(d0)["Memory"] == 256 * 2**20

    # cmd runs inside the container: its file system, its cgroup.
    assert d0.cmd("cat /mnt/vol1/marker").strip() == "ok"
    assert d0.container.id in d0.cmd("cat /proc/self/cgroup")

    d0.updateCpuLimit(cpu_quota=10000)
    d0.updateMemoryLimit(mem_limit=128 * 2**20, memswap_limit=128 * 2**20)
    assert (inspect(d0)["CpuQuota"], inspect(d0)["Memory"]) == (10000, 128 * 2**20)
    assert d0.resources["cpu_quota"] == 10000 and d0.resources["cpu_period"] == 50000

    # TCP across the 10 Mbit/s TCLink (checksum offload off on the userspace datapath).
    d1.cmd("iperf3 -s -1 -D")
    report = json.loads(d0.cmd("iperf3 -c 10.0.0.2 -t 3 -J"))
    mbps = report["end"]["sum_received"]["bits_per_second"] / 1e6
    assert 7 < mbps <= 10.5, mbps

    d2 = net.addDocker("d2", ip="10.0.0.3", dimage=worker_image)
    net.addLink(d2, s1)
    d2.configDefault()
    assert net.ping([d0], manualdestip="10.0.0.3") == 0.0
    net.removeDocker("d1")
    assert [h.name for h in net.hosts] == ["d0", "d2"]
    assert len(net.links) == 3 and "mn.d1" not in containernet_containers()
    assert net.ping([d0, d2]) == 0.0
