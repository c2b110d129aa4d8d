"""raft/node/load_service.py with a fake host (no sockets, no Raft): the load_* request contract."""

from __future__ import annotations

import trio

from raft.node.load_service import LoadService
from raft.protocol.load_requests import parse_load
from raft.protocol.replies import ErrorReply
from raft.core.ready import ProduceAnswer
from raft.core.types import ErrorCode
from storage.memory import MemoryLog
from storage.records import encode_values


class FakeHost:
    def __init__(self) -> None:
        self.log = MemoryLog()
        self.leader = True

    def is_leader(self) -> bool:
        return self.leader

    def commit_index(self) -> int:
        return self.log.dirty_offset

    def refuse_not_leader(self) -> ErrorReply:
        return ErrorReply(ErrorCode.NOT_LEADER, "ask node 2", {"leader_addr": "127.0.0.1:2"})

    async def propose_and_wait(self, batch, acks, timeout_s):  # noqa: ANN001
        base = self.log.dirty_offset + 1
        self.log.append([batch.placed(base, 1)])
        return ProduceAnswer(0, ErrorCode.OK, base, base + batch.count - 1)


async def call(svc: LoadService, host: FakeHost, frame: dict) -> dict:
    """A request frame through the protocol's parse and the service, the reply as its frame."""
    reply = await svc.handle(host, parse_load(frame["t"], frame))
    return reply.to_frame(frame["id"])


def run(coro_fn):  # noqa: ANN001
    return trio.run(coro_fn)


def test_begin_stage_commit_and_rerun():
    host = FakeHost()
    svc = LoadService(host.log, timeout_ms=1000)

    async def main():
        r = await call(svc, host, {"t": "load_begin", "id": 1, "load_id": "L"})
        assert r["ok"] and r["load"]["state"] == "open"
        gen = r["load"]["gen"]
        for seq in (0, 1, 1):  # seq 1 twice: a retried request
            r = await call(svc, host, {"t": "load_stage", "id": 2, "load_id": "L", "gen": gen,
                                        "partition": 0, "attempt": 0, "seq": seq, "count": 2,
                                        "payload": encode_values([b"a%d" % seq, b"b%d" % seq])})
            assert r["ok"], r
        st = await call(svc, host, {"t": "load_status", "id": 3})
        assert st["high_watermark"] == gen - 1  # the open load holds readers back
        r = await call(svc, host, {"t": "load_commit", "id": 4, "load_id": "L", "gen": gen,
                                    "attempts": [[0, 0, 2, 4]]})
        assert r["load"]["state"] == "committed" and r["load"]["rows"] == 4
        # A retried commit is answered the same way.
        r = await call(svc, host, {"t": "load_commit", "id": 5, "load_id": "L", "gen": gen,
                                    "attempts": [[0, 0, 2, 4]]})
        assert r["load"]["state"] == "committed" and r["load"]["gen"] == gen
        stable = svc.stable_offset(host.commit_index())
        shown = svc.visible(host.log.read(0, 1 << 30), stable)
        assert [b.base_offset for b, _ in shown] == [1, 3]
        # Re-running: begin says committed and appends nothing; stages are refused.
        dirty = host.log.dirty_offset
        r = await call(svc, host, {"t": "load_begin", "id": 6, "load_id": "L"})
        assert r["load"]["state"] == "committed" and host.log.dirty_offset == dirty
        r = await call(svc, host, {"t": "load_stage", "id": 7, "load_id": "L", "gen": gen,
                                    "partition": 0, "attempt": 1, "seq": 0, "count": 1,
                                    "payload": encode_values([b"x"])})
        assert r["error"]["code"] == "LOAD_CLOSED"

    run(main)


def test_incomplete_commit_is_refused_and_errors_are_typed():
    host = FakeHost()
    svc = LoadService(host.log, timeout_ms=1000)

    async def main():
        gen = (await call(svc, host, {"t": "load_begin", "id": 1, "load_id": "L"}))["load"]["gen"]
        r = await call(svc, host, {"t": "load_commit", "id": 2, "load_id": "L", "gen": gen,
                                    "attempts": [[0, 0, 3, 30]]})
        assert r["ok"] and r["load"]["state"] == "aborted"
        assert "0 of its 3 batches" in r["load"]["reason"]
        r = await call(svc, host, {"t": "load_commit", "id": 3, "load_id": "L", "gen": gen,
                                    "attempts": [[0, "x"]]})
        assert r["error"]["code"] == "BAD_REQUEST"
        r = await call(svc, host, {"t": "load_stage", "id": 4, "load_id": "L"})
        assert r["error"]["code"] == "BAD_REQUEST"
        host.leader = False
        r = await call(svc, host, {"t": "load_begin", "id": 5, "load_id": "M"})
        assert r["error"]["code"] == "NOT_LEADER"

    run(main)


def test_leader_expires_idle_loads_once():
    host = FakeHost()
    svc = LoadService(host.log, timeout_ms=1000)

    async def main():
        await call(svc, host, {"t": "load_begin", "id": 1, "load_id": "L"})

    run(main)
    begin_ms = host.log.read(0, 1 << 20)[0].timestamp_ms
    assert svc.expired(True, host.commit_index(), begin_ms + 500) == []
    aborts = svc.expired(True, host.commit_index(), begin_ms + 1500)
    assert len(aborts) == 1
    assert svc.expired(True, host.commit_index(), begin_ms + 1600) == []  # not re-proposed
    assert svc.expired(False, host.commit_index(), begin_ms + 99_000) == []  # followers never
    host.log.append([aborts[0].placed(host.log.dirty_offset + 1, 1)])
    svc.stable_offset(host.commit_index())
    assert svc.index.table.get("L").state.value == "aborted"


def test_a_staged_batch_that_is_not_records_is_refused():
    """load_stage applies the produce rule (storage/records.py) to its records: a payload that
    is not `count` records is refused with BAD_REQUEST and nothing is appended."""
    host = FakeHost()
    svc = LoadService(host.log, timeout_ms=1000)

    async def main():
        gen = (await call(svc, host, {"t": "load_begin", "id": 1, "load_id": "L"}))["load"]["gen"]
        dirty = host.log.dirty_offset
        stage = {"t": "load_stage", "id": 2, "load_id": "L", "gen": gen, "partition": 0,
                 "attempt": 0, "seq": 0}
        for payload, count, fragment in (
                (b"\xc1not msgpack records", 3, "0xc1"),
                (encode_values([b"a" * 8, b"b" * 8]), 3, "holds 2 records but count is 3"),
                (encode_values([b"x"]), 2**40, "cannot fit")):
            r = await call(svc, host, {**stage, "count": count, "payload": payload})
            assert r["error"]["code"] == "BAD_REQUEST", r
            assert fragment in r["error"]["message"], r["error"]["message"]
        assert host.log.dirty_offset == dirty
        r = await call(svc, host, {**stage, "count": 2, "payload": encode_values([b"a", b"b"])})
        assert r["ok"], r

    run(main)


def test_the_leader_check_comes_before_the_field_checks():
    """A follower answers NOT_LEADER (naming the leader) even to a malformed load request, so
    the client goes to the leader first; the leader answers the bad field with a reply."""
    host = FakeHost()
    svc = LoadService(host.log, timeout_ms=1000)
    bad = {"t": "load_stage", "id": 4, "load_id": "L", "gen": "one"}

    async def main():
        host.leader = False
        r = await call(svc, host, bad)
        assert r["error"]["code"] == "NOT_LEADER" and r["id"] == 4, r
        host.leader = True
        r = await call(svc, host, bad)
        assert r["error"]["code"] == "BAD_REQUEST" and '"gen"' in r["error"]["message"], r

    run(main)
