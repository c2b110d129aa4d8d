"""Replicated subscriptions: a mirror partition carries its source partition's subscription
positions (issue 30, docs/REPLICATION.md "Replicated subscriptions").

Every SUBS_EVERY_S (every CAPPED_AGAIN_S while a position was capped) the puller reads the source partition's subscriptions (`sub_list`, the
link's own `__link.*` left out) and sets each on the mirror with a reset, at the source's
position **capped at the mirror's committed visible high watermark + 1**. Offsets are the
same on both clusters, so a consumer that moves to the mirror after a failover resumes at a
position it had reached on the source or before it: it may read again what it read after
that, it never skips a record. Positions only follow the source (a reset on the source moves
the mirror's back too); a sink consumer's own subscription of the same name is overwritten
while the topic is an active mirror.
"""

from __future__ import annotations

from typing import Any

from raft.core.subscription_table import Op, OpRequest
from raft.node.api.fetch import visible_hw

SUBS_EVERY_S = 10.0  # a sub_list writes an entry on the source (it reads after its own)
CAPPED_AGAIN_S = 1.0  # while the mirror is behind a source position (catching up)
SUBMIT_TIMEOUT_S = 10.0
LINK_PREFIX = "__link."


def planned(source_rows: list[dict[str, Any]], have: dict[str, int],
            cap: int) -> list[tuple[str, int]]:
    """(name, position) to set on the mirror: each source subscription at min(its position,
    cap), where the mirror's differs. Pure, so the rule is tested on its own."""
    out = []
    for row in source_rows:
        name = str(row["name"])
        if name.startswith(LINK_PREFIX):
            continue
        position = min(int(row["position"]), cap)
        if position >= 0 and have.get(name) != position:
            out.append((name, position))
    return out


def capped(source_rows: list[dict[str, Any]], cap: int) -> bool:
    """Whether a source position is past `cap` (the mirror behind it): the round is repeated
    soon, not in SUBS_EVERY_S, so a mirror that catches up carries the positions promptly."""
    return any(int(r["position"]) > cap for r in source_rows
               if not str(r["name"]).startswith(LINK_PREFIX))


async def mirror_subscriptions(client: Any, group: Any, source_topic: str,
                               partition: int) -> tuple[int, bool]:
    """One round: how many positions it set, and whether one was capped. Errors propagate
    (the caller logs them)."""
    rows = await client.subscriptions(topic=source_topic, partition=partition,
                                      timeout=SUBMIT_TIMEOUT_S)
    subs = group.subs
    if subs is None:
        return 0, False
    cap = visible_hw(group) + 1
    have = {name: s.position for name, s in subs.table.subs.items()}
    plan = planned(rows, have, cap)
    if not plan:
        return 0, capped(rows, cap)
    outcomes = await subs.submit_many([OpRequest(Op.RESET, name, "", position)
                                       for name, position in plan], SUBMIT_TIMEOUT_S)
    return sum(1 for o in outcomes if o.ok), capped(rows, cap)
