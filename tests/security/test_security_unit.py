"""The security rules one at a time, without a cluster: who a certificate names, what a
principal may send, what the auth file accepts, the settings that must go together, and the
tools that write certificates and tokens. Several tests here are the killers of the security
mutants in tests/raft/test_mutants.py (plain functions, no fixtures)."""

from __future__ import annotations

import functools
import json
import logging
import tempfile
import threading
import tomllib
from pathlib import Path

import prometheus_client
import pytest
import trio

from raft.cli import pki
from raft.cli.main import main as raftlog
from raft.client import ClientSecurity
from raft.node import api
from raft.node.auth import (REQUIRED, AuthError, AuthFileError, Authenticator, AuthTable,
                            Permission, Session, token_digest)
from raft.node.config import ConfigError, NodeConfig
from raft.node.gate import Gate
from raft.node.load_service import OPS as LOAD_OPS
from raft.node.logfmt import JsonFormatter
from raft.node.metrics import NodeMetrics, state_families
from raft.node.tls import Identity, NodeTLS, PeerIdentityError, TLSConfigError, identity_of
from raft.protocol.framing import WireError
from raft.protocol.hello import Hello
from raft.core.types import ErrorCode, Role

from secfixtures import make_pki


@functools.cache
def shared_pki():
    """One PKI for the whole module (and for the mutant killers, which take no fixtures)."""
    return make_pki(Path(tempfile.mkdtemp(prefix="raftlog-sec-unit-")))


def node_config(node_id: int = 1, **extra) -> NodeConfig:
    p = shared_pki()
    return NodeConfig(node_id=node_id, data_dir="/nonexistent",
                      peers={1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"},
                      **p.node_settings(node_id), **extra)


# -- identities -----------------------------------------------------------------------------------

def san(*uris: str) -> dict:
    return {"subjectAltName": tuple(("URI", u) for u in uris) + (("DNS", "localhost"),)}


@pytest.mark.parametrize("cert, expected", [
    (san("raftlog://node/3"), Identity("node", "3")),
    (san("raftlog://client/spark"), Identity("client", "spark")),
    (san("raftlog://node/0"), None),  # ids start at 1
    (san("raftlog://node/x"), None),
    (san("raftlog://client/a/b"), None),
    (san("raftlog://node/1", "raftlog://node/2"), None),  # ambiguous: refused
    (san("https://example.com"), None),
    ({"subject": ((("commonName", "legacy-app"),),)}, Identity("client", "legacy-app")),
    ({}, None),
    (None, None),
])
def test_identity_of_a_certificate(cert, expected) -> None:
    assert identity_of(cert) == expected


def test_issued_certificates_carry_the_identities_peers_check() -> None:
    p = shared_pki()
    info = pki.describe(p.node(2).cert)
    assert "URI:raftlog://node/2" in info["names"] and "IP:127.0.0.1" in info["names"]
    assert "URI:raftlog://client/ops" in pki.describe(p.client("ops").cert)["names"]
    assert pki.describe(p.node(2).cert)["issuer"] == pki.describe(p.ca)["subject"]


# -- the auth file ----------------------------------------------------------------------------------

GOOD_DIGEST = "sha256:" + "a" * 64


@pytest.mark.parametrize("data, fragment", [
    ({"users": {}}, "unknown key(s) users"),
    ({"principals": {"bad name": {}}}, "a name is"),
    ({"principals": {"a": []}}, "must be a table"),
    ({"principals": {"a": {"permissions": "consume"}}}, "must be a list"),
    ({"principals": {"a": {"permissions": ["read"]}}}, "must each be one of"),
    ({"principals": {"a": {"permissions": [], "role": "x"}}}, "unknown key(s) role"),
    ({"principals": {"a": {"tokens": ["rl_secret-token-pasted-raw"]}}}, "never the token"),
    ({"principals": {"a": {"tokens": [GOOD_DIGEST]}, "b": {"tokens": [GOOD_DIGEST]}}},
     "also listed under"),
])
def test_a_bad_auth_file_is_refused_with_the_entry_named(data, fragment) -> None:
    with pytest.raises(AuthFileError) as e:
        AuthTable.from_dict(data, source="auth.toml")
    assert fragment in str(e.value) and "auth.toml" in str(e.value)
    assert "rl_secret" not in str(e.value)  # a pasted token is never echoed


def test_the_auth_file_round_trips_through_its_writer() -> None:
    table = AuthTable.load(shared_pki().auth_file)
    again = AuthTable.from_dict(tomllib.loads(table.to_toml()))
    assert again == table
    assert all(t not in table.to_toml() for t in shared_pki().tokens.values())


def test_every_request_type_has_a_permission() -> None:
    """A new request type must be classified here (unlisted types need admin: fail closed)."""
    known = set(api.REQUESTS) | set(LOAD_OPS)
    assert known <= set(REQUIRED), sorted(known - set(REQUIRED))


# -- authentication and permissions ----------------------------------------------------------------

def authenticator() -> Authenticator:
    return Authenticator(shared_pki().auth_file)


def session_of(name: str) -> Session:
    return authenticator().authenticate(shared_pki().tokens[name], None)


# (principal, request type) -> None (allowed) or the missing permission
MATRIX = [
    ("reader", "status", None), ("reader", "load_status", None),
    ("reader", "fetch", None), ("reader", "produce", "produce"),
    ("reader", "remove_node", "admin"), ("reader", "load_stage", "produce"),
    ("writer", "produce", None), ("writer", "load_commit", None), ("writer", "fetch", "consume"),
    ("writer", "load_abort", "admin"), ("writer", "transfer_leader", "admin"),
    ("ops", "add_node", None), ("ops", "load_abort", None), ("ops", "produce", None),
    ("nobody", "status", None), ("nobody", "fetch", "consume"),
    ("ops", "some_future_request", None), ("writer", "some_future_request", "admin"),
    ("reader", "sub_commit_many", None), ("writer", "sub_commit_many", "consume"),
]


def test_permissions_per_principal_and_request_type() -> None:
    auth = authenticator()
    for name, t, missing in MATRIX:
        refusal = auth.authorize(session_of(name), t)
        if missing is None:
            assert refusal is None, (name, t, refusal)
        else:
            assert refusal is not None, (name, t)
            assert refusal.code == ErrorCode.FORBIDDEN and refusal.permission == missing
            assert f"lacks the {missing} permission" in refusal.message and name in refusal.message


def test_a_revoked_token_stops_working_on_an_open_connection() -> None:
    p = shared_pki()
    path = Path(tempfile.mkdtemp()) / "auth.toml"
    path.write_text(p.auth_file.read_text())
    auth = Authenticator(path)
    session = auth.authenticate(p.tokens["reader"], None)
    assert auth.authorize(session, "fetch") is None
    table = AuthTable.load(path)
    kept = {n: pr for n, pr in table.principals.items() if n != "reader"}
    path.write_text(AuthTable(kept).to_toml())
    auth.reload()
    refusal = auth.authorize(session, "status")
    assert refusal is not None and refusal.code == ErrorCode.UNAUTHENTICATED
    assert "revoked" in refusal.message


@pytest.mark.parametrize("hello, identity, outcome", [
    ({"token": "rl_not-a-real-token"}, None, "not valid"),
    ({}, None, "requires authentication"),
    ({"token": 42}, None, "must be a non-empty string"),
    ({"token": ""}, None, "must be a non-empty string"),
    ({"token": "x" * 600}, None, "must be a non-empty string"),
    ({}, Identity("client", "ops"), "ops"),
    # A node's own client (node-internal requests only: test_link_gap_secured.py).
    ({}, Identity("node", "2"), "node-2"),
])
def test_authentication_outcomes(hello, identity, outcome) -> None:
    """A client hello, parsed by the protocol (which owns the token's shape) and judged by the
    authenticator (which owns its validity): both refusals are UNAUTHENTICATED."""
    auth = authenticator()
    try:
        parsed = Hello.parse({"v": 1, "t": "hello", "role": "client", **hello})
        session = auth.authenticate(parsed.token, identity)
    except (AuthError, WireError) as e:
        assert not isinstance(e, WireError) or e.code == ErrorCode.UNAUTHENTICATED
        assert outcome in str(e)
        assert "rl_" not in str(e)
    else:
        assert session.principal == outcome
        assert session.method == ("node" if identity.kind == "node" else "certificate")


def test_tokens_are_stored_only_as_digests() -> None:
    p = shared_pki()
    text = p.auth_file.read_text()
    for token in p.tokens.values():
        assert token not in text and token_digest(token) in text


# -- settings that go together ------------------------------------------------------------------

@pytest.mark.parametrize("settings, fragment", [
    ({"tls_cert": "x.pem"}, "needs --tls-cert, --tls-key and --tls-ca together"),
    ({"tls_cert": "/nonexistent/c.pem", "tls_key": "/nonexistent/k.pem",
      "tls_ca": "/nonexistent/ca.pem"}, "is not a readable file"),
    ({"auth_file": "auth.toml"}, "auth_file needs TLS"),
    ({"metrics_listen": "nowhere"}, "must look like HOST:PORT"),
    ({"log_format": "xml"}, "log format"),
])
def test_security_settings_are_checked_up_front(settings, fragment) -> None:
    with pytest.raises(ConfigError) as e:
        NodeConfig(node_id=1, data_dir="/tmp/x", peers={1: "127.0.0.1:1"}, **settings).validate()
    assert fragment in str(e.value)


def test_a_node_refuses_a_certificate_of_another_node_or_a_foreign_key() -> None:
    p = shared_pki()
    with pytest.raises(TLSConfigError, match="names node"):
        NodeTLS(1, p.node(2).cert, p.node(2).key, p.ca)
    with pytest.raises(TLSConfigError, match="does not fit"):
        NodeTLS(1, p.node(1).cert, p.node(2).key, p.ca)
    with pytest.raises(TLSConfigError, match="not a PEM"):
        NodeTLS(1, p.node(1).cert, p.node(1).key, p.node(1).key)


def test_a_node_refuses_an_expired_certificate(tmp_path: Path) -> None:
    p = shared_pki()
    out = pki.Issued(tmp_path / "n1.pem", tmp_path / "n1-key.pem")
    pki.issue_node(p.dir, 1, days=0, out=out)
    with pytest.raises(TLSConfigError, match="expired"):
        NodeTLS(1, out.cert, out.key, p.ca)


# -- the peer identity checks (mutant killers) -----------------------------------------------------

def test_a_peer_hello_must_match_its_certificate() -> None:
    gate = Gate(node_config(1), NodeMetrics())
    gate.check_peer(2, Identity("node", "2"), "test")
    for identity in (Identity("node", "3"), Identity("client", "2"), None):
        with pytest.raises(WireError) as e:
            gate.check_peer(2, identity, "test")
        assert e.value.code == ErrorCode.UNAUTHENTICATED


class _FakeTLS:
    def __init__(self, cert: dict) -> None:
        self.cert = cert

    def getpeercert(self) -> dict:
        return self.cert


def test_a_dialled_peer_must_present_the_expected_node_id() -> None:
    p = shared_pki()
    tls = NodeTLS(1, p.node(1).cert, p.node(1).key, p.ca)
    tls.check_peer(_FakeTLS(san("raftlog://node/2")), 2)  # type: ignore[arg-type]
    for cert in (san("raftlog://node/3"), san("raftlog://client/2"), {}):
        with pytest.raises(PeerIdentityError):
            tls.check_peer(_FakeTLS(cert), 2)  # type: ignore[arg-type]


# -- tools ---------------------------------------------------------------------------------------

def test_certs_cli_init_issue_show(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = tmp_path / "tls"
    assert raftlog(["certs", "init", "--dir", str(d)]) == 0
    assert (d / "ca-key.pem").stat().st_mode & 0o077 == 0  # the key is private
    assert raftlog(["certs", "init", "--dir", str(d)]) == 2  # never replaced by accident
    assert "already exists" in capsys.readouterr().err
    assert raftlog(["certs", "issue", "--dir", str(d), "--node-id", "7", "--host",
                    "n7.example.com", "--host", "10.1.2.3"]) == 0
    assert raftlog(["certs", "issue", "--dir", str(d), "--client", "spark"]) == 0
    capsys.readouterr()
    assert raftlog(["certs", "show", str(d / "node-7.pem")]) == 0
    names = json.loads(capsys.readouterr().out)["names"]
    assert set(names) == {"URI:raftlog://node/7", "DNS:n7.example.com", "IP:10.1.2.3"}
    NodeTLS(7, d / "node-7.pem", d / "node-7-key.pem", d / "ca.pem")  # a node accepts it
    assert raftlog(["certs", "issue", "--dir", str(tmp_path / "none"), "--node-id", "1"]) == 2


def test_token_cli_create_rotate_revoke(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "auth.toml"
    args = ["token", "create", "--auth-file", str(path), "--principal", "reader"]
    assert raftlog(args) == 2  # a new principal needs permissions
    assert raftlog([*args, "--permissions", "consume"]) == 0
    first = capsys.readouterr().out.strip()
    assert raftlog(args) == 0  # a second token, same permissions
    second = capsys.readouterr().out.strip()
    auth = Authenticator(path)
    assert first not in path.read_text() and second not in path.read_text()
    for token in (first, second):
        assert auth.authenticate(token, None).principal == "reader"
    assert raftlog([*args, "--replace"]) == 0  # rotation: the others go
    third = capsys.readouterr().out.strip()
    auth.reload()
    assert auth.authenticate(third, None).principal == "reader"
    with pytest.raises(AuthError):
        auth.authenticate(first, None)
    assert AuthTable.load(path).principals["reader"].permissions == {Permission.CONSUME}
    assert raftlog(["token", "revoke", "--auth-file", str(path), "--principal", "reader"]) == 0
    auth.reload()
    with pytest.raises(AuthError):
        auth.authenticate(third, None)
    assert raftlog([*args[:4], "--principal", "x", "--permissions", "read"]) == 2


def test_client_security_settings(tmp_path: Path) -> None:
    p = shared_pki()
    with pytest.raises(ConfigError, match="both --tls-cert and --tls-key"):
        ClientSecurity.create(tls_ca=p.ca, tls_cert=p.client("ops").cert)
    with pytest.raises(ConfigError, match="does not exist"):
        ClientSecurity.create(tls_ca=tmp_path / "missing.pem")
    with pytest.raises(ConfigError, match="without spaces"):
        ClientSecurity.create(token="two words")
    sec = ClientSecurity.create(tls_ca=p.ca, token=p.tokens["ops"])
    assert sec.tls and p.tokens["ops"] not in repr(sec)


# -- logs and metrics -------------------------------------------------------------------------------

def test_json_log_lines_carry_node_term_and_event() -> None:
    fmt = JsonFormatter(lambda: {"node": 3, "term": 7})
    record = logging.LogRecord("raftlog.node", logging.INFO, __file__, 1,
                               "state_changed node=%d role=%s term=%d leader=%s error=%r",
                               (3, "leader", 7, None, "x y"), None)
    line = json.loads(fmt.format(record))
    assert line["node"] == 3 and line["term"] == 7 and line["event"] == "state_changed"
    assert line["role"] == "leader" and line["leader"] == "None" and line["error"] == "x y"
    assert line["f_node"] == 3 and line["level"] == "INFO" and line["ts"].endswith("Z")


def test_metric_families_from_a_status_map() -> None:
    st = {"role": "leader", "term": 5, "leader_id": 1, "dirty_offset": 100,
          "flushed_offset": 99, "commit_index": 90, "high_watermark": 90, "start_offset": 0,
          "voters": [1, 2, 3], "learners": [],
          "followers": [{"node_id": 2, "match_index": 80, "flushed_offset": 70,
                         "bytes_behind": 2000, "catchup_bytes_per_s": 5.0, "recovering": True}],
          "links": {"2": {"connected": True, "dropped": 3}}, "acked_bytes": {2: 12345}}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in state_families(st) for s in fam.samples}
    assert samples[("raftlog_role", (("role", "leader"),))] == 1
    assert samples[("raftlog_role", (("role", "follower"),))] == 0
    assert samples[("raftlog_commit_index", ())] == 90
    assert samples[("raftlog_follower_lag_offsets", (("follower", "2"), ("kind", "match")))] == 20
    assert samples[("raftlog_follower_lag_offsets", (("follower", "2"), ("kind", "flushed")))] == 30
    assert samples[("raftlog_follower_lag_bytes", (("follower", "2"), ("kind", "flushed")))] == 3000
    assert samples[("raftlog_peer_dropped_messages_total", (("peer", "2"),))] == 3
    assert samples[("raftlog_follower_replicated_bytes_total", (("follower", "2"),))] == 12345


def test_state_gauges_for_retention_and_subscriptions() -> None:
    st = {"role": "follower", "retained_bytes": 4096, "subscriptions": {"subscriptions": 3},
          "retention": {"active": True, "held_by": "subscription 'etl'", "deleted_bytes": 77,
                        "deleted_batches": 2}}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in state_families(st) for s in fam.samples}
    assert samples[("raftlog_retained_bytes", ())] == 4096
    assert samples[("raftlog_retention_held", ())] == 1
    assert samples[("raftlog_retention_deleted_bytes_total", ())] == 77
    assert samples[("raftlog_retention_deleted_batches_total", ())] == 2
    assert samples[("raftlog_subscriptions", ())] == 3
    samples = {s.name: s.value for fam in state_families({"role": "leader"}) for s in fam.samples}
    assert samples["raftlog_retention_held"] == 0 and samples["raftlog_subscriptions"] == 0


def test_election_counters() -> None:
    m = NodeMetrics()
    m.observe_state(1, Role.PRE_CANDIDATE, 0, None, None)
    m.observe_state(1, Role.CANDIDATE, 1, None, 1)
    m.observe_state(1, Role.LEADER, 1, 1, 1)
    m.observe_state(1, Role.FOLLOWER, 2, 2, None)
    m.observe_state(1, Role.FOLLOWER, 2, 2, None)
    value = m.registry.get_sample_value
    assert value("raftlog_elections_started_total") == 1
    assert value("raftlog_elections_won_total") == 1
    assert value("raftlog_leader_changes_total") == 2


def test_a_scrape_from_another_thread_reads_state_on_the_trio_thread() -> None:
    m = NodeMetrics()
    seen: list[object] = []

    async def main() -> None:
        m.bind(lambda: (seen.append(threading.current_thread()), {"term": 9})[1])
        text = await trio.to_thread.run_sync(
            lambda: prometheus_client.generate_latest(m.registry).decode())
        assert "raftlog_term 9.0" in text

    trio.run(main)
    assert seen == [threading.main_thread()]


def test_an_unknown_token_is_refused() -> None:
    with pytest.raises(AuthError):
        authenticator().authenticate("rl_" + "x" * 43, None)


def test_a_node_refuses_a_forbidden_request_before_dispatch() -> None:
    """A one-node TLS cluster with an auth file: a consume-only token cannot produce (FORBIDDEN
    naming the permission; nothing reaches the log), reads on the same connection, and an
    admin certificate produces."""
    from raft.client import Client, PermissionDeniedError
    from raft.node.server import Node
    from storage.memory import MemoryLog

    p = shared_pki()
    config = NodeConfig(node_id=1, data_dir="/nonexistent", peers={1: "127.0.0.1:0"},
                        tick_ms=10, election_ticks=5, auth_file=str(p.auth_file),
                        **p.node_settings(1))
    memlog = MemoryLog()
    seen: dict[str, object] = {}

    async def main() -> None:
        node = Node(config, log_storage=memlog)
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            try:
                with trio.fail_after(20):
                    while not node.is_leader():
                        await trio.sleep(0.01)
                async with Client(node.address, tls_ca=str(p.ca),
                                  token=p.tokens["reader"]) as c:
                    seen["dirty_before"] = memlog.dirty_offset
                    try:
                        await c.produce([b"x"])
                    except PermissionDeniedError as e:
                        seen["refused"] = e.permission
                    seen["dirty_after"] = memlog.dirty_offset
                    seen["read"] = (await c.fetch(0)).high_watermark
                    seen["conn_ok"] = [not x.broken for x in c._conns.values()]
                ops = p.client("ops")
                async with Client(node.address, tls_ca=str(p.ca), tls_cert=str(ops.cert),
                                  tls_key=str(ops.key)) as c:
                    seen["admin_offset"] = (await c.produce([b"y"])).base_offset
            finally:
                node.request_shutdown()

    trio.run(main)
    # Asserted here, outside trio: a mutant test needs the plain failure, not a group.
    assert seen["refused"] == "produce", seen
    assert seen["dirty_after"] == seen["dirty_before"]
    assert seen["read"] >= 0 and seen["conn_ok"] == [True]
    assert seen["admin_offset"] > seen["dirty_before"]


def test_a_node_refuses_a_revoked_tokens_next_request_on_its_open_connection() -> None:
    """The node-wide check before dispatch is the only one that knows a token was revoked
    (the per-topic check after routing looks at permissions only): a reader's connection
    stays open across the SIGHUP reload that revoked its token, and its next fetch is
    UNAUTHENTICATED, not served."""
    from raft.client import Client, RaftlogError
    from raft.node.server import Node
    from storage.memory import MemoryLog

    p = shared_pki()
    path = Path(tempfile.mkdtemp()) / "auth.toml"
    path.write_text(p.auth_file.read_text())
    settings = p.node_settings(1)
    settings["auth_file"] = str(path)
    config = NodeConfig(node_id=1, data_dir="/nonexistent", peers={1: "127.0.0.1:0"},
                        tick_ms=10, election_ticks=5, **settings)
    seen: dict[str, object] = {}

    async def main() -> None:
        node = Node(config, log_storage=MemoryLog())
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            try:
                with trio.fail_after(20):
                    while not node.is_leader():
                        await trio.sleep(0.01)
                async with Client(node.address, tls_ca=str(p.ca),
                                  token=p.tokens["reader"]) as c:
                    seen["before"] = (await c.fetch(0)).high_watermark
                    table = AuthTable.load(path)
                    kept = {n: pr for n, pr in table.principals.items() if n != "reader"}
                    path.write_text(AuthTable(kept).to_toml())
                    node.reload_security()  # what SIGHUP does
                    try:
                        seen["after"] = (await c.fetch(0)).high_watermark
                    except RaftlogError as e:
                        seen["refused"] = str(e)
            finally:
                node.request_shutdown()

    trio.run(main)
    assert isinstance(seen["before"], int), seen
    assert "after" not in seen and "revoked" in str(seen.get("refused")), seen


def test_security_settings_from_toml(tmp_path: Path) -> None:
    p = shared_pki()
    toml = tmp_path / "node.toml"
    toml.write_text(
        f'node_id = 1\ndata_dir = "{tmp_path}"\npeers = {{ "1" = "127.0.0.1:7101" }}\n'
        f'tls_cert = "{p.node(1).cert}"\ntls_key = "{p.node(1).key}"\ntls_ca = "{p.ca}"\n'
        f'auth_file = "{p.auth_file}"\nmetrics_listen = "127.0.0.1:9101"\n'
        f'log_format = "json"\n')
    config = NodeConfig.from_toml(toml)
    assert config.tls_enabled and config.auth_file == str(p.auth_file)
    assert config.metrics_listen == "127.0.0.1:9101" and config.log_format == "json"
    gate = Gate(config, NodeMetrics())
    assert gate.tls is not None and gate.auth.enabled
    flags = NodeConfig.from_args({"config": str(toml), "metrics_listen": "127.0.0.1:9200"})
    assert flags.metrics_listen == "127.0.0.1:9200"  # a flag wins over the file


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_a_tls_client_of_a_plaintext_node_is_told_so() -> None:
    from raft.client import Client, TLSError
    from raft.node.server import Node
    from storage.memory import MemoryLog

    config = NodeConfig(node_id=1, data_dir="/nonexistent", peers={1: "127.0.0.1:0"},
                        tick_ms=10, election_ticks=5)
    seen: dict[str, object] = {}

    async def main() -> None:
        node = Node(config, log_storage=MemoryLog())
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            try:
                async with Client(node.address, tls_ca=str(shared_pki().ca), timeout=5) as c:
                    await c.status(node.address)
            except TLSError as e:
                seen["error"] = e.message
            finally:
                node.request_shutdown()

    records = _Records()
    logger = logging.getLogger("raftlog.node")  # whatever handlers and propagation it has
    logger.addHandler(records)
    try:
        trio.run(main)
    finally:
        logger.removeHandler(records)
    assert "does not speak TLS" in str(seen.get("error")), seen
    assert any("tls_client_refused" in m for m in records.messages)
