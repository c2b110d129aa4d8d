"""MetadataFollower: the metadata kept current from the controller's log, bounded per call,
resumed from the state stored with a cut log start."""

from __future__ import annotations

import msgpack
import pytest

from raft.controller.bootstrap import bootstrap_commands
from raft.controller.commands import CreateTopic, DeleteTopic, encode_command
from raft.controller.follower import MetadataFollower, MetadataGap
from raft.controller.section import SECTION, SECTION_NAME
from raft.controller.state import Refusal
from raft.core.snapshot import SnapshotContext
from storage.batch import Batch, BatchKind
from storage.memory import MemoryLog


def controller_log(payloads: list[bytes]) -> MemoryLog:
    log = MemoryLog()
    for i, payload in enumerate(payloads):
        kind = BatchKind.CONTROL if payload[:1] != b"d" else BatchKind.DATA
        log.append([Batch.create(payload, 1, kind=kind, base_offset=i, term=1)])
    log.flush()
    return log


ENTRIES = [encode_command(c) for c in bootstrap_commands({1: "a", 2: "b", 3: "c"})] + [
    b"data",  # not a control entry
    msgpack.packb({"ctl": "load_begin", "load_id": "x"}),  # another control user's
    encode_command(CreateTopic("orders", ((1, 2), (2, 3)))),
    encode_command(CreateTopic("orders", ((1, 2),))),  # refused: exists
    encode_command(DeleteTopic("orders")),
]


def test_catch_up_applies_committed_entries_with_their_verdicts() -> None:
    log = controller_log(ENTRIES)
    f = MetadataFollower(log)
    applied = f.catch_up(commit_index=6)  # up to the first orders create
    assert [a.offset for a in applied] == [0, 1, 2, 3, 6]
    assert all(a.result.ok for a in applied) and "orders" in f.metadata.topics
    [refused, deleted] = f.catch_up(commit_index=100)
    assert refused.result.refusal is Refusal.TOPIC_EXISTS
    assert deleted.result.ok and f.metadata.is_deleted(2)
    assert f.catch_up(commit_index=100) == []


def test_catch_up_is_bounded_per_call() -> None:
    f = MetadataFollower(controller_log(ENTRIES))
    assert [a.offset for a in f.catch_up(100, max_batches=2)] == [0, 1]
    assert [a.offset for a in f.catch_up(100, max_batches=2)] == [2, 3]


def test_a_cut_log_resumes_from_the_metadata_stored_with_its_start() -> None:
    log = controller_log(ENTRIES)
    state = SECTION.fresh(SnapshotContext(), 0)
    for b in log.read(0, 1 << 20, 7):
        SECTION.apply(state, b)
    log.truncate_prefix(7, {"v": 1, "start_offset": 7,
                            "sections": {SECTION_NAME: SECTION.dump(state, 7)}})
    f = MetadataFollower(log)
    assert "orders" in f.metadata.topics
    [refused, deleted] = f.catch_up(100)
    assert (refused.offset, deleted.offset) == (7, 8)
    whole = MetadataFollower(controller_log(ENTRIES))
    whole.catch_up(100)
    assert f.metadata == whole.metadata


def test_a_cut_log_without_the_metadata_stops_the_node() -> None:
    log = controller_log(ENTRIES)
    log.truncate_prefix(3, {"v": 1, "start_offset": 3, "sections": {}})
    with pytest.raises(MetadataGap, match="cannot rebuild"):
        MetadataFollower(log)
