"""How a subscription reader (`Consumer`, `TopicSubscription`) closes: one copy of the rules
both follow, so they cannot drift apart.

- `async with` closes it on the way out: normally with `aclose()` (commit what was processed,
  the record handed out last included, and give up the lease), or after an exception with
  `_close_after_error()` (commit only what finished before the record in hand, which the next
  reader reads again: at least once). The close is shielded when an exception (a cancellation,
  say) is leaving the block, so the lease is given up instead of left to run out.
- Closing twice does nothing, and a reader that never opened has nothing to commit or release.
- A closed reader hands out no more records.
"""

from __future__ import annotations

from typing import Any, Self

import trio


class ReaderLifecycle:
    """Mixed into a reader with `_opened` and `_closed` flags, `aclose()` and
    `_close_after_error()`; those two start with `if not self._closing(): return`."""

    _opened: bool
    _closed: bool

    async def aclose(self) -> None:
        raise NotImplementedError

    async def _close_after_error(self) -> None:
        raise NotImplementedError

    def _closing(self) -> bool:
        """Mark the reader closed. True the first time, for a reader that had opened (there is
        something to commit and a lease or membership to give up); False otherwise."""
        if self._closed:
            return False
        self._closed = True
        return self._opened

    def __aiter__(self) -> Self:
        return self

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: Any, *exc: Any) -> None:
        with trio.CancelScope(shield=exc_type is not None):
            if exc_type is None:
                await self.aclose()
            else:
                await self._close_after_error()
