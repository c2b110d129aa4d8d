"""Disaster recovery of a cluster from its mirror, on real processes (issue 30, seed 000;
docs/REPLICATION.md "Disaster recovery runbook"): cluster A's topic of 2 partitions is mirrored
to cluster B with a subscription; A loses the topic (deleted, recreated empty: B's link describe
shows source_behind and copies nothing); the runbook: `link pause` on B,
`raftlog link create back --source B --topic orders --restore` on A, which recreates the topic
under its own name with B's offsets and bytes and its subscription positions, promotes it and
deletes the link; a produce on A lands at the next offset; `link resume` on B, whose mirror
then follows A's new writes (its puller checks A holds its last batch)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from raft.cli.localcluster import LocalCluster, wait_for
from storage.records import encode_values
from tests.node.test_links_processes import batches, knows, leader_address, run_cli
from tests.node.test_topics_processes import admin, call, produce

pytestmark = pytest.mark.slow
TOPIC, PARTITIONS = "orders", 2


def copies(a: LocalCluster, b: LocalCluster) -> bool:
    """Whether B's mirror serves exactly A's batches, in every partition."""
    for p in range(PARTITIONS):
        src, dst = leader_address(a, set(), TOPIC, p), leader_address(b, set(), TOPIC, p)
        if src is None or dst is None:
            return False
        try:
            if batches(src, TOPIC, p)[1] != batches(dst, TOPIC, p)[1]:
                return False
        except (OSError, AssertionError):
            return False
    return True


def positions(cluster: LocalCluster) -> dict[int, dict[str, int]]:
    """Each partition's subscriptions (the links' own left out): {partition: {name: pos}}."""
    out: dict[int, dict[str, int]] = {}
    for p in range(PARTITIONS):
        address = leader_address(cluster, set(), TOPIC, p)
        reply = call(address or "", "sub_list", topic=TOPIC, partition=p, timeout_ms=5000)
        assert reply["ok"], reply
        out[p] = {s["name"]: s["position"] for s in reply["subscriptions"]
                  if not s["name"].startswith("__link.")}
    return out


def test_a_cluster_restores_a_lost_topic_from_its_mirror(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "a", nodes=1) as a, LocalCluster(tmp_path / "b", nodes=1) as b:
        a.wait_leader(60)
        b.wait_leader(60)
        made = admin(a, set(), "topic_create", name=TOPIC, partitions=PARTITIONS, replicas=1)
        assert made["ok"], made
        wait_for(lambda: knows(a.servers.split(",")[0], TOPIC), "A's topic led", 60)
        for p in range(PARTITIONS):
            for i in range(3):
                produce(a, set(), TOPIC, p, f"p{p}-{i}".encode())
        # A consumer's positions on A: part way into partition 0, at the end of partition 1.
        for p in range(PARTITIONS):
            address = leader_address(a, set(), TOPIC, p)
            assert address is not None
            hw, got = batches(address, TOPIC, p)
            at = got[1][0] if p == 0 else hw + 1
            opened = call(address, "sub_open", name="app", topic=TOPIC, partition=p,
                          timeout_ms=5000, **{"from": at})
            assert opened["ok"], opened
        code, text = run_cli("link", "create", "dr", "--source", a.servers, "--topic", TOPIC,
                             "--servers", b.servers, "--timeout", "30")
        assert code == 0, text
        wait_for(lambda: copies(a, b), "B's mirror to hold A's batches", 60)
        wanted = positions(a)
        wait_for(lambda: positions(b) == wanted, "the subscription to reach B", 60)
        held = {p: batches(leader_address(b, set(), TOPIC, p) or "", TOPIC, p)[1]
                for p in range(PARTITIONS)}

        # A loses the topic: deleted, and recreated empty (an application's auto-create).
        gone = admin(a, set(), "topic_delete", name=TOPIC)
        assert gone["ok"], gone
        made = admin(a, set(), "topic_create", name=TOPIC, partitions=PARTITIONS, replicas=1)
        assert made["ok"], made

        def behind() -> bool:
            code, text = run_cli("link", "describe", "dr", "--servers", b.servers)
            return code == 0 and text.count("source_behind: the source is behind the mirror: "
                                            "it lost data") == PARTITIONS

        wait_for(behind, "B's link to stop: the source is behind its mirror", 60)
        # The runbook: pause B's link, restore A from B.
        code, text = run_cli("link", "pause", "dr", "--servers", b.servers)
        assert code == 0, text
        code, text = run_cli("link", "create", "back", "--source", b.servers, "--topic", TOPIC,
                             "--restore", "--json", "--servers", a.servers, "--timeout", "30")
        assert code == 0, text
        report = json.loads(text[text.index("{\n"):])  # after the progress lines (stderr)
        assert "link resume dr" in " ".join(report["next"]), report
        for p in range(PARTITIONS):
            address = leader_address(a, set(), TOPIC, p)
            assert address is not None
            assert batches(address, TOPIC, p)[1] == held[p]  # offsets, counts, times, bytes
        assert positions(a) == wanted
        [restored] = call(a.servers.split(",")[0], "metadata", topics=[TOPIC])["topics"]
        assert restored["mirror_active"] is False, restored  # promoted: writable
        code, text = run_cli("link", "list", "--json", "--servers", a.servers)
        assert code == 0 and json.loads(text)["links"] == [], text  # the restore link is gone

        # Writes on A resume at the next offset.
        last = held[0][-1]
        deadline = time.monotonic() + 30
        while True:
            address = leader_address(a, set(), TOPIC, 0) or ""
            taken = call(address, "produce", acks="quorum", timeout_ms=5000, topic=TOPIC,
                         partition=0, payload=encode_values([b"after"]), count=1)
            if taken["ok"] or time.monotonic() > deadline:
                break
            assert taken["error"]["code"] in ("MIRROR_READ_ONLY", "NOT_LEADER"), taken
            time.sleep(0.1)  # the promote reaching the partition's leader: a retry's pause
        assert taken["ok"] and taken["base_offset"] == last[0] + last[1], (taken, last)

        # B's link in the original direction resumes, and its mirror follows A again.
        code, text = run_cli("link", "resume", "dr", "--servers", b.servers)
        assert code == 0, text
        wait_for(lambda: copies(a, b), "B's mirror to follow A's new writes", 60)
