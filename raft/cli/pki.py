"""A small certificate authority for raftlog clusters, written with `cryptography` (never by
shelling out to openssl): what `raftlog certs` and `raftlog up --tls` use.

Identities live in the certificate's subject alternative names, as URIs that
raft.node.tls.identity_of reads back:
- a node: `raftlog://node/<id>`, plus the DNS names and IP addresses clients dial (clients check
  the host name like any TLS client; peers check the node id instead);
- a client: `raftlog://client/<name>`: the principal that the node's auth file gives
  permissions to.

Files in a directory (keys are written 0600, never printed):
    ca.pem, ca-key.pem                      the cluster CA
    node-<id>.pem, node-<id>-key.pem        one per node
    client-<name>.pem, client-<name>-key.pem
Keys are ECDSA P-256: small, and a handshake costs far less CPU than with RSA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from raft.node.tls import client_uri, node_uri

CA_DAYS = 3650
LEAF_DAYS = 825  # what public CAs may issue at most: rotate at least that often
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class PkiError(Exception):
    """A certificate cannot be made or read; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Issued:
    cert: Path
    key: Path


def ca_paths(directory: Path) -> Issued:
    return Issued(Path(directory) / "ca.pem", Path(directory) / "ca-key.pem")


def node_paths(directory: Path, node_id: int) -> Issued:
    return Issued(Path(directory) / f"node-{node_id}.pem",
                  Path(directory) / f"node-{node_id}-key.pem")


def client_paths(directory: Path, name: str) -> Issued:
    return Issued(Path(directory) / f"client-{name}.pem",
                  Path(directory) / f"client-{name}-key.pem")


def check_client_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise PkiError(f"client name {name!r} must be 1-63 letters, digits, '.', '_' or '-' "
                       f"(it becomes the principal the auth file names)")
    return name


# -- writing ------------------------------------------------------------------------------------

def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def init_ca(directory: Path, *, days: int = CA_DAYS, name: str = "raftlog cluster CA",
            force: bool = False) -> Issued:
    """A new self-signed CA in `directory` (refused if one is there, unless `force`)."""
    paths = ca_paths(directory)
    if not force and (paths.cert.exists() or paths.key.exists()):
        raise PkiError(f"{paths.cert} already exists; issue certificates with it, or pass "
                       f"--force to replace it (every certificate it signed stops working)")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    paths = ca_paths(directory)
    try:
        cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        key = serialization.load_pem_private_key(paths.key.read_bytes(), password=None)
    except FileNotFoundError as e:
        raise PkiError(f"no CA in {directory} ({e.filename} is missing); create one with "
                       f"`raftlog certs init --dir {directory}`") from None
    except ValueError as e:
        raise PkiError(f"the CA in {directory} cannot be read ({e})") from None
    return cert, key  # type: ignore[return-value]


def _san_entries(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _issue(directory: Path, paths: Issued, common_name: str, uri: str, hosts: list[str],
           usages: list[x509.ObjectIdentifier], days: int) -> Issued:
    ca_cert, ca_key = load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(uri), *_san_entries(hosts)]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(paths.key, key)
    _write_cert(paths.cert, cert)
    return paths


def issue_node(directory: Path, node_id: int, hosts: list[str] | tuple[str, ...] = LOCAL_HOSTS,
               *, days: int = LEAF_DAYS, out: Issued | None = None) -> Issued:
    """A node certificate (server and client use: nodes dial each other) naming `node_id` and
    the host names/addresses clients use to reach it."""
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id <= 0:
        raise PkiError(f"node id {node_id!r} must be a positive integer")
    return _issue(directory, out or node_paths(directory, node_id), f"raftlog node {node_id}",
                  node_uri(node_id), list(hosts),
                  [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], days)


def issue_client(directory: Path, name: str, *, days: int = LEAF_DAYS,
                 out: Issued | None = None) -> Issued:
    """A client certificate whose principal is `name`."""
    check_client_name(name)
    return _issue(directory, out or client_paths(directory, name), name, client_uri(name), [],
                  [ExtendedKeyUsageOID.CLIENT_AUTH], days)


def valid_for(path: Path, days: float = 1.0) -> bool:
    """True when the certificate at `path` exists, parses and stays valid `days` longer."""
    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError):
        return False
    return cert.not_valid_after_utc > _now() + dt.timedelta(days=days)


def local_cluster(directory: Path, node_ids: list[int]) -> tuple[Issued, dict[int, Issued]]:
    """For `raftlog up --tls`: the CA (made once, reused on restart) and a certificate for each
    node valid on this machine's loopback names (re-issued when missing or about to expire)."""
    directory = Path(directory)
    ca = ca_paths(directory)
    if not (ca.cert.exists() and ca.key.exists()) or not valid_for(ca.cert, 30):
        ca = init_ca(directory, force=True)
    nodes = {}
    for node_id in node_ids:
        paths = node_paths(directory, node_id)
        if not (paths.key.exists() and valid_for(paths.cert, 7) and _signed_by(paths.cert, ca)):
            issue_node(directory, node_id)
        nodes[node_id] = paths
    return ca, nodes


def _signed_by(cert_path: Path, ca: Issued) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
        ca_cert = x509.load_pem_x509_certificate(Path(ca.cert).read_bytes())
        cert.verify_directly_issued_by(ca_cert)
    except (OSError, ValueError, TypeError, x509.InvalidSignature):
        return False
    return True


def describe(path: Path) -> dict[str, object]:
    """What `raftlog certs show` prints: subject, identities, validity, issuer."""
    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError) as e:
        raise PkiError(f"{path} is not a PEM certificate ({e})") from None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = ([f"URI:{u}" for u in san.get_values_for_type(x509.UniformResourceIdentifier)]
                 + [f"DNS:{d}" for d in san.get_values_for_type(x509.DNSName)]
                 + [f"IP:{i}" for i in san.get_values_for_type(x509.IPAddress)])
    except x509.ExtensionNotFound:
        names = []
    return {"subject": cert.subject.rfc4514_string(), "issuer": cert.issuer.rfc4514_string(),
            "names": names, "not_before": cert.not_valid_before_utc.isoformat(),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "serial": format(cert.serial_number, "x")}
