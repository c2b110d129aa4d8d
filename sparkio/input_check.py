"""`raftlog load`: does the input look like the --format given? Checked before Spark starts,
from the first bytes of the first data file, because Spark's own answer to a mismatch is either
a raw SQLSTATE message or, worse, none: JSON read from a CSV file becomes `_corrupt_record`
rows, CSV read from a parquet file becomes rows of binary junk, and both would be loaded.

Parquet files begin with the magic bytes PAR1; a JSON Lines file (what Spark reads by default)
begins with `{`. CSV has no signature: only "it is not parquet" is checked. Errors name the
formats and the flag to change; `spark_message` shortens what Spark says when it still fails.
"""

from __future__ import annotations

import os
import re

FORMATS = ("parquet", "csv", "json")
PARQUET_MAGIC = b"PAR1"


class InputMismatch(Exception):
    """The input is not in the --format given; the message says which flag to change."""


def first_data_file(path: str) -> str | None:
    """`path` itself, or the first data file under a directory (Spark's output directories
    hold _SUCCESS and .crc files beside part-* files)."""
    if os.path.isfile(path):
        return path
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for name in sorted(files):
            if not name.startswith(("_", ".")):
                return os.path.join(root, name)
    return None


def check(path: str, fmt: str) -> None:
    """Raise InputMismatch when `path` cannot be `fmt`."""
    data_file = first_data_file(path)
    if data_file is None:
        raise InputMismatch(f"{path} holds no data file to load")
    with open(data_file, "rb") as f:
        head = f.read(4096)
    shown = data_file if data_file == path else f"{data_file} (in {path})"
    if fmt == "parquet":
        if not head.startswith(PARQUET_MAGIC):
            guess = "json" if head.lstrip().startswith(b"{") else "csv"
            raise InputMismatch(f"{shown} is not a parquet file (it does not begin with "
                                f"PAR1); if it is {guess}, pass --format {guess} (formats: "
                                f"{', '.join(FORMATS)})")
        return
    if head.startswith(PARQUET_MAGIC):
        raise InputMismatch(f"{shown} is a parquet file, not {fmt}; pass --format parquet")
    if fmt == "json" and head.strip() and not head.lstrip().startswith(b"{"):
        raise InputMismatch(f"{shown} is not JSON Lines (one object per line, starting with "
                            f"{{); if it is csv, pass --format csv (formats: "
                            f"{', '.join(FORMATS)})")


def spark_message(e: BaseException) -> str:
    """Spark's error as one line without its class and SQLSTATE decorations."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    text = lines[0] if lines else type(e).__name__
    text = re.sub(r"^\[[A-Z0-9_.]+\]\s*", "", text)
    return re.sub(r"\s*SQLSTATE:\s*\w+\.?", "", text).strip()
