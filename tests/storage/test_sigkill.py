"""A process killed with SIGKILL at random moments keeps every batch it reported flushed.

The child (tests/storage/writer.py) reports `flushed N` only after flush() returned; the parent
kills it after a random number of reports (sometimes before the first), reopens the directory
and checks a clean prefix: contiguous offsets, CRCs and payloads good, nothing past the end.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

from storage import open_log
from storage.batch import Batch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from writer import payload_for  # noqa: E402

KILLS = 20


def check_log(path: Path, must_hold: int) -> int:
    log = open_log(path)
    try:
        assert log.flushed_offset == log.dirty_offset, "a reopened log has no dirty tail"
        assert log.flushed_offset >= must_hold, (
            f"reported flushed offset {must_hold} lost: log ends at {log.flushed_offset}")
        expect = log.start_offset
        while expect <= log.dirty_offset:
            batches = log.read(expect, 1 << 20)  # read() verifies every CRC
            assert batches
            for b in batches:
                assert b.base_offset == expect
                assert b.payload == payload_for(b.base_offset, len(b.payload))
                expect = b.last_offset + 1
        assert expect == log.dirty_offset + 1
        assert log.read(expect, 1 << 20) == []
        return log.flushed_offset
    finally:
        log.close()


def test_sigkill_keeps_every_reported_flush(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    path = tmp_path / "log"
    reported = -1
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for round_no in range(KILLS):
        child = subprocess.Popen([sys.executable, str(HERE / "writer.py"), str(path),
                                  str(round_no)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                 env=env)
        try:
            assert child.stdout is not None
            for _ in range(rng.choice([0, 1, 2, 5, 10, 25])):
                line = child.stdout.readline()
                assert line.startswith("flushed "), f"writer died: {line!r}"
                reported = max(reported, int(line.split()[1]))
            child.send_signal(signal.SIGKILL)
            # Lines written before the kill were reported too: they must survive.
            for line in child.stdout:
                reported = max(reported, int(line.split()[1]))
        finally:
            child.kill()
            child.wait()
        assert child.returncode == -signal.SIGKILL
        check_log(path, reported)
    # The log keeps working after all that.
    log = open_log(path)
    try:
        base = log.dirty_offset + 1
        log.append([Batch.create(payload_for(base, 64), 2).placed(base, log.last_term())])
        assert log.flush() == base + 1
    finally:
        log.close()
    assert check_log(path, base + 1) == base + 1
