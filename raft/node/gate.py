"""What a connection must pass before the node serves its hello: TLS (when configured), the
peer's identity, the client's authentication. The node (raft.node.server) asks the gate at each
step; the gate owns the node's TLS material and auth table and reloads both on SIGHUP.

Every refusal is one log line (no secret in it) and a clear answer to the other end when one
can be given: a plaintext client of a TLS node gets a plaintext error frame, a TLS client of a
plaintext node a TLS alert, a client that fails to authenticate an UNAUTHENTICATED error frame.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from raft.node import tls as tlsmod
from raft.node.auth import AuthError, AuthFileError, Authenticator, Session
from raft.node.config import ConfigError, NodeConfig
from raft.node.metrics import NodeMetrics
from raft.node.tls import Identity, NodeTLS, PrefixedStream, TLSConfigError
from raft.protocol.framing import encode_frame, WireError
from raft.protocol.replies import error_frame
from raft.protocol.streams import FrameReader
from raft.core.types import ErrorCode

log = logging.getLogger("raftlog.node")


class Gate:
    def __init__(self, config: NodeConfig, metrics: NodeMetrics) -> None:
        self.node_id = config.node_id
        self._max_frame = config.max_frame_bytes
        self._metrics = metrics
        self.tls: NodeTLS | None = None
        if config.tls_enabled:
            try:
                self.tls = NodeTLS(config.node_id, config.tls_cert, config.tls_key,
                                   config.tls_ca)
            except TLSConfigError as e:
                raise ConfigError(str(e)) from None
        self.auth = Authenticator(config.auth_file)

    # -- SIGHUP ----------------------------------------------------------------------------------
    def reload(self) -> None:
        """Re-read the auth file and the TLS files; what fails to load is logged and the
        current version stays in force (a typo must not lock everyone out)."""
        if self.auth.path is not None:
            try:
                table = self.auth.reload()
            except AuthFileError as e:
                log.error("auth_reload_failed node=%d error=%s; keeping the previous table",
                          self.node_id, e)
            else:
                assert table is not None
                log.warning("auth_reloaded node=%d principals=%d tokens=%d", self.node_id,
                            len(table.principals), table.token_count)
        if self.tls is not None:
            try:
                self.tls = self.tls.reload()
            except TLSConfigError as e:
                log.error("tls_reload_failed node=%d error=%s; keeping the current "
                          "certificates", self.node_id, e)
            else:
                log.warning("tls_reloaded node=%d cert_expires=%s", self.node_id,
                            f"{self.tls.not_after:%Y-%m-%d}")

    # -- a new connection ------------------------------------------------------------------------
    async def open(self, raw: trio.SocketStream) -> tuple[trio.abc.Stream | None,
                                                         Identity | None]:
        """The stream to read the hello from (TLS or not) and the certificate's identity;
        (None, None) when the connection was refused or closed here."""
        first = await tlsmod.sniff(raw)
        if not first:
            return None, None
        if self.tls is None:
            if tlsmod.looks_like_tls(first):
                log.warning("tls_client_refused node=%d remote=%s: this node runs without "
                            "TLS", self.node_id, remote_of(raw))
                await _best_effort(raw.send_all(tlsmod.PROTOCOL_VERSION_ALERT))
                return None, None
            return PrefixedStream(raw, first), None
        if not tlsmod.looks_like_tls(first):
            await self._refuse_plaintext(raw, first)
            return None, None
        try:
            return await tlsmod.accept_tls(raw, first, self.tls.server)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            self._metrics.tls_failures.inc()
            log.info("tls_handshake_failed node=%d remote=%s reason=%s", self.node_id,
                     remote_of(raw), tlsmod.handshake_failure(e))
            return None, None

    async def _refuse_plaintext(self, raw: trio.SocketStream, first: bytes) -> None:
        """Read the plaintext hello (so closing does not reset the connection before the
        client reads our answer), then answer with an error frame."""
        self._metrics.plaintext_refused.inc()
        log.warning("plaintext_refused node=%d remote=%s: this node requires TLS",
                    self.node_id, remote_of(raw))
        reader = FrameReader(PrefixedStream(raw, first), self._max_frame)
        try:
            await reader.receive_raw()
        except (WireError, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        err = error_frame(ErrorCode.UNAUTHENTICATED,
                          f"node {self.node_id} requires TLS: plaintext connections are "
                          f"refused; connect with TLS, trusting the cluster CA (--tls-ca "
                          f"FILE or RAFTLOG_TLS_CA; `raftlog up --tls` writes it to "
                          f"<data-dir>/tls/ca.pem)")
        self._metrics.count_error(ErrorCode.UNAUTHENTICATED.name)
        await _best_effort(raw.send_all(encode_frame(err)))

    # -- the hello ---------------------------------------------------------------------------------
    def check_peer(self, claimed: int, identity: Identity | None, remote: str) -> None:
        """With TLS, a peer's certificate must name the node its hello claims to be."""
        if self.tls is None:
            return
        if identity is None or identity.node_id != claimed:
            named = "nothing" if identity is None else f"{identity.kind} {identity.name}"
            log.warning("peer_refused node=%d remote=%s claimed=%d certificate=%s",
                        self.node_id, remote, claimed, named)
            raise WireError(f"the hello claims node {claimed} but the certificate names "
                            f"{named}; a node needs a certificate for its own id from "
                            f"the cluster CA (raftlog certs issue --node-id {claimed})",
                            code=ErrorCode.UNAUTHENTICATED)

    def authenticate(self, token: str | None, identity: Identity | None,
                     remote: str) -> Session:
        """The session of a client whose hello carried `token` (None: none)."""
        try:
            return self.auth.authenticate(token, identity)
        except AuthError as e:
            self._metrics.auth_failures.inc()
            log.warning("auth_failed node=%d remote=%s method=%s reason=%s", self.node_id,
                        remote, "token" if token is not None else
                        "certificate" if identity is not None else "none", e)
            raise WireError(str(e), code=ErrorCode.UNAUTHENTICATED) from None


def remote_of(stream: Any) -> str:
    """host:port of the other end, for logs ("?" when unknown)."""
    while isinstance(stream, PrefixedStream):
        stream = stream.stream
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except (AttributeError, OSError, ValueError, TypeError):
        return "?"


async def _best_effort(send: Any) -> None:
    try:
        with trio.move_on_after(2.0):
            await send
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
