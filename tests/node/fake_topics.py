"""A fake cluster with topics, in this process, for the client's routing tests: nodes that speak
the wire protocol (hello, metadata, topic_create, produce, fetch, status) over real sockets,
with one shared truth (who leads each partition) and a metadata view the test can make stale,
so a test can set up exactly the redirect, the unknown topic or the lost connection it is
about. Partition logs and the idempotent producer tables are kept per (topic, partition), as
each partition's Raft group keeps them in a real node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio

from raft.protocol.framing import encode_frame
from raft.protocol.replies import ok_reply
from raft.protocol.streams import FrameReader


def error(rid: int, code: str, message: str, **details: Any) -> dict[str, Any]:
    return {"t": "reply", "id": rid, "ok": False,
            "error": {"code": code, "message": message, **details}}


@dataclass
class FakeCluster:
    """The shared state of the fake nodes. `leaders[topic][p]` is the truth; `meta_leaders`
    is what `metadata` answers (None: the truth), so a test can make it stale."""

    nodes: dict[int, str] = field(default_factory=dict)
    leaders: dict[str, list[int]] = field(default_factory=dict)
    meta_leaders: dict[str, list[int]] | None = None
    hints: bool = True  # NOT_LEADER names the leader
    controller: int = 1
    lagging: set[int] = field(default_factory=set)  # nodes that answer UNKNOWN_TOPIC for new topics
    new_topics: set[str] = field(default_factory=set)
    logs: dict[tuple[str, int], list[tuple[bytes, int, int]]] = field(default_factory=dict)
    producers: dict[tuple[str, int, int], dict[int, tuple[int, int]]] = \
        field(default_factory=dict)
    frames: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (node, frame)
    metadata_requests: int = 0
    drop_reply_once: set[tuple[str, int]] = field(default_factory=set)  # hang up after write

    def add_topic(self, name: str, partitions: int) -> None:
        ids = sorted(self.nodes)
        self.leaders[name] = [ids[p % len(ids)] for p in range(partitions)]
        for p in range(partitions):
            self.logs[(name, p)] = []

    def produced(self, topic: str, partition: int) -> list[tuple[bytes, int, int]]:
        return self.logs[(topic, partition)]

    def metadata(self) -> dict[str, Any]:
        view = self.meta_leaders if self.meta_leaders is not None else self.leaders
        topics = []
        for name, leaders in sorted(view.items()):
            ids = sorted(self.nodes)
            topics.append({"name": name, "settings": {}, "partitions": [
                {"partition": p, "group": 1 + p, "leader": lead,
                 "leader_address": self.nodes.get(lead),
                 "replicas": [lead] + [i for i in ids if i != lead][:2]}
                for p, lead in enumerate(leaders)]})
        return {"controller": self.controller,
                "controller_address": self.nodes[self.controller], "applied": 7,
                "nodes": [{"node_id": i, "address": a} for i, a in sorted(self.nodes.items())],
                "topics": topics}

    def answer(self, node: int, frame: dict[str, Any]) -> dict[str, Any]:
        self.frames.append((node, frame))
        rid, t = frame["id"], frame["t"]
        if t == "metadata":
            self.metadata_requests += 1
            meta = self.metadata()
            if node in self.lagging and node != self.controller:  # its view lacks new topics
                meta["topics"] = [t for t in meta["topics"] if t["name"] not in self.new_topics]
            return ok_reply(rid, **meta)
        if t == "status":
            return ok_reply(rid, status={"node_id": node, "role": "leader"})
        if t == "topic_create":
            if node != self.controller:
                return error(rid, "NOT_LEADER", "not the controller's leader",
                             leader_id=self.controller,
                             leader_addr=self.nodes[self.controller])
            if frame["name"] in self.leaders:
                return error(rid, "TOPIC_EXISTS", f"topic {frame['name']!r} exists")
            self.add_topic(frame["name"], frame["partitions"])
            return ok_reply(rid, topic={"name": frame["name"]})
        topic = frame.get("topic", "default")
        partition = frame.get("partition", 0)
        if topic not in self.leaders or (node in self.lagging and topic in self.new_topics):
            return error(rid, "UNKNOWN_TOPIC", f"unknown topic {topic!r}", topic=topic,
                         topics=sorted(t for t in self.leaders if t not in self.new_topics
                                       or node not in self.lagging))
        if partition >= len(self.leaders[topic]):
            return error(rid, "UNKNOWN_TOPIC", f"no partition {partition}", topic=topic,
                         partitions=len(self.leaders[topic]))
        lead = self.leaders[topic][partition]
        if lead != node:
            hint = {"leader_id": lead, "leader_addr": self.nodes[lead]} if self.hints else {}
            return error(rid, "NOT_LEADER", f"node {node} does not lead {topic}/{partition}",
                         **hint)
        log = self.logs.setdefault((topic, partition), [])
        if t == "produce":
            pid, seq = frame.get("producer_id", 0), frame.get("sequence", -1)
            table = self.producers.setdefault((topic, partition, pid), {})
            if pid and seq in table:
                base, last = table[seq]
                return ok_reply(rid, base_offset=base, last_offset=last, duplicate=True)
            base = sum(c for _, c, _ in log)
            log.append((frame["payload"], frame["count"], base))
            last = base + frame["count"] - 1
            if pid:
                table[seq] = (base, last)
            return ok_reply(rid, base_offset=base, last_offset=last)
        if t == "fetch":
            offset = frame["offset"]
            hw = sum(c for _, c, _ in log) - 1
            batches = [{"base_offset": base, "payload": payload, "count": count}
                       for payload, count, base in log if base + count > offset]
            return ok_reply(rid, batches=batches[:4], high_watermark=hw, start_offset=0,
                            next_offset=max(offset, (batches[:4][-1]["base_offset"]
                                                     + batches[:4][-1]["count"])
                                            if batches else offset))
        return error(rid, "BAD_REQUEST", f"unknown request type {t!r}")


async def serve_node(cluster: FakeCluster, node: int, listeners: list[trio.SocketListener], *,
                     task_status: Any = trio.TASK_STATUS_IGNORED) -> None:

    async def handle(stream: trio.SocketStream) -> None:
        reader = FrameReader(stream, 64 << 20)
        async with stream:
            if await reader.receive() is None:
                return
            await stream.send_all(encode_frame({"t": "hello", "node_id": node}))
            while (frame := await reader.receive()) is not None:
                reply = cluster.answer(node, frame)
                key = (frame["t"], node)
                if key in cluster.drop_reply_once:
                    cluster.drop_reply_once.discard(key)
                    return  # written, then the connection is lost before the answer
                await stream.send_all(encode_frame(reply))

    task_status.started()
    await trio.serve_listeners(handle, listeners)


async def start(nursery: trio.Nursery, cluster: FakeCluster, n: int = 3) -> list[str]:
    """Start n fake nodes (ids 1..n); their addresses. Each listens on a port the kernel
    picked and that stayed bound (a port found free and then bound again could be taken in
    between: CI saw EADDRINUSE)."""
    listening = [await trio.open_tcp_listeners(0, host="127.0.0.1") for _ in range(n)]
    for i, listeners in enumerate(listening, start=1):
        cluster.nodes[i] = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    for i, listeners in enumerate(listening, start=1):
        await nursery.start(serve_node, cluster, i, listeners)
    return [cluster.nodes[i] for i in sorted(cluster.nodes)]
