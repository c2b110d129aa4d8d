"""Links and mirror topics in the controller metadata (issue 30): verdicts from the state and
the command alone, table-driven; the snapshot carries links, origins and gaps."""

from __future__ import annotations

import msgpack
import pytest

from raft.controller.commands import CreateTopic, DeleteTopic, decode_command, encode_command
from raft.controller.command_fields import MalformedCommand
from raft.controller.link_commands import (CreateLink, DeleteLink, LinkEvent, MirrorTopic,
                                           PauseLink, PromoteTopic, ResumeLink)
from raft.controller.links import LinkState, link_subscription
from raft.controller.state import ClusterMetadata, EffectKind, Refusal
from tests.controller.controller_helpers import founded, run

R3 = (1, 2, 3)


def link_cmd(name: str = "dr", topics: tuple[tuple[str, str, int], ...] = (("orders", "orders", 4),),
             **kw: object) -> CreateLink:
    mirrors = tuple(MirrorTopic(s, m, (R3,) * n) for s, m, n in topics)
    return CreateLink(name, ("10.0.0.1:9000",), "c0ffee", mirrors, **kw)  # type: ignore[arg-type]


def test_create_link_creates_read_only_mirror_topics_with_the_source_partition_count() -> None:
    meta = founded()
    [result] = run(meta, link_cmd(tls_ca_pem="PEM", token="tok", created_ms=5))
    assert result.ok, result.reason
    topic = meta.topics["orders"]
    assert len(topic.partitions) == 4 and topic.mirror_active
    assert topic.origin is not None and topic.origin.to_map() == {
        "link": "dr", "source_cluster_id": "c0ffee", "source_topic": "orders"}
    assert [e.kind for e in result.effects] == [EffectKind.GROUP_CREATED] * 4
    link = meta.links["dr"]
    assert link.state is LinkState.ACTIVE and link.topics == {"orders": "orders"}
    assert link.describe()["token"] is True and "tls_ca_pem" not in link.describe()
    assert link.describe(secrets=True)["token"] == "tok"


@pytest.mark.parametrize("setup, command, refusal", [
    ((), link_cmd(name="a.b"), Refusal.INVALID_NAME),
    ((), link_cmd(name=""), Refusal.INVALID_NAME),
    ((), link_cmd(name="x" * 65), Refusal.INVALID_NAME),  # its subscription name must fit
    ((link_cmd(),), link_cmd(topics=(("x", "x", 1),)), Refusal.LINK_EXISTS),
    ((CreateTopic("orders", (R3,)),), link_cmd(), Refusal.TOPIC_EXISTS),
    ((), link_cmd(topics=(("a", "m", 1), ("b", "m", 1))), Refusal.INVALID_NAME),
    ((), link_cmd(topics=(("a", "m", 1), ("a", "n", 1))), Refusal.INVALID_NAME),
    ((), link_cmd(topics=(("a", "bad name", 1),)), Refusal.INVALID_NAME),
    ((), CreateLink("dr", ("h:1",), "c", (MirrorTopic("a", "a", ((1, 2, 9),)),)),
     Refusal.UNKNOWN_NODE),
    ((), DeleteLink("nope"), Refusal.UNKNOWN_LINK),
    ((), PauseLink("nope"), Refusal.UNKNOWN_LINK),
    ((), ResumeLink("nope"), Refusal.UNKNOWN_LINK),
    ((), PromoteTopic("nope"), Refusal.UNKNOWN_TOPIC),
    ((), PromoteTopic("default"), Refusal.NOT_A_MIRROR),
    ((link_cmd(), PromoteTopic("orders")), PromoteTopic("orders"), Refusal.NOT_A_MIRROR),
    ((), LinkEvent("dr", "orders", 0, 1, 2), Refusal.UNKNOWN_LINK),
    ((link_cmd(),), LinkEvent("dr", "default", 0, 1, 2), Refusal.NOT_A_MIRROR),
    ((link_cmd(),), LinkEvent("dr", "orders", 4, 1, 2), Refusal.UNKNOWN_PARTITION),
])
def test_refusals_change_nothing(setup: tuple, command: object, refusal: Refusal) -> None:
    meta = founded()
    assert all(r.ok for r in run(meta, *setup))
    before = meta.to_snapshot()
    [result] = run(meta, command)  # type: ignore[arg-type]
    assert result.refusal is refusal, result.reason
    assert result.reason  # says what to do
    after = meta.to_snapshot()
    assert after == {**before, "applied": after["applied"]}


def test_a_refused_link_creates_none_of_its_topics() -> None:
    meta = founded()
    run(meta, CreateTopic("b", (R3,)))
    [result] = run(meta, link_cmd(topics=(("a", "a", 2), ("b", "b", 1))))
    assert result.refusal is Refusal.TOPIC_EXISTS and "a" not in meta.topics


@pytest.mark.parametrize("commands, state, active", [
    ((PauseLink("dr"),), LinkState.PAUSED, True),
    ((PauseLink("dr"), ResumeLink("dr")), LinkState.ACTIVE, True),
    ((PromoteTopic("orders"),), LinkState.ACTIVE, False),
])
def test_link_state_changes(commands: tuple, state: LinkState, active: bool) -> None:
    meta = founded()
    results = run(meta, link_cmd(), *commands)
    assert all(r.ok for r in results)
    assert meta.links["dr"].state is state
    assert meta.topics["orders"].mirror_active is active
    assert meta.topics["orders"].origin is not None  # translated for ever


def test_delete_link_keeps_its_mirrors_read_only_until_promoted() -> None:
    meta = founded()
    assert all(r.ok for r in run(meta, link_cmd(), DeleteLink("dr")))
    assert "dr" not in meta.links and meta.topics["orders"].mirror_active
    assert run(meta, PromoteTopic("orders"))[0].ok
    assert run(meta, DeleteTopic("orders"))[0].ok


def test_link_events_count_gaps_per_partition() -> None:
    meta = founded()
    run(meta, link_cmd(), LinkEvent("dr", "orders", 2, 10, 19), LinkEvent("dr", "orders", 2, 30, 30))
    # A retried report (its first answer lost, under load) is the same gap: counted once.
    assert all(r.ok for r in run(meta, LinkEvent("dr", "orders", 2, 30, 30)))
    [gap] = meta.links["dr"].describe()["gaps"]
    assert gap == {"topic": "orders", "partition": 2, "bootstraps": 2, "offsets_lost": 11,
                   "latest": [[10, 19], [30, 30]]}


def test_snapshot_carries_links_origins_and_gaps() -> None:
    meta = founded()
    run(meta, link_cmd(tls_ca_pem="PEM", token="t"), PauseLink("dr"),
        LinkEvent("dr", "orders", 1, 0, 4), link_cmd("other", (("x", "east.x", 2),)),
        PromoteTopic("east.x"))
    raw = msgpack.unpackb(msgpack.packb(meta.to_snapshot()), raw=False)
    back = ClusterMetadata.from_snapshot(raw)
    assert back.to_snapshot() == meta.to_snapshot()
    assert back.links["dr"].state is LinkState.PAUSED
    assert back.topics["east.x"].origin is not None and not back.topics["east.x"].mirror_active


def test_a_cluster_without_links_snapshots_as_before() -> None:
    assert "links" not in founded().to_snapshot()
    assert all(len(t) == 4 for t in founded().to_snapshot()["topics"])


def test_malformed_snapshot_link_is_refused() -> None:
    meta = founded()
    run(meta, link_cmd())
    raw = meta.to_snapshot()
    raw["links"][0][4] = "sideways"
    with pytest.raises(ValueError, match="malformed"):
        ClusterMetadata.from_snapshot(raw)


@pytest.mark.parametrize("command", [
    link_cmd(tls_ca_pem="x", token="y", created_ms=7), DeleteLink("dr"), PauseLink("dr"),
    ResumeLink("dr"), PromoteTopic("orders"), LinkEvent("dr", "orders", 3, 5, 9)])
def test_link_commands_round_trip(command: object) -> None:
    assert decode_command(encode_command(command)) == command  # type: ignore[arg-type]


@pytest.mark.parametrize("fields, match", [
    ({"op": "link_event", "link": "dr", "topic": "t", "partition": 0, "gap_from": 5,
      "gap_to": 4}, "gap_to"),
    ({"op": "create_link", "name": "dr", "source_servers": [], "source_cluster_id": "c",
      "mirrors": [["a", "a", [[1]]]], "tls_ca_pem": "", "token": "", "created_ms": 0},
     "source_servers"),
    ({"op": "create_link", "name": "dr", "source_servers": ["h:1"], "source_cluster_id": "c",
      "mirrors": [["a", "a"]], "tls_ca_pem": "", "token": "", "created_ms": 0}, "mirror"),
])
def test_malformed_link_commands(fields: dict, match: str) -> None:
    payload = msgpack.packb({"ctl": "controller", "v": 1, **fields})
    with pytest.raises(MalformedCommand, match=match):
        decode_command(payload)


def test_link_subscription_name_fits_a_subscription_name() -> None:
    from raft.core.subscription_table import MAX_NAME_CHARS
    assert link_subscription("abc", "dr") == "__link.abc.dr"
    assert len(link_subscription("f" * 32, "x" * 64)) <= MAX_NAME_CHARS
