"""One owner per data directory: an open LMDB log holds an exclusive flock on `<dir>/LOCK`.

A second `raftlog serve` beside a live node once joined the cluster as the same node, and a
second `raftlog up` emptied a running cluster's logs. A second opener, in the same process or in
another, must now fail at once with DataDirLocked while the first keeps working; the directory is
free again once the owner closes the log or dies (SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage import DataDirLocked, StorageError, open_log
from storage.batch import Batch
from storage.dirlock import LOCK_FILE

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
TIMEOUT_S = 60  # generous bound for a Python start-up; the refusal itself never waits


def append_one(log) -> int:
    base = log.dirty_offset + 1
    log.append([Batch.create(b"v" * 32, 2).placed(base, max(1, log.last_term()))])
    return log.flush()


def try_open_in_subprocess(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(HERE / "holder.py"), "try", str(path)],
                          capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=TIMEOUT_S,
                          check=False)


def test_second_open_in_process_and_in_subprocess_fail_fast(tmp_path: Path) -> None:
    first = open_log(tmp_path)
    try:
        assert append_one(first) == 1
        assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(DataDirLocked) as err:
            open_log(tmp_path)
        assert isinstance(err.value, StorageError)
        msg = str(err.value)
        assert str(tmp_path) in msg and f"pid {os.getpid()}" in msg
        assert err.value.pid == os.getpid() and err.value.path == str(tmp_path)

        other = try_open_in_subprocess(tmp_path)
        assert other.returncode == 3, other
        assert other.stdout.startswith("locked another raftlog process "
                                       f"(pid {os.getpid()}) is using {tmp_path}")
        assert "stop it first, or give this node another --data-dir" in other.stdout

        # The first owner is undisturbed: it appends, flushes and reads on.
        assert append_one(first) == 3
        assert [b.base_offset for b in first.read(0, 1 << 20)] == [0, 2]
    finally:
        first.close()
    # Closed: the directory is free for a new owner, in this process and in another.
    assert try_open_in_subprocess(tmp_path).stdout.strip() == "opened"
    again = open_log(tmp_path)
    try:
        assert again.dirty_offset == 3
    finally:
        again.close()


def test_lock_dies_with_a_sigkilled_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, str(HERE / "holder.py"), "hold", str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env=ENV)
    try:
        assert holder.stdin is not None and holder.stdout is not None
        line = holder.stdout.readline()
        assert line.startswith("ready "), line
        pid = int(line.split()[1])
        holder.stdin.write("append\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "flushed 1"

        with pytest.raises(DataDirLocked) as err:
            open_log(tmp_path)
        assert err.value.pid == pid
        assert f"another raftlog process (pid {pid}) is using {tmp_path}" in str(err.value)

        # The holder still works after being challenged.
        holder.stdin.write("append\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "flushed 3"

        holder.send_signal(signal.SIGKILL)
        assert holder.wait(TIMEOUT_S) == -signal.SIGKILL
    finally:
        holder.kill()
        holder.wait()
    log = open_log(tmp_path)  # the kernel dropped the dead holder's lock
    try:
        assert log.flushed_offset == 3 and len(log.read(0, 1 << 20)) == 2
        assert append_one(log) == 5
    finally:
        log.close()


def test_a_log_dropped_without_close_frees_the_directory(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    append_one(log)
    del log  # unreachable: nothing can write through it any more
    log = open_log(tmp_path)
    try:
        assert log.dirty_offset == 1
    finally:
        log.close()

