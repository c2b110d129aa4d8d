"""Topic-scoped permissions: grants on names and prefixes add to node-wide permissions."""

from __future__ import annotations

import pytest

from raft.controller.access import (
    TopicGrant,
    TopicPermission,
    may_use,
    parse_grant,
    parse_grants,
    usable_topics,
)

P, C, A = TopicPermission.PRODUCE, TopicPermission.CONSUME, TopicPermission.ADMIN


def test_grants_parse_names_prefixes_and_everything() -> None:
    assert parse_grant("produce:orders") == TopicGrant(P, "orders")
    assert parse_grant("consume:logs.*") == TopicGrant(C, "logs.", prefix=True)
    assert parse_grant("admin:*") == TopicGrant(A, "", prefix=True)
    assert [str(g) for g in parse_grants(["produce:orders", "consume:logs.*"])] == [
        "produce:orders", "consume:logs.*"]


@pytest.mark.parametrize("text,why", [
    ("orders", "PERMISSION:PATTERN"),
    ("write:orders", "PERMISSION:PATTERN"),
    ("produce:", "names no topic"),
    ("produce:a*b", "only end"),
    ("produce:a b", "letters"),
    ("consume:" + "x" * 300, "249"),
])
def test_a_bad_grant_says_what_a_grant_looks_like(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_grant(text)


# (node-wide permissions, grants, permission asked, topic, allowed)
CASES = [
    ([], ["produce:orders"], P, "orders", True),
    ([], ["produce:orders"], P, "orders2", False),  # a name is exact, not a prefix
    ([], ["produce:orders"], C, "orders", False),  # only the permission granted
    ([], ["consume:logs.*"], C, "logs.app", True),
    ([], ["consume:logs.*"], C, "logs.", True),
    ([], ["consume:logs.*"], C, "logsx", False),
    ([], ["admin:*"], A, "anything", True),
    ([], ["admin:*"], P, "anything", False),  # admin does not imply produce (as in auth.py)
    (["consume"], [], C, "any-topic", True),  # today's node-wide permissions cover every topic
    (["consume"], ["produce:orders"], P, "orders", True),  # grants add
    (["consume"], ["produce:orders"], P, "other", False),
    ([], [], C, "t", False),
]


@pytest.mark.parametrize("wide,grants,perm,topic,allowed", CASES)
def test_may_use(wide, grants, perm, topic, allowed) -> None:
    assert may_use(perm, topic, wide, parse_grants(grants)) is allowed


def test_usable_topics_filters_a_listing() -> None:
    grants = parse_grants(["consume:logs.*", "consume:orders"])
    topics = ["orders", "logs.a", "logs.b", "secret", "default"]
    assert usable_topics(C, topics, [], grants) == ["logs.a", "logs.b", "orders"]
    assert usable_topics(C, topics, ["consume"], ()) == sorted(topics)
