"""Running the `raftlog` command as a user does, for the CLI process tests: one-shot commands
(`raftlog(...)`), long-running ones whose output is read as it comes (`Running`), and a
`raftlog up` cluster (`UpCluster`). Every wait is a condition polled under a deadline."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from raft.cli.localcluster import LocalCluster, free_ports

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0  # generous: process start-up on a loaded 2-core box


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if k != "RAFTLOG_SERVERS"}
    out["PYTHONPATH"] = str(REPO)
    out.update(extra)
    return out


def raftlog(*args: str, stdin: bytes | str = b"", timeout: float = DEADLINE_S,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `raftlog ARGS` to completion; stdout/stderr as text (undecodable bytes escaped)."""
    data = stdin.encode() if isinstance(stdin, str) else stdin
    try:
        res = subprocess.run([sys.executable, "-m", "raft.cli", *args], input=data,
                             capture_output=True, timeout=timeout, env=env(**(extra_env or {})),
                             cwd=REPO)
    except subprocess.TimeoutExpired as e:  # say what the command had printed by then
        out = (e.stdout or b"").decode(errors="backslashreplace")
        err = (e.stderr or b"").decode(errors="backslashreplace")
        raise AssertionError(f"`raftlog {' '.join(args)}` still running after {timeout} s; "
                             f"stdout so far:\n{out[-3000:]}\nstderr so far:\n{err[-3000:]}"
                             ) from None
    return subprocess.CompletedProcess(res.args, res.returncode,
                                       res.stdout.decode(errors="backslashreplace"),
                                       res.stderr.decode(errors="backslashreplace"))


def cli(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`raftlog ARGS` in this process (raft.cli.main.main), for commands that never touch a
    cluster or a port (help, usage and configuration errors, config show, completion): the
    same code without a Python start-up per call."""
    from raft.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.pop("RAFTLOG_SERVERS", None)
    os.environ.update(extra_env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # --help, --version
                code = int(e.code or 0)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["raftlog", *args], code, out.getvalue(), err.getvalue())


def wait_for(cond: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)  # polling a subprocess's output, not synchronising with it


class Running:
    """A `raftlog` process whose stdout and stderr lines are collected as they arrive."""

    def __init__(self, *args: str, stdin: bool = False,
                 extra_env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raft.cli", *args], cwd=REPO, env=env(**(extra_env or {})),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE)
        self.out: list[str] = []
        self.err: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(s, dest), daemon=True)
                         for s, dest in ((self.proc.stdout, self.out),
                                         (self.proc.stderr, self.err))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream: Any, dest: list[str]) -> None:
        for raw in iter(stream.readline, b""):
            dest.append(raw.decode(errors="backslashreplace").rstrip("\n"))

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait_line(self, pattern: str, *, stream: str = "err", count: int = 1,
                  timeout: float = DEADLINE_S) -> re.Match[str]:
        """The count-th line of stderr (or stdout) matching the regex `pattern`."""
        lines = self.err if stream == "err" else self.out

        def found() -> re.Match[str] | None:
            matches = [m for m in map(re.compile(pattern).search, list(lines)) if m]
            return matches[count - 1] if len(matches) >= count else None

        def cond() -> re.Match[str] | None:
            m = found()
            if m is None and self.proc.poll() is not None:
                for t in self._threads:  # the pumps drain the exited process's pipes
                    t.join(timeout=10)
                m = found()
                if m is None:
                    raise AssertionError(f"exited {self.proc.returncode} without a line "
                                         f"matching {pattern!r}; stderr: {self.err[-10:]}")
            return m
        return wait_for(cond, f"a line matching {pattern!r}", timeout)

    def wait(self, timeout: float = DEADLINE_S) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        return code

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def free_base_port(n: int) -> int:
    """A port p such that p .. p+n-1 are all free now, outside the ephemeral range (see
    raft.cli.localcluster.free_ports)."""
    return free_ports(n, consecutive=True)[0]


class UpCluster(Running):
    """`raftlog up --nodes N --data-dir D --base-port P [extra]`, started and waited for."""

    def __init__(self, data_dir: Path, nodes: int = 3, *extra: str) -> None:
        self.data_dir = data_dir
        self.base_port = free_base_port(nodes)
        self.nodes = nodes
        super().__init__("up", "--nodes", str(nodes), "--data-dir", str(data_dir),
                         "--base-port", str(self.base_port), *extra)
        m = self.wait_line(r"^export RAFTLOG_SERVERS=(\S+)$")
        self.servers = m.group(1)

    @property
    def addresses(self) -> dict[int, str]:
        return {i + 1: a for i, a in enumerate(self.servers.split(","))}

    def pid(self, node_id: int, count: int = 1) -> int:
        m = self.wait_line(rf"^node {node_id}: \S+\s+pid (\d+)", count=count)
        return int(m.group(1))


@contextlib.contextmanager
def local_cluster(directory: Path, nodes: int) -> Iterator[LocalCluster]:
    """A started LocalCluster of real `raftlog serve` processes with a leader, stopped on the
    way out whatever happens: the body of the process tests' module-scoped cluster fixtures."""
    c = LocalCluster(directory, nodes=nodes)
    c.start()
    try:
        c.wait_leader(timeout=60)
        yield c
    finally:
        c.stop()
