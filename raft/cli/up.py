"""`raftlog up`: start a LocalCluster and watch it until Ctrl-C.

Before anything starts, `up` makes sure it would be the only owner: it holds an exclusive lock
on DATA_DIR/up.lock for its life, refuses when a node directory is locked by a running node
(a `raftlog serve` or an orphan of an earlier `up`), and refuses when a port is taken. A refusal
is exit 2 and touches nothing (no node is started, no log file written).

A node that dies is reported (how it ended and its log's last line) and the others keep
running, so failover and catch-up can be tried by hand. Without --restart `up` prints the
command that restarts it; with --restart it restarts it itself, pausing longer each time a
node dies soon after its start (and never after exit 2: a configuration error does not go
away by itself). A node restarted by hand with the printed command is not `up`'s child; `up`
notices it through its data dir's lock (raft/cli/adopted.py), watches it like the others and
stops it with them. `up` ends (exit 1) only when every node is down; Ctrl-C stops every node
and exits 130 (SIGTERM: 0). Node settings (--server-arg, --config) are raft/cli/up_settings.py's.

`up --partitions N` grows the topic `default` (the one commands without --topic use) to N
partitions once the cluster has a leader, each with min(3, nodes) replicas as placed by the
controller (grow only: an existing data dir whose `default` has more keeps them). Commands
without --topic still read and write its partition 0, as before topics; `--topic default`
spreads records over all N by key (`raftlog produce --topic default --key-separator :`).
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

from raft.cli.adopted import Adopted
from raft.cli.adopted import find as find_hand_started
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
    usable_data_dir(data_dir)
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


def usable_data_dir(data_dir: Path) -> None:
    """Create --data-dir if missing; ConfigError (exit 2, one line) when it cannot be a
    directory: a file in the way, no permission."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir} is a file, not a directory; pass a directory "
                          f"(it is created if missing), e.g. --data-dir ./data")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--data-dir {data_dir} cannot be created ({e.strerror or e}); pass "
                          f"a directory you can write to") from None


def check_free(cluster: LocalCluster) -> None:
    """Refuse (ConfigError) when a node directory is owned by a running node or a port is
    taken, before anything starts (a node of K shards: each shard's directory and port)."""
    for i in cluster.addresses:
        base = cluster.data_dir / f"node-{i}"
        for lock in [base / LOCK_FILE, *sorted(base.glob(f"shard-*/{LOCK_FILE}"))]:
            if lock.exists():
                _check_lock(lock, i)
    for i, addr in cluster.addresses.items():
        host, base_port = parse_address(addr)
        for port in range(base_port, base_port + cluster.shards):  # shard k: port + k
            _check_port(host, port, i, cluster.shards)


def _check_lock(lock: Path, i: int) -> None:
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


def _check_port(host: str, port: int, i: int, shards: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the nodes bind
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            what = f"node {i}" if shards == 1 else f"node {i}: {shards} shards, port + k each"
            raise ConfigError(f"port {port} ({what}) is in use, by another `raftlog up` or "
                              f"`serve`?; stop it, pick another --base-port, or fewer "
                              f"--shards") from None


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
              notes: list[str] | None = None, partitions: int | None = None) -> int:
    """Run the cluster until Ctrl-C; `notes` are printed with the client hints. With
    `partitions`, grow the default topic to that many once there is a leader."""
    lock_fd = claim(cluster.data_dir)
    try:
        check_free(cluster)
        return _run(cluster, restart, notes or [], partitions)
    finally:
        os.close(lock_fd)


class _Stop:
    """Set by SIGINT (Ctrl-C: exit 130, like every command) or SIGTERM (exit 0)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum
        self.event.set()

    def code(self, otherwise: int) -> int:
        return 130 if self.signum == signal.SIGINT else otherwise


def grow_default_topic(cluster: LocalCluster, partitions: int) -> str:
    """`up --partitions N`: the default topic with at least N partitions; what happened, as
    one line to print."""
    from raft.client import RaftlogError, UnknownTopicError

    try:
        # The default topic's partition leads before the controller has applied its bootstrap
        # (the metadata names no topic until then): wait for it, bounded.
        deadline = time.monotonic() + 60.0
        while True:
            try:
                info = cluster.client.topic("default", refresh=True)
                break
            except UnknownTopicError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
        if info.partition_count >= partitions:
            return (f"topic default: {info.partition_count} partitions (--partitions "
                    f"{partitions} asks for no more)")
        info = cluster.client.alter_topic("default", partitions=partitions, timeout=60.0)
    except RaftlogError as e:
        return (f"could not grow topic default to {partitions} partitions ({e.code}: "
                f"{e.message}); run `raftlog topic alter default --partitions {partitions}` "
                f"once the cluster is up")
    return (f"topic default: {info.partition_count} partitions, each led; commands without "
            f"--topic use partition 0, `--topic default` spreads by key over all")


def _run(cluster: LocalCluster, restart: bool, notes: list[str],
         partitions: int | None = None) -> int:
    stop = _Stop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    adopted: dict[int, Adopted] = {}
    cluster.start()
    try:
        for i, addr in cluster.addresses.items():
            say(f"node {i}: {addr}  pid {cluster.pid(i)}  log {cluster.data_dir / f'node-{i}.log'}")
        say("waiting for a leader...")
        deadline = time.monotonic() + 30
        leader = None
        while leader is None and not stop.event.is_set():
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
                stop.event.wait(0.1)
        if stop.event.is_set():
            return stop.code(0)
        say(f"leader: node {leader}")
        if partitions is not None:
            say(grow_default_topic(cluster, partitions))
        say(f"export RAFTLOG_SERVERS={cluster.servers}")
        say("try: echo hello | raftlog produce; raftlog consume; raftlog status "
            "(with RAFTLOG_SERVERS exported, or add --servers " + cluster.servers + ")")
        for note in notes:
            say(note)
        say("Ctrl-C stops every node cleanly.")
        return stop.code(_watch(cluster, stop.event, restart, adopted))
    finally:
        for a in adopted.values():  # every node stops at once: SIGTERM them all first
            a.signal(signal.SIGTERM)
        codes = cluster.stop()
        ended = [f"node {i} (pid {a.pid}) " + ("stopped" if a.stop() else "DID NOT STOP")
                 for i, a in sorted(adopted.items())]
        for a in adopted.values():
            a.close()
        say(f"stopped: exit codes {codes}" + (f"; started outside `up`: {', '.join(ended)}"
                                               if ended else ""))


def _watch(cluster: LocalCluster, stop: threading.Event, restart: bool,
           adopted: dict[int, Adopted]) -> int:
    reported: set[int] = set()
    pending: dict[int, _Restart] = {}
    while not stop.wait(POLL_S):
        now = time.monotonic()
        for i in cluster.addresses:
            code = cluster.returncode(i)
            if code is None:
                reported.discard(i)
                continue
            if i in adopted:
                if adopted[i].alive():
                    continue
                a = adopted.pop(i)
                a.close()
                reported.discard(i)  # reported below, as any node that ends
                code = None
            elif i in reported:
                hand = find_hand_started(cluster.data_dir / f"node-{i}", i)
                if hand is not None:
                    adopted[i] = hand
                    pending.pop(i, None)
                    cluster.started_at[i] = now
                    say(f"node {i} runs again (pid {hand.pid}, started outside `up`); `up` "
                        f"watches it and stops it with the others")
                    continue
            if i not in reported:
                reported.add(i)
                ran = now - cluster.started_at.get(i, now)
                tail = last_log_line(cluster, i)
                how = describe_exit(code) if code is not None else "ended"
                say(f"node {i} {how} after {ran:.0f} s; the others keep "
                    f"running" + (f". Its log ends: {tail}" if tail else ""))
                if restart and code != 2:
                    pause = RESTART_PAUSE_S[0]
                    if i in pending and ran < STABLE_S:
                        pause = min(RESTART_PAUSE_S[1], pending[i].pause * 2)
                    pending[i] = _Restart(now + pause, pause)
                    say(f"restarting node {i} in {pause:.0f} s")
                else:
                    say(f"restart it with: {serve_command(cluster, i)}")
                    say(f"(`up` notices node {i} when it runs again, and Ctrl-C stops it "
                        f"with the others)")
            due = pending.get(i)
            if due is not None and now >= due.due and i not in adopted:
                cluster.start(i)
                reported.discard(i)
                due.due = float("inf")
                say(f"node {i} restarted: pid {cluster.pid(i)}")
        restarting = any(r.due != float("inf") for r in pending.values())
        if all(cluster.returncode(i) is not None and i not in adopted
               for i in cluster.addresses) and not restarting:
            say("every node is down; stopping")
            return 1
    return 0
