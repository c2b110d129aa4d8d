"""Argument types and options shared by the `raftlog` commands: a bad value is a usage error
(exit 2, with the flag's name) before anything connects.

Where the cluster is: `--servers`, else the RAFTLOG_SERVERS environment variable (as rpk reads
RPK_BROKERS, etcdctl ETCDCTL_ENDPOINTS and nats NATS_URL), else the selected profile, else the
addresses `raftlog up` uses by default. raft/cli/client_settings.py fills it (and the TLS files,
token, timeout and acks) in after parsing and remembers where each came from (`raftlog config
show` prints that)."""

from __future__ import annotations

import argparse
import datetime as dt
import re

# The number types live in raft/cli/argtypes.py (serve needs them without the rest of this
# module); the commands import them from here too.
from raft.cli.argtypes import (non_negative_float, non_negative_int,  # noqa: F401
                               positive_float, positive_int)
from raft.cli.client_settings import ACKS_ALIASES, DEFAULT_SERVERS, SERVERS_ENV
from raft.cli.security import add_client_security_args, add_profile_arg
from raft.client import parse_servers
from raft.node.config import ConfigError

ACKS_CHOICES = ("quorum", "leader", "none", "all", "1", "0")


def servers_arg(p: argparse.ArgumentParser, *, timeout: float = 10.0,
                timeout_help: str = "seconds per operation, retries included",
                security: bool = True, profile_timeout: bool = True) -> None:
    """--servers, --timeout and --profile, and (unless the parser has the node's own TLS flags
    already) the client's TLS and token flags. With `profile_timeout` a profile's `timeout`
    applies (it means seconds per operation; status and membership changes keep their own)."""
    p.add_argument("--servers", default=None, type=_servers, metavar="HOST:PORT,...",
                   help=f"any nodes of the cluster (default: ${SERVERS_ENV}, else the "
                        f"profile's, else {DEFAULT_SERVERS}, where `raftlog up` listens by "
                        f"default)")
    from_profile = ", or the profile's timeout" if profile_timeout else ""
    p.add_argument("--timeout", type=positive_float, default=None,
                   help=f"{timeout_help} (default {timeout:g}{from_profile})")
    p.set_defaults(timeout_default=timeout, timeout_from_profile=profile_timeout)
    add_profile_arg(p)
    if security:
        add_client_security_args(p)


def _servers(text: str) -> str:
    try:
        parse_servers(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def acks(text: str) -> str:
    """quorum | leader | none, or Kafka's all | 1 | 0."""
    value = ACKS_ALIASES.get(text.strip().lower(), text.strip().lower())
    if value not in ("quorum", "leader", "none"):
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from quorum/all, leader/1, none/0)")
    return value


def start_offset(text: str) -> int | str:
    """`consume --from`: an offset (>= 0), -N (the last N records), `start` or `end`."""
    word = text.strip().lower()
    if word in ("start", "beginning", "oldest"):
        return "start"
    if word in ("end", "newest"):
        return "end"
    try:
        return int(word)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an offset: give N (from offset N), -N (the last N records), "
            f"start or end") from None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 7 * 86_400_000}


def since(text: str, now_ms: int | None = None) -> int:
    """`consume --since`: a point in time as epoch milliseconds. Either a duration back from
    now (`90s`, `10m`, `1h30m`, `2d`) or an ISO 8601 date/time (`2026-11-23`,
    `2026-11-23T10:00`, `2026-11-23T10:00:00+01:00`; local time when no offset is given)."""
    raw = text.strip()
    now = int(dt.datetime.now().timestamp() * 1000) if now_ms is None else now_ms
    parts = _DURATION.findall(raw.lower())
    if parts and "".join(n + u for n, u in parts) == raw.lower():
        return now - int(sum(float(n) * _UNIT_MS[u] for n, u in parts))
    try:
        when = dt.datetime.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (10m, 1h30m, 2d) nor an ISO time "
            f"(2026-11-23T10:00)") from None
    if when.tzinfo is None:
        when = when.astimezone()  # naive: the local time zone, as `date` shows it
    return int(when.timestamp() * 1000)


def json_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--json", action="store_true",
                   help=f"{what}; errors too are one JSON object on stderr: "
                        f'{{"error": {{"code": ..., "message": ...}}}}')

