"""A one-process, no-Raft stand-in server for fast sparkio tests of the wire contract.

It serves `fetch`, `status` and the `load_*` operations from a MemoryLog with the same
LoadService the real node uses (commit index = last appended offset). The real 3-node cluster
tests (test_spark_cluster.py) are what prove replication; this one keeps the Spark-side tests
independent of the cluster's start-up time. Run: python tests/spark/single_node.py PORT
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import msgpack
import trio

from raft.load_service import LoadService
from raft.ready import ProduceAnswer
from raft.types import ErrorCode
from raft.wire import error_reply, ok_reply
from storage.memory import MemoryLog

_LEN = 4


@dataclass
class Host:
    log: MemoryLog

    def is_leader(self) -> bool:
        return True

    def commit_index(self) -> int:
        return self.log.dirty_offset

    def not_leader_reply(self, rid: int) -> dict:
        return error_reply(rid, ErrorCode.NOT_LEADER, "never happens here")

    async def propose_and_wait(self, batch, acks, timeout_s):  # noqa: ANN001
        base = self.log.dirty_offset + 1
        self.log.append([batch.placed(base, 1)])
        return ProduceAnswer(0, ErrorCode.OK, base, base + batch.count - 1)


async def serve(port: int) -> None:
    log = MemoryLog()
    host = Host(log)
    svc = LoadService(log)

    async def fetch(req: dict) -> dict:
        rid, off = req["id"], req["offset"]
        stable = svc.stable_offset(host.commit_index())
        if off < log.start_offset or off > stable + 1:
            return error_reply(rid, ErrorCode.OFFSET_OUT_OF_RANGE, "out of range",
                               start_offset=log.start_offset, high_watermark=stable)
        out, nxt = [], off
        if off <= stable:
            read = [b for b in log.read(off, req.get("max_bytes", 1 << 20))
                    if b.last_offset <= stable]
            nxt = read[-1].last_offset + 1 if read else off
            for b, payload in svc.visible(read, stable):
                out.append({"base_offset": b.base_offset, "count": b.count,
                            "timestamp_ms": b.timestamp_ms, "payload": payload})
        return ok_reply(rid, batches=out, high_watermark=stable, start_offset=log.start_offset,
                        next_offset=nxt)

    async def conn(stream: trio.SocketStream) -> None:
        buf = bytearray()

        async def recv() -> dict | None:
            while True:
                if len(buf) >= _LEN:
                    n = int.from_bytes(buf[:_LEN], "big")
                    if len(buf) >= _LEN + n:
                        obj = msgpack.unpackb(bytes(buf[_LEN:_LEN + n]), raw=False)
                        del buf[:_LEN + n]
                        return obj
                data = await stream.receive_some(1 << 20)
                if not data:
                    return None
                buf.extend(data)

        async def send(obj: dict) -> None:
            body = msgpack.packb(obj, use_bin_type=True)
            await stream.send_all(len(body).to_bytes(4, "big") + body)

        try:
            while (req := await recv()) is not None:
                t = req.get("t")
                if t == "hello":
                    await send({"v": 1, "t": "hello", "node_id": 1})
                elif svc.handles(t):
                    await send(await svc.handle(host, req))
                elif t == "fetch":
                    await send(await fetch(req))
                elif t == "status":
                    await send(ok_reply(req["id"], status={
                        "node_id": 1, "role": "leader", "leader_id": 1,
                        "dirty_offset": log.dirty_offset, "commit_index": log.dirty_offset,
                        "high_watermark": svc.stable_offset(log.dirty_offset)}))
                else:
                    await send(error_reply(req.get("id", 0), ErrorCode.BAD_REQUEST, t))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    await trio.serve_tcp(conn, port, host="127.0.0.1")


if __name__ == "__main__":
    trio.run(serve, int(sys.argv[1]))
