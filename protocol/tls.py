"""TLS for every CES API: who is who in the lab's certificates, the one place SSL contexts are
built (every server and client of `protocol.http` takes them from here), and the rule that plain
HTTP stays on loopback.

An *identity* is a folder of three PEM files, as `python -m lab certs` makes one per party:

    cert.pem   the party's certificate, signed by the lab's CA
    key.pem    its private key (mode 0600: a key others may read is refused)
    ca.pem     the lab's CA: every peer must chain to it

The certificate's common name says who the party is — `control` (the control machine: the Master,
the SDN app and the operator's commands), `agent-<node>` (the edge agent of a host),
`switch-<name>` (an OpenFlow switch) — and its subject alternative names carry the host's names
and addresses, which a client checks against the URL it called. Both sides verify: a server
requires a client certificate from the lab's CA (mutual TLS) and each API says which identities
may call what (`JsonApp(peers=...)`); a client checks the server's chain and name.

Standard library only: an edge host needs the `ssl` module and its three files, nothing else.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CERT, KEY, CA = "cert.pem", "key.pem", "ca.pem"
TLS_DIR_ENV = "CES_TLS_DIR"
CONTROL = "control"  # the control machine's identity: Master, SDN app, operator
AGENT_PREFIX, SWITCH_PREFIX = "agent-", "switch-"
# A client that connects and never finishes its handshake holds a serving thread this long.
HANDSHAKE_TIMEOUT_S = 10.0


class TlsError(ValueError):
    """An identity that cannot be used (a file missing, unreadable, too open, not matching), or
    a server that would listen beyond loopback in plain HTTP without `--insecure`."""


def agent_identity(node: str) -> str:
    return f"{AGENT_PREFIX}{node}"


def switch_identity(switch: str) -> str:
    return f"{SWITCH_PREFIX}{switch}"


def agent_node(identity: str | None) -> str | None:
    """The node of an agent's identity; None for any other."""
    if identity and identity.startswith(AGENT_PREFIX):
        return identity[len(AGENT_PREFIX) :]
    return None


@dataclass(frozen=True)
class Tls:
    """One party's TLS: the identity folder and the two contexts built from it (the Master and
    the agents are servers and clients both)."""

    folder: Path
    server: ssl.SSLContext = field(repr=False)
    client: ssl.SSLContext = field(repr=False)


def identity_files(folder: str | os.PathLike) -> tuple[Path, Path, Path]:
    f = Path(folder)
    return f / CERT, f / KEY, f / CA


def load_tls(folder: str | os.PathLike) -> Tls:
    """The identity in `folder`; a TlsError naming the file and the problem otherwise. The one
    builder of SSL contexts: TLS 1.2 or later, the peer's certificate required and verified
    against the lab's CA on both sides, the server's name checked by clients."""
    cert, key, ca = identity_files(folder)
    for path in (cert, key, ca):
        if not path.is_file():
            raise TlsError(f"TLS identity {folder}: {path.name} is missing (python -m lab certs)")
    mode = key.stat().st_mode
    if mode & 0o077:
        raise TlsError(
            f"TLS identity {folder}: {KEY} is readable by others (mode "
            f"{mode & 0o777:o}); chmod 600 it"
        )
    contexts = []
    for purpose in (ssl.PROTOCOL_TLS_SERVER, ssl.PROTOCOL_TLS_CLIENT):
        ctx = ssl.SSLContext(purpose)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(cert, key)
            ctx.load_verify_locations(cafile=ca)
        except ssl.SSLError as e:
            raise TlsError(
                f"TLS identity {folder}: {e.reason or e} (a key that is not the "
                f"certificate's, or not PEM)"
            ) from None
        except OSError as e:
            raise TlsError(f"TLS identity {folder}: cannot read it ({e.strerror})") from None
        ctx.verify_mode = ssl.CERT_REQUIRED  # a server too: mutual TLS
        contexts.append(ctx)
    return Tls(Path(folder), *contexts)


def default_tls_dir() -> str:
    return os.environ.get(TLS_DIR_ENV, "")


def peer_identity(sock: object) -> str | None:
    """The common name of the verified certificate `sock`'s peer presented (None: no TLS)."""
    if not isinstance(sock, ssl.SSLSocket):
        return None
    cert = sock.getpeercert() or {}
    for rdn in cert.get("subject", ()):
        for attribute in rdn:
            if attribute[0] == "commonName":
                return str(attribute[1])
    return None


def control_only(peer: str | None, method: str, path: str) -> bool:
    """The `peers` rule of an API only the control machine calls (an agent's command channel,
    the SDN app's REST API): the Master and the operator hold its certificate; an agent's or a
    switch's certificate, though the lab's CA signed it, may not."""
    return peer == CONTROL
