"""The built-in sections of the state at the log start (raft/core/snapshot.py): the term at the log
start, the configuration in force there, the idempotent producer table and the Spark loads table.

Importing this module registers them; the core imports it, so every node has them. A new table
adds one `register_section(...)` here (or in its own module, imported here).
"""

from __future__ import annotations

from typing import Any

from raft.core.loads import LoadTable
from raft.core.membership import ClusterConfig, ConfigEntry
from raft.core import mirror
from raft.core import subscription_table as subscriptions
from raft.core.producers import ProducerTable
from raft.core.snapshot import (
    CONFIG,
    LOADS,
    PRODUCERS,
    TERM,
    Section,
    SnapshotContext,
    register_section,
    section_raw,
)
from storage.batch import Batch, BatchKind
from storage.mirrored import MIRROR_SECTION


# -- term: the term of the entry at start - 1 (a one-element list, so folding is in place) ------
def _term_apply(state: list[int], batch: Batch) -> None:
    state[0] = batch.term


def _term_load(raw: Any, ctx: SnapshotContext) -> list[int]:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise ValueError(f"the term at the log start must be an integer >= 0, got {raw!r}")
    return [raw]


# -- config: the configuration in force at start - 1 ---------------------------------------------
def _config_fresh(ctx: SnapshotContext, start: int) -> list[ConfigEntry]:
    return [ConfigEntry(-1, 0, ClusterConfig.from_dict(ctx.bootstrap_config))]


def _config_apply(state: list[ConfigEntry], batch: Batch) -> None:
    if batch.kind == BatchKind.CONFIG:
        state[0] = ConfigEntry(batch.base_offset, batch.term, ClusterConfig.from_batch(batch))


def config_entry_to_raw(entry: ConfigEntry) -> dict[str, Any]:
    return {"offset": entry.offset, "term": entry.term, "config": entry.config.to_dict()}


def config_entry_from_raw(raw: Any) -> ConfigEntry:
    try:
        return ConfigEntry(int(raw["offset"]), int(raw["term"]),
                           ClusterConfig.from_dict(raw["config"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"the configuration at the log start is malformed ({e!r})") from None


# -- producers ---------------------------------------------------------------------------------
def _producers_fresh(ctx: SnapshotContext, start: int = 0) -> ProducerTable:
    return ProducerTable(ctx.producer_window, ctx.max_producers)


def _producers_load(raw: Any, ctx: SnapshotContext) -> ProducerTable:
    table = _producers_fresh(ctx)
    if not isinstance(raw, list):
        raise ValueError("the producer table at the log start must be a list")
    table.load(raw)
    return table


def _producers_apply(table: ProducerTable, batch: Batch) -> None:
    table.record(batch)  # ignores everything but DATA batches with a producer id


# -- loads -------------------------------------------------------------------------------------
def _loads_dump(table: LoadTable, start: int) -> dict[str, Any]:
    table.prune_below(start)
    return table.dump()


def _loads_load(raw: Any, ctx: SnapshotContext) -> LoadTable:
    if not isinstance(raw, dict):
        raise ValueError("the loads table at the log start must be a map")
    return LoadTable.load(raw)


register_section(Section(TERM, lambda ctx, start: [0], _term_apply, lambda s, start: s[0], _term_load))
register_section(Section(CONFIG, _config_fresh, _config_apply,
                         lambda s, start: config_entry_to_raw(s[0]),
                         lambda raw, ctx: [config_entry_from_raw(raw)]))
register_section(Section(PRODUCERS, _producers_fresh, _producers_apply,
                         lambda t, start: t.dump(), _producers_load))
register_section(Section(LOADS, lambda ctx, start: LoadTable(start), LoadTable.apply, _loads_dump,
                         _loads_load))
# The subscription table (issue 16): positions committed through the log, so a node restarted
# behind a new log start, or given a state transfer, knows every subscription's position.
register_section(Section(subscriptions.SNAPSHOT_SECTION, subscriptions.section_fresh,
                         subscriptions.section_apply, subscriptions.section_dump,
                         subscriptions.section_load))
# Mirror partitions (issue 30): the visible end as of the log start, so a group whose MIRRORED
# batches retention cut, or a follower reset by a state transfer, keeps its position rule.
register_section(Section(MIRROR_SECTION, mirror.section_fresh, mirror.section_apply,
                         mirror.section_dump, mirror.section_load))


def stored_config(snapshot: dict | None) -> ConfigEntry | None:
    """The configuration stored with a log start (None without a snapshot)."""
    raw = section_raw(snapshot, CONFIG)
    return None if raw is None else config_entry_from_raw(raw)
