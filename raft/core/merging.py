"""Concurrent produces proposed within one Ready pass, appended as one stored batch (issue 28).

Why. Every stored batch costs each node a fixed amount of work whatever it holds: the leader
places it, keeps it in the unflushed tail, encodes it into the flush and into an append frame
per follower; each follower decodes it, checks its CRC and puts it into LMDB; every node's
subscription and load indexes read its header back. With many writers of one record each
(closed64: 64 writers, one record in flight each) that per-batch work was about a quarter of
the leader's calls per write (docs/PERFORMANCE.md, "Issue 28: closed64, ..."). So the leader
holds a plain client DATA batch open until its next Ready pass instead of appending it at once,
and a later proposal that may join it is appended in the same stored batch: one batch per group
of concurrent writes instead of one per write.

The rules (what consumers and producers can tell):
- Only DATA batches of non-idempotent producers (producer_id == NO_PRODUCER) join, never in a
  translated (mirror) group. An idempotent batch must stay a batch of its own: the producer
  table remembers (producer id, sequence) -> the batch's offsets, and a retry is recognised by
  that; a merged batch carries no producer id, so a retry of a write inside it would be
  appended again (the duplicate this table exists to stop). STAGED, CONTROL, CONFIG, NOOP and
  MIRRORED batches never join either: each is read as one unit by its own reader.
- Only batches with the same timestamp_ms: a record has no timestamp of its own, consumers see
  its batch's, so the leader never changes what a producer set (a producer that set none was
  stamped with the leader's clock when its request was parsed, raft/protocol/requests.py,
  before it got here).
- Only payloads that are exactly one msgpack array of `count` records (storage/records.py; the
  node checked that when it admitted the request): the merged payload is one array of the
  summed count, each payload's records as they were (storage.records.join_records), and the
  merged batch's CRC is computed over it.
- Bounded: a merged batch holds at most `merge_max_records` records and `merge_max_bytes`
  bytes (and never more than max_append_bytes), so followers' append frames and consumers'
  fetch budgets keep their bounds. merge_max_records = 0 turns merging off.
- Order: a proposal that may not join first appends the open batch, so the log holds writes in
  the order they were proposed. Anything else that appends as leader does the same
  (`_append_as_leader`), and so do ready(), tick() and a leadership transfer; if leadership
  ends first, the open batch's writes are answered NOT_LEADER (nothing was written).
- Each request is answered for its own records: its own base and last offsets inside the
  merged batch, at its own ack level (quorum: once committed; leader and none: once appended).

A mixin of RaftCore (raft/core/raft.py), which owns the state it reads and writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raft.core.leader_state import Waiting
from raft.core.open_batch import OpenBatch, merge_start
from raft.core.types import Acks, ErrorCode
from storage.batch import Batch

if TYPE_CHECKING:
    from raft.core.config import RaftConfig
    from raft.core.leader_state import LeaderState


class ProduceMerging:
    """The open batch is `self.leader.open` (raft/core/leader_state.py): it goes with the
    leadership."""

    cfg: "RaftConfig"
    leader: "LeaderState | None"

    def _merge_limits(self) -> tuple[int, int]:
        cfg = self.cfg
        return cfg.merge_max_records, min(cfg.merge_max_bytes, cfg.max_append_bytes)

    def _open_propose(self, request_id: int, batch: Batch, acks: Acks) -> bool:
        """Hold `batch` open for the Ready pass (joining the open batch if it may); False
        when it is to be appended alone now (the open batch, if any, is appended first)."""
        lead = self.leader
        assert lead is not None
        max_records, max_bytes = self._merge_limits()
        start = merge_start(batch, self.cfg.translated) if max_records else -1
        held = lead.open
        if held is not None:
            if (start >= 0 and batch.timestamp_ms == held.timestamp_ms
                    and held.count + batch.count <= max_records
                    and held.nbytes + len(batch.payload) - start <= max_bytes):
                held.add(request_id, batch, acks, start)
                return True
            self._seal_open()
        if start < 0 or batch.count > max_records or batch.size > max_bytes:
            return False
        lead.open = OpenBatch(request_id, batch, acks, start)
        return True

    def _open_waiting(self) -> int:
        """Quorum writes in the open batch (they count against max_pending_produce)."""
        lead = self.leader
        return 0 if lead is None or lead.open is None else lead.open.quorum

    def _seal_open(self) -> None:
        """Append the open batch, if any, and answer or enqueue each of its writes."""
        lead = self.leader
        if lead is None or lead.open is None:
            return
        held, lead.open = lead.open, None
        placed = self._place_as_leader(held.batch())
        if placed is None:
            for request_id, _, _ in held.members:
                self._answer(request_id, ErrorCode.BACKPRESSURE, message=(
                    "the leader's unflushed tail is full; retry after the running flush"))
            return
        base = placed.base_offset
        quorum = False
        for request_id, count, acks in held.members:
            last = base + count - 1
            if acks == Acks.QUORUM:
                lead.waiting.append(Waiting(request_id, base, last))
                quorum = True
            else:
                self._answer(request_id, ErrorCode.OK, base_offset=base, last_offset=last)
            base = last + 1
        if quorum:
            self._answer_committed()  # a single voter may already cover it

    def _drop_open(self, lead: "LeaderState") -> None:
        """Leadership ends with writes still open: none was written; each is told so."""
        held, lead.open = lead.open, None
        if held is None:
            return
        for request_id, _, _ in held.members:
            self._answer(request_id, ErrorCode.NOT_LEADER, leader_id=self.leader_id,
                         message="leadership changed before the write was appended; nothing "
                                 "was written: send it to the new leader")
