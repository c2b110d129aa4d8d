"""Nodes `raftlog up` supervises without having started them: a node restarted by hand with the
command `up` prints (`raftlog serve ... &` in another shell) is not `up`'s child, so before this
`up` neither noticed it nor stopped it: Ctrl-C printed "stopped" while such nodes kept running
(a background job of the user's shell is in its own process group: the terminal's Ctrl-C never
reaches it).

`up` finds such a node through the node directory's lock file, which holds the owner's pid
(storage/dirlock.py), read without taking the lock (a probe of the flock could make the node's
own lock attempt fail at start). The pid is checked against the process's command line (a
`serve` of that node id), then held as a pidfd: readable once the process has ended, and immune
to the pid being reused. Linux only (/proc and pidfds); elsewhere nothing is adopted.
"""

from __future__ import annotations

import os
import select
import signal
from dataclasses import dataclass
from pathlib import Path

from storage.lmdb_log import LOCK_FILE


@dataclass(slots=True)
class Adopted:
    """A running node process that `up` watches and stops but did not start."""

    node_id: int
    pid: int
    fd: int  # pidfd

    def alive(self) -> bool:
        readable, _, _ = select.select([self.fd], [], [], 0)
        return not readable

    def signal(self, sig: int) -> None:
        try:
            signal.pidfd_send_signal(self.fd, sig)
        except ProcessLookupError:
            pass  # it has ended already

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the process to end; True once it has."""
        readable, _, _ = select.select([self.fd], [], [], timeout)
        return bool(readable)

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM (a clean stop), then SIGKILL after `timeout`; True once it has ended."""
        self.signal(signal.SIGTERM)
        if self.wait(timeout):
            return True
        self.signal(signal.SIGKILL)
        return self.wait(10.0)

    def close(self) -> None:
        os.close(self.fd)


def find(node_dir: Path, node_id: int) -> Adopted | None:
    """The running `serve` of `node_id` that holds `node_dir`'s lock, if there is one."""
    try:
        text = (node_dir / LOCK_FILE).read_text(errors="replace").strip()
        pid = int(text)
    except (OSError, ValueError):
        pid = _supervisor(node_dir)
        if pid is None:
            return None
    if pid == os.getpid() or not _is_node(pid, node_id):
        return None
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None
    if not _is_node(pid, node_id):  # the pid was reused between the check and the open
        os.close(fd)
        return None
    return Adopted(node_id, pid, fd)


def _supervisor(node_dir: Path) -> int | None:
    """A node of K shards (docs/SHARDS.md): its shard 0 holds DATA_DIR/node-<id>/shard-0/'s
    lock, and the `serve` to watch is that shard's parent, the supervisor."""
    try:
        pid = int((node_dir / "shard-0" / LOCK_FILE).read_text(errors="replace").strip())
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])  # the ppid
    except (OSError, ValueError, IndexError):
        return None


def _is_node(pid: int, node_id: int) -> bool:
    """Whether process `pid` is a `serve` of node `node_id` (its command line says so)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if "serve" not in args:
        return False
    for i, arg in enumerate(args):
        if arg == "--node-id" and i + 1 < len(args) and args[i + 1] == str(node_id):
            return True
        if arg == f"--node-id={node_id}":
            return True
    return False
