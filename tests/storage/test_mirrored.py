"""Reads in visible offsets (storage/mirrored.py) over the LogStorage contract, on both stores:
a log of MIRRORED batches with gaps, interleaved with the group's own NOOP and CONTROL entries,
read from every visible offset (inside batches, inside gaps, past the end) against a model; the
visible high watermark at every batch boundary; the visible start after a retention cut; hints
that a truncation made stale; bounded reads."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import open_log
from storage.api import LogStorage
from storage.batch import Batch, BatchKind
from storage.mirrored import (
    MIRROR_SECTION,
    Hint,
    MalformedTag,
    decode_tag,
    encode_tag,
    fetch,
    find,
    mirrored,
    records_of,
    run_sync,
    visible_end_upto,
    visible_start,
    visible_to_log,
)
from storage.records import encode_values

IMPLS = ["memory", "lmdb"]


@pytest.fixture(params=IMPLS)
def log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStorage]:
    lg = open_log(None if request.param == "memory" else tmp_path / "log", map_size=64 << 20)
    yield lg
    lg.close()


def own(kind: BatchKind) -> Batch:
    return Batch.create(b"" if kind == BatchKind.NOOP else b"\x80", 1, kind=kind)


def build(log: LogStorage, seed: int, n: int = 60) -> list[tuple[int, int, int]]:
    """Append `n` MIRRORED batches (random counts, random gaps) with NOOP/CONTROL entries in
    between; returns the model: (visible base, count, log base) of each."""
    rng = random.Random(seed)
    model = []
    visible = rng.randrange(0, 5)
    for _ in range(n):
        for _ in range(rng.choice([0, 0, 0, 1, 2])):
            b = own(rng.choice([BatchKind.NOOP, BatchKind.CONTROL]))
            log.append([b.placed(log.dirty_offset + 1, 1)])
        count = rng.randrange(1, 5)
        values = [f"v{visible + k}".encode() for k in range(count)]
        b = mirrored(visible, count, 1000 + visible, encode_values(values))
        model.append((visible, count, log.dirty_offset + 1))
        log.append([b.placed(log.dirty_offset + 1, 1)])
        visible += count + rng.choice([0, 0, 1, 7])  # gaps: the source's own entries
    log.flush()
    return model


def expected_first(model: list[tuple[int, int, int]], v: int) -> tuple[int, int, int] | None:
    return next((m for m in model if m[0] + m[1] - 1 >= v), None)


def test_the_tag_codec() -> None:
    assert decode_tag(encode_tag(0)) == 0 and decode_tag(encode_tag(-1)) == -1
    assert decode_tag(encode_tag(2**62)) == 2**62
    for bad in (b"", b"\x01\x00", b"\x02" + b"\x00" * 8):
        with pytest.raises(MalformedTag):
            decode_tag(bad)
    with pytest.raises(MalformedTag):
        encode_tag(-2)
    b = mirrored(5, 2, 7, encode_values([b"a", b"b"]))
    assert b.kind == BatchKind.MIRRORED and records_of(b) == encode_values([b"a", b"b"])


@pytest.mark.parametrize("seed", [1, 2])
def test_a_fetch_from_any_visible_offset_starts_at_the_batch_holding_it_or_the_next(
        log: LogStorage, seed: int) -> None:
    model = build(log, seed)
    upto = log.dirty_offset
    last_visible = model[-1][0] + model[-1][1] - 1
    for v in range(0, last_visible + 3):
        out, nxt, _ = run_sync(fetch(log, v, upto, 1 << 20, 3))
        want = expected_first(model, v)
        if want is None:
            assert out == [] and nxt == v
            continue
        i = model.index(want)
        got = [(b["base_offset"], b["count"]) for b in out]
        assert got == [(m[0], m[1]) for m in model[i:i + 3]]
        assert nxt == model[min(i + 2, len(model) - 1)][0] + model[min(i + 2,
                                                                         len(model) - 1)][1]
        first = out[0]
        assert first["timestamp_ms"] == 1000 + first["base_offset"]
        assert first["payload"] == encode_values(
            [f"v{first['base_offset'] + k}".encode() for k in range(first["count"])])
        assert run_sync(visible_to_log(log, v, upto)) == want[2] + max(0, v - want[0])


def test_the_visible_end_at_every_commit_boundary(log: LogStorage) -> None:
    model = build(log, 4, n=30)
    ends = {}
    for vbase, count, lbase in model:
        ends[lbase + count - 1] = vbase + count - 1
    current = -1
    for off in range(0, log.dirty_offset + 1):
        (b,) = log.read(off, 1 << 20, 1)
        if b.last_offset != off:
            continue  # a commit index is always a batch's last offset
        current = ends.get(off, current)
        assert run_sync(visible_end_upto(log, off)) == current


def test_reads_stop_at_the_commit_index(log: LogStorage) -> None:
    model = build(log, 5, n=10)
    vbase, count, lbase = model[4]
    upto = lbase + count - 1
    out, nxt, _ = run_sync(fetch(log, 0, upto, 1 << 20, 100))
    assert [b["base_offset"] for b in out] == [m[0] for m in model[:5]]
    assert nxt == vbase + count
    out, nxt, _ = run_sync(fetch(log, vbase + count, upto, 1 << 20, 100))
    assert out == [] and nxt == vbase + count


def test_reads_are_bounded_by_bytes_and_batches_but_return_at_least_one(
        log: LogStorage) -> None:
    model = build(log, 6, n=20)
    upto = log.dirty_offset
    out, _, _ = run_sync(fetch(log, 0, upto, 1, 100))
    assert len(out) == 1
    out, _, _ = run_sync(fetch(log, 0, upto, 1 << 20, 4))
    assert len(out) == 4
    steps = fetch(log, 0, upto, 1 << 20, 100)
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration:
            break
    assert yields >= 1  # it gives the caller a chance to run other work


def test_a_sequential_consumers_hint_is_used_and_a_stale_one_is_not_trusted(
        log: LogStorage) -> None:
    model = build(log, 7, n=20)
    upto = log.dirty_offset
    out, nxt, hint = run_sync(fetch(log, 0, upto, 1 << 20, 5))
    assert hint is not None and hint.visible == nxt
    again, _, _ = run_sync(fetch(log, nxt, upto, 1 << 20, 5, hint))
    assert again[0]["base_offset"] == model[5][0]
    # A wrong hint (as a truncation and new appends could leave) costs a search, not a result.
    wrong = Hint(nxt, model[1][2] + model[1][1] - 1)
    found = run_sync(find(log, nxt, upto, wrong))
    assert found.batch is not None and decode_tag(found.batch.payload) == model[5][0]
    # A hint for a batch that a truncation removed.
    log.truncate_suffix(model[3][2] - 1)
    gone = run_sync(find(log, nxt, log.dirty_offset, hint))
    assert gone.batch is None


def test_the_visible_start_is_one_past_the_visible_end_kept_with_the_log_start(
        log: LogStorage) -> None:
    model = build(log, 8, n=10)
    assert visible_start(log) == 0
    vbase, count, lbase = model[4]
    cut = lbase + count  # the next batch's base (a NOOP/CONTROL or MIRRORED)
    log.truncate_prefix(cut, {"v": 1, "start_offset": cut,
                              "sections": {MIRROR_SECTION: vbase + count - 1}})
    assert visible_start(log) == vbase + count
    out, _, _ = run_sync(fetch(log, vbase + count, log.dirty_offset, 1 << 20, 1))
    assert out[0]["base_offset"] == model[5][0]
    # Everything mirrored cut: the visible end comes from the state at the start.
    last = model[-1]
    end = last[2] + last[1]
    log.append([own(BatchKind.NOOP).placed(end, 1)])
    log.flush()
    log.truncate_prefix(end, {"v": 1, "start_offset": end,
                              "sections": {MIRROR_SECTION: last[0] + last[1] - 1}})
    assert run_sync(visible_end_upto(log, log.dirty_offset)) == last[0] + last[1] - 1
    assert run_sync(fetch(log, 0, log.dirty_offset, 1 << 20, 5))[0] == []


def test_an_empty_log_has_nothing_visible(log: LogStorage) -> None:
    assert run_sync(visible_end_upto(log, -1)) == -1
    assert visible_start(log) == 0
    out, nxt, _ = run_sync(fetch(log, 0, -1, 1 << 20, 5))
    assert out == [] and nxt == 0
    assert run_sync(visible_to_log(log, 0, -1)) == 0
