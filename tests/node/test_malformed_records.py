"""Issue 24 item 3 on in-process nodes: a produce whose payload is not `count` records of the
documented shape is refused (BAD_REQUEST, the connection stays, nothing is appended), and a
committed batch that cannot be decoded (written here straight through the leader's Raft group,
as a node before the check or a faulty library would have) is reported by the client library
with its offsets while every record around it stays readable."""

from __future__ import annotations

import msgpack

from inproc_cluster import RawClient, running_cluster, trio_test, values_payload
from raft.client import Client, Consumer, UndecodableBatch, UndecodableBatchError
from raft.core.types import Acks, ErrorCode
from storage.batch import Batch
from storage.records import Record, encode_records

# The payload from the issue: sent with count=3 it was acknowledged and committed.
ISSUE_PAYLOAD = b"\xc1not msgpack records"

MALFORMED = [
    (ISSUE_PAYLOAD, 3, "starts with the never-used byte 0xc1"),
    (encode_records([Record(b"one-" * 4), Record(b"two-" * 4)]), 3,
     "holds 2 records but count is 3"),
    (msgpack.packb([[None, "text, not bin", None]]), 1, "the value must be a bin, got a str"),
    (encode_records([Record(b"v")]) + b"\xc0", 1, "1 bytes follow"),
    (msgpack.packb([[None, b"v", [["h", 7]]]], use_bin_type=True), 1,
     "header 0's value must be a bin or nil"),
]


@trio_test
async def test_a_malformed_produce_is_refused_and_nothing_is_appended() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        first = await cl.request("produce", payload=values_payload([b"before"]), count=1)
        assert first["ok"], first
        for payload, count, fragment in MALFORMED:
            r = await cl.request("produce", payload=payload, count=count)
            assert not r["ok"], (fragment, r)
            assert r["error"]["code"] == "BAD_REQUEST"
            message = r["error"]["message"]
            assert fragment in message and "docs/PROTOCOL.md" in message, message
        # The connection still serves, and the refused batches took no offsets.
        after = await cl.request("produce", payload=values_payload([b"after"]), count=1)
        assert after["ok"] and after["base_offset"] == first["base_offset"] + 1, after
        await cl.aclose()


@trio_test
async def test_readers_report_an_undecodable_batch_and_read_on() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        async with Client([n.address for n in c.nodes], timeout=10) as client:
            before = await client.produce([b"b0", b"b1"], timestamp_ms=1_000)
            # What a node without the check appended for the issue's produce.
            ans = await leader.group.propose_and_wait(
                Batch.create(ISSUE_PAYLOAD, 3, timestamp_ms=2_000), Acks.QUORUM, 10.0)
            assert ans.error == ErrorCode.OK, ans
            bad = (ans.base_offset, ans.last_offset)
            after = await client.produce([b"a0", b"a1"], timestamp_ms=3_000)
            assert after.base_offset == bad[1] + 1
            # Finding offsets by time counts it by its timestamp, like any batch.
            assert await client.offset_for_time(1_500) == bad[0]
            assert await client.offset_for_time(2_500) == after.base_offset
            assert await client.offset_for_time(500) == before.base_offset

            res = await client.fetch(before.base_offset)
            assert [(r.offset, r.value) for r in res.records] == [
                (before.base_offset, b"b0"), (before.base_offset + 1, b"b1"),
                (after.base_offset, b"a0"), (after.base_offset + 1, b"a1")]
            assert [(u.first_offset, u.last_offset) for u in res.undecodable] == [bad]
            assert "0xc1" in res.undecodable[0].reason
            assert f"offsets {bad[0]}-{bad[1]}" in res.undecodable[0].message
            # Fetching from inside the batch still names the whole batch.
            inside = await client.fetch(bad[0] + 1)
            assert [(u.first_offset, u.last_offset) for u in inside.undecodable] == [bad]
            assert [r.value for r in inside.records] == [b"a0", b"a1"]

            # The Consumer raises once, after the records before it; iterating again reads on.
            got: list[bytes] = []
            errors: list[UndecodableBatchError] = []
            async with Consumer(client, "raiser", follow=False) as consumer:
                while True:
                    try:
                        async for record in consumer:
                            got.append(record.value)
                        break
                    except UndecodableBatchError as e:
                        assert got == [b"b0", b"b1"], got  # the records before came first
                        errors.append(e)
            assert got == [b"b0", b"b1", b"a0", b"a1"]
            assert [(e.first_offset, e.last_offset) for e in errors] == [bad]
            assert f"offsets {bad[0]}-{bad[1]}" in str(errors[0])
            # Closing committed past everything read, the bad batch included (the position may
            # be further still: the subscription's own entries take offsets too).
            sub = await client.subscription("raiser")
            assert sub["position"] > after.last_offset

            # Or a callback is told, and the iteration never stops.
            told: list[UndecodableBatch] = []
            async with Consumer(client, "teller", follow=False,
                                on_undecodable=told.append) as consumer:
                values = [r.value async for r in consumer]
            assert values == [b"b0", b"b1", b"a0", b"a1"]
            assert [(u.first_offset, u.last_offset) for u in told] == [bad]

            # A subscription positioned inside the batch: told once, never moved back.
            told.clear()
            async with Consumer(client, "inside", follow=False, start=bad[0] + 1,
                                exclusive=True, on_undecodable=told.append) as consumer:
                values = [r.value async for r in consumer]
            assert values == [b"a0", b"a1"]
            assert [(u.first_offset, u.last_offset) for u in told] == [bad]
            assert (await client.subscription("inside"))["position"] > after.last_offset
