"""Per-destination sender-side shaping (edge.tc) inside a network namespace of our own."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from edge import tc


@pytest.fixture
def netns_pid(prefix: str):
    """A process in a fresh network namespace holding a veth pair `d0`/`d1` (up)."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "600"])
    try:
        pid = proc.pid
        ours = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{pid}/ns/net") == ours:  # until unshare(2) has happened
            assert time.monotonic() < deadline, "unshare did not create a namespace"
            time.sleep(0.01)
        for cmd in (
            ["ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1"],
            ["ip", "link", "set", "d0", "up"],
            ["ip", "link", "set", "d1", "up"],
        ):
            subprocess.run(["nsenter", "-t", str(pid), "-n", *cmd], check=True)
        yield pid
    finally:
        proc.kill()
        proc.wait()


def test_destination_classes_for_any_host_number(netns_pid: int):
    tc.shape("d0", 100, pid=netns_pid)
    assert tc.link_rate("d0", pid=netns_pid) == pytest.approx(100)
    # Host part 1 used to collide with the HTB root's handle 1:.
    for ip, rate in (("10.0.0.1", 20), ("10.0.0.2", 5), ("10.0.1.7", 50)):
        tc.set_destination("d0", ip, rate, pid=netns_pid)
    assert tc.destinations("d0", pid=netns_pid) == {
        1: pytest.approx(20),
        2: pytest.approx(5),
        0x107: pytest.approx(50),
    }
    tc.set_destination("d0", "10.0.0.1", 30, pid=netns_pid)  # change in place
    tc.remove_destination("d0", "10.0.0.2", pid=netns_pid)
    assert tc.destinations("d0", pid=netns_pid) == {1: pytest.approx(30), 0x107: pytest.approx(50)}
    filters = tc.tc(netns_pid, "filter", "show", "dev", "d0", "parent", "1:")
    assert "flowid 1:2" not in filters and "flowid 1:1 " in filters + " "
    tc.change("d0", 40, pid=netns_pid)
    assert tc.link_rate("d0", pid=netns_pid) == pytest.approx(40)
    assert tc.destinations("d0", pid=netns_pid)[1] == pytest.approx(30)
    tc.clear("d0", pid=netns_pid)
    assert tc.link_rate("d0", pid=netns_pid) is None


def test_destination_needs_a_shaped_interface_and_a_host_address(netns_pid: int):
    with pytest.raises(tc.TcError, match="not shaped yet"):
        tc.set_destination("d0", "10.0.0.3", 10, pid=netns_pid)
    tc.shape("d0", 100, pid=netns_pid)
    with pytest.raises(tc.TcError, match="no per-destination class"):
        tc.set_destination("d0", "10.0.0.0", 10, pid=netns_pid)
