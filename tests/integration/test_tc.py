"""Per-destination sender-side shaping (edge.tc) inside a network namespace of our own."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time

import pytest

from edge import tc
from protocol.dilation import Dilation


def _namespace() -> subprocess.Popen:
    """A process in a fresh network namespace of its own."""
    proc = subprocess.Popen(["unshare", "--net", "sleep", "600"])
    ours = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{proc.pid}/ns/net") == ours:  # until unshare(2) has happened
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("unshare did not create a namespace")
        time.sleep(0.01)
    return proc


def _in(pid: int, *cmd: str) -> None:
    subprocess.run(["nsenter", "-t", str(pid), "-n", *cmd], check=True)


@pytest.fixture
def netns_pid(prefix: str):
    """A process in a fresh network namespace holding a veth pair `d0`/`d1` (up)."""
    proc = _namespace()
    try:
        _in(proc.pid, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        _in(proc.pid, "ip", "link", "set", "d0", "up")
        _in(proc.pid, "ip", "link", "set", "d1", "up")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def two_hosts(prefix: str):
    """Two network namespaces joined by a veth pair: `d0` 10.9.0.1 in the first, `d1`
    10.9.0.2 in the second; yields their pids."""
    a, b = _namespace(), _namespace()
    try:
        _in(a.pid, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        _in(a.pid, "ip", "link", "set", "d1", "netns", str(b.pid))
        for proc, dev, ip in ((a, "d0", "10.9.0.1"), (b, "d1", "10.9.0.2")):
            _in(proc.pid, "ip", "addr", "add", f"{ip}/24", "dev", dev)
            _in(proc.pid, "ip", "link", "set", dev, "up")
        yield a.pid, b.pid
    finally:
        for proc in (a, b):
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


def test_the_first_grant_gives_the_acknowledgements_a_class_and_the_last_takes_it(netns_pid: int):
    """A grant carries its pair's data: the node's TCP acknowledgements (the data coming the
    other way) are matched first, into a class of their own at the link's rate; the plain
    link comes back with the last grant."""
    tc.shape("d0", 200, pid=netns_pid)
    tc.set_destination("d0", "10.0.0.2", 90, pid=netns_pid)
    tc.set_destination("d0", "10.0.0.3", 90, pid=netns_pid)

    def filters() -> list[tuple[str, str]]:  # (pref, flowid) of every rule
        out = tc.tc(netns_pid, "filter", "show", "dev", "d0", "parent", "1:")
        rules = [line.split() for line in out.splitlines() if "flowid " in line]
        # "... fh 800::800 order 2048 key ht 800 bkt 0 *flowid 1:fffd not_in_hw"
        at = [next(i for i, x in enumerate(w) if x.endswith("flowid")) for w in rules]
        return [(w[w.index("pref") + 1], w[i + 1]) for w, i in zip(rules, at)]

    assert filters() == [("1", "1:fffd"), ("2", "1:2"), ("2", "1:3")]
    classes = tc.tc(netns_pid, "class", "show", "dev", "d0")
    assert "class htb 1:fffd parent 1:ffff" in classes
    assert tc.destinations("d0", pid=netns_pid) == {2: pytest.approx(90), 3: pytest.approx(90)}
    tc.change("d0", 100, pid=netns_pid)  # the acknowledgements' class follows the link
    ack = next(
        line
        for line in tc.tc(netns_pid, "class", "show", "dev", "d0").splitlines()
        if "1:fffd" in line.split()
    )
    assert tc._parse_rate(ack.split()[ack.split().index("rate") + 1]) == pytest.approx(100)
    tc.remove_destination("d0", "10.0.0.2", pid=netns_pid)
    assert filters() == [("1", "1:fffd"), ("2", "1:3")]
    tc.remove_destination("d0", "10.0.0.3", pid=netns_pid)
    assert filters() == []
    assert "1:fffd" not in tc.tc(netns_pid, "class", "show", "dev", "d0")


def _sent(pid: int, dev: str) -> dict[str, tuple[int, int]]:
    """{class id: (bytes, packets) it sent} of `dev`'s HTB classes (a packet may be a GSO
    super-packet of many segments)."""
    out, sent, current = tc.tc(pid, "-s", "class", "show", "dev", dev), {}, ""
    for line in out.splitlines():
        words = line.split()
        if words[:2] == ["class", "htb"]:
            current = words[2]
        elif words[:1] == ["Sent"]:
            sent[current] = (int(words[1]), int(words[3]))
    return sent


def _python(pid: int, code: str, **popen: object) -> subprocess.Popen:
    """Python `code` run in the network namespace of `pid`."""
    return subprocess.Popen(["nsenter", "-t", str(pid), "-n", sys.executable, "-c", code], **popen)


def _connect(dst_ip: str) -> str:
    """Python that connects `c` to the receiver at `dst_ip`, once it listens."""
    return (
        "import socket, time\n"
        "for _ in range(100):\n"
        "    try:\n"
        f"        c = socket.create_connection(('{dst_ip}', 5001)); break\n"
        "    except OSError: time.sleep(0.05)\n"
    )


def _send(src: int, dst: int, dst_ip: str, sending: str) -> str:
    """Run `sending` (Python, `c` a TCP connection to a receiver in namespace `dst` that reads
    to the end) in namespace `src`; what it printed."""
    receiver = _python(
        dst,
        "import socket\n"
        f"s = socket.create_server(('{dst_ip}', 5001))\n"
        "c, _ = s.accept()\n"
        "while c.recv(1 << 16): pass\n",
    )
    try:
        sender = _python(
            src, f"{_connect(dst_ip)}{sending}c.close()\n", stdout=subprocess.PIPE, text=True
        )
        out, _ = sender.communicate(timeout=60)
        assert sender.returncode == 0 and receiver.wait(timeout=30) == 0
        return out
    finally:
        receiver.kill()


def test_the_acknowledgements_leave_the_grant_to_its_data(two_hosts: tuple[int, int]):
    """What the first namespace sends to the second: a grant's data in the grant's class, the
    acknowledgements of what the second sends it in their own class."""
    a, b = two_hosts
    tc.shape("d0", 1000, pid=a)
    tc.set_destination("d0", "10.9.0.2", 500, pid=a)
    before = _sent(a, "d0")
    _send(b, a, "10.9.0.1", "c.sendall(bytes(4_000_000))\n")  # a only acknowledges
    acked = _sent(a, "d0")
    assert acked["1:fffd"][1] - before["1:fffd"][1] >= 10, acked
    assert acked["1:2"][1] - before["1:2"][1] <= 3, acked  # nothing but the connection's own
    _send(a, b, "10.9.0.2", "c.sendall(bytes(4_000_000))\n")  # a sends the data
    sent = _sent(a, "d0")
    assert sent["1:2"][0] - acked["1:2"][0] >= 4_000_000, sent
    assert sent["1:fffd"][0] - acked["1:fffd"][0] < 100_000, sent  # its own handshake, no data


def test_a_class_holds_a_tcp_message_to_its_rate_and_burst(two_hosts: tuple[int, int]):
    """TCP hands the qdisc packets of up to 64 KB (GSO), which HTB charges whole when its class
    has tokens: past slow start, a 60 000-byte message after a pause went out at once through a
    1.14 Mbit/s class. The leaf's TBF cuts such a packet to the class's burst, so the last of a
    few messages takes what the class's rate allows beyond its burst."""
    a, b = two_hosts
    rate, nbytes = 2.0, 60_000
    tc.shape("d0", 100, pid=a)
    tc.set_destination("d0", "10.9.0.2", rate, pid=a)
    took = _send(
        a,
        b,
        "10.9.0.2",
        "for _ in range(4):\n"  # past slow start: TCP's window holds a message
        "    time.sleep(0.3)\n"  # the class's bucket fills
        "    t = time.monotonic()\n"
        f"    c.sendall(bytes({nbytes}))\n"
        "    while int.from_bytes(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)"
        "[24:28], 'little'):\n"  # tcpi_unacked
        "        time.sleep(0.001)\n"
        "print(time.monotonic() - t)\n",
    )
    at_rate = (nbytes - tc.burst_bytes(rate)) * 8 / (rate * 1e6)  # headers left out: a lower bound
    assert float(took) >= 0.9 * at_rate, (took, at_rate)


def _dropped(pid: int, dev: str, parent: str) -> int:
    """Packets the qdisc under class `parent` dropped ("qdisc tbf 8003: parent 1:2 ...", then
    " Sent ... (dropped N, ...")."""
    lines = tc.tc(pid, "-s", "qdisc", "show", "dev", dev).splitlines()
    for line, stats in itertools.pairwise(lines):
        words = line.split()
        if "parent" in words and words[words.index("parent") + 1] == parent:
            return int(stats.split("dropped")[1].split(",")[0])
    raise AssertionError(f"no qdisc under {parent} on {dev}")


def test_a_class_queues_a_message_window_without_a_drop(two_hosts: tuple[int, int]):
    """TCP puts a message's window in the queue at once: a ring step's 135 KB through a 30
    Mbit/s grant lost ~5 packets per message to a queue of 32 full-size packets and one of 64
    KB, and a lost retransmission waits out TCP's timeouts. The leaf holds what the pfifo before
    it held: as many of TCP's largest packets."""
    a, b = two_hosts
    tc.shape("d0", 100, pid=a)
    tc.set_destination("d0", "10.9.0.2", 30, pid=a)
    _send(
        a,
        b,
        "10.9.0.2",
        "for _ in range(20):\n"
        "    c.sendall(bytes(135_000))\n"
        "    while int.from_bytes(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)"
        "[24:28], 'little'):\n"  # tcpi_unacked: the step is over
        "        time.sleep(0.001)\n",
    )
    assert _sent(a, "d0")["1:2"][0] >= 20 * 135_000
    assert _dropped(a, "d0", "1:2") == 0


def test_a_changed_grant_keeps_its_flow_going(two_hosts: tuple[int, int]):
    """The Master re-shares the spare every few seconds, and each share moves the grant's rate.
    A leaf changed with it (a TBF at the grant's rate) stopped a stream for 1.5-2 s at each step
    down, in TCP's retransmission timeouts with nothing dropped; the class's HTB alone follows
    the grant, and the stream goes on at the new rate."""
    a, b = two_hosts
    k = Dilation(2.75)
    for pid, dev in ((a, "d0"), (b, "d1")):  # as the emulation's links: segments cut in software
        _in(pid, "ethtool", "-K", dev, "tx", "off")
    tc.shape("d0", 200, pid=a, dilation=k)
    tc.set_destination("d0", "10.9.0.2", 152, pid=a, dilation=k)
    receiver = _python(
        b,
        "import socket, time\n"
        "s = socket.create_server(('10.9.0.2', 5001))\n"
        "c, _ = s.accept()\n"
        "t0, got, marks = time.monotonic(), 0, []\n"
        "while (n := len(c.recv(1 << 20))):\n"
        "    got += n\n"
        "    marks.append((time.monotonic() - t0, got))\n"
        "print(' '.join(f'{t:.3f}:{g}' for t, g in marks))\n",
        stdout=subprocess.PIPE,
        text=True,
    )
    sender = _python(
        a,
        _connect("10.9.0.2")
        + "c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b'cubic')\n"  # the nodes'
        "end = time.monotonic() + 7\n"
        "while time.monotonic() < end: c.sendall(bytes(1 << 18))\n"
        "c.close()\n",
    )
    try:
        for mbps in (136, 154, 133, 157, 135):
            time.sleep(1.0)
            tc.set_destination("d0", "10.9.0.2", mbps, pid=a, dilation=k)
        assert sender.wait(timeout=30) == 0
        out, _ = receiver.communicate(timeout=30)
    finally:
        sender.kill()
        receiver.kill()
    marks = [(float(t), int(g)) for t, g in (m.split(":") for m in out.split())]
    # every half second from the first change on carries at least half the lowest grant
    floor = 0.5 * k.host_mbps(133) * 1e6 / 8 * 0.5
    for start in [1.0 + 0.5 * i for i in range(10)]:
        sent = [g for t, g in marks if start <= t < start + 0.5]
        assert sent and sent[-1] - sent[0] >= floor, (start, sent and sent[-1] - sent[0], floor)
