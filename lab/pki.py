"""The lab's certificates: one CA and an identity (`protocol.tls`) for every party of an inventory.

    python -m lab certs --hosts lab.yaml --topo lab-topo.yaml --pki ~/ces-pki [--days 365]

makes (or keeps) in the `--pki` folder:

    ca.pem, ca.key            the lab's CA (its key never leaves this folder)
    control/                  the control machine: the Master, the SDN app, the operator's
                              commands; names: the inventory's `master`, localhost, 127.0.0.1, ::1
    agent-<node>/             each host's agent; names: the node and the host's `address`
    switch-<name>/            each OpenFlow switch of the topology; names: the switch

each identity folder holding cert.pem, key.pem (0600) and ca.pem: what the party needs, copied as
it is (`lab start` installs an agent's into its container). Keys are ECDSA P-256: a handshake
signs with the server's key and, mutual, the client's; P-256 signs about twenty times faster
than RSA-2048, and every heartbeat may be a handshake. A leaf is issued again when it is
missing, names other than its party's, is not the CA's, or expires within `RENEW_DAYS`; the
rest are kept. `check_identity` is what `lab check` reports: expiry and names.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from protocol.tls import CA, CERT, CONTROL, KEY, agent_identity, switch_identity
from topologies import Topology

PKI_ENV = "CES_PKI_DIR"  # the default of every command's --pki
CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_DAYS = 30  # `lab check` warns, and `lab certs` renews, this close to expiry
CA_KEY, CA_CERT = "ca.key", "ca.pem"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class PkiError(ValueError):
    """A certificate folder that cannot be used: one line naming the file and the problem."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_private(path: Path, data: bytes) -> None:
    """A file only its owner may read, never readable by others for an instant."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def make_ca(common_name: str = "CES lab CA", days: int = CA_DAYS):
    """(key, certificate) of a new CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key,
    ca_cert: x509.Certificate,
    identity: str,
    names: list[str],
    days: int = LEAF_DAYS,
    not_before: dt.datetime | None = None,
):
    """(key, certificate) of `identity` (its common name), `names` in its subject alternative
    names, signed by the CA; usable as a server's and as a client's (mutual TLS)."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or _now() - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([_general_name(n) for n in dict.fromkeys(names)]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def write_identity(folder: Path, key, cert: x509.Certificate, ca_cert: x509.Certificate) -> None:
    """An identity folder (0700): cert.pem, key.pem (0600), ca.pem."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    _write_private(folder / KEY, _key_pem(key))
    (folder / CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / CA).write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))


def load_ca(pki: Path):
    """(key, certificate) of the CA in `pki`, made there if absent."""
    key_file, cert_file = pki / CA_KEY, pki / CA_CERT
    if not key_file.exists() and not cert_file.exists():
        pki.mkdir(parents=True, exist_ok=True, mode=0o700)
        key, cert = make_ca()
        _write_private(key_file, _key_pem(key))
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return key, cert
    try:
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError) as e:
        raise PkiError(f"{pki}: the CA ({CA_KEY}, {CA_CERT}) cannot be read: {e}") from None
    if key.public_key() != cert.public_key():
        raise PkiError(f"{pki}: {CA_KEY} is not the key of {CA_CERT}")
    return key, cert


class Lab(Protocol):
    """What the certificates are made from: the lab's inventory (`Inventory`) or a cluster bound
    to its topology (`lab.cluster.Layout`, several agents on one host)."""

    @property
    def master(self) -> str: ...

    def agent_addresses(self) -> dict[str, str]: ...


def parties(inv: Lab, topo: Topology) -> dict[str, list[str]]:
    """Every identity of the lab and the names its certificate must carry."""
    out = {CONTROL: [inv.master, *LOOPBACK_NAMES]}
    for node, address in inv.agent_addresses().items():
        out[agent_identity(node)] = [node, address]
    for sw in topo.switches:
        out[switch_identity(sw.name)] = [sw.name]
    return out


@dataclass(frozen=True)
class CertFacts:
    """What a certificate says, as `lab check` reports it."""

    identity: str
    names: tuple[str, ...]
    not_after: dt.datetime

    def days_left(self) -> float:
        return (self.not_after - _now()).total_seconds() / 86400


def read_cert(folder: Path, ca_cert: x509.Certificate | None = None) -> CertFacts:
    """The facts of the certificate in identity folder `folder`, checked to be signed by
    `ca_cert` when given; a PkiError naming the file otherwise."""
    path = folder / CERT
    try:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as e:
        raise PkiError(f"{path}: cannot read it ({e.strerror})") from None
    except ValueError:
        raise PkiError(f"{path}: not a PEM certificate") from None
    if ca_cert is not None:
        try:
            cert.verify_directly_issued_by(ca_cert)
        except (ValueError, TypeError, InvalidSignature):
            raise PkiError(f"{path}: not signed by the lab's CA") from None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for v in san.get_values_for_type(x509.IPAddress)]
        names += san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        names = []
    return CertFacts(str(cns[0].value) if cns else "", tuple(names), cert.not_valid_after_utc)


def _canonical(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def check_identity(pki: Path, identity: str, names: list[str]) -> tuple[CertFacts | None, str]:
    """(its facts, the problem: '' if none) of `identity`'s certificate in `pki`: present,
    signed by the lab's CA, named `identity`, carrying every one of `names`, valid for more
    than `RENEW_DAYS`."""
    where = pki / identity / CERT
    try:
        ca = x509.load_pem_x509_certificate((pki / CA_CERT).read_bytes())
    except (OSError, ValueError):
        return None, f"{pki / CA_CERT}: the lab's CA cannot be read (python -m lab certs)"
    try:
        facts = read_cert(pki / identity, ca)
    except PkiError as e:
        return None, str(e)
    if facts.identity != identity:
        return facts, f"{where}: it is {facts.identity!r}'s certificate, not {identity!r}'s"
    missing = [n for n in names if _canonical(n) not in {_canonical(x) for x in facts.names}]
    if missing:
        return facts, (
            f"{where}: names {', '.join(facts.names)}, not {', '.join(missing)} "
            "(python -m lab certs issues it again)"
        )
    left = facts.days_left()
    if left <= 0:
        return facts, f"{where}: expired on {facts.not_after:%Y-%m-%d}"
    if left < RENEW_DAYS:
        return facts, (
            f"{where}: expires on {facts.not_after:%Y-%m-%d}, in {left:.0f} days "
            "(python -m lab certs renews it)"
        )
    return facts, ""


def make_lab(pki: Path, inv: Lab, topo: Topology, days: int = LEAF_DAYS) -> dict[str, str]:
    """The CA and every party's identity in `pki` (see the module doc): what was done, by
    identity ("made", "kept", "renewed: <why>")."""
    ca_key, ca_cert = load_ca(pki)
    done = {}
    for identity, names in parties(inv, topo).items():
        folder = pki / identity
        if not (folder / CERT).exists():
            why = ""
        else:
            _, why = check_identity(pki, identity, names)
            if not why and not (folder / KEY).exists():
                why = f"{KEY} missing"
            if not why:
                done[identity] = "kept"
                continue
        key, cert = issue(ca_key, ca_cert, identity, names, days)
        write_identity(folder, key, cert, ca_cert)
        done[identity] = f"renewed: {why}" if why else "made"
    return done


def check_lab(pki: Path, inv: Lab, topo: Topology) -> tuple[dict[str, str], list[str]]:
    """Every party's certificate in `pki` checked (`check_identity`): (the expiry date of each
    good one by identity, one line per problem)."""
    good, problems = {}, []
    for identity, names in parties(inv, topo).items():
        facts, problem = check_identity(pki, identity, names)
        if problem:
            problems.append(problem)
        elif facts is not None:
            good[identity] = f"{facts.not_after:%Y-%m-%d}"
    return good, problems


def unusable(problems: list[str]) -> list[str]:
    """The problems a run cannot start with: all but a certificate close to its expiry."""
    return [p for p in problems if ": expires on " not in p]
