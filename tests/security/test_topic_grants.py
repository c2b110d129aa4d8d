"""Topic-scoped permissions (issue 26 item 7): an auth file principal with `topics` grants may
use only the topics they match, checked per request against the topic the request reaches;
`metadata` shows it only those topics; principals without grants keep their node-wide meaning
(the rest of tests/security runs on auth files without any grant)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import trio

from raft.core.types import ErrorCode
from raft.node.auth import AuthFileError, AuthTable, Authenticator, new_token, token_digest
from raft.node.config import NodeConfig
from test_security_unit import shared_pki

ORDERS_GRANTS = ["produce:orders.*", "consume:orders.*"]


def grants_file() -> tuple[Path, str]:
    """The shared PKI's auth file plus principal `orders-app` (token, topic grants only)."""
    p = shared_pki()
    token = new_token()
    path = Path(tempfile.mkdtemp(prefix="raftlog-grants-")) / "auth.toml"
    path.write_text(p.auth_file.read_text() + "\n[principals.orders-app]\npermissions = []\n"
                    f"topics = {ORDERS_GRANTS!r}\n".replace("'", '"')
                    + f'tokens = ["{token_digest(token)}"]\n')
    return path, token


def test_grants_are_checked_against_the_topic_and_an_old_file_means_what_it_did() -> None:
    path, token = grants_file()
    auth = Authenticator(path)
    orders = auth.authenticate(token, None)
    assert auth.authorize(orders, "produce") is None  # a grant may cover it: topic decides
    assert auth.authorize_topic(orders, "produce", "orders.eu") is None
    refused = auth.authorize_topic(orders, "produce", "payments")
    assert refused is not None and refused.code == ErrorCode.FORBIDDEN
    assert refused.permission == "produce" and refused.topic == "payments"
    assert "'payments'" in refused.message and "produce" in refused.message
    assert auth.authorize_topic(orders, "fetch", "payments") is not None
    assert auth.authorize_topic(orders, "produce", None) is not None  # no topic: node-wide
    assert auth.authorize(orders, "remove_node") is not None  # membership is not a topic's
    assert auth.authorize(orders, "topic_create") is not None  # no admin grant at all
    assert auth.visible_topics(orders, ["default", "orders.eu", "payments"]) == ["orders.eu"]
    # Principals without grants: node-wide as before, every topic visible.
    reader = auth.authenticate(shared_pki().tokens["reader"], None)
    assert auth.authorize_topic(reader, "fetch", "payments") is None
    assert auth.visible_topics(reader, ["orders.eu", "payments"]) is None
    # The writer round-trips grants.
    table = AuthTable.load(path)
    import tomllib
    assert AuthTable.from_dict(tomllib.loads(table.to_toml())) == table


@pytest.mark.parametrize("grants, fragment", [
    (["write:orders"], "PERMISSION:PATTERN"), (["produce:or*ders"], "'*' may only end"),
    ("produce:orders", "must be a list"),
])
def test_a_bad_grant_is_refused_naming_the_principal(grants, fragment) -> None:
    with pytest.raises(AuthFileError) as e:
        AuthTable.from_dict({"principals": {"app": {"permissions": [], "topics": grants}}},
                            source="auth.toml")
    assert fragment in str(e.value) and "[principals.app]" in str(e.value)


def test_a_prefix_grant_produces_to_its_topics_only_and_sees_only_them() -> None:
    """A one-node TLS node with the grants file: the `orders.*` token produces to orders.eu,
    gets FORBIDDEN naming payments and the permission (nothing reaches payments' log), and
    its metadata lists orders.eu only; the admin certificate sees every topic."""
    from raft.client import Client, PermissionDeniedError
    from raft.node.server import Node
    from storage.memory import MemoryLog

    p = shared_pki()
    path, token = grants_file()
    config = NodeConfig(node_id=1, data_dir="/nonexistent", peers={1: "127.0.0.1:0"},
                        tick_ms=10, election_ticks=5, auth_file=str(path),
                        **p.node_settings(1))
    seen: dict[str, object] = {}

    async def main() -> None:
        node = Node(config, log_storage=MemoryLog())
        ops = p.client("ops")
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)
            try:
                async with Client(node.address, tls_ca=str(p.ca), tls_cert=str(ops.cert),
                                  tls_key=str(ops.key), timeout=20) as admin:
                    for name in ("orders.eu", "payments"):
                        await admin.create_topic(name, 1, 1)
                    seen["admin_topics"] = [t.name for t in await admin.list_topics()]
                async with Client(node.address, tls_ca=str(p.ca), token=token,
                                  timeout=20) as c:
                    seen["orders"] = (await c.produce([b"o"], topic="orders.eu")).base_offset
                    try:
                        await c.produce([b"p"], topic="payments")
                    except PermissionDeniedError as e:
                        seen["refused"] = (e.permission, str(e))
                    seen["topics"] = [t.name for t in await c.list_topics()]
                    seen["read"] = len((await c.fetch(0, topic="orders.eu")).records)
                gid = node.topics.metadata.topics["payments"].partitions[0].group
                seen["payments_dirty"] = node.registry.get(gid).log.dirty_offset
            finally:
                node.request_shutdown()

    trio.run(main)
    # Asserted here, outside trio: a mutant test needs the plain failure, not a group.
    assert seen["orders"] >= 0
    permission, message = seen.get("refused", (None, "the produce to payments was accepted"))
    assert permission == "produce" and "'payments'" in message, seen
    assert seen["payments_dirty"] < 1, "a refused produce reached the log"
    assert seen["topics"] == ["orders.eu"], seen
    assert {"default", "orders.eu", "payments"} <= set(seen["admin_topics"]), seen
    assert seen["read"] == 1


def test_token_create_and_revoke_keep_a_principals_topic_grants(tmp_path: Path) -> None:
    from raft.cli.main import main as cli_main
    path, _token = grants_file()
    assert cli_main(["token", "create", "--auth-file", str(path), "--principal", "orders-app",
                     "--replace"]) == 0
    assert [str(g) for g in AuthTable.load(path).principals["orders-app"].grants] == ORDERS_GRANTS
    assert cli_main(["token", "revoke", "--auth-file", str(path), "--principal",
                     "orders-app"]) == 0
    assert [str(g) for g in AuthTable.load(path).principals["orders-app"].grants] == ORDERS_GRANTS


def test_token_create_sets_replaces_and_drops_topic_grants(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    """`--topics` gives a new principal grants only (nothing node-wide), replaces an existing
    principal's grants, '' drops them; a bad grant is refused and the file is left as it was."""
    from raft.cli.main import main as cli_main
    path = tmp_path / "auth.toml"
    assert cli_main(["token", "create", "--auth-file", str(path), "--principal", "app",
                     "--topics", "produce:orders.*, consume:logs"]) == 0
    app = AuthTable.load(path).principals["app"]
    assert [str(g) for g in app.grants] == ["produce:orders.*", "consume:logs"]
    assert app.permissions == frozenset()
    assert cli_main(["token", "create", "--auth-file", str(path), "--principal", "app",
                     "--topics", "admin:team-a.*"]) == 0
    app = AuthTable.load(path).principals["app"]
    assert [str(g) for g in app.grants] == ["admin:team-a.*"] and len(app.token_digests) == 2
    before = path.read_text()
    assert cli_main(["token", "create", "--auth-file", str(path), "--principal", "app",
                     "--topics", "write:x"]) != 0
    assert "--topics" in capsys.readouterr().err and path.read_text() == before
    assert cli_main(["token", "create", "--auth-file", str(path), "--principal", "app",
                     "--topics", "", "--permissions", "consume"]) == 0
    app = AuthTable.load(path).principals["app"]
    assert app.grants == () and {p.value for p in app.permissions} == {"consume"}


def test_a_sighup_reload_brings_grants_in_and_a_bad_grant_keeps_the_previous_table() -> None:
    path, token = grants_file()
    text = path.read_text()
    path.write_text(text.replace(f"topics = {ORDERS_GRANTS!r}\n".replace("'", '"'), ""))
    auth = Authenticator(path)
    orders = auth.authenticate(token, None)
    assert auth.authorize(orders, "produce") is not None  # no grants, no permissions
    path.write_text(text)
    auth.reload()
    assert auth.authorize(orders, "produce") is None
    assert auth.authorize_topic(orders, "produce", "orders.us") is None
    path.write_text(text.replace("produce:orders.*", "produce:or*ders"))
    with pytest.raises(AuthFileError):
        auth.reload()
    assert auth.authorize_topic(orders, "produce", "orders.us") is None  # the previous table
