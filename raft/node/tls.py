"""TLS for a node's one port: who is on the other end, and the handshakes.

Why identities live in certificates: a peer's hello says which node it is, and without TLS any
process that can reach the port can claim to be node 2 and vote. With `--tls-cert/--tls-key/
--tls-ca`, every connection is TLS; a peer must present a certificate signed by the cluster CA
that names the node id its hello claims (`raftlog://node/<id>` in the subject alternative
names), and that node must be a member. Clients verify the node against the CA (and its host
name) like any TLS client, and may present a certificate of their own (`raftlog://client/<name>`)
to authenticate (raft.node.auth).

A node started with TLS still reads the first bytes of a connection before the handshake: a TLS
ClientHello starts with a handshake record header (0x16, then version 0x03 0x00..0x04), a
raftlog frame with its 4-byte length (0x00 for any sane frame size). A plaintext client therefore gets a plaintext error frame saying TLS is required
instead of a handshake it cannot understand. A node without TLS answers a TLS client with a
fatal TLS alert (protocol_version), which the client reports as "not a TLS node".
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

NODE_URI_PREFIX = "raftlog://node/"
CLIENT_URI_PREFIX = "raftlog://client/"
TLS_HANDSHAKE_BYTE = 0x16
# A TLS record: alert (21), version 3.1, length 2, fatal (2), protocol_version (70).
PROTOCOL_VERSION_ALERT = bytes([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46])


class TLSConfigError(ValueError):
    """The node's certificate, key or CA cannot be used; the message says which and why."""


class PeerIdentityError(Exception):
    """The other end's certificate does not name the node we expected."""


def node_uri(node_id: int) -> str:
    return f"{NODE_URI_PREFIX}{node_id}"


def client_uri(name: str) -> str:
    return f"{CLIENT_URI_PREFIX}{name}"


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a verified certificate names: a node (`name` is its id) or a client principal."""

    kind: str  # "node" or "client"
    name: str

    @property
    def node_id(self) -> int | None:
        return int(self.name) if self.kind == "node" else None

    @property
    def principal(self) -> str:
        """The name the auth file uses: the client's name, or `node-<id>` for a node."""
        return self.name if self.kind == "client" else f"node-{self.name}"


def identity_of(peercert: dict[str, Any] | None) -> Identity | None:
    """The identity in a verified peer certificate (ssl's getpeercert() dict); None when there
    is no certificate or it names no raftlog identity. A certificate naming two identities is
    refused as ambiguous (None)."""
    if not peercert:
        return None
    found: list[Identity] = []
    for kind, value in peercert.get("subjectAltName", ()):
        if kind != "URI" or not isinstance(value, str):
            continue
        if value.startswith(NODE_URI_PREFIX):
            rest = value[len(NODE_URI_PREFIX):]
            if rest.isdigit() and int(rest) > 0:
                found.append(Identity("node", str(int(rest))))
        elif value.startswith(CLIENT_URI_PREFIX):
            rest = value[len(CLIENT_URI_PREFIX):]
            if rest and "/" not in rest:
                found.append(Identity("client", rest))
    if len(found) == 1:
        return found[0]
    if not found:  # a client certificate from another tool: its common name is the principal
        for rdn in peercert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName" and isinstance(value, str) and value:
                    return Identity("client", value)
    return None


# -- the node's TLS material -------------------------------------------------------------------

class NodeTLS:
    """The contexts a node uses: `server` for every accepted connection (client certificates
    optional, verified against the CA when presented) and `peer` to dial other nodes (mutual
    TLS; the peer's identity is checked by node id, not host name)."""

    def __init__(self, node_id: int, cert: str | Path, key: str | Path, ca: str | Path) -> None:
        self.node_id = node_id
        self.cert, self.key, self.ca = Path(cert), Path(key), Path(ca)
        self.not_after = check_node_certificate(self.cert, node_id)
        self.server = self._context(ssl.Purpose.CLIENT_AUTH)
        self.server.verify_mode = ssl.CERT_OPTIONAL
        self.peer = self._context(ssl.Purpose.SERVER_AUTH)
        self.peer.check_hostname = False  # peers are checked by node id (check_peer below)
        self.peer.verify_mode = ssl.CERT_REQUIRED

    def _context(self, purpose: ssl.Purpose) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose == ssl.Purpose.CLIENT_AUTH
                             else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except FileNotFoundError as e:
            raise TLSConfigError(f"tls file {e.filename} does not exist; pass --tls-cert and "
                                 f"--tls-key of this node (raftlog certs issue)") from None
        except ssl.SSLError as e:
            raise TLSConfigError(f"tls_key {self.key} does not fit tls_cert {self.cert} or "
                                 f"is not a PEM key ({e.reason or e}); issue a new pair with "
                                 f"`raftlog certs issue`") from None
        try:
            ctx.load_verify_locations(cafile=str(self.ca))
        except FileNotFoundError:
            raise TLSConfigError(f"tls_ca {self.ca} does not exist; pass the cluster CA "
                                 f"(ca.pem from `raftlog certs init`)") from None
        except ssl.SSLError as e:
            raise TLSConfigError(f"tls_ca {self.ca} is not a PEM certificate ({e.reason or e})"
                                 ) from None
        return ctx

    def reload(self) -> "NodeTLS":
        """The same files read again (certificate rotation on SIGHUP); raises TLSConfigError
        and leaves the caller's current contexts alone if they no longer load."""
        return NodeTLS(self.node_id, self.cert, self.key, self.ca)

    def check_peer(self, stream: trio.SSLStream, expected: int) -> None:
        """After dialing: the peer's certificate must name node `expected`."""
        ident = identity_of(stream.getpeercert())
        if ident is None or ident.node_id != expected:
            named = "no node id" if ident is None else f"{ident.kind} {ident.name}"
            raise PeerIdentityError(f"the certificate presented names {named}, not node "
                                    f"{expected}; check --peers and that node's --tls-cert")


def check_node_certificate(path: Path, node_id: int) -> dt.datetime:
    """Refuse at startup a certificate that names another node, or none, or has expired
    (every peer would refuse it later, with a less direct message). Returns its expiry."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except FileNotFoundError:
        raise TLSConfigError(f"tls_cert {path} does not exist; pass this node's certificate "
                             f"(raftlog certs issue --node-id {node_id})") from None
    except (OSError, ValueError) as e:
        raise TLSConfigError(f"tls_cert {path} is not a PEM certificate ({e})") from None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    ids = [u[len(NODE_URI_PREFIX):] for u in uris if u.startswith(NODE_URI_PREFIX)]
    if ids != [str(node_id)]:
        raise TLSConfigError(f"tls_cert {path} names node(s) {ids or 'none'}, not node "
                             f"{node_id}: peers identify nodes by this; issue one with "
                             f"`raftlog certs issue --node-id {node_id}`")
    now = dt.datetime.now(dt.timezone.utc)
    if cert.not_valid_after_utc <= now:
        raise TLSConfigError(f"tls_cert {path} expired on {cert.not_valid_after_utc:%Y-%m-%d}; "
                             f"issue a new one with `raftlog certs issue --node-id {node_id}`")
    return cert.not_valid_after_utc


# -- streams -----------------------------------------------------------------------------------

class PrefixedStream(trio.abc.Stream):
    """A stream that first returns bytes already read from it (the sniffed first chunk).

    Over plain TCP (every accepted connection without TLS: clients and peers) it then reads the
    socket itself: trio's receive_some wraps each recv in two generator context managers and a
    reschedule, a large share of the leader's per-request loop time (issue 28). Bytes already
    there are returned at once (a checkpoint every PLAIN_READS_PER_CHECKPOINT such reads, so a
    fast sender cannot hold the loop), otherwise it waits for the socket to become readable;
    cancelled while waiting, it has taken no bytes (as trio's)."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix
        self._plain = stream.socket if type(stream) is trio.SocketStream else None
        self._ready_reads = 0  # reads in a row that found bytes without waiting

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            n = len(self._prefix) if max_bytes is None else max_bytes
            data, self._prefix = self._prefix[:n], self._prefix[n:]
            return data
        if self._plain is None:
            return await self.stream.receive_some(max_bytes)
        return await self._receive_plain(max_bytes or PLAIN_READ_BYTES)

    async def _receive_plain(self, max_bytes: int) -> bytes:
        sock = self._plain
        while True:
            fd = sock.fileno()
            if fd < 0:
                raise trio.ClosedResourceError("the connection is closed")
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                self._ready_reads = 0
                await trio.lowlevel.wait_readable(sock)
                continue
            except OSError as e:  # as trio's stream reports a broken connection
                raise trio.BrokenResourceError(f"the connection broke: {e}") from e
            self._ready_reads += 1
            if self._ready_reads >= PLAIN_READS_PER_CHECKPOINT:
                self._ready_reads = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data

    def take_prefix(self) -> bytes:
        """The sniffed bytes not yet returned (for a reader that takes the socket over)."""
        prefix, self._prefix = self._prefix, b""
        return prefix

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.stream.send_eof()  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        await self.stream.aclose()


SNIFF_BYTES = 3
PLAIN_READ_BYTES = 64 * 1024  # a read's size when the caller names none
PLAIN_READS_PER_CHECKPOINT = 8


async def sniff(stream: trio.abc.ReceiveStream) -> bytes:
    """The first bytes of a connection: at least SNIFF_BYTES (fewer only at EOF), enough to
    tell a TLS record from a frame. The caller bounds the wait (the hello timeout)."""
    first = b""
    while len(first) < SNIFF_BYTES:
        data = await stream.receive_some(4096)
        if not data:
            break
        first += data
    return first


def looks_like_tls(first: bytes) -> bool:
    """A TLS handshake record header: type 0x16, version 3.0 to 3.4 (what every ClientHello
    starts with; random bytes match it one time in millions)."""
    return (len(first) >= SNIFF_BYTES and first[0] == TLS_HANDSHAKE_BYTE and first[1] == 0x03
            and first[2] <= 0x04)


async def accept_tls(stream: trio.abc.Stream, first: bytes,
                     context: ssl.SSLContext) -> tuple[trio.SSLStream, Identity | None]:
    """The server side of the handshake on a connection whose first bytes were sniffed;
    returns the TLS stream and the identity of the client's certificate, if it sent one."""
    tls = trio.SSLStream(PrefixedStream(stream, first), context, server_side=True)
    await tls.do_handshake()
    return tls, identity_of(tls.getpeercert())


async def dial_tls(stream: trio.abc.Stream, context: ssl.SSLContext,
                   host: str) -> trio.SSLStream:
    tls = trio.SSLStream(stream, context, server_hostname=host)
    await tls.do_handshake()
    return tls


def handshake_failure(exc: BaseException) -> str:
    """A short reason for a failed handshake (the ssl error under trio's wrapper)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, ssl.SSLError):
        return cause.reason or cause.strerror or str(cause)
    return str(cause) or type(cause).__name__
