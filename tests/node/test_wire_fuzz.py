"""Wire fuzzing against a live in-process 3-node cluster (issue 24): random frames of every
request type with fields of random types and sizes, malformed hellos and raw garbage, while an
idempotent producer keeps writing at quorum. Afterwards every node must still be up and
serving, every record acknowledged at quorum (the steady producer's and any the fuzzer's
produce frames got) must read back from every node at its acknowledged offset, and no committed
batch may be undecodable: a payload that is not `count` records must never have been appended.

Bounded and reproducible: a seeded RNG drives at most RAFTLOG_FUZZ_CASES cases within
RAFTLOG_FUZZ_BUDGET_S seconds (250 and 20 by default; RAFTLOG_FUZZ_SEED picks another
sequence, to explore further); every assertion names the seed and the case. Membership
changes are kept invalid (a random valid add_node/remove_node would really change the cluster)
and peer hellos never claim a real member's id (peers are trusted by design; TLS guards them).
"""

from __future__ import annotations

import itertools
import math
import os
import random
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
import trio

from inproc_cluster import DEADLINE_S, Producer, check_acked, running_cluster, trio_test
from raft.protocol.framing import WireError
from raft.protocol.streams import FrameReader
from raft.node.api import REQUESTS
from raft.node.config import ConfigError, parse_address
from raft.node.load_service import OPS
from raft.protocol.load_requests import LoadAbort
from raft.core.types import Role
from storage.records import MalformedRecords, Record, check_records, decode_records, \
    encode_records

SEED = int(os.environ.get("RAFTLOG_FUZZ_SEED", "240003"))
CASES = int(os.environ.get("RAFTLOG_FUZZ_CASES", "250"))
# And at most this long generating them (a slow CI box runs fewer cases, the same prefix of
# the seed's sequence, so a failure still reproduces by seed and case).
BUDGET_S = float(os.environ.get("RAFTLOG_FUZZ_BUDGET_S", "20"))
MAX_FRAME = 256 * 1024
MEMBERS = (1, 2, 3)
# Every request type the node routes, and names it must refuse.
TYPES = sorted(REQUESTS) + sorted(OPS) + ["hello", "raft", "reply", "error", "nonsense", ""]
FIELDS = ["acks", "timeout_ms", "payload", "count", "producer_id", "sequence", "timestamp_ms",
          "offset", "max_bytes", "max_wait_ms", "to", "node_id", "address", "load_id", "gen",
          "partition", "attempt", "seq", "attempts", "reason", "name", "consumer", "lease_ms",
          "position", "from", "commits", "prefix", "after", "limit", "role", "msgs",
          "auto_reset", "expect"]
# The fields each request type reads: a well-typed frame fills these (so the checks behind
# the field parsing are reached too).
RELEVANT = {
    "produce": ["acks", "timeout_ms", "producer_id", "sequence", "timestamp_ms"],
    "fetch": ["offset", "max_bytes", "max_wait_ms"],
    "transfer_leader": ["to", "timeout_ms"],
    "add_node": ["node_id", "address"],
    "remove_node": ["node_id"],
    "sub_open": ["name", "consumer", "from", "lease_ms", "auto_reset", "timeout_ms"],
    "sub_commit": ["name", "position", "consumer", "lease_ms", "timeout_ms"],
    "sub_commit_many": ["commits", "timeout_ms"],
    "sub_reset": ["name", "to", "consumer", "expect", "timeout_ms"],
    "sub_pin": ["name", "from", "consumer"],
    "sub_release": ["name", "consumer"],
    "sub_delete": ["name"],
    "sub_get": ["name"],
    "sub_list": ["prefix", "after", "limit"],
    "load_begin": ["load_id"],
    "load_stage": ["load_id", "gen", "partition", "attempt", "seq", "acks", "timeout_ms"],
    "load_commit": ["load_id", "gen", "attempts"],
    "load_abort": ["load_id", "gen", "reason"],
    "load_status": ["load_id"],
}
INTS = [0, 1, -1, 2, 7, 255, 256, 65535, 2**31 - 1, 2**31, 2**32, 2**53, 2**63 - 1,
        -(2**63), 2**64 - 1]


# -- random values --------------------------------------------------------------------------------
def rand_value(rng: random.Random, depth: int = 0) -> Any:
    """Any msgpack value: scalars of every type and awkward size, and nested containers."""
    kind = rng.randrange(11 if depth < 2 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(INTS)
    if kind == 3:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 4:
        return rng.choice([0.0, -1.5, 1e300, math.inf, -math.inf, math.nan, rng.random()])
    if kind == 5:
        n = rng.choice([0, 1, 5, 40, 300, 70_000])
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x2FFF)]))
                       for _ in range(min(n, 300))) * max(1, n // 300)
    if kind in (6, 7):
        n = rng.choice([0, 1, 8, 64, 1000, 100_000, MAX_FRAME + 10])
        return rng.randbytes(min(n, 4096)) * max(1, n // 4096)
    if kind in (8, 9):
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {rand_key(rng): rand_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def rand_key(rng: random.Random) -> Any:
    return rng.choice(FIELDS) if rng.random() < 0.7 else rand_value(rng, 2)


_VALUES = itertools.count()


def rand_records(rng: random.Random) -> list[Record]:
    """Records whose values are unique in the run (so each acknowledged one is found once)."""
    return [Record(b"fz%d-" % next(_VALUES) + rng.randbytes(rng.randrange(40)),
                   rng.choice([None, rng.randbytes(rng.randrange(8))]),
                   rng.choice([None, tuple((f"h{j}", rng.randbytes(3))
                                           for j in range(rng.randrange(3)))]) or None)
            for _ in range(rng.randrange(1, 6))]


def rand_payload(rng: random.Random) -> tuple[bytes, int]:
    """(payload, count): valid records, or records spoiled in one of many ways."""
    recs = rand_records(rng)
    payload, count = encode_records(recs), len(recs)
    spoil = rng.randrange(12)  # 0, 7..11: left valid
    if spoil == 1:
        count += rng.choice([-1, 1, 2, 1000, 2**31 - 2])
    elif spoil == 2 and len(payload) > 1:
        payload = payload[:rng.randrange(1, len(payload))]
    elif spoil == 3:
        i = rng.randrange(len(payload))
        payload = payload[:i] + bytes([rng.randrange(256)]) + payload[i + 1:]
    elif spoil == 4:
        payload += rng.randbytes(rng.randrange(1, 4))
    elif spoil == 5:
        payload = msgpack.packb(rand_value(rng), use_bin_type=True)
    elif spoil == 6:
        payload = b"\xc1not msgpack records"  # the issue's
        count = 3
    return payload, max(count, rng.choice([count, 0, -1]) if rng.random() < 0.1 else count)


def plausible(rng: random.Random, name: str) -> Any:
    """A value of the right type for the field (so deeper checks are reached)."""
    if name == "acks":
        return rng.choice(["quorum", "quorum", "quorum", "leader", "none", "all"])
    if name in ("timeout_ms", "max_wait_ms"):
        return rng.randint(0, 300) if rng.random() < 0.1 else rng.randint(100, 1000)
    if name in ("offset", "position", "gen", "to"):
        return rng.randint(-2, 60)
    if name in ("max_bytes", "lease_ms", "limit"):
        return rng.choice([1, 100, 1 << 20, 2**40])
    if name == "producer_id":
        return rng.choice([0, 0, 0, 0, 0, -1, 77, 2**62])
    if name in ("sequence", "partition", "attempt", "seq", "timestamp_ms"):
        return rng.choice([-1, 0, 0, 0, 1, 2, 77, 2**62])
    if name in ("load_id", "name", "consumer", "prefix", "after", "reason"):
        return rng.choice(["", "fz", f"fz-{rng.randrange(4)}", f"fz-{rng.randrange(4)}",
                           "a b", "x" * 300])
    if name == "from":
        return rng.choice(["start", "end", 0, 5, "middle"])
    if name == "attempts":
        return [[rng.randrange(3), rng.randrange(3), rng.randrange(3), rng.randrange(9)]
                for _ in range(rng.randrange(3))]
    if name == "commits":
        return [{"name": f"fz-{rng.randrange(4)}", "position": rng.randrange(30)}
                for _ in range(rng.randrange(4))]
    if name == "msgs":
        return [{"k": rng.choice(["hb", "ae", "rv", "zz"]), "term": rand_value(rng, 2)}]
    return rand_value(rng)


def rand_request(rng: random.Random, rid: int, found: Findings) -> dict[str, Any]:
    """Half the frames are well typed (every field the type reads, plausible values, at most
    one field spoiled); the other half carry random fields of random types."""
    t = rng.choice(TYPES + ["produce", "load_stage"] * 4)
    frame: dict[Any, Any] = {"v": 1, "t": t, "id": rid}
    if rng.random() < 0.5:
        for name in RELEVANT.get(t, []):
            if rng.random() < 0.9:
                frame[name] = plausible(rng, name)
        if t.startswith("load_") and found.loads and rng.random() < 0.8:
            frame["load_id"], frame["gen"] = rng.choice(sorted(found.loads))
        if rng.random() < 0.3:
            frame[rng.choice(FIELDS)] = rand_value(rng)
    else:
        for name in rng.sample(FIELDS, rng.randrange(0, 9)):
            frame[name] = plausible(rng, name) if rng.random() < 0.6 else rand_value(rng)
    if t in ("produce", "load_stage") and rng.random() < 0.8:
        frame["payload"], frame["count"] = rand_payload(rng)
    if rng.random() < 0.05:  # a broken envelope: version, type tag or id
        frame[rng.choice(["v", "t", "id"])] = rand_value(rng)
    if rng.random() < 0.05:
        frame[rand_value(rng, 2) if rng.random() < 0.5 else "junk"] = rand_value(rng)
    keep_membership_invalid(frame)
    return frame


def keep_membership_invalid(frame: dict[Any, Any]) -> None:
    """A random add_node/remove_node must not be a valid change of the real cluster."""
    if frame.get("t") not in ("add_node", "remove_node"):
        return
    node_id = frame.get("node_id")
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 1:
        return
    if frame["t"] == "remove_node" and node_id in MEMBERS:
        frame["node_id"] = 1000 + node_id  # not a member: refused
    if frame["t"] == "add_node":
        address = frame.get("address")
        try:
            if isinstance(address, str):
                parse_address(address, what="address")
                frame["address"] = "not an address"
        except ConfigError:
            pass


def rand_hello(rng: random.Random) -> tuple[dict[Any, Any], bool | None]:
    """(a first frame, whether the node must refuse it; None: either answer is right):
    mostly malformed hellos and peer hellos for no member. A version equal to 1 is accepted;
    a client hello with a random token may be either (this cluster runs without
    authentication: a well-formed token is ignored, a malformed one refused)."""
    choice = rng.randrange(6)
    if choice == 0:
        return {"v": 1, "t": "hello", "role": rand_value(rng)}, True
    if choice == 1:
        node_id = rand_value(rng)
        if isinstance(node_id, int) and not isinstance(node_id, bool) and node_id in MEMBERS:
            node_id += 100
        return {"v": 1, "t": "hello", "role": "peer", "node_id": node_id}, True
    if choice == 2:
        return {"v": 1, "t": rng.choice([t for t in TYPES if t != "hello"]), "id": 1}, True
    if choice == 3:
        v = rand_value(rng)
        return {"v": v, "t": "hello", "role": "client"}, v != 1
    if choice == 4:
        return ({"t": "hello", "role": "client", **{rand_key(rng): rand_value(rng)}}
                | {"v": rng.choice([0, 2, None, "1"])}), True
    return {"v": 1, "t": "hello", "role": "client", "token": rand_value(rng)}, None


def rand_garbage(rng: random.Random) -> bytes:
    choice = rng.randrange(6)
    if choice == 0:
        return rng.randbytes(rng.randrange(1, 64))
    if choice == 1:
        return struct.pack(">I", rng.choice([MAX_FRAME + 1, 2**32 - 1])) + rng.randbytes(16)
    if choice == 2:
        return b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    if choice == 3:
        body = msgpack.packb(rand_value(rng), use_bin_type=True)[:MAX_FRAME - 16]
        return struct.pack(">I", len(body)) + body
    if choice == 4:
        return struct.pack(">I", 50) + rng.randbytes(rng.randrange(50))  # truncated
    return b"\x00\x00"  # half a length header


# -- the fuzzing client ---------------------------------------------------------------------------
@dataclass
class Findings:
    acked: list[tuple[int, list[bytes]]] = field(default_factory=list)  # quorum-acked produces
    loads: set[tuple[str, int]] = field(default_factory=set)  # opened by a fuzz load_begin
    replies: int = 0
    errors: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)  # "type code" -> how often


class Conn:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader(stream, 64 << 20)

    async def send(self, data: bytes) -> bool:
        try:
            await self.stream.send_all(data)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return False  # the node closed on an earlier frame

    async def recv(self) -> dict[str, Any] | None:
        """The next frame, None once the node closed the connection."""
        try:
            return await self.reader.receive()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return None


def encode(frame: dict[Any, Any]) -> bytes:
    body = msgpack.packb(frame, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


async def one_case(rng: random.Random, address: str, case: int, found: Findings) -> None:
    where = f"seed {SEED} case {case}"
    host, port = parse_address(address)
    conn = Conn(await trio.open_tcp_stream(host, port))
    try:
        kind = rng.randrange(10)
        if kind == 0:  # raw garbage instead of a hello
            await conn.send(rand_garbage(rng))
            await conn.stream.send_eof()
            await expect_only_errors_then_close(conn, where)
            return
        if kind == 1:  # a malformed hello
            hello, refuse = rand_hello(rng)
            await conn.send(encode(hello))
            err = await conn.recv()
            assert err is not None and err["t"] in ("error", "hello"), (where, hello, err)
            assert refuse is None or (err["t"] == "error") == refuse, (where, hello, err)
            if err["t"] == "error":
                assert err["message"], (where, err)
                assert await conn.recv() is None, f"{where}: open after refusing the hello"
                found.errors += 1
            return
        await conn.send(encode({"v": 1, "t": "hello", "role": "client"}))
        hello = await conn.recv()
        assert hello is not None and hello["t"] == "hello", (where, hello)
        for i in range(rng.randrange(1, 4)):
            if kind == 2 and i > 0:  # garbage mid-session
                await conn.send(rand_garbage(rng))
                await conn.stream.send_eof()
                await expect_only_errors_then_close(conn, where)
                return
            frame = rand_request(rng, case * 10 + i, found)
            try:
                data = encode(frame)
            except (OverflowError, ValueError, TypeError):  # msgpack cannot encode it
                continue
            if not await conn.send(data):
                return
            reply = await conn.recv()
            assert reply is not None, f"{where}: closed without a reply or an error frame"
            if not await judge(frame, reply, found, where):
                assert await conn.recv() is None, f"{where}: open after an error frame"
                return
    finally:
        await conn.stream.aclose()


async def expect_only_errors_then_close(conn: Conn, where: str) -> None:
    while True:
        try:
            frame = await conn.recv()
        except WireError:
            return
        if frame is None:
            return
        # Garbage can happen to parse as a request; otherwise only error frames come back.
        assert frame["t"] in ("error", "reply", "hello"), (where, frame)


async def judge(frame: dict[Any, Any], reply: dict[str, Any], found: Findings,
                where: str) -> bool:
    """Check one answer; True while the connection should stay open."""
    assert reply.get("v") == 1, (where, reply)
    if reply["t"] == "error":  # the frame was refused as unusable: the node hangs up
        assert isinstance(reply["code"], str) and reply["message"], (where, reply)
        found.errors += 1
        return False
    assert reply["t"] == "reply" and reply["id"] == frame["id"], (where, frame, reply)
    found.replies += 1
    outcome = f"{frame['t']} {'OK' if reply['ok'] else reply['error']['code']}"
    found.outcomes[outcome] = found.outcomes.get(outcome, 0) + 1
    if not reply["ok"]:
        err = reply["error"]
        assert isinstance(err["code"], str) and isinstance(err["message"], str) \
            and err["message"], (where, reply)
        # INTERNAL is an unexpected exception in the node: bad input must get a clear error.
        assert err["code"] != "INTERNAL", (where, f"{frame!r:.400}", reply)
        return True
    t = frame["t"]
    if t in ("produce", "load_stage"):
        # The oracle: whatever else the frame held, an accepted payload is valid records.
        try:
            check_records(frame["payload"], frame["count"])
        except (MalformedRecords, TypeError, KeyError) as e:
            raise AssertionError(f"{where}: a {t} of a payload that is not `count` records "
                                 f"was accepted: {e}; frame {frame!r:.300}") from None
        # A duplicate answers for an earlier batch of that producer id and sequence, which
        # may have held other records: only first writes are checked.
        if t == "produce" and frame.get("acks", "quorum") in (None, "quorum") \
                and not reply.get("duplicate"):
            values = [r.value for r in decode_records(frame["payload"], frame["count"])]
            found.acked.append((reply["base_offset"], values))
    if t == "load_begin" and isinstance(reply.get("load"), dict):
        found.loads.add((reply["load"]["load_id"], reply["load"]["gen"]))
    return True


# -- the test -------------------------------------------------------------------------------------
async def read_everything(address: str, where: str) -> list[tuple[int, bytes]]:
    """Every committed record on one node; fails on a batch that is not valid records."""
    host, port = parse_address(address)
    conn = Conn(await trio.open_tcp_stream(host, port))
    out: list[tuple[int, bytes]] = []
    try:
        await conn.send(encode({"v": 1, "t": "hello", "role": "client"}))
        assert (await conn.recv())["t"] == "hello"
        await conn.send(encode({"v": 1, "t": "status", "id": 1}))
        offset = (await conn.recv())["status"]["start_offset"]
        while True:
            await conn.send(encode({"v": 1, "t": "fetch", "id": 2, "offset": offset,
                                    "max_bytes": 1 << 20}))
            reply = await conn.recv()
            assert reply is not None and reply["ok"], (where, reply)
            for b in reply["batches"]:
                try:
                    records = decode_records(b["payload"], b["count"])
                except MalformedRecords as e:
                    raise AssertionError(f"{where}: node {address} committed an undecodable "
                                         f"batch at {b['base_offset']}: {e}") from None
                out.extend((b["base_offset"] + i, r.value) for i, r in enumerate(records))
            offset = reply["next_offset"]
            if offset > reply["high_watermark"]:
                return out
    finally:
        await conn.stream.aclose()


@trio_test
async def test_fuzzed_frames_leave_every_node_up_and_every_acked_record_readable() -> None:
    rng = random.Random(SEED)
    found = Findings()
    async with running_cluster(3, max_frame_bytes=MAX_FRAME, max_fetch_wait_ms=200,
                               max_timeout_ms=2000, default_timeout_ms=2000) as cluster:
        await cluster.wait_leader()
        addresses = [n.address for n in cluster.nodes]
        steady = Producer(addresses, producer_id=2424)
        async with trio.open_nursery() as nursery:
            async def produce_forever() -> None:
                i = 0
                while True:
                    await steady.produce([f"steady-{i}-{j}".encode() for j in range(3)])
                    i += 1

            nursery.start_soon(produce_forever)
            stop_at = trio.current_time() + BUDGET_S
            done = 0
            for case in range(CASES):
                if trio.current_time() > stop_at:
                    break
                done += 1
                # Mostly the leader (the requests that change the log are served there).
                leaders = [n.address for n in cluster.nodes if n.core.role == Role.LEADER]
                target = rng.choice(leaders if leaders and rng.random() < 0.7 else addresses)
                with trio.fail_after(DEADLINE_S):  # a node that stops answering is a failure
                    await one_case(rng, target, case, found)
            # A few more acknowledgements after the last hostile frame.
            target = len(steady.acked) + 3
            with trio.fail_after(DEADLINE_S):
                while len(steady.acked) < target:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
        await steady.aclose()

        where = f"seed {SEED}"
        print(f"wire fuzz {where}: {done} cases, {found.replies} replies, {found.errors} error "
              f"frames, {len(found.acked)} fuzzed produces acknowledged, {len(found.loads)} "
              f"loads opened; replies: {sorted(found.outcomes.items())}")
        assert all(not n._stopped.is_set() for n in cluster.nodes), f"{where}: a node stopped"
        assert found.replies > done // 2 and found.errors > done // 20, found
        # Loads the fuzzer opened hold readers back; abort them (any outcome will do).
        leader = await cluster.wait_leader()
        for load_id, gen in sorted(found.loads):
            await leader.group.loads.handle(leader.api, LoadAbort(load_id, gen))
        with trio.fail_after(DEADLINE_S):
            while leader.group.loads.index.table._open:
                await trio.sleep(0.02)
        await cluster.wait_hw(leader.core.high_watermark)
        for node in cluster.nodes:
            records = await read_everything(node.address, where)
            check_acked(steady.acked + found.acked, records)
        assert steady.acked, f"{where}: the steady producer never got an ack"
