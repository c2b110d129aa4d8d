"""raft/core/loads.py: the staged-load state machine, table-driven and without Spark or sockets.

Each scenario is a list of log entries (what the leader appended, in log order) plus the commit
index; we check what a consumer would see: the stable offset and the visible records.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from raft.core.loads import (
    LoadIndex,
    LoadState,
    LoadTable,
    StageTag,
    decode_stage_tag,
    encode_abort,
    encode_begin,
    encode_commit,
    encode_staged_payload,
)
from storage.batch import Batch, BatchKind
from storage.memory import MemoryLog
from storage.records import decode_records, encode_values


@dataclass
class Begin:
    load: str


@dataclass
class Stage:
    load: str
    gen: int
    part: int
    att: int
    seq: int
    values: tuple[bytes, ...]


@dataclass
class Commit:
    load: str
    gen: int
    attempts: list[tuple[int, int, int, int]]


@dataclass
class Abort:
    load: str
    gen: int


@dataclass
class Data:
    values: tuple[bytes, ...]


def to_batch(e, ts: int = 1000) -> Batch:
    if isinstance(e, Begin):
        return Batch.create(encode_begin(e.load), 1, kind=BatchKind.CONTROL, timestamp_ms=ts)
    if isinstance(e, Commit):
        return Batch.create(encode_commit(e.load, e.gen, e.attempts), 1,
                            kind=BatchKind.CONTROL, timestamp_ms=ts)
    if isinstance(e, Abort):
        return Batch.create(encode_abort(e.load, e.gen, "test"), 1, kind=BatchKind.CONTROL,
                            timestamp_ms=ts)
    if isinstance(e, Stage):
        tag = StageTag(e.load, e.gen, e.part, e.att, e.seq)
        return Batch.create(encode_staged_payload(tag, encode_values(list(e.values))),
                            len(e.values), kind=BatchKind.STAGED, timestamp_ms=ts)
    if isinstance(e, Data):
        return Batch.create(encode_values(list(e.values)), len(e.values), timestamp_ms=ts)
    raise TypeError(e)


def build(entries) -> MemoryLog:
    log = MemoryLog()
    off = 0
    for e in entries:
        b = to_batch(e).placed(off, 1)
        log.append([b])
        off = b.last_offset + 1
    log.flush()
    return log


def consume(entries, commit_index: int | None = None) -> tuple[int, list[tuple[int, bytes]]]:
    """(stable offset, [(offset, value)]) a consumer sees."""
    log = build(entries)
    ci = log.dirty_offset if commit_index is None else commit_index
    idx = LoadIndex(log)
    assert idx.catch_up(ci)
    stable = idx.stable_offset(ci)
    seen = []
    if stable >= 0:
        for b, payload in idx.visible_batches(log.read(0, 1 << 30), stable):
            for i, r in enumerate(decode_records(payload)):
                seen.append((b.base_offset + i, r.value))
    return stable, seen


V = lambda *xs: tuple(x.encode() for x in xs)  # noqa: E731

# Offsets: every CONTROL entry takes 1, a STAGED/DATA batch one per value.
CASES = {
    "no loads: everything committed is visible": (
        [Data(V("a", "b")), Data(V("c"))], None, 2, ["a", "b", "c"]),
    "open load holds back later plain data (LSO)": (
        [Data(V("a")), Begin("L"), Stage("L", 1, 0, 0, 0, V("x")), Data(V("b"))], None, 0,
        ["a"]),
    "commit publishes named attempts only": (
        [Begin("L"),                                     # 0
         Stage("L", 0, 0, 0, 0, V("p0a0")),              # 1
         Stage("L", 0, 0, 1, 0, V("p0a1")),              # 2  retry of partition 0
         Stage("L", 0, 1, 0, 0, V("p1a0", "p1a0b")),     # 3-4
         Commit("L", 0, [(0, 1, 1, 1), (1, 0, 1, 2)])],  # 5
        None, 5, ["p0a1", "p1a0", "p1a0b"]),
    "duplicate seq (client retry) is shown once": (
        [Begin("L"), Stage("L", 0, 0, 0, 0, V("x")), Stage("L", 0, 0, 0, 0, V("x")),
         Stage("L", 0, 0, 0, 1, V("y")), Commit("L", 0, [(0, 0, 2, 2)])],
        None, 4, ["x", "y"]),
    "abort discards everything": (
        [Begin("L"), Stage("L", 0, 0, 0, 0, V("x")), Abort("L", 0), Data(V("after"))],
        None, 3, ["after"]),
    "missing batch aborts the commit": (
        [Begin("L"), Stage("L", 0, 0, 0, 1, V("y")), Commit("L", 0, [(0, 0, 2, 2)])],
        None, 2, []),
    "row count mismatch aborts the commit": (
        [Begin("L"), Stage("L", 0, 0, 0, 0, V("y")), Commit("L", 0, [(0, 0, 1, 5)])],
        None, 2, []),
    "stale generation data is never published": (
        [Begin("L"), Stage("L", 0, 0, 0, 0, V("old")),      # run 1 (gen 0) crashed
         Begin("L"), Stage("L", 2, 0, 0, 0, V("new")),      # run 2 (gen 2)
         Stage("L", 0, 0, 0, 1, V("zombie")),                # run 1's zombie task
         Commit("L", 0, [(0, 0, 2, 2)]),                     # run 1's driver: ignored
         Commit("L", 2, [(0, 0, 1, 1)])],
        None, 6, ["new"]),
    "begin after commit is a no-op; late writes stay hidden": (
        [Begin("L"), Stage("L", 0, 0, 0, 0, V("x")), Commit("L", 0, [(0, 0, 1, 1)]),
         Begin("L"), Stage("L", 0, 0, 1, 0, V("again")), Stage("L", 3, 0, 0, 0, V("g3"))],
        None, 5, ["x"]),
    "uncommitted tail is not visible": (
        [Data(V("a")), Begin("L"), Stage("L", 1, 0, 0, 0, V("x")), Commit("L", 1, [(0, 0, 1, 1)])],
        2, 0, ["a"]),
    "staged data for an unknown load is never visible": (
        [Stage("nope", 0, 0, 0, 0, V("x")), Data(V("a"))], None, 1, ["a"]),
    "two loads: the earlier open one bounds the LSO": (
        [Begin("A"), Begin("B"), Stage("B", 1, 0, 0, 0, V("b")), Commit("B", 1, [(0, 0, 1, 1)]),
         Data(V("d"))], None, -1, []),
    "two loads both committed, interleaved": (
        [Begin("A"), Begin("B"), Stage("B", 1, 0, 0, 0, V("b")), Stage("A", 0, 0, 0, 0, V("a")),
         Commit("B", 1, [(0, 0, 1, 1)]), Commit("A", 0, [(0, 0, 1, 1)])],
        None, 5, ["b", "a"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_consumer_view(name):
    entries, ci, want_stable, want_values = CASES[name]
    stable, seen = consume(entries, ci)
    assert stable == want_stable
    assert [v.decode() for _, v in seen] == want_values
    offsets = [o for o, _ in seen]
    assert offsets == sorted(set(offsets)), "offsets must be unique and increasing"


def test_states_and_reasons():
    log = build([Begin("L"), Stage("L", 0, 0, 0, 1, V("y")), Commit("L", 0, [(0, 0, 2, 2)])])
    idx = LoadIndex(log)
    idx.catch_up(log.dirty_offset)
    load = idx.table.get("L")
    assert load.state == LoadState.ABORTED and "1 of its 2 batches" in load.reason
    # A re-run (new begin) opens a fresh generation that can commit.
    log.append([to_batch(Begin("L")).placed(3, 1)])
    log.append([to_batch(Stage("L", 3, 0, 0, 0, V("z"))).placed(4, 1)])
    log.append([to_batch(Commit("L", 3, [(0, 0, 1, 1)])).placed(5, 1)])
    idx.catch_up(log.dirty_offset)
    load = idx.table.get("L")
    assert (load.state, load.gen, load.rows) == (LoadState.COMMITTED, 3, 1)
    assert idx.table.stage_error("L", 3) == "load 'L' is already committed"
    assert "restarted" in idx.table.stage_error("L", 0)
    assert idx.table.stage_error("M", 7) is None


def test_expiry_uses_last_activity():
    t = LoadTable()
    t.apply(to_batch(Begin("L"), ts=1_000).placed(0, 1))
    t.apply(to_batch(Stage("L", 0, 0, 0, 0, V("x")), ts=5_000).placed(1, 1))
    assert t.expired(now_ms=5_500, timeout_ms=1_000) == []
    assert t.expired(now_ms=6_001, timeout_ms=1_000) == [("L", 0)]
    t.apply(to_batch(Abort("L", 0)).placed(2, 1))
    assert t.expired(now_ms=10**9, timeout_ms=1) == []


def test_rebuild_after_restart_matches_live_table():
    entries = [Begin("L"), Stage("L", 0, 0, 0, 0, V("x")), Data(V("d")),
               Commit("L", 0, [(0, 0, 1, 1)]), Begin("M")]
    log = build(entries)
    live = LoadIndex(log)
    # Apply in small steps (as ticks would), then rebuild from scratch in one go.
    for ci in range(log.dirty_offset + 1):
        live.catch_up(ci, max_bytes=1)
    rebuilt = LoadIndex(log)
    rebuilt.catch_up(log.dirty_offset)
    assert {k: v.describe() for k, v in live.table.loads.items()} == \
           {k: v.describe() for k, v in rebuilt.table.loads.items()}
    assert live.stable_offset(log.dirty_offset) == rebuilt.stable_offset(log.dirty_offset) == 3


def test_apply_rejects_gaps():
    t = LoadTable()
    with pytest.raises(ValueError, match="in order"):
        t.apply(to_batch(Data(V("a"))).placed(5, 1))


def test_tag_roundtrip_and_garbage():
    tag = StageTag("load-é", 12, 3, 1, 7)
    payload = encode_staged_payload(tag, b"REC")
    got, hdr = decode_stage_tag(payload)
    assert got == tag and payload[hdr:] == b"REC"
    for bad in [b"", b"\x00", b"\x05\x00ab", b"\x00\x00" + b"x" * 30]:
        with pytest.raises(ValueError):
            decode_stage_tag(bad)
    # Garbage staged payloads are applied harmlessly and never shown.
    t = LoadTable()
    b = Batch.create(b"\x05\x00ab", 1, kind=BatchKind.STAGED).placed(0, 1)
    t.apply(b)
    assert t.visible(b) is None


# -- generated histories --------------------------------------------------------------------------
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def histories(draw):
    """A log as Spark + retries + zombies could write it: one load, several runs (generations),
    task attempts staging numbered batches (some resent, some lost), commits naming attempts,
    aborts, and interleaved plain data."""
    entries: list = []
    gens: list[int] = []
    off = 0

    def add(e) -> None:
        nonlocal off
        entries.append(e)
        off += len(e.values) if isinstance(e, (Stage, Data)) else 1

    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["begin", "stage", "stage", "stage", "stage", "stage",
                                     "commit", "commit", "abort", "data"]))
        if kind == "commit" and not any(isinstance(e, Stage) and e.gen == gens[-1]
                                        for e in entries):
            kind = "stage"  # an empty commit this early teaches little
        if kind == "begin" or not gens:
            gens.append(off)
            add(Begin("L"))
        elif kind == "stage":
            gen = gens[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(gens))
            part, att, seq = draw(st.integers(0, 2)), draw(st.integers(0, 2)), \
                draw(st.integers(0, 3))
            add(Stage("L", gen, part, att, seq, (f"{gen}/{part}/{att}/{seq}".encode(),) *
                      (1 + seq % 2)))
        elif kind == "commit":
            gen = gens[-1] if draw(st.integers(0, 3)) else draw(st.sampled_from(gens))
            attempts = []
            if draw(st.booleans()):
                # What a correct driver sends: for some partitions, one attempt that staged
                # seqs 0..n-1 under this generation.
                have: dict[tuple[int, int], set[int]] = {}
                for e in entries:
                    if isinstance(e, Stage) and e.gen == gen:
                        have.setdefault((e.part, e.att), set()).add(e.seq)
                used: set[int] = set()
                for (p, a), seqs in sorted(have.items()):
                    n = 0
                    while n in seqs:
                        n += 1
                    if p not in used and (draw(st.booleans()) or not attempts):
                        used.add(p)
                        attempts.append((p, a, n, sum(1 + s % 2 for s in range(n))))
            else:
                for p in draw(st.lists(st.integers(0, 2), unique=True, max_size=3)):
                    a, n = draw(st.integers(0, 2)), draw(st.integers(0, 4))
                    attempts.append((p, a, n, sum(1 + s % 2 for s in range(n))))
            add(Commit("L", gen, attempts))
        elif kind == "abort":
            add(Abort("L", draw(st.sampled_from(gens))))
        else:
            add(Data((b"plain",)))
    return entries


def model(entries):
    """The specification, written independently of LoadTable: which (value) multiset a consumer
    must see once everything is committed."""
    state, gen, staged, published = None, None, {}, None
    off = 0
    shown_plain = 0
    for e in entries:
        if isinstance(e, Begin):
            if state != "committed":
                state, gen, staged = "open", off, {}
        elif isinstance(e, Stage):
            if state == "open" and e.gen == gen:
                staged.setdefault((e.part, e.att), {}).setdefault(e.seq, e.values)
        elif isinstance(e, Commit):
            if state == "open" and e.gen == gen:
                ok = True
                seen_parts = set()
                for p, a, n, rows in e.attempts:
                    have = staged.get((p, a), {})
                    if any(s not in have for s in range(n)) or \
                            sum(len(have[s]) for s in range(n)) != rows or p in seen_parts:
                        ok = False
                    seen_parts.add(p)
                if ok:
                    state = "committed"
                    published = [v for p, a, n, _ in e.attempts for s in range(n)
                                 for v in staged[(p, a)][s]]
                else:
                    state = "aborted"
        elif isinstance(e, Abort):
            if state == "open" and e.gen == gen:
                state = "aborted"
        elif isinstance(e, Data):
            shown_plain += 1
        off += len(e.values) if isinstance(e, (Stage, Data)) else 1
    return state, sorted(published or []), shown_plain


@settings(max_examples=500, deadline=None)
@given(histories())
def test_generated_histories_match_the_model(entries):
    state, want, plain = model(entries)
    stable, seen = consume(entries)
    values = [v for _, v in seen]
    if state == "open":
        # The open load's begin bounds the stable offset: nothing of it (or after it) is shown.
        assert all(v == b"plain" for v in values)
        return
    assert sorted(v for v in values if v != b"plain") == want
    assert values.count(b"plain") == plain
