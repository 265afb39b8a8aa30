"""Receive buffers of the userspace datapath's packet sockets.

On the userspace (netdev) datapath ovs-vswitchd reads every port through an AF_PACKET socket
created with the host's `net.core.rmem_default` (~208 KiB, ~90 full-size frames). When the
forwarding thread shares two cores with the workers it falls behind by a few milliseconds, the
socket overflows and a 200 Mbit/s flow lost 400–750 segments a run: TCP backed off to 0.82–0.86
of its grant (docs/testbed.md). Enlarging those sockets' buffers, and only those, removes the
loss without changing a host-wide sysctl: `pidfd_getfd(2)` hands us a duplicate of the daemon's
socket, and a socket option set on the duplicate is set on the one socket both share.
"""

from __future__ import annotations

import ctypes
import os
import socket
import time
from pathlib import Path

# 4 MiB: ~1800 full-size frames, ~150 ms of a 400 Mbit/s port's traffic.
RX_BUFFER_BYTES = 4 << 20
_SYS_PIDFD_GETFD = 438  # same number on every architecture
_SO_RCVBUFFORCE = 33  # asm-generic; not exported by Python's socket module
_OVS_PIDFILE = Path("/var/run/openvswitch/ovs-vswitchd.pid")
_libc = ctypes.CDLL(None, use_errno=True)


class SocketBufferError(RuntimeError):
    pass


def vswitchd_pid() -> int:
    try:
        return int(_OVS_PIDFILE.read_text())
    except (OSError, ValueError) as e:
        raise SocketBufferError(f"ovs-vswitchd's pid from {_OVS_PIDFILE}: {e}") from None


def packet_sockets(pid: int, ifindexes: set[int]) -> dict[int, int]:
    """{fd in `pid`: ifindex} of `pid`'s AF_PACKET sockets bound to one of `ifindexes`."""
    by_inode: dict[str, int] = {}
    # sk RefCnt Type Proto Iface R Rmem User Inode
    for line in Path(f"/proc/{pid}/net/packet").read_text().splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 9 and int(cols[4]) in ifindexes:
            by_inode[cols[8]] = int(cols[4])
    found = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:[") and target[8:-1] in by_inode:
            found[int(fd.name)] = by_inode[target[8:-1]]
    return found


def set_receive_buffer(pidfd: int, fd: int, nbytes: int) -> None:
    """SO_RCVBUFFORCE on socket `fd` of the process behind `pidfd` (the kernel doubles `nbytes`
    for bookkeeping)."""
    dup = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    if dup < 0:
        raise SocketBufferError(
            f"pidfd_getfd(ovs-vswitchd, fd {fd}): {os.strerror(ctypes.get_errno())}"
        )
    with socket.socket(fileno=dup) as sock:  # closes our duplicate only
        sock.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, nbytes // 2)


def enlarge_receive_buffers(
    interfaces: list[str], nbytes: int = RX_BUFFER_BYTES, timeout_s: float = 5.0
) -> None:
    """Give ovs-vswitchd's sockets on `interfaces` (host-side ports) `nbytes` of receive buffer.

    Waits up to `timeout_s` for the daemon to open a socket on every port it was just given."""
    pid = vswitchd_pid()
    try:
        wanted = {socket.if_nametoindex(name): name for name in interfaces}
    except OSError as e:
        raise SocketBufferError(f"port interfaces {interfaces}: {e}") from None
    deadline = time.monotonic() + timeout_s
    while True:
        sockets = packet_sockets(pid, set(wanted))
        missing = set(wanted) - set(sockets.values())
        if not missing:
            break
        if time.monotonic() > deadline:
            names = ", ".join(sorted(wanted[i] for i in missing))
            raise SocketBufferError(
                f"ovs-vswitchd ({pid}) has no packet socket on {names} after {timeout_s:.0f} s"
            )
        time.sleep(0.05)
    pidfd = os.pidfd_open(pid)
    try:
        for fd in sockets:
            set_receive_buffer(pidfd, fd, nbytes)
    finally:
        os.close(pidfd)
