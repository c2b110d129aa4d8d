"""The state at the log start: what a node needs, besides its log, to carry on from an offset
whose history it no longer holds.

Retention drops the front of the log, and a follower behind the leader's log start is reset to
it (the state transfer). Either way the node loses batches that built its replicated tables: the
cluster configuration, the idempotent producer table, the Spark loads table, ... So the log start
always travels with a snapshot of those tables *as of start - 1*, written by storage in the same
transaction as the start itself (LogStorage.truncate_prefix / reset / persist_start): a crash can
never pair a start with another start's state.

The snapshot is a plain msgpack map, opaque to storage and to the wire:

    {"v": 1, "start_offset": S, "sections": {"term": ..., "config": ..., "producers": ...,
                                              "loads": ..., <later sections>: ...}}

Each named section is owned by one `Section`: how to start it for an empty log, how to fold one
committed batch into it, and how to encode and decode it. Retention folds the batches it drops
into the previous snapshot to make the next one (raft/core/retention.py), so no section is ever
rebuilt from the whole history. A new replicated table (subscriptions, ...) adds its own section
with `register_section` and reads it back with `section_raw`; nothing else changes. Sections a
build does not know are carried through unchanged (a mixed-version cluster keeps them).

Built-in sections are in raft/core/snapshot_sections.py. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from storage.batch import Batch

SNAPSHOT_VERSION = 1

# Names of the built-in sections (raft/core/snapshot_sections.py).
TERM = "term"  # the term of the entry at start - 1
CONFIG = "config"  # the cluster configuration in force at start - 1
PRODUCERS = "producers"  # the idempotent producer table (raft/core/producers.py)
LOADS = "loads"  # the Spark loads table (raft/core/loads.py)


@dataclass(slots=True, frozen=True)
class SnapshotContext:
    """What a section needs to build or decode its state on this node: the core's knobs for the
    producer table and the configuration in force before the log's first CONFIG entry."""

    producer_window: int = 8
    max_producers: int = 100_000
    bootstrap_config: dict[str, Any] = field(default_factory=lambda: {"voters": [1]})
    # Sections only this group's snapshots carry, after the registered ones (the controller's
    # metadata in group 0: raft.controller.section). Registered sections are every group's.
    extra: tuple["Section", ...] = ()

    def sections(self) -> dict[str, "Section"]:
        """Every section this group's snapshots carry, by name, registered ones first."""
        if not self.extra:
            return SECTIONS
        out = dict(SECTIONS)
        for s in self.extra:
            if s.name in out and out[s.name] is not s:
                raise ValueError(f"snapshot section {s.name!r} is registered already")
            out[s.name] = s
        return out


@dataclass(slots=True, frozen=True)
class Section:
    """One named part of the state. `fresh(ctx, start)` is the state of an empty log starting at
    `start` (0, unless a log start has no stored state: an old reset); `apply`
    folds one committed batch (called in log order, every batch); `dump` makes it msgpack-able
    and `load` reads a dump back (raising ValueError on anything malformed: snapshots arrive from
    peers). `dump` gets the start offset the snapshot is for, so a section may drop what only
    the dropped batches needed."""

    name: str
    fresh: Callable[[SnapshotContext, int], Any]
    apply: Callable[[Any, Batch], None]
    dump: Callable[[Any, int], Any]
    load: Callable[[Any, SnapshotContext], Any]


SECTIONS: dict[str, Section] = {}


def register_section(section: Section) -> None:
    """Add a section to every snapshot this node makes from now on (call it at import time)."""
    if section.name in SECTIONS and SECTIONS[section.name] is not section:
        raise ValueError(f"a snapshot section named {section.name!r} is already registered")
    SECTIONS[section.name] = section


def section_raw(snapshot: dict | None, name: str) -> Any:
    """The encoded section `name` of a stored snapshot (None if absent): what a table's owner
    decodes to restore itself."""
    if not snapshot:
        return None
    sections = snapshot.get("sections")
    return sections.get(name) if isinstance(sections, dict) else None


@dataclass(slots=True)
class StartState:
    """Decoded sections at `start_offset` (the state as of start_offset - 1), foldable forward."""

    start_offset: int
    states: dict[str, Any]
    # Sections of names this build does not know: carried through as they came.
    unknown: dict[str, Any] = field(default_factory=dict)
    # The sections this state folds (SnapshotContext.sections()): the registered ones, plus a
    # group's own (the controller's metadata) when its context names them.
    sections: dict[str, Section] = field(default_factory=lambda: SECTIONS)

    @staticmethod
    def fresh(ctx: SnapshotContext, start: int = 0) -> "StartState":
        """The state of an empty log that starts at `start` (0 for a new log)."""
        sections = ctx.sections()
        return StartState(start, {name: s.fresh(ctx, start) for name, s in sections.items()},
                          sections=sections)

    @staticmethod
    def from_snapshot(snapshot: Any, ctx: SnapshotContext) -> "StartState":
        """Decode a snapshot (stored, or received in a state transfer); ValueError says what
        is wrong with it. A section missing from it (made before that section existed) starts
        fresh."""
        if not isinstance(snapshot, dict) or snapshot.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"the state at the log start must be a map with v="
                             f"{SNAPSHOT_VERSION}, got {type(snapshot).__name__}")
        start = snapshot.get("start_offset")
        sections = snapshot.get("sections")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0 \
                or not isinstance(sections, dict):
            raise ValueError("the state at the log start needs an integer start_offset >= 0 "
                             "and a map of sections")
        states = {}
        known = ctx.sections()
        for name, s in known.items():
            states[name] = (s.fresh(ctx, start) if name not in sections
                            else s.load(sections[name], ctx))
        unknown = {k: v for k, v in sections.items() if k not in known}
        return StartState(start, states, unknown, known)

    def apply(self, batch: Batch) -> None:
        """Fold the next batch (it must start at start_offset): the state moves past it."""
        if batch.base_offset != self.start_offset:
            raise ValueError(f"the state at offset {self.start_offset} cannot fold a batch at "
                             f"{batch.base_offset}: fold batches in order, without gaps")
        for name, s in self.sections.items():
            s.apply(self.states[name], batch)
        self.start_offset = batch.last_offset + 1

    def to_snapshot(self) -> dict[str, Any]:
        sections = dict(self.unknown)
        for name, s in self.sections.items():
            sections[name] = s.dump(self.states[name], self.start_offset)
        return {"v": SNAPSHOT_VERSION, "start_offset": self.start_offset, "sections": sections}
