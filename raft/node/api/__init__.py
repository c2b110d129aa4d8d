"""The client API: one module per request family, and the registry the node routes through.

Adding a request type: a new module here with `REQUESTS = {"name": Request(parse, execute)}`
(raft.node.api.context.Request), and its line in `_MODULES` below. A handler sees the node only
through raft.node.api.context.ApiContext.
"""

from __future__ import annotations

from collections.abc import Callable

from raft.node.api import admin, fetch, loads, membership, produce, subscriptions
from raft.node.api.context import ApiContext, Request

__all__ = ["REQUESTS", "ApiContext", "Request", "lookup"]

# Request families with fixed type names (listed to clients that send an unknown type).
_MODULES = (
    produce,
    fetch,
    admin,
    membership,
    subscriptions,
)

# Families whose type names are decided at run time: (context, type) -> Request or None.
_RESOLVERS: tuple[Callable[[ApiContext, str], Request | None], ...] = (
    loads.resolve,
)


def _collect() -> dict[str, Request]:
    out: dict[str, Request] = {}
    for module in _MODULES:
        for t, request in module.REQUESTS.items():
            if t in out:
                raise RuntimeError(f"request type {t!r} is registered twice "
                                   f"(again by {module.__name__})")
            out[t] = request
    return out


REQUESTS: dict[str, Request] = _collect()


def lookup(ctx: ApiContext, t: str) -> Request | None:
    """The handler for request type `t`, or None for an unknown type."""
    request = REQUESTS.get(t)
    if request is not None:
        return request
    for resolve in _RESOLVERS:
        request = resolve(ctx, t)
        if request is not None:
            return request
    return None
