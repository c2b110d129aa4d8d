"""The client API: one module per request family, and the registry the node routes through.

Adding a request type: its typed request in raft.protocol (a dataclass with `parse` and
`to_frame`, listed in raft.protocol.PARSERS), then a module here with
`HANDLERS = {Type.T: execute}` (an `async execute(ctx, request) -> Reply`), and its line in
`_MODULES` below. A handler sees the node only through raft.node.api.context.ApiContext.
"""

from __future__ import annotations

from typing import Any

from raft.node.api import admin, fetch, links, loads, membership, produce, topics
from raft.node.api import subscribe as subscriptions
from raft.node.api.context import ApiContext, Handler
from raft.protocol import PARSERS
from raft.protocol.load_requests import parse_load

__all__ = ["REQUESTS", "ApiContext", "Handler", "lookup", "parse"]

# Request families with fixed type names (listed to clients that send an unknown type).
_MODULES = (
    produce,
    fetch,
    admin,
    membership,
    subscriptions,
    topics,
    links,
)


def _collect() -> dict[str, Handler]:
    out: dict[str, Handler] = {}
    for module in _MODULES:
        for t, execute in module.HANDLERS.items():
            if t in out:
                raise RuntimeError(f"request type {t!r} is registered twice "
                                   f"(again by {module.__name__})")
            if t not in PARSERS:
                raise RuntimeError(f"request type {t!r} ({module.__name__}) has no typed "
                                   f"request in raft.protocol.PARSERS")
            out[t] = execute
    return out


REQUESTS: dict[str, Handler] = _collect()


def lookup(ctx: ApiContext, t: str) -> Handler | None:
    """The handler for request type `t`, or None for an unknown type. The staged-load family
    is the load service's to name (absent without one)."""
    execute = REQUESTS.get(t)
    if execute is not None:
        return execute
    return loads.execute if loads.handles(ctx, t) else None


def parse(ctx: ApiContext, t: str, frame: dict[str, Any]) -> Any:
    """The typed request of a frame whose type `lookup` knows (WireError: a bad field)."""
    parser = PARSERS.get(t)
    if parser is None:
        return parse_load(t, frame)
    return parser(frame, ctx.limits)
