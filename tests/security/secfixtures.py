"""Helpers for the security tests: a cluster CA with node and client certificates (made with
raft/cli/pki.py, as operators make them), a second CA nobody trusts, an auth file with tokens,
and small blocking TLS/plaintext wire clients that speak frames byte for byte."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from raft.cli import pki
from raft.node.auth import AuthTable, Principal, Permission, new_token, token_digest
from raft.protocol.framing import encode_frame

SOCKET_TIMEOUT_S = 20.0


@dataclass
class Pki:
    dir: Path
    other: Path  # another CA, trusted by nobody in the cluster
    tokens: dict[str, str]  # principal -> token
    auth_file: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    def node(self, node_id: int) -> pki.Issued:
        return pki.node_paths(self.dir, node_id)

    def client(self, name: str) -> pki.Issued:
        return pki.client_paths(self.dir, name)

    def node_settings(self, node_id: int) -> dict[str, str]:
        n = self.node(node_id)
        return {"tls_cert": str(n.cert), "tls_key": str(n.key), "tls_ca": str(self.ca)}

    def node_flags(self, node_id: int) -> list[str]:
        n = self.node(node_id)
        return ["--tls-cert", str(n.cert), "--tls-key", str(n.key), "--tls-ca", str(self.ca)]


PRINCIPALS = {
    "reader": {Permission.CONSUME},
    "writer": {Permission.PRODUCE},
    "ops": {Permission.ADMIN, Permission.PRODUCE, Permission.CONSUME},
    "nobody": set(),
}


def make_pki(root: Path, nodes: tuple[int, ...] = (1, 2, 3)) -> Pki:
    root = Path(root)
    pki.init_ca(root / "ca")
    for i in nodes:
        pki.issue_node(root / "ca", i)
    for name in ("ops", "stranger"):  # "stranger" has a certificate but no permissions
        pki.issue_client(root / "ca", name)
    pki.init_ca(root / "other")
    pki.issue_node(root / "other", 4)
    pki.issue_client(root / "other", "ops")
    tokens = {name: new_token() for name in PRINCIPALS}
    write_auth_file(root / "auth.toml", tokens)
    return Pki(root / "ca", root / "other", tokens, root / "auth.toml")


def write_auth_file(path: Path, tokens: dict[str, str]) -> None:
    table = AuthTable({name: Principal(name, frozenset(perms),
                                       (token_digest(tokens[name]),) if name in tokens else ())
                       for name, perms in PRINCIPALS.items()})
    AuthTable.from_dict({"principals": {  # what a node will load
        n: {"permissions": [x.value for x in p.permissions], "tokens": list(p.token_digests)}
        for n, p in table.principals.items()}})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(table.to_toml())
    tmp.replace(path)


# -- blocking wire clients ----------------------------------------------------------------------

def client_context(ca: Path, cert: pki.Issued | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    return ctx


def peer_context(ca: Path, cert: pki.Issued) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(cert.cert, cert.key)
    return ctx


class Wire:
    """One connection speaking raw frames, over TLS when given a context."""

    def __init__(self, address: str, context: ssl.SSLContext | None = None) -> None:
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S)
        self.sock = context.wrap_socket(sock, server_hostname=host) if context else sock
        self.buf = b""

    def send(self, frame: dict[str, Any]) -> None:
        self.sock.sendall(encode_frame(frame))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, n: int) -> bool:
        while len(self.buf) < n:
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError, ssl.SSLEOFError):
                return False
            if not chunk:
                return False
            self.buf += chunk
        return True

    def recv(self) -> dict[str, Any] | None:
        if not self._read(4):
            return None
        (n,) = struct.unpack(">I", self.buf[:4])
        assert self._read(4 + n), "server closed mid-frame"
        body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
        return msgpack.unpackb(body, raw=False, strict_map_key=False)

    def hello(self, **fields: Any) -> dict[str, Any] | None:
        self.send({"v": 1, "t": "hello", "role": "client", **fields})
        return self.recv()

    def request(self, t: str, rid: int, **fields: Any) -> dict[str, Any] | None:
        self.send({"v": 1, "t": t, "id": rid, **fields})
        return self.recv()

    def expect_error_then_close(self) -> dict[str, Any]:
        err = self.recv()
        assert err is not None, "connection closed without an error frame"
        assert err["t"] == "error", err
        assert isinstance(err["message"], str) and err["message"]
        assert self.recv() is None, "connection stayed open after the error frame"
        return err

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# -- processes -------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, stdin: str = "", env: dict[str, str] | None = None,
            timeout: float = 60) -> "subprocess.CompletedProcess[str]":
    """`raftlog ARGS` as a user runs it (a fresh process)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    for name in ("RAFTLOG_TOKEN", "RAFTLOG_TOKEN_FILE", "RAFTLOG_TLS_CA", "RAFTLOG_TLS_CERT",
                 "RAFTLOG_TLS_KEY"):
        if env is None or name not in env:
            full_env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "raft.cli", *args], input=stdin, text=True,
                          capture_output=True, timeout=timeout, env=full_env, cwd=REPO)


def scrape(address: str) -> dict[str, list[Any]]:
    """GET /metrics and parse it with prometheus_client's own parser: name -> samples."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{address}/metrics", timeout=SOCKET_TIMEOUT_S) as r:
        assert r.headers.get_content_type() == "text/plain", r.headers
        text = r.read().decode()
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def gauge(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v
                                                            for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]
