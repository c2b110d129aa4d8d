"""Number types for argparse (`type=positive_int`): a bad value is a usage error naming the
flag. Apart from raft/cli/args.py (which re-exports them) because they need nothing but
argparse: `raftlog serve` uses them and must not import the client settings args.py brings
(a restarted node's start-up, docs/PERFORMANCE.md "start28")."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def _parsed(text: str, parse: Callable[[str], T], what: str) -> T:
    try:
        return parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def _bounded(value: T, ok: bool, rule: str) -> T:
    if not ok:
        raise argparse.ArgumentTypeError(f"{value} must be {rule}")
    return value


def positive_int(text: str) -> int:
    value = _parsed(text, int, "an integer")
    return _bounded(value, value >= 1, "at least 1")


def non_negative_int(text: str) -> int:
    value = _parsed(text, int, "an integer")
    return _bounded(value, value >= 0, "0 or more")


def positive_float(text: str) -> float:
    value = _parsed(text, float, "a number")
    return _bounded(value, value > 0, "above 0")


def non_negative_float(text: str) -> float:
    value = _parsed(text, float, "a number")
    return _bounded(value, value >= 0, "0 or more")
