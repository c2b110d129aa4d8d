"""Log line formats for `raftlog serve`: key=value text (default) or JSON (`--log-format json`).

The node's messages are written as `event_name key=value key=value ...; free text`. The JSON
formatter turns each into one object per line, with the node id and current term added from
the running node (so a log pipeline can filter by node and correlate by term without parsing):

    {"ts": "2026-05-09T07:35:25.123Z", "level": "INFO", "logger": "raftlog.node",
     "node": 1, "term": 4, "event": "state_changed", "role": "leader", "leader": "1", ...}

Values that look like integers become numbers; everything else stays a string. Keys that would
overwrite the fixed fields are prefixed with `f_`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable
from typing import Any

# key=value where value is a quoted repr, a bracketed/braced group, or up to the next space.
_PAIR = re.compile(r"(?<![\w.])([a-z_][a-z0-9_]*)=('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|"
                   r"\[[^\]]*\]|\{[^}]*\}|[^\s;]+)")
_EVENT = re.compile(r"^([a-z][a-z0-9_]*)(?=\s|$|:)")
_FIXED = ("ts", "level", "logger", "node", "term", "event", "message", "exc")


class JsonFormatter(logging.Formatter):
    """One JSON object per record. `context()` supplies node and term (or {} before a node
    runs); it is called on whatever thread logs, and must only read plain values."""

    def __init__(self, context: Callable[[], dict[str, Any]] | None = None) -> None:
        super().__init__()
        self.context = context or (lambda: {})

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
                    .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
        }
        try:
            out.update(self.context())
        except Exception:  # never lose a log line to the context
            pass
        m = _EVENT.match(message)
        out["event"] = m.group(1) if m else "message"
        for key, value in _PAIR.findall(message):
            if key in _FIXED or key in out:
                key = f"f_{key}"
            out[key] = _value(value)
        out["message"] = message
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def _value(text: str) -> Any:
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


TEXT_FORMAT = "ts=%(asctime)s level=%(levelname)s logger=%(name)s event=%(message)s"


def make_formatter(fmt: str, context: Callable[[], dict[str, Any]] | None = None,
                   shard: int | None = None) -> logging.Formatter:
    """`shard`: a shard process of a node of K > 1 (docs/SHARDS.md) says which on every line
    (its shards share the node's stderr, so their lines interleave)."""
    if fmt == "json":
        if shard is None:
            return JsonFormatter(context)
        inner = context or (lambda: {})
        return JsonFormatter(lambda: {**inner(), "shard": shard})
    if shard is None:
        return logging.Formatter(TEXT_FORMAT)
    return logging.Formatter(TEXT_FORMAT.replace(" event=", f" shard={shard} event="))
