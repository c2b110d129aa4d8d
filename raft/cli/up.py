"""`raftlog up`: start a LocalCluster and watch it until Ctrl-C.

Before anything starts, `up` makes sure it would be the only owner: it holds an exclusive lock
on DATA_DIR/up.lock for its life, refuses when a node directory is locked by a running node
(a `raftlog serve` or an orphan of an earlier `up`), and refuses when a port is taken. A refusal
is exit 2 and touches nothing (no node is started, no log file written).

A node that dies is reported (how it ended and its log's last line) and the others keep
running, so failover and catch-up can be tried by hand. Without --restart `up` prints the
command that restarts it; with --restart it restarts it itself, pausing longer each time a
node dies soon after its start (and never after exit 2: a configuration error does not go
away by itself). `up` ends (exit 1) only when every node is down.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from raft.cli.localcluster import LocalCluster
from raft.node.config import ConfigError, parse_address
from storage.lmdb_log import LOCK_FILE

LOCK_NAME = "up.lock"
POLL_S = 0.5  # how often the supervisor looks at its nodes
RESTART_PAUSE_S = (1.0, 30.0)  # first pause before a restart, and the most it grows to
STABLE_S = 30.0  # a node that ran this long before dying gets the shortest pause again
EXIT_MEANING = {0: "stopped cleanly", 2: "a configuration error",
                3: "a fail-stop: it could no longer trust its state; a restart recovers from "
                   "its flushed log"}


def say(text: str) -> None:
    """One line on stderr, never wrapped (a piped `up` must not break a command in two)."""
    print(text, file=sys.stderr, flush=True)


@dataclass(slots=True)
class _Restart:
    due: float
    pause: float


def claim(data_dir: Path) -> int:
    """Take DATA_DIR/up.lock (fd kept open for the process's life; the kernel releases it
    however `up` ends). Raises ConfigError naming the other `up`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConfigError(f"another `raftlog up` (pid {pid}) is running on {data_dir}; stop it "
                          f"(Ctrl-C in its terminal, or kill -TERM {pid}), or pass another "
                          f"--data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def check_free(cluster: LocalCluster) -> None:
    """Refuse (ConfigError) when a node directory is owned by a running node or a port is
    taken, before anything starts."""
    for i in cluster.addresses:
        lock = cluster.data_dir / f"node-{i}" / LOCK_FILE
        if not lock.exists():
            continue
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise ConfigError(f"node {i}'s data in {lock.parent} is in use by a running node "
                              f"(pid {pid}); stop it first (kill -TERM {pid}), or pass another "
                              f"--data-dir") from None
        finally:
            os.close(fd)  # closing drops the probe's shared lock
    for i, addr in cluster.addresses.items():
        host, port = parse_address(addr)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the nodes bind
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                raise ConfigError(f"port {port} (node {i}) is in use, by another `raftlog up` "
                                  f"or `serve`?; stop it, or pick another --base-port") from None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} ({EXIT_MEANING.get(code, 'an error')})"


def last_log_line(cluster: LocalCluster, node_id: int) -> str:
    lines = [x for x in cluster.node_log(node_id).splitlines() if x.strip()]
    return lines[-1].strip() if lines else ""


def serve_command(cluster: LocalCluster, node_id: int) -> str:
    args = cluster.command(node_id)[3:]  # drop `python -m raft.cli`
    log = cluster.data_dir / f"node-{node_id}.log"
    return f"raftlog {shlex.join(args)} >> {shlex.quote(str(log))} 2>&1 &"


def supervise(cluster: LocalCluster, *, restart: bool = False,
              notes: list[str] | None = None) -> int:
    """Run the cluster until Ctrl-C; `notes` are printed with the client hints."""
    lock_fd = claim(cluster.data_dir)
    try:
        check_free(cluster)
        return _run(cluster, restart, notes or [])
    finally:
        os.close(lock_fd)


def _run(cluster: LocalCluster, restart: bool, notes: list[str]) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster.start()
    try:
        for i, addr in cluster.addresses.items():
            say(f"node {i}: {addr}  pid {cluster.pid(i)}  log {cluster.data_dir / f'node-{i}.log'}")
        say("waiting for a leader...")
        deadline = time.monotonic() + 30
        leader = None
        while leader is None and not stop.is_set():
            failed = [i for i in cluster.addresses if cluster.returncode(i) == 2]
            if failed:
                for i in failed:
                    say(f"node {i} could not start: {last_log_line(cluster, i)}")
                return 2
            if time.monotonic() > deadline:
                say("no leader within 30 s; see the node logs above")
                return 1
            leader = cluster.leader()
            if leader is None:
                stop.wait(0.1)
        if stop.is_set():
            return 0
        say(f"leader: node {leader}")
        say(f"export RAFTLOG_SERVERS={cluster.servers}")
        say("try: echo hello | raftlog produce; raftlog consume; raftlog status "
            "(with RAFTLOG_SERVERS exported, or add --servers " + cluster.servers + ")")
        for note in notes:
            say(note)
        say("Ctrl-C stops every node cleanly.")
        return _watch(cluster, stop, restart)
    finally:
        codes = cluster.stop()
        say(f"stopped: exit codes {codes}")


def _watch(cluster: LocalCluster, stop: threading.Event, restart: bool) -> int:
    reported: set[int] = set()
    pending: dict[int, _Restart] = {}
    while not stop.wait(POLL_S):
        now = time.monotonic()
        for i in cluster.addresses:
            code = cluster.returncode(i)
            if code is None:
                reported.discard(i)
                continue
            if i not in reported:
                reported.add(i)
                ran = now - cluster.started_at.get(i, now)
                tail = last_log_line(cluster, i)
                say(f"node {i} {describe_exit(code)} after {ran:.0f} s; the others keep "
                    f"running" + (f". Its log ends: {tail}" if tail else ""))
                if restart and code != 2:
                    pause = RESTART_PAUSE_S[0]
                    if i in pending and ran < STABLE_S:
                        pause = min(RESTART_PAUSE_S[1], pending[i].pause * 2)
                    pending[i] = _Restart(now + pause, pause)
                    say(f"restarting node {i} in {pause:.0f} s")
                else:
                    say(f"restart it with: {serve_command(cluster, i)}")
            due = pending.get(i)
            if due is not None and now >= due.due and code is not None:
                cluster.start(i)
                reported.discard(i)
                due.due = float("inf")
                say(f"node {i} restarted: pid {cluster.pid(i)}")
        restarting = any(r.due != float("inf") for r in pending.values())
        if all(cluster.returncode(i) is not None for i in cluster.addresses) and not restarting:
            say("every node is down; stopping")
            return 1
    return 0
