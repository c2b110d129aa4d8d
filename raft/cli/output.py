r"""How `raftlog` commands print: record values as unambiguous text, bytes in JSON, and errors
as one line (or one JSON object with --json), with the next step for the user.

Text mode prints one record per line, so a value is escaped the way Python and C write string
literals: a backslash as `\\`, newline/CR/tab as `\n`/`\r`/`\t`, other control characters and
bytes that are not UTF-8 as `\xNN` (`\uNNNN` for other unprintable characters). Printable text,
non-ASCII included, is printed as it is. So a value is never confused with another: the bytes
FF FE print as `\xff\xfe`, the text `\xff` as `\\xff`. JSON output carries text as `value` and
anything else base64-encoded as `value_b64` (the same for keys and header values).
"""

from __future__ import annotations

import base64
import json
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raft.client import UndecodableBatch

_NAMED = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}

# The next step for a user, per error code (printed after the server's message).
HINTS = {
    "UNAVAILABLE": "start a cluster with `raftlog up`, or pass --servers (or set "
                   "RAFTLOG_SERVERS) to the addresses of a running one",
    "UNAUTHENTICATED": "the cluster requires authentication: pass a current token "
                       "(RAFTLOG_TOKEN, or --token) or a client certificate (--tls-cert and "
                       "--tls-key); an operator makes tokens with `raftlog token create`",
    "TOPIC_EXISTS": "pick another name, or see the existing topic with `raftlog topic describe "
                    "NAME`",
    "FORBIDDEN": "this principal lacks the permission named above; ask an operator to grant it "
                 "in the cluster's auth file (docs/SECURITY.md)",
}


def escape_value(b: bytes) -> str:
    """One line of text that shows exactly which bytes `b` holds (see the module doc)."""
    text = b.decode("utf-8", "surrogateescape")
    if text.isprintable() and "\\" not in text:
        return text  # the common case, unchanged
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _NAMED:
            out.append(_NAMED[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # a byte that is not UTF-8
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def put_bytes(out: dict[str, Any], name: str, b: bytes) -> None:
    """UTF-8 text as `name`, anything else base64 as `name_b64`."""
    try:
        out[name] = b.decode()
    except UnicodeDecodeError:
        out[f"{name}_b64"] = base64.b64encode(b).decode()


def headers_json(headers: tuple[tuple[str, bytes], ...] | None) -> list[dict[str, Any]]:
    """Headers as a list of {"key", "value"|"value_b64"} (order and repeats kept, as Kafka
    and the Spark source have them)."""
    out = []
    for k, v in headers or ():
        h: dict[str, Any] = {"key": k}
        put_bytes(h, "value", v)
        out.append(h)
    return out


def print_error(command: str, code: str, message: str, *, as_json: bool, hint: bool = True,
                **extra: Any) -> None:
    """One error on stderr: `raftlog CMD: CODE: message` (plus a hint line for some codes)
    or, with --json, one object {"error": {"code", "message", "hint"?, ...}}."""
    hint_text = HINTS.get(code) if hint else None
    if as_json:
        err: dict[str, Any] = {"code": code, "message": message, **extra}
        if hint_text:
            err["hint"] = hint_text
        print(json.dumps({"error": err}), file=sys.stderr, flush=True)
        return
    line = f"raftlog {command}: {code}: {message}" if code not in ("USAGE", "CONFIG") \
        else f"raftlog {command}: {message}"
    if hint_text:
        line += f"\n  hint: {hint_text}"
    print(line, file=sys.stderr, flush=True)


class Undecodable:
    """How `consume` reports a committed batch it cannot decode (raft.client.UndecodableBatch):
    once, as one line on stderr naming its offsets and what to do, after the records before it;
    reading goes on past it, and `status` (the exit status) is 1 once one was reported."""

    def __init__(self, as_json: bool = False) -> None:
        self.seen: set[tuple[int, int]] = set()
        self.as_json = as_json  # --json: one JSON object per line on stderr instead

    @property
    def status(self) -> int:
        return 1 if self.seen else 0

    def report(self, batch: UndecodableBatch) -> None:
        if (batch.first_offset, batch.last_offset) not in self.seen:
            self.seen.add((batch.first_offset, batch.last_offset))
            sys.stdout.flush()  # the records before it come first on a shared terminal
            if self.as_json:
                sys.stderr.write(json.dumps({"undecodable": {
                    "first_offset": batch.first_offset, "last_offset": batch.last_offset,
                    "reason": batch.reason, "message": batch.message}}) + "\n")
            else:
                sys.stderr.write(f"raftlog consume: {batch.message}\n")
            sys.stderr.flush()
