"""The node side of staged loads: wire requests, the fetch filter and the leader's load timeout.

The node calls this through narrow hooks and owns none of the logic:
  * `LoadService.handles(t)` / `await handle(host, req)`: the `load_*` wire requests, typed
    by raft.protocol.load_requests, answered with typed replies;
  * `await catch_up(commit_index)`, then `stable_offset(commit_index)` + `visible(batches,
    stable)`: what fetch may show;
  * `expired(...)`: the leader aborts open loads idle past the timeout (the group's load task
    first applies up to a budget of committed entries per round, `await catch_up(..., budget)`).
The state itself lives in raft/core/loads.py (pure; every node applies the same committed entries).

Applying means reading every committed batch once. That is done in slices of at most
CATCH_UP_SLICE_BYTES / CATCH_UP_SLICE_BATCHES with a checkpoint between slices, never in one
go: after a large write (or a restart) the index may be hundreds of MiB behind, and reading
that in one step held the event loop for seconds.

`host` is the node, seen through `LoadHost`: its log, whether it leads, and one coroutine that
proposes a batch and waits for its ProduceAnswer.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Protocol

import trio

from raft.core.loads import (
    DEFAULT_LOAD_TIMEOUT_MS,
    LoadIndex,
    StageTag,
    encode_abort,
    encode_begin,
    encode_commit,
    encode_staged_payload,
)
from raft.protocol.load_requests import (LOAD_TYPES, LoadAbort, LoadBegin, LoadCommit,
                                         LoadRefused, LoadRequest, LoadStage, LoadStatus)
from raft.protocol.replies import ErrorReply, OkReply, Reply
from raft.core.types import Acks, ErrorCode
from storage.batch import Batch, BatchKind
from storage.records import MalformedRecords, check_records

log = logging.getLogger("raft.core.loads")

OPS = LOAD_TYPES  # the request types this service answers (raft.protocol.load_requests)
# One slice of catching the load index up (then the event loop runs other tasks).
CATCH_UP_SLICE_BYTES = 1 << 20
CATCH_UP_SLICE_BATCHES = 1024


class LoadHost(Protocol):
    def is_leader(self) -> bool: ...

    def commit_index(self) -> int: ...

    def refuse_not_leader(self) -> ErrorReply:
        """NOT_LEADER naming the leader (SHUTTING_DOWN while the node stops)."""
        ...

    async def propose_and_wait(self, batch: Batch, acks: Acks, timeout_s: float) -> Any:
        """Propose `batch`; return the core's ProduceAnswer (error, base/last offset)."""
        ...


def load_timeout_ms() -> int:
    """RAFTLOG_LOAD_TIMEOUT_MS overrides the 1 h default (tests use seconds)."""
    return int(os.environ.get("RAFTLOG_LOAD_TIMEOUT_MS", DEFAULT_LOAD_TIMEOUT_MS))


class LoadService:
    def __init__(self, log_storage, timeout_ms: int | None = None) -> None:  # noqa: ANN001
        self.index = LoadIndex(log_storage)
        self.timeout_ms = load_timeout_ms() if timeout_ms is None else timeout_ms
        self._aborting: dict[tuple[str, int], float] = {}  # (load, gen) -> when we proposed

    # -- catching up ---------------------------------------------------------------------------
    def catch_up_slice(self, commit_index: int) -> bool:
        """Apply one bounded slice of committed entries; True once everything up to
        `commit_index` is applied, or when nothing more can be applied now."""
        before = self.index.table.applied
        done = self.index.catch_up(commit_index, max_bytes=CATCH_UP_SLICE_BYTES,
                                   max_batches=CATCH_UP_SLICE_BATCHES)
        return done or self.index.table.applied == before

    async def catch_up(self, commit_index: int, max_bytes: int | None = None) -> None:
        """Apply what is committed up to `commit_index` (or at most about `max_bytes` of
        it), one bounded slice per event-loop step."""
        slices = 0
        while not self.catch_up_slice(commit_index):
            slices += 1
            if max_bytes is not None and slices * CATCH_UP_SLICE_BYTES >= max_bytes:
                return
            await trio.lowlevel.checkpoint()

    # -- fetch hooks ---------------------------------------------------------------------------
    def stable_offset(self, commit_index: int) -> int:
        """The consumer-visible high watermark: committed, applied, before any open load.
        Applies what is left synchronously: on the event loop, `await catch_up` first."""
        self.index.catch_up(commit_index)
        return self.index.stable_offset(commit_index)

    def visible(self, batches: list[Batch], stable: int) -> list[tuple[Batch, bytes]]:
        """(batch, consumer payload) for the batches a consumer sees, all at or below stable."""
        return self.index.visible_batches(batches, stable)

    # -- timer hook ----------------------------------------------------------------------------
    def expired(self, is_leader: bool, commit_index: int, now_ms: int) -> list[Batch]:
        """Abort batches the leader should propose now (each expired load once a minute)."""
        if not is_leader:
            self._aborting.clear()
            return []
        self.catch_up_slice(commit_index)  # the group's load task applies the rest
        out = []
        for lid, gen in self.index.table.expired(now_ms, self.timeout_ms):
            if now_ms - self._aborting.get((lid, gen), -1e18) < 60_000:
                continue
            self._aborting[(lid, gen)] = now_ms
            log.warning("load timed out load_id=%s gen=%d timeout_ms=%d: aborting", lid, gen,
                        self.timeout_ms)
            out.append(Batch.create(encode_abort(lid, gen, f"no activity for "
                                                           f"{self.timeout_ms} ms"), 1,
                                    kind=BatchKind.CONTROL, timestamp_ms=now_ms))
        return out

    # -- requests ------------------------------------------------------------------------------
    @staticmethod
    def handles(t: str) -> bool:
        return t in OPS

    async def handle(self, host: LoadHost, req: LoadRequest) -> Reply:
        """Answer one typed load request (raft.protocol.load_requests.parse_load). The leader
        check comes first, then a refused field, then the load's state."""
        if isinstance(req, LoadStatus):
            return await self._status(host, req)
        if not host.is_leader():
            return host.refuse_not_leader()
        if isinstance(req, LoadRefused):
            return ErrorReply(req.code, req.message)
        if isinstance(req, LoadStage):
            return await self._stage(host, req)
        return await self._control(host, req)

    def _describe(self, load_id: str) -> dict[str, Any] | None:
        load = self.index.table.get(load_id)
        return None if load is None else load.describe()

    async def _status(self, host: LoadHost, req: LoadStatus) -> Reply:
        if not host.is_leader():
            return host.refuse_not_leader()
        ci = host.commit_index()
        await self.catch_up(ci)
        stable = self.stable_offset(ci)
        lid = req.load_id
        return OkReply({"load": None if lid is None else self._describe(lid),
                        "high_watermark": stable, "start_offset": self.index.log.start_offset,
                        "open_loads": len(self.index.table._open)})

    async def _stage(self, host: LoadHost, req: LoadStage) -> Reply:
        tag = StageTag(req.load_id, req.gen, req.partition, req.attempt, req.seq)
        why = self.index.table.stage_error(tag.load_id, tag.gen)
        if why is not None:
            return ErrorReply(ErrorCode.LOAD_CLOSED, f"{why}: nothing more to write")
        try:  # the records part obeys the same rule as a produce (storage/records.py)
            check_records(req.payload, req.count)
            data = encode_staged_payload(tag, req.payload)
        except (MalformedRecords, ValueError) as e:
            return ErrorReply(ErrorCode.BAD_REQUEST, str(e))
        # The leader's clock stamps staged batches (like Kafka's LogAppendTime): the load
        # timeout measures idleness by these stamps, so a client's skewed clock cannot keep a
        # load open forever or expire it early.
        batch = Batch.create(data, req.count, kind=BatchKind.STAGED, timestamp_ms=_now_ms())
        ans = await host.propose_and_wait(batch, req.acks, req.timeout_ms / 1000)
        if ans.error != ErrorCode.OK:
            return self._answer_error(host, ans)
        return OkReply({"base_offset": ans.base_offset, "last_offset": ans.last_offset})

    async def _control(self, host: LoadHost, req: LoadBegin | LoadCommit | LoadAbort) -> Reply:
        lid = req.load_id
        await self._catch_up_fully(host)
        if isinstance(req, LoadBegin):
            known = self.index.table.get(lid)
            if known is not None and known.state.value == "committed":
                return OkReply({"load": known.describe()})
            payload = encode_begin(lid)
        elif isinstance(req, LoadCommit):
            payload = encode_commit(lid, req.gen, list(req.attempts))
        else:
            payload = encode_abort(lid, req.gen, req.reason)
        batch = Batch.create(payload, 1, kind=BatchKind.CONTROL, timestamp_ms=_now_ms())
        ans = await host.propose_and_wait(batch, Acks.QUORUM, 30.0)
        if ans.error != ErrorCode.OK:
            return self._answer_error(host, ans)
        # Committed: apply through our entry so the table shows its outcome.
        await self._catch_up_fully(host)
        if self.index.table.applied < ans.last_offset:
            return ErrorReply(ErrorCode.TIMEOUT, "the load operation committed but is not "
                                                 "applied yet; retry (it is idempotent)")
        load = self.index.table.get(lid)
        desc = load.describe() if load is not None else None
        log.info("load op=%s load_id=%s offset=%d state=%s", req.T, lid, ans.base_offset,
                 desc and desc["state"])
        return OkReply({"load": desc, "offset": ans.base_offset})

    async def _catch_up_fully(self, host: LoadHost) -> None:
        """Apply everything committed (after a restart that can be a long scan, in slices).
        The answer to a load request must reflect the whole log."""
        await self.catch_up(host.commit_index())

    @staticmethod
    def _answer_error(host: LoadHost, ans: Any) -> Reply:
        if ans.error == ErrorCode.NOT_LEADER:
            return host.refuse_not_leader()
        return ErrorReply(ans.error, f"{ans.error.name} while writing the load entry; "
                                     f"retry (load requests are idempotent)")


def _now_ms() -> int:
    return int(time.time() * 1000)
