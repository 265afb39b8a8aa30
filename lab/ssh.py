"""SSH to a lab host with paramiko, its host key checked against known_hosts.

An unknown host key is refused unless the caller accepts new keys (then it is saved to the
known_hosts file, as OpenSSH's `accept-new`); a changed key is always refused. Every failure is a
`HostError` whose message names the host and the problem in one line.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import threading
from collections.abc import Iterable
from pathlib import Path

import paramiko

from .inventory import Host

CONNECT_TIMEOUT_S = 10.0
# Every failure is a HostError in one line; paramiko's own log (connections, tracebacks) would
# bury it, wherever this module is used (python -m lab, run.py --hosts).
logging.getLogger("paramiko").setLevel(logging.CRITICAL)


class HostError(RuntimeError):
    """A lab host that cannot be used: one line naming the host and the problem."""

    def __init__(self, host: Host, problem: str):
        super().__init__(f"{host.label()}: {problem}")
        self.host, self.problem = host, problem


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's form, as `ssh-keygen -lf` prints it."""
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _UnknownHostKey(Exception):
    def __init__(self, key: paramiko.PKey):
        self.key = key


class _Refuse(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):
        raise _UnknownHostKey(key)


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """OpenSSH's accept-new: an unknown key is added to the file (a changed one never reaches a
    policy). Read-merge-write under a lock, since several hosts are connected at once."""

    lock = threading.Lock()

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        with self.lock:
            keys = paramiko.HostKeys(str(self.path))
            keys.add(hostname, key.get_name(), key)
            keys.save(str(self.path))
        client.get_host_keys().add(hostname, key.get_name(), key)


class Remote:
    """One SSH connection to `host`; `run` executes a shell command there."""

    def __init__(self, host: Host, known_hosts: Path, accept_new: bool = False):
        self.host, self.known_hosts, self.accept_new = host, known_hosts, accept_new
        self.client = paramiko.SSHClient()

    def __enter__(self) -> Remote:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def connect(self) -> Remote:
        h = self.host
        if self.accept_new and not self.known_hosts.exists():
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.known_hosts.touch(mode=0o600)
        if self.known_hosts.exists():
            self.client.get_host_keys().load(str(self.known_hosts))
        self.client.set_missing_host_key_policy(
            _AcceptNew(self.known_hosts) if self.accept_new else _Refuse()
        )
        try:
            key = paramiko.PKey.from_path(h.key_file)
        except (OSError, paramiko.SSHException, ValueError) as e:
            raise HostError(h, f"cannot load the key {h.key_file} ({e})") from None
        try:
            self.client.connect(
                h.address,
                h.port,
                h.user,
                pkey=key,
                timeout=CONNECT_TIMEOUT_S,
                banner_timeout=CONNECT_TIMEOUT_S,
                auth_timeout=CONNECT_TIMEOUT_S,
                look_for_keys=False,
                allow_agent=False,
            )
        except _UnknownHostKey as e:
            raise HostError(
                h,
                f"unknown host key {fingerprint(e.key)}: not in "
                f"{self.known_hosts}; check it with the host's administrator, "
                f"then rerun with --accept-new-host-keys",
            ) from None
        except paramiko.BadHostKeyException as e:
            raise HostError(
                h,
                f"host key CHANGED: the host offers {fingerprint(e.key)}, "
                f"{self.known_hosts} has {fingerprint(e.expected_key)}; refusing "
                f"(if the host was reinstalled: ssh-keygen -R "
                f"'[{h.address}]:{h.port}' -f {self.known_hosts})",
            ) from None
        except paramiko.AuthenticationException:
            raise HostError(h, f"the key {h.key_file} is refused for user {h.user}") from None
        except (paramiko.ssh_exception.NoValidConnectionsError, TimeoutError, OSError) as e:
            raise HostError(h, f"unreachable over SSH ({e})") from None
        except paramiko.SSHException as e:  # a key file paramiko cannot read, a protocol error
            raise HostError(h, f"SSH failed: {e}") from None
        return self

    def run(
        self, command: str, timeout_s: float = 60.0, stdin: Iterable[bytes] = ()
    ) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) of `command`; `stdin` chunks are streamed to it."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise HostError(self.host, "the SSH connection was lost")
        chan = transport.open_session(timeout=CONNECT_TIMEOUT_S)
        chan.settimeout(timeout_s)
        try:
            chan.exec_command(command)
            for chunk in stdin:
                chan.sendall(chunk)
            chan.shutdown_write()
            out, err = chan.makefile("rb").read(), chan.makefile_stderr("rb").read()
            return (
                chan.recv_exit_status(),
                out.decode(errors="replace"),
                err.decode(errors="replace"),
            )
        except TimeoutError:
            raise HostError(
                self.host, f"no answer within {timeout_s:g} s to: {command.split()[0]} ..."
            ) from None
        finally:
            chan.close()

    def ok(self, command: str, what: str, timeout_s: float = 60.0) -> str:
        """stdout of `command`; a HostError saying `what` failed (with stderr's last line)."""
        status, out, err = self.run(command, timeout_s)
        if status != 0:
            detail = "; ".join((err.strip() or out.strip()).splitlines())
            raise HostError(self.host, f"{what} ({detail or f'exit {status}'})")
        return out
