"""How shards 1..K-1 of a node follow the controller (docs/SHARDS.md).

The controller group lives on shard 0 of each node. The supervisor (raft.node.supervisor) gives
shard 0 the write end of one pipe per other shard, and shard k the read end of its own. Shard 0
(`FeedWriter`) writes the controller metadata it applied, whenever it changes, as one frame: a
4-byte big-endian length and a msgpack map {"meta": ClusterMetadata.to_snapshot(), "founders":
[[group, [node, ...]], ...], "leader": id, "address": shard 0 address of the controller's
leader, "caught_up": bool}. Only the newest state matters, so a writer that is behind skips to
it: a slow reader costs shard 0 nothing but one pending write.

Shard k (`ShardFollower`) stands where shard 0 has raft.node.controller.ControllerService: the
metadata, the founders of each group, whether the metadata is caught up, the listeners told of
every new state (the reconciler starts and stops the partitions placed on shard k). It never
proposes: topic requests go to shard 0 of the controller's leader, as the metadata says.

The pipe is local and private to the node's processes (no socket, no authentication needed);
shard 0 ending closes it, and the supervisor then stops the node (fail-stop as a whole).
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import trio

from raft.controller.state import ClusterMetadata
from raft.core.types import ErrorCode
from raft.node.controller import Proposed

log = logging.getLogger("raftlog.node")

FEEDS_ENV = "RAFTLOG_SHARD_FEEDS"  # shard 0: "fd,fd,..." (write ends, shard 1..K-1)
FEED_ENV = "RAFTLOG_CONTROLLER_FEED"  # shard k: "fd" (its read end)
RESEND_CHECK_S = 0.5  # how often the writer looks at the controller's leader (it moves alone)
MAX_FEED_FRAME = 256 * 1024 * 1024
_LEN = struct.Struct(">I")


def encode_feed(state: dict[str, Any]) -> bytes:
    body = msgpack.packb(state, use_bin_type=True)
    return _LEN.pack(len(body)) + body


class FeedWriter:
    """Shard 0's side: the applied controller metadata to every other shard of this node."""

    def __init__(self, fds: list[int], runtime: Any) -> None:
        self.fds = fds
        self.runtime = runtime  # raft.node.topic_runtime.TopicRuntime
        self._changed = trio.Event()
        self.sent = 0

    def kick(self) -> None:
        self._changed.set()

    def _key(self) -> tuple[Any, ...]:
        ctl = self.runtime.controller
        return ctl.applied, ctl.leader(), ctl.caught_up()

    def state(self) -> dict[str, Any]:
        ctl = self.runtime.controller
        meta = ctl.metadata
        leader = ctl.leader()
        info = meta.nodes.get(leader) if leader is not None else None
        return {"meta": meta.to_snapshot(),
                "founders": [[g, list(f)] for g, f in sorted(ctl.founders.items())],
                "leader": leader, "address": None if info is None else info.address,
                "caught_up": ctl.caught_up()}

    async def run(self) -> None:
        streams = [trio.lowlevel.FdStream(fd) for fd in self.fds]
        last: tuple[Any, ...] | None = None
        while streams:
            with trio.move_on_after(RESEND_CHECK_S):
                await self._changed.wait()
            self._changed = trio.Event()
            key = self._key()
            if key == last or key[0] < 0:
                continue
            frame = encode_feed(self.state())
            for stream in list(streams):
                try:
                    await stream.send_all(frame)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                    log.warning("shard_feed_closed error=%s (that shard stopped; the "
                                "supervisor stops the node)", e)
                    streams.remove(stream)
            last = key
            self.sent += 1


class ShardFollower:
    """Shard k's controller: the metadata shard 0 applied (module docstring)."""

    def __init__(self, fd: int, shard: int) -> None:
        self.fd = fd
        self.shard = shard
        self._metadata = ClusterMetadata()
        self.founders: dict[int, tuple[int, ...]] = {}
        self.leader_hint: tuple[int | None, str | None] = (None, None)
        self._caught_up = False
        self._applied = trio.Event()
        self.on_applied: list[Callable[[], None]] = []
        self.states = 0

    @property
    def metadata(self) -> ClusterMetadata:
        return self._metadata

    @property
    def applied(self) -> int:
        return self._metadata.applied

    def open(self) -> None:
        """Nothing to restore: shard 0 sends the whole state first."""

    def caught_up(self) -> bool:
        return self._caught_up

    def leader(self) -> int | None:
        return self.leader_hint[0]

    def take(self, state: dict[str, Any]) -> None:
        """A state from shard 0 (ValueError if malformed: shard 0 wrote it, a bug)."""
        self._metadata = ClusterMetadata.from_snapshot(state["meta"])
        self.founders = {int(g): tuple(f) for g, f in state["founders"]}
        self.leader_hint = (state.get("leader"), state.get("address"))
        self._caught_up = bool(state.get("caught_up"))
        self.states += 1
        self._applied.set()
        self._applied = trio.Event()
        for listener in list(self.on_applied):
            listener()

    async def run(self) -> None:
        stream = trio.lowlevel.FdStream(self.fd)
        buffer = bytearray()
        while True:
            chunk = await stream.receive_some(1 << 20)
            if not chunk:
                log.warning("shard_feed_ended shard=%d (shard 0 stopped; the supervisor "
                            "stops the node)", self.shard)
                return
            buffer += chunk
            newest = None
            while len(buffer) >= _LEN.size:
                (size,) = _LEN.unpack_from(buffer)
                if size > MAX_FEED_FRAME:
                    raise ValueError(f"controller feed frame of {size} bytes")
                if len(buffer) < _LEN.size + size:
                    break
                newest = bytes(buffer[_LEN.size:_LEN.size + size])
                del buffer[:_LEN.size + size]
            if newest is not None:  # only the newest state matters
                self.take(msgpack.unpackb(newest, raw=False, strict_map_key=False))

    async def wait_applied(self, offset: int) -> bool:
        while self._metadata.applied < offset:
            await self._applied.wait()
        return True

    async def propose(self, command: Any, timeout_s: float) -> Proposed:
        leader, address = self.leader_hint
        return Proposed(error=ErrorCode.NOT_LEADER,
                        message=f"topic requests go to the controller's leader, shard 0 of "
                                f"node {leader} ({address}); this is shard {self.shard}")


def feed_fds(env: dict[str, str] | None = None) -> tuple[list[int], int | None]:
    """(write fds for shard 0, read fd for shard k) from the supervisor's environment."""
    env = os.environ if env is None else env
    writes = [int(x) for x in env.get(FEEDS_ENV, "").split(",") if x]
    read = env.get(FEED_ENV)
    return writes, int(read) if read else None
