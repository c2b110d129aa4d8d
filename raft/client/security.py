"""How a client proves who it is and checks who it talks to: TLS (the cluster CA, optionally a
client certificate) and a bearer token sent in the hello.

    Client("h:p", tls_ca="ca.pem")                       # TLS, server checked against the CA
    Client("h:p", tls_ca="ca.pem", token=os.environ["RAFTLOG_TOKEN"])
    Client("h:p", tls_ca="ca.pem", tls_cert="me.pem", tls_key="me-key.pem")

The server's host name is checked against its certificate like any TLS client does
(`raftlog certs issue --host` puts the names in). The token never appears in a repr, an error
message or a log line.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import trio

from raft.client.errors import RaftlogError
from raft.node.config import ConfigError
from raft.protocol.hello import Hello


class TLSError(RaftlogError):
    """The TLS handshake failed: the server's certificate is not trusted (wrong --tls-ca, or a
    host name it does not cover), the server refused our certificate, or one side does not
    speak TLS. Not retried: every node of a cluster would fail the same way."""

    code = "TLS_ERROR"


@dataclass(slots=True)
class ClientSecurity:
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = field(default=None, repr=False)
    _context: ssl.SSLContext | None = field(default=None, repr=False)

    @classmethod
    def create(cls, *, tls_ca: str | Path | None = None, tls_cert: str | Path | None = None,
               tls_key: str | Path | None = None, token: str | None = None
               ) -> "ClientSecurity":
        """Check the settings now (a missing file is a configuration error, not a connection
        failure found later) and build the TLS context once."""
        sec = cls(str(tls_ca) if tls_ca else None, str(tls_cert) if tls_cert else None,
                  str(tls_key) if tls_key else None, token or None)
        if (sec.tls_cert is None) != (sec.tls_key is None):
            raise ConfigError("a client certificate needs both --tls-cert and --tls-key")
        if sec.tls_cert and not sec.tls_ca:
            raise ConfigError("--tls-cert needs --tls-ca (the cluster CA that signed the "
                              "nodes' certificates)")
        if token is not None and (not isinstance(token, str) or not token.strip()
                                  or any(c.isspace() for c in token)):
            raise ConfigError("the token must be a non-empty string without spaces (as "
                              "`raftlog token create` printed it)")
        if sec.tls_ca:
            sec._context = sec._build_context()
        return sec

    @property
    def tls(self) -> bool:
        return self._context is not None

    def _build_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_verify_locations(cafile=self.tls_ca)
        except FileNotFoundError:
            raise ConfigError(f"--tls-ca {self.tls_ca} does not exist; pass the cluster CA "
                              f"(`raftlog up --tls` writes <data-dir>/tls/ca.pem)") from None
        except ssl.SSLError as e:
            raise ConfigError(f"--tls-ca {self.tls_ca} is not a PEM certificate "
                              f"({e.reason or e})") from None
        if self.tls_cert:
            try:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            except FileNotFoundError as e:
                raise ConfigError(f"client certificate file {e.filename} does not exist") \
                    from None
            except ssl.SSLError as e:
                raise ConfigError(f"--tls-key {self.tls_key} does not fit --tls-cert "
                                  f"{self.tls_cert} ({e.reason or e})") from None
        return ctx

    def hello(self) -> Hello:
        """The client hello, carrying the token when there is one."""
        return Hello.client(self.token)

    async def wrap(self, stream: trio.SocketStream, host: str, address: str
                   ) -> trio.abc.Stream:
        """The TLS handshake (when configured); TLSError says what went wrong."""
        if self._context is None:
            return stream
        tls = trio.SSLStream(stream, self._context, server_hostname=host)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as e:
            raise tls_error(address, e) from None
        return tls


def tls_error(address: str, exc: BaseException) -> Exception:
    """A failed handshake (or a failure right after it: TLS 1.3 reports a refused client
    certificate on the first read) as a TLSError that says what to check; a connection that
    simply dropped stays a connection error (retried on another node)."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if isinstance(cause, ssl.SSLCertVerificationError):
        return TLSError(f"{address}: the node's certificate is not trusted "
                        f"({cause.verify_message}); check that --tls-ca is the cluster's CA "
                        f"(and that the node's certificate covers the host name you dialled)")
    if isinstance(cause, ssl.SSLError):
        reason = cause.reason or str(cause)
        if "PROTOCOL_VERSION" in reason or "WRONG_VERSION" in reason:
            return TLSError(f"{address} does not speak TLS ({reason}); drop --tls-ca to "
                            f"connect in plaintext, or start the node with --tls-cert")
        if "UNKNOWN_CA" in reason or "CERTIFICATE" in reason or "BAD_CERT" in reason:
            return TLSError(f"{address} refused our client certificate ({reason}); use one "
                            f"signed by the cluster CA (raftlog certs issue --client NAME)")
        return TLSError(f"{address}: TLS handshake failed ({reason})")
    return ConnectionError(f"{address} closed the connection during the TLS handshake "
                           f"({cause or type(cause).__name__}); is it a raftlog node?")
