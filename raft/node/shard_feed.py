"""How shards 1..K-1 of a node follow the controller (docs/SHARDS.md).

The controller group lives on shard 0 of each node. The supervisor (raft.node.supervisor) gives
shard 0 the write end of one pipe per other shard, and shard k the read end of its own. Shard 0
(`FeedWriter`) writes the controller metadata it applied, whenever it changes, as one frame: a
4-byte big-endian length and a msgpack map {"meta": ClusterMetadata.to_snapshot() (each
partition's founders included), "leader": id, "address": shard 0 address of the controller's
leader, "caught_up": bool}. Only the newest state matters, so a writer that is behind skips to
it: a slow reader costs shard 0 nothing but one pending write.

Shard k (`ShardFollower`) stands where shard 0 has raft.node.controller.ControllerService: the
metadata (with each group's founders), whether the metadata is caught up, the listeners told of
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
REPORTS_ENV = "RAFTLOG_SHARD_REPORTS"  # shard 0: "fd,fd,..." (read ends of the reports)
REPORT_ENV = "RAFTLOG_SHARD_REPORT"  # shard k: "fd" (the write end of its report)
REPORT_EVERY_S = 0.2  # how often a shard looks for leadership changes of its partitions
FIGURES_EVERY_S = 1.0  # how often a shard sends its figures (shard_figures) all the same
RESEND_CHECK_S = 0.5  # how often the writer looks at the controller's leader (it moves alone)
MAX_FEED_FRAME = 256 * 1024 * 1024
_LEN = struct.Struct(">I")


def encode_feed(state: dict[str, Any]) -> bytes:
    body = msgpack.packb(state, use_bin_type=True)
    return _LEN.pack(len(body)) + body


async def read_frames(stream: Any, take: Callable[[dict[str, Any]], None]) -> None:
    """Frames from `stream` until EOF, each decoded and given to `take` (only the newest of
    those read together: every frame is a whole state)."""
    buffer = bytearray()
    while True:
        chunk = await stream.receive_some(1 << 20)
        if not chunk:
            return
        buffer += chunk
        newest = None
        while len(buffer) >= _LEN.size:
            (size,) = _LEN.unpack_from(buffer)
            if size > MAX_FEED_FRAME:
                raise ValueError(f"shard feed frame of {size} bytes")
            if len(buffer) < _LEN.size + size:
                break
            newest = bytes(buffer[_LEN.size:_LEN.size + size])
            del buffer[:_LEN.size + size]
        if newest is not None:
            take(msgpack.unpackb(newest, raw=False, strict_map_key=False))


def local_leaders(runtime: Any) -> dict[int, int]:
    """{group: leader id} of the partitions this shard runs whose leader it knows."""
    out = {}
    for group in runtime.node.registry.groups():
        gid, core = group.group_id, group.core
        if core is not None and core.leader_id is not None and \
                (gid not in runtime.unmanaged or runtime.shard == 0):
            out[gid] = core.leader_id
    return out


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def shard_figures(runtime: Any) -> dict[str, Any]:
    """This shard process's own figures for the node's `status` (docs/SHARDS.md): the groups
    it runs, its CPU seconds (every thread: utime+stime), its resident memory and its event
    loop's largest recent lag. Read from the process itself: cheap, no scrape."""
    times = os.times()
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        rss = None
    node = runtime.node
    lag = getattr(node, "loop_lag", None)
    return {"groups": len(node.registry.ids()), "cpu_seconds": round(times.user +
                                                                      times.system, 2),
            "rss_bytes": rss,
            "loop_lag_max_ms": None if lag is None else lag.snapshot().to_dict()["max_ms"]}


class LeaderReporter:
    """Shard k's side of the way back: the leaders of its partitions, when they change, so
    shard 0 (and through its feed every shard) answers `metadata` with every partition's
    leader (clients go straight to it: docs/SHARDS.md); and its own figures
    (`shard_figures`, every FIGURES_EVERY_S) for the node's `status`."""

    def __init__(self, fd: int, runtime: Any) -> None:
        self.fd = fd
        self.runtime = runtime

    async def run(self) -> None:
        stream = trio.lowlevel.FdStream(self.fd)
        last: dict[int, int] | None = None
        figures_at = -FIGURES_EVERY_S
        while True:
            leaders = local_leaders(self.runtime)
            now = trio.current_time()
            if leaders != last or now - figures_at >= FIGURES_EVERY_S:
                report = {"leaders": sorted(leaders.items()),
                          "figures": shard_figures(self.runtime)}
                try:
                    await stream.send_all(encode_feed(report))
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return  # shard 0 stopped: the supervisor stops the node
                last, figures_at = leaders, now
            await trio.sleep(REPORT_EVERY_S)


class FeedWriter:
    """Shard 0's side: the applied controller metadata to every other shard of this node."""

    def __init__(self, fds: list[int], runtime: Any, reports: list[int] = ()) -> None:
        self.fds = fds
        self.reports = list(reports)
        self.runtime = runtime  # raft.node.topic_runtime.TopicRuntime
        self._changed = trio.Event()
        self.sent = 0
        self.remote: dict[int, dict[int, int]] = {}  # shard -> {group: leader} it reported
        self.figures: dict[int, dict[str, Any]] = {}  # shard -> its last shard_figures

    def kick(self) -> None:
        self._changed.set()

    def leaders(self) -> dict[int, int]:
        """Every shard's partitions' leaders, as far as known here."""
        out = local_leaders(self.runtime)
        for reported in self.remote.values():
            out.update(reported)
        return out

    def _key(self) -> tuple[Any, ...]:
        ctl = self.runtime.controller
        return (ctl.applied, ctl.leader(), ctl.caught_up(),
                tuple(sorted(self.leaders().items())))

    async def _read_reports(self, shard: int, fd: int) -> None:
        def take(state: dict[str, Any]) -> None:
            leaders = {int(g): int(n) for g, n in state["leaders"]}
            self.figures[shard] = dict(state.get("figures") or {})
            if leaders != self.remote.get(shard):
                self.remote[shard] = leaders
                self.kick()

        await read_frames(trio.lowlevel.FdStream(fd), take)

    def state(self) -> dict[str, Any]:
        ctl = self.runtime.controller
        meta = ctl.metadata
        leader = ctl.leader()
        info = meta.nodes.get(leader) if leader is not None else None
        return {"meta": meta.to_snapshot(),
                "leader": leader, "address": None if info is None else info.address,
                "caught_up": ctl.caught_up(), "leaders": sorted(self.leaders().items())}

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for shard, fd in enumerate(self.reports, start=1):
                nursery.start_soon(self._read_reports, shard, fd)
            await self._write()

    async def _write(self) -> None:
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
        self.leader_hint: tuple[int | None, str | None] = (None, None)
        self.leaders: dict[int, int] = {}  # group -> leader id, every shard's (shard 0 merged)
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
        self.leader_hint = (state.get("leader"), state.get("address"))
        self._caught_up = bool(state.get("caught_up"))
        self.leaders = {int(g): int(n) for g, n in state.get("leaders") or ()}
        self.states += 1
        self._applied.set()
        self._applied = trio.Event()
        for listener in list(self.on_applied):
            listener()

    async def run(self) -> None:
        await read_frames(trio.lowlevel.FdStream(self.fd), self.take)
        log.warning("shard_feed_ended shard=%d (shard 0 stopped; the supervisor stops the "
                    "node)", self.shard)

    async def wait_applied(self, offset: int) -> bool:
        while self._metadata.applied < offset:
            await self._applied.wait()
        return True

    async def propose(self, command: Any, timeout_s: float) -> Proposed:
        leader, address = self.leader_hint
        return Proposed(error=ErrorCode.NOT_LEADER,
                        message=f"topic requests go to the controller's leader, shard 0 of "
                                f"node {leader} ({address}); this is shard {self.shard}")


def _fds(env: Any, name: str) -> list[int]:
    return [int(x) for x in env.get(name, "").split(",") if x]


def feed_fds(env: dict[str, str] | None = None) -> tuple[list[int], list[int], int | None,
                                                         int | None]:
    """From the supervisor's environment: shard 0's feed write ends and report read ends;
    shard k's feed read end and report write end."""
    env = os.environ if env is None else env
    read, report = _fds(env, FEED_ENV), _fds(env, REPORT_ENV)
    return (_fds(env, FEEDS_ENV), _fds(env, REPORTS_ENV), read[0] if read else None,
            report[0] if report else None)
