r"""What `raftlog produce` reads: stdin as bytes, split into lines as they arrive, and each line
turned into a record (its bytes as the value, or KEY<SEP>VALUE with --key-separator, or a JSON
object with --input json).

Lines are split at `\n` only (a `\r` before it is kept: it is part of the value); a last line
without a newline counts. Nothing is decoded in the default mode, so any bytes but `\n` can be
sent. A line longer than MAX_LINE_BYTES is not buffered past that bound: it is reported as
too large and skipped.

JSON input, one object per line (what `raftlog consume --json` prints, so the two round-trip):
    {"value": "text"}  or  {"value_b64": "..."}        the value (required)
    "key" / "key_b64"                                  optional key
    "headers": {"k": "v", ...}, or [{"key": "k", "value": "v" | "value_b64": "..."}, ...],
               or [["k", "v"], ...]                   optional headers
`offset`, `partition` and `timestamp_ms` are ignored (the cluster assigns offsets and times, and
the producer picks the partition: by key, or --partition), so `consume --json` output goes back
in as it is; other fields are refused.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import trio

from storage.records import Record

MAX_LINE_BYTES = 64 << 20  # a line is one record; a frame above the nodes' limit is refused
READ_CHUNK = 1 << 16
_IGNORED = {"offset", "partition", "timestamp_ms"}
_FIELDS = {"value", "value_b64", "key", "key_b64", "headers"} | _IGNORED


@dataclass(slots=True)
class Line:
    number: int  # 1-based, in input order
    data: bytes | None  # None: longer than MAX_LINE_BYTES (skipped)
    size: int


async def read_lines(fd: int, max_line: int = MAX_LINE_BYTES) -> AsyncIterator[list[Line]]:
    """The lines of `fd`, as lists: the lines each read completed (a pipe or a terminal delivers
    what it has, so a line is passed on as soon as it is complete; nothing waits for the end
    of input, and a burst of input costs one hand-over, not one per line)."""
    buf = bytearray()
    number = 0
    skipping = 0  # bytes of an over-long line dropped so far (0: not skipping)
    while True:
        chunk = await trio.to_thread.run_sync(os.read, fd, READ_CHUNK, abandon_on_cancel=True)
        if not chunk:
            break
        out: list[Line] = []
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                piece = chunk[start:]
                if skipping:
                    skipping += len(piece)
                elif len(buf) + len(piece) > max_line:
                    skipping = len(buf) + len(piece)
                    buf.clear()
                else:
                    buf += piece
                break
            number += 1
            piece = chunk[start:nl]
            if skipping or len(buf) + len(piece) > max_line:
                out.append(Line(number, None, skipping + len(buf) + len(piece)))
                skipping = 0
                buf.clear()
            elif buf:
                buf += piece
                out.append(Line(number, bytes(buf), len(buf)))
                buf.clear()
            else:
                out.append(Line(number, piece, len(piece)))
            start = nl + 1
        if out:
            yield out
    if buf or skipping:
        yield [Line(number + 1, None if skipping else bytes(buf), skipping or len(buf))]


class RecordMaker:
    """Line -> Record, for one `produce` invocation's --input, --key, --key-separator and
    --header flags.

    With a key separator, the bytes before the first separator are the key and the rest the
    value (`user-1:hello` with `:`); a line without the separator fails, reported like any
    failed line (not sent, exit 1), as Kafka's console producer refuses such lines: sending it
    without a key would quietly break whatever relies on keys."""

    def __init__(self, mode: str = "lines", key: bytes | None = None,
                 headers: list[tuple[str, bytes]] | None = None,
                 key_separator: bytes | None = None) -> None:
        if mode not in ("lines", "json"):
            raise ValueError(f"input mode {mode!r}: choose lines or json")
        if key_separator is not None:
            if not key_separator:
                raise ValueError("--key-separator must not be empty")
            if b"\n" in key_separator:
                raise ValueError("--key-separator cannot hold a newline: lines are split at "
                                 "newlines first")
            if mode != "lines":
                raise ValueError("--key-separator splits plain lines; with --input json the "
                                 "key is the object's \"key\" field")
            if key is not None:
                raise ValueError("give --key (one key for every record) or --key-separator "
                                 "(a key per line), not both")
        self.mode, self.key, self.headers = mode, key, list(headers or [])
        self.key_separator = key_separator

    def make(self, data: bytes) -> Record:
        """The record for one line; ValueError says what is wrong with the line."""
        if self.mode == "lines":
            if self.key_separator is not None:
                key, sep, value = data.partition(self.key_separator)
                if not sep:
                    shown = self.key_separator.decode(errors="backslashreplace")
                    raise ValueError(f"no key separator {shown!r} in the line "
                                     f"(--key-separator: each line is KEY, the separator, "
                                     f"VALUE); it was not sent")
                return Record(value, key, tuple(self.headers) or None)
            return Record(data, self.key, tuple(self.headers) or None)
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"not JSON ({e})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"a JSON object is expected, like {{\"value\": \"...\"}}, not "
                             f"{type(obj).__name__}")
        unknown = sorted(set(obj) - _FIELDS)
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; use value (or value_b64), "
                             f"key (or key_b64) and headers")
        value = _bytes_field(obj, "value")
        if value is None:
            raise ValueError('no "value" (or "value_b64") field')
        key = _bytes_field(obj, "key")
        headers = self.headers + _headers(obj.get("headers"))
        return Record(value, key if key is not None else self.key, tuple(headers) or None)


def _bytes_field(obj: dict[str, Any], name: str) -> bytes | None:
    text, b64 = obj.get(name), obj.get(f"{name}_b64")
    if text is not None and b64 is not None:
        raise ValueError(f"give {name} or {name}_b64, not both")
    if text is not None:
        if not isinstance(text, str):
            raise ValueError(f"{name} must be a string (binary goes in {name}_b64)")
        return text.encode()
    if b64 is not None:
        if not isinstance(b64, str):
            raise ValueError(f"{name}_b64 must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{name}_b64 is not valid base64") from None
    return None


def _headers(raw: Any) -> list[tuple[str, bytes]]:
    if raw is None:
        return []
    items: list[tuple[Any, Any]] = []
    if isinstance(raw, dict):
        items = [(k, {"value": v}) for k, v in raw.items()]
    elif isinstance(raw, list):
        for h in raw:
            if isinstance(h, dict) and "key" in h:
                items.append((h["key"], h))
            elif isinstance(h, list) and len(h) == 2:
                items.append((h[0], {"value": h[1]}))
            else:
                raise ValueError('each header is {"key": ..., "value": ...} or [key, value]')
    else:
        raise ValueError('headers must be an object {"k": "v"} or a list of {"key", "value"}')
    out = []
    for k, h in items:
        if not isinstance(k, str):
            raise ValueError("header keys must be strings")
        v = _bytes_field(h, "value")
        if v is None:
            raise ValueError(f"header {k!r} has no value")
        out.append((k, v))
    return out


def parse_header(text: str) -> tuple[str, bytes]:
    """--header KEY=VALUE."""
    k, sep, v = text.partition("=")
    if not sep or not k:
        raise ValueError(f"--header {text!r} must look like KEY=VALUE")
    return k, v.encode()
