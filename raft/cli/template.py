r"""`raftlog consume --format TEMPLATE`: one line per record, laid out by a template, as rpk's
`-f` and kcat's `-f` do, with Python's braces:

    raftlog consume --format '{offset} {key}={value}'
    raftlog consume --format '{time}\t{headers}\t{value}'

Placeholders: {key}, {value}, {offset}, {partition}, {timestamp} (ms since the epoch), {time}
(the same as ISO 8601, UTC) and {headers} (`k=v` pairs joined by `,`). A format spec works as in
Python (`{offset:>8}`); `{{` and `}}` are literal braces, and `\t`, `\n`, `\\` in the template
are a tab, a newline and a backslash. Each record ends with a newline.

Keys, values and headers are escaped as plain `consume` escapes values (raft.cli.output), so a
record stays one line and its bytes can be told apart; in {headers} a `,` or `=` inside a
header key or value is written `\x2c` / `\x3d`. A record without a key prints nothing for {key}
(as does an empty key: --json tells them apart). {partition} is the record's partition of its
topic (0 for the default topic, which `consume` reads without --topic).
"""

from __future__ import annotations

import datetime as dt
import re
import string
from collections.abc import Callable

from raft.cli.output import escape_value
from raft.client import FetchedRecord
from raft.node.config import ConfigError

FIELDS = ("key", "value", "offset", "partition", "timestamp", "time", "headers")
_ESCAPES = {"t": "\t", "n": "\n", "\\": "\\"}


def compile_template(template: str) -> Callable[[FetchedRecord], str]:
    """The function that lays out one record (with its newline); ConfigError (exit 2) names
    an unknown placeholder."""
    text = re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), template)
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as e:
        raise ConfigError(f"--format {template!r}: {e} (write {{{{ and }}}} for literal "
                          f"braces)") from None
    for _, name, _, conversion in parsed:
        if name is None:
            continue
        if name not in FIELDS or conversion:
            raise ConfigError(f"--format {template!r}: unknown placeholder {{{name}}}; use "
                              + ", ".join(f"{{{f}}}" for f in FIELDS))

    def render(r: FetchedRecord) -> str:
        when = dt.datetime.fromtimestamp(r.timestamp_ms / 1000, dt.timezone.utc)
        return text.format(
            key="" if r.key is None else escape_value(r.key), value=escape_value(r.value),
            offset=r.offset, partition=r.partition, timestamp=r.timestamp_ms,
            time=when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            headers=",".join(f"{_header_part(k.encode())}={_header_part(v)}"
                             for k, v in r.headers or ())) + "\n"
    return render


def _header_part(b: bytes) -> str:
    return escape_value(b).replace(",", "\\x2c").replace("=", "\\x3d")
