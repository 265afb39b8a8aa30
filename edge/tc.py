"""Egress shaping with tc HTB, in the root network namespace or in a given process's namespace.

One layout serves both link emulation and the per-destination grants of a node's Network Manager:

    root 1: htb default fffe
    └── 1:ffff  the interface's capacity (rate = ceil = capacity)
        ├── 1:fffe  everything not granted per destination (ARP, pings, unscheduled flows)
        ├── 1:fffd  with the first grant: the node's TCP acknowledgements (segments under 128
        │           bytes), rate = ceil = capacity, u32 filter at prio 1
        └── 1:<n>   one class per destination IP, rate = ceil = its grant, u32 filter on dst/32
                    at prio 2 (n = the host part of the address, so no state is kept outside
                    the kernel)

A grant carries the data its pair sends. The acknowledgements of the data coming the other way
go to the same address, and in the grant's class they took a share of it and queued behind its
data: in a direct all-reduce on a 200 Mbit/s bottleneck (every pair sending both ways, each
direction granted 91 % of its share) the 37-packet queue of a 91 Mbit/s grant dropped 55-254 of
the node's own packets per class and run, which TCP answers by halving its window without a
retransmission, and the collective took 1.36-1.38 × its bound at the grants; with the
acknowledgements in a class of their own, 1.04-1.05 × and no drops (1.14-1.16 × against
1.29-1.40 × at 100 Mbit/s; the calibration's bottleneck, mlp-large, 2-3 runs each, the leaves'
drop counters; experiments/calibrate_perfmodel.py measures the collective). The Master leaves
the acknowledgements their room beside the grants (`master.network.NetworkController.GRANTABLE`).

Every class's leaf is a TBF at the link's rate with the class's burst, holding `queue_pkts`
(~5 ms of traffic: a queue of 1000 packets made OVS's userspace datapath drop inside the switch,
ENVIRONMENT.md "Queues matter") of the largest packets its sender hands it (`queue_bytes`: on
a node's interface its own TCP's, up to 64 KB; on a switch's port full-size frames), with
netem below it when the link has a delay and the kernel has sch_netem (its limit the same queue
and room for the packets in their delay, `netem_limit`). The TBF is there for TCP's
segmentation offload: TCP hands the qdisc packets of up to 64 KB (GSO, whatever the device's
offloads), and HTB charges such a packet whole against its class's tokens and lets it out at
line rate whenever they are positive. A class granted 1.14 Mbit/s with a 15 000-byte burst let
each 60 000-byte message of a TCP sender through in one go after a 0.5 s pause, and held the
messages to 1.9 × its rate while busy after 0.175 s pauses (a scratch probe: two namespaces,
the receiver's tcpdump, the class's counters); a UDP sender's 1448-byte datagrams through the
same class were held to the burst and the rate. A TBF cuts a packet larger than its bucket
into segments, which HTB then charges one by one, so the class's burst is what it says; the
segments would be cut at the device anyway (its checksum offload is off, `testbed`), so it
costs no CPU. The class's HTB is the shaper; the TBF passes the link's rate and does not follow
a grant: a TBF changed under HTB while TCP sends through it stopped the flow for 1.5-2 s at
each change (a scratch probe at K = 2.75: a stream through a grant stepping between 133 and
157 Mbit/s every 2 s carried nothing for 1.5-2 s after each step, 9 retransmission timeouts in
14 s and no drop; with the HTB class changed alone, none). In runs whose leaves followed their
grant, 6 of 58 campus runs had a ring stall at its grants' changes for 2.1-9.2 s (emulated, K
= 2.75), timeout after doubled timeout (`tests/integration/test_tc.py`).

Rates are emulated Mbit/s. Under time dilation (`protocol.dilation`) a class's rate is the host's
share of it (÷ K) and a delay lasts K times longer, while what is counted in bytes or packets —
bursts, quanta, queue lengths — stays what the emulated rate gives: the queue holds the same
emulated milliseconds of traffic at any K.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import subprocess

from protocol.dilation import NONE, Dilation

log = logging.getLogger(__name__)


def queue_pkts(rate_mbps: float) -> int:
    """Leaf queue: ~5 ms of traffic at the rate, between 32 and 128 packets."""
    return int(min(max(rate_mbps * 1e6 / 8 * 0.005 / 1500, 32), 128))


# The largest packet a node's own TCP hands its interface's qdisc (GSO, whatever the device's
# offloads; the device cuts it, its checksum offload off), and a full-size frame: the largest a
# switch forwards to its port.
GSO_MAX_BYTES, FRAME_BYTES = 65_536, 1514


def queue_bytes(rate_mbps: float, switch_port: bool = False) -> int:
    """A leaf's queue in bytes: `queue_pkts` of the largest packets its sender hands it, as much
    as the pfifo leaf before the TBF held (it counted any packet as one).

    On a node's interface, TCP's: it puts a message's window in the queue at once. A ring step
    of 135 KB through a 30 Mbit/s grant lost 4.7 packets per message to a queue of 32
    full-size packets and one of 64 KB, none to this one (a scratch probe at K = 2.75; every
    message recovered, in the same time), and iperf3 streams through 2, 5 and 20 Mbit/s grants
    retransmitted 2-17 segments in 8 s with that queue, none with this one.

    On a switch's port, frames: what the queue holds stays charged to the packet socket the
    userspace datapath sends through, and a longer queue fills the socket's send buffer, which
    drops inside the switch (ENVIRONMENT.md, "Queues matter")."""
    return queue_pkts(rate_mbps) * (FRAME_BYTES if switch_port else GSO_MAX_BYTES)


def netem_limit(rate_mbps: float, delay_ms: float, switch_port: bool = False) -> int:
    """A netem leaf's limit in packets: below the TBF, which cuts TCP's large packets into
    full-size ones, the leaf's queue (`queue_bytes`) in those, and the packets in their delay at
    the rate. netem counts the packets it delays in its limit: with the queue's alone, a link of
    190 Mbit/s and 20 ms would carry 79 packets per 20 ms, 47 Mbit/s. Emulated rate and delay,
    so the same at any K."""
    in_flight = rate_mbps * 1e6 / 8 * delay_ms / 1000 / 1500
    return math.ceil(queue_bytes(rate_mbps, switch_port) / FRAME_BYTES) + math.ceil(in_flight)


LINK_CLASS, DEFAULT_CLASS, ACK_CLASS = 0xFFFF, 0xFFFE, 0xFFFD
# TCP segments shorter than 128 bytes (IP total length): pure acknowledgements, 52 bytes with
# timestamps and up to 84 with SACK blocks.
ACK_MATCH = "match ip protocol 6 0xff match u16 0x0000 0xff80 at 2"
ACK_PRIO, DESTINATION_PRIO = 1, 2
_netem: bool | None = None  # learnt at first use


class TcError(RuntimeError):
    pass


def netns_prefix(pid: int | None) -> list[str]:
    """The command prefix that runs a host tool in the network namespace of `pid` (None: the
    root namespace)."""
    return [] if pid is None else ["nsenter", "-t", str(pid), "-n"]


def tc(pid: int | None, *args: str, check: bool = True) -> str:
    done = subprocess.run(netns_prefix(pid) + ["tc", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise TcError(
            f"tc {' '.join(args)}{'' if pid is None else f' (in netns of {pid})'}: "
            f"{done.stderr.strip()}"
        )
    return done.stdout


def _batch(pid: int | None, lines: list[str]) -> None:
    done = subprocess.run(
        netns_prefix(pid) + ["tc", "-batch", "-"],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise TcError(
            f"tc -batch{'' if pid is None else f' (in netns of {pid})'}: {done.stderr.strip()}"
        )


def _rate(mbps: float) -> str:
    return f"{max(mbps, 0.001) * 1000:.0f}kbit"


def burst_bytes(mbps: float) -> int:
    """A class's (and its TBF's) burst in bytes: 4 ms of traffic, so that the userspace
    datapath's batches pass and the shaper's timer may be that late, and at least two full-size
    packets (a TBF drops a packet larger than its bucket). A message that starts on a full
    bucket passes the burst at line rate beyond the grant: a 60 000-byte message after a pause
    took 1.31 × a 1.14 Mbit/s grant on the wire with the 15 000 bytes this floor used to be
    (100 ms of that grant), 1.05 × with 3028 (the probe above). TCP streams through 2, 5 and 20
    Mbit/s grants reached 0.95-0.96 of them in goodput with this leaf and floor, 0.96-0.97 with
    the pfifo leaf and 15 000 before it, also beside two busy loops (iperf3, 8 s each)."""
    return max(3028, int(mbps * 1e6 / 8 * 0.004))


def _htb_args(mbps: float, dilation: Dilation) -> str:
    # quantum: explicit, so HTB does not warn about r2q at high rates.
    quantum = min(max(1514, int(mbps * 1e6 / 8 / 1000)), 200_000)
    rate = _rate(dilation.host_mbps(mbps))
    burst = burst_bytes(mbps)
    return f"rate {rate} ceil {rate} burst {burst} cburst {burst} quantum {quantum}"


def _tbf_args(
    class_mbps: float, link_mbps: float, dilation: Dilation, switch_port: bool = False
) -> str:
    """A leaf's TBF: the link's rate, the class's burst (what it cuts larger packets to) and its
    queue (`queue_bytes`), both at the class's rate when the leaf was made."""
    return (
        f"rate {_rate(dilation.host_mbps(link_mbps))} burst {burst_bytes(class_mbps)} "
        f"limit {queue_bytes(class_mbps, switch_port)}"
    )


def probe_netem() -> bool:
    """Whether this kernel has sch_netem: learnt from use, else tried once in a throwaway
    network namespace (nothing of the host's changes)."""
    global _netem
    if _netem is None:
        done = subprocess.run(
            ["unshare", "-n", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True,
        )
        _netem = done.returncode == 0
    return _netem


def _leaf(
    pid: int | None,
    dev: str,
    minor: int,
    rate_mbps: float,
    link_mbps: float,
    delay_ms: float,
    dilation: Dilation = NONE,
    switch_port: bool = False,
) -> None:
    """A new leaf for class 1:`minor` (at `rate_mbps`, on a link of `link_mbps`): its TBF, and
    netem below it for the link's delay where the kernel has sch_netem; its queue a switch
    port's when `switch_port` (`queue_bytes`)."""
    global _netem
    # No explicit handle: the kernel picks a free one (a handle derived from the minor would
    # collide with the root's `1:` for a destination whose host part is 1).
    parent = f"1:{minor:x}"
    tc(
        pid,
        "qdisc",
        "add",
        "dev",
        dev,
        "parent",
        parent,
        "tbf",
        *_tbf_args(rate_mbps, link_mbps, dilation, switch_port).split(),
    )
    if delay_ms <= 0 or _netem is False:
        return
    handle = _leaf_handle(tc(pid, "qdisc", "show", "dev", dev), parent)
    try:
        tc(
            pid,
            "qdisc",
            "replace",  # in place of the TBF's own queue
            "dev",
            dev,
            "parent",
            f"{handle}1",
            "netem",
            "delay",
            f"{dilation.host_seconds(delay_ms)}ms",
            "limit",
            str(netem_limit(rate_mbps, delay_ms, switch_port)),
        )
        _netem = True
    except TcError as e:
        if "unknown" not in str(e).lower() and "no such file" not in str(e).lower():
            raise
        _netem = False
        log.warning(
            "this kernel has no sch_netem: link delays are NOT emulated "
            "(bandwidth shaping still works)"
        )


def _leaf_handle(qdiscs: str, parent: str) -> str:
    """The handle ("8005:") of the qdisc under class `parent` ("1:2") in `tc qdisc show`."""
    for line in qdiscs.splitlines():
        words = line.split()
        if "parent" in words and words[words.index("parent") + 1] == parent:
            return words[2]
    raise TcError(f"no qdisc under class {parent}")


def shape(
    dev: str,
    rate_mbps: float,
    delay_ms: float = 0.0,
    pid: int | None = None,
    dilation: Dilation = NONE,
    switch_port: bool = False,
) -> None:
    """Shape `dev` to `rate_mbps` (+ `delay_ms` where netem exists); replaces any old setup.
    `switch_port`: `dev` is a switch's port, not a node's interface (`queue_bytes`)."""
    tc(pid, "qdisc", "del", "dev", dev, "root", check=False)  # `replace` fails on an HTB root
    _batch(pid, shape_lines(dev, rate_mbps, dilation=dilation)[:3])
    _leaf(pid, dev, DEFAULT_CLASS, rate_mbps, rate_mbps, delay_ms, dilation, switch_port)


def shape_lines(
    dev: str,
    rate_mbps: float,
    delay_ms: float = 0.0,
    dilation: Dilation = NONE,
    netem: bool = False,
    switch_port: bool = False,
) -> list[str]:
    """`shape` as `tc -batch` lines for a `dev` with no root qdisc yet, netem below its leaf's
    TBF where `netem` (the kernel has it) and the link has a delay: for a host reached over SSH,
    where one `tc -batch` per network namespace shapes every interface of it (`lab.fabric`)."""
    # The default class's TBF gets a handle of its own choosing (one `tc -batch` cannot read
    # back the one the kernel picks; the kernel picks from 8000: up, the root is 1:).
    lines = [
        f"qdisc add dev {dev} root handle 1: htb default {DEFAULT_CLASS:x}",
        f"class add dev {dev} parent 1: classid 1:{LINK_CLASS:x} htb "
        f"{_htb_args(rate_mbps, dilation)}",
        f"class add dev {dev} parent 1:{LINK_CLASS:x} classid 1:{DEFAULT_CLASS:x} htb "
        f"{_htb_args(rate_mbps, dilation)}",
        f"qdisc add dev {dev} parent 1:{DEFAULT_CLASS:x} handle 2: tbf "
        f"{_tbf_args(rate_mbps, rate_mbps, dilation, switch_port)}",
    ]
    if delay_ms > 0 and netem:
        lines.append(
            f"qdisc replace dev {dev} parent 2:1 netem delay "
            f"{dilation.host_seconds(delay_ms)}ms "
            f"limit {netem_limit(rate_mbps, delay_ms, switch_port)}"
        )
    return lines


def change(
    dev: str,
    rate_mbps: float,
    delay_ms: float | None = None,
    pid: int | None = None,
    dilation: Dilation = NONE,
    switch_port: bool = False,
) -> None:
    """Change the capacity (and delay) of a shaped `dev` (a switch's port: `shape`), keeping its
    per-destination classes."""
    # The classes at the link's rate: the default one, and the acknowledgements' while grants hold.
    at_link = [DEFAULT_CLASS]
    classes = tc(pid, "class", "show", "dev", dev)
    if f"class htb 1:{ACK_CLASS:x} " in classes:
        at_link.append(ACK_CLASS)
    before = _link_rate(classes, dilation) or 0.0
    _batch(
        pid,
        [
            f"class change dev {dev} parent 1: classid 1:{LINK_CLASS:x} htb "
            f"{_htb_args(rate_mbps, dilation)}",
            *(
                f"class change dev {dev} parent 1:{LINK_CLASS:x} classid 1:{minor:x} htb "
                f"{_htb_args(rate_mbps, dilation)}"
                for minor in at_link
            ),
        ],
    )
    # The leaves at the link's rate follow it; the granted classes' leaves are made again for a
    # new delay, or when the link grows beyond the rate their TBF passes.
    leaves = dict.fromkeys(at_link, rate_mbps)
    if delay_ms is not None or rate_mbps > before:
        leaves |= _destinations(classes, dilation)
    if delay_ms is None:
        delay_ms = link_delay_ms(dev, pid, dilation)
    for minor, mbps in leaves.items():
        tc(pid, "qdisc", "del", "dev", dev, "parent", f"1:{minor:x}", check=False)
        _leaf(pid, dev, minor, mbps, rate_mbps, delay_ms, dilation, switch_port)


def link_delay_ms(dev: str, pid: int | None = None, dilation: Dilation = NONE) -> float:
    """The delay of `dev`'s link (its default leaf's netem) in emulated ms; 0 without netem."""
    qdiscs = tc(pid, "qdisc", "show", "dev", dev)
    try:
        below = f"{_leaf_handle(qdiscs, f'1:{DEFAULT_CLASS:x}')}1"
    except TcError:  # not shaped
        return 0.0
    for line in qdiscs.splitlines():
        words = line.split()
        if "netem" in words and below in words and "delay" in words:
            return dilation.emulated_seconds(_parse_time_ms(words[words.index("delay") + 1]))
    return 0.0


def _parse_time_ms(text: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    return float(text) * 1e-3  # tc prints plain numbers in microseconds


def class_minor(dst_ip: str) -> int:
    host = int(ipaddress.IPv4Address(dst_ip)) & 0xFFFF
    if not 0 < host < ACK_CLASS:
        raise TcError(
            f"{dst_ip}: no per-destination class for this address (host part "
            f"must be 1..{ACK_CLASS - 1})"
        )
    return host


def set_destination(
    dev: str, dst_ip: str, rate_mbps: float, pid: int | None = None, dilation: Dilation = NONE
) -> None:
    """Grant `rate_mbps` to traffic from `dev` to `dst_ip` (add or change the class)."""
    minor = class_minor(dst_ip)
    classes = tc(pid, "class", "show", "dev", dev)
    capacity = _link_rate(classes, dilation)
    if capacity is None:
        raise TcError(f"{dev}: not shaped yet (call shape() with the line rate first)")
    exists = f"class htb 1:{minor:x} " in classes
    _batch(
        pid,
        [
            f"class {'change' if exists else 'add'} dev {dev} parent 1:{LINK_CLASS:x} "
            f"classid 1:{minor:x} htb {_htb_args(rate_mbps, dilation)}"
        ],
    )
    if exists:  # a changed grant keeps its leaf (module doc: a TBF changed under load stalls)
        return
    # The link's delay holds for granted traffic too: a grant shapes the rate, it does not
    # shorten the wire (a leaf without it skipped the node's link delay on netem kernels).
    delay = link_delay_ms(dev, pid, dilation) if _netem is not False else 0.0
    if f"class htb 1:{ACK_CLASS:x} " not in classes:
        _batch(
            pid,
            [
                f"class add dev {dev} parent 1:{LINK_CLASS:x} classid 1:{ACK_CLASS:x} htb "
                f"{_htb_args(capacity, dilation)}",
                f"filter add dev {dev} parent 1: protocol ip prio {ACK_PRIO} u32 {ACK_MATCH} "
                f"flowid 1:{ACK_CLASS:x}",
            ],
        )
        _leaf(pid, dev, ACK_CLASS, capacity, capacity, delay, dilation)
    _leaf(pid, dev, minor, rate_mbps, capacity, delay, dilation)
    _batch(
        pid,
        [
            f"filter add dev {dev} parent 1: protocol ip prio {DESTINATION_PRIO} u32 "
            f"match ip dst {dst_ip}/32 flowid 1:{minor:x}"
        ],
    )


def remove_destination(dev: str, dst_ip: str, pid: int | None = None) -> None:
    """Drop the grant to `dst_ip`: its traffic falls back to the default class."""
    remove_class(dev, class_minor(dst_ip), pid)


def remove_class(dev: str, minor: int, pid: int | None = None) -> None:
    """Drop the per-destination class `minor` (as `destinations` lists it) and its filter; with
    the last of them the acknowledgements' class goes too, leaving the plain link."""
    for line in tc(pid, "filter", "show", "dev", dev, "parent", "1:").splitlines():
        words = line.split()
        if f"1:{minor:x}" in words and "fh" in words:  # "... fh 800::801 ... flowid 1:2"
            tc(
                pid,
                "filter",
                "del",
                "dev",
                dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                str(DESTINATION_PRIO),
                "handle",
                words[words.index("fh") + 1],
                "u32",
            )
    tc(pid, "class", "del", "dev", dev, "classid", f"1:{minor:x}", check=False)
    if not destinations(dev, pid):
        tc(pid, "filter", "del", "dev", dev, "parent", "1:", "prio", str(ACK_PRIO), check=False)
        tc(pid, "class", "del", "dev", dev, "classid", f"1:{ACK_CLASS:x}", check=False)


def destinations(dev: str, pid: int | None = None, dilation: Dilation = NONE) -> dict[int, float]:
    """{class minor (= host part of the destination): rate in Mbit/s} of the granted classes."""
    return _destinations(tc(pid, "class", "show", "dev", dev), dilation)


def _destinations(classes: str, dilation: Dilation) -> dict[int, float]:
    """`destinations` from `tc class show`'s output."""
    out = {}
    for line in classes.splitlines():
        words = line.split()
        if len(words) > 2 and words[1] == "htb":
            minor = int(words[2].split(":")[1], 16)
            if minor not in (LINK_CLASS, DEFAULT_CLASS, ACK_CLASS):
                out[minor] = dilation.emulated_mbps(_parse_rate(words[words.index("rate") + 1]))
    return out


def link_rate(dev: str, pid: int | None = None, dilation: Dilation = NONE) -> float | None:
    """The shaped capacity of `dev` in Mbit/s, None when not shaped."""
    return _link_rate(tc(pid, "class", "show", "dev", dev), dilation)


def _link_rate(classes: str, dilation: Dilation) -> float | None:
    """The link class's rate in emulated Mbit/s from `tc class show`'s output, None without it."""
    for line in classes.splitlines():
        words = line.split()
        if len(words) > 2 and words[2] == f"1:{LINK_CLASS:x}":
            return dilation.emulated_mbps(_parse_rate(words[words.index("rate") + 1]))
    return None


def _parse_rate(text: str) -> float:
    units = {"bit": 1e-6, "Kbit": 1e-3, "Mbit": 1.0, "Gbit": 1e3}
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * units[unit]
    raise TcError(f"cannot parse tc rate {text!r}")


def clear(dev: str, pid: int | None = None) -> None:
    tc(pid, "qdisc", "del", "dev", dev, "root", check=False)
