"""Diagnosis aid: what every thread of the node was doing while one event-loop step ran long.

Why: single event-loop lags of 0.4-0.9 s under a heavily loaded machine (issue 28), whose steps
used a fraction of that in CPU (`slow_step ... ms=686.6 cpu_ms=134.1`): the loop's thread was
waiting, for the GIL, the disk (a page fault) or a CPU, and a log line after the step cannot say
which. A watchdog thread looks while the step is still running: the Python stack of every thread,
each thread's state, CPU and major faults from /proc (R running, S sleeping, D waiting on the
disk), and the machine's load. With `RAFTLOG_SLOW_STEP_MS=N` only (raft/node/looplag.py
SlowSteps); off by default, it costs nothing then.

The watchdog needs the GIL to look: if the loop's thread holds it through a long C call, the
first look comes when that call ends or yields the GIL, and the stack shows where it was.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback

log = logging.getLogger("raftlog.node")

MAX_DUMPS_PER_STEP = 3  # looks at one long step: at N ms, 2N and 3N
FRAMES_PER_THREAD = 6  # the innermost frames of each stack


class StallWatch:
    """Looks at the process while a step runs longer than `threshold_s` (see module docstring).
    The loop's instrument calls `step_began` / `step_ended`; plain attribute writes, no lock."""

    def __init__(self, threshold_s: float) -> None:
        self.threshold_s = threshold_s
        self._step_started = 0.0  # 0.0: no step running
        self._step_task = ""
        self._step_serial = 0
        self._loop_ident = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="raftlog stall watch",
                                        daemon=True)
        self._thread.start()

    def step_began(self, task_name: str, now: float) -> None:
        self._step_task = task_name
        self._step_serial += 1
        self._step_started = now

    def step_ended(self) -> None:
        self._step_started = 0.0

    def _watch(self) -> None:
        period = max(self.threshold_s / 4, 0.005)
        dumped_serial, dumps = -1, 0
        while True:
            time.sleep(period)
            started, serial = self._step_started, self._step_serial
            if not started:
                continue
            running = time.perf_counter() - started
            if serial != dumped_serial:
                dumped_serial, dumps = serial, 0
            if dumps >= MAX_DUMPS_PER_STEP or running < self.threshold_s * (dumps + 1):
                continue
            dumps += 1
            try:
                log.warning("stall_dump task=%s running_ms=%.0f look=%d\n%s", self._step_task,
                            running * 1000, dumps, self.describe())
            except Exception:  # a diagnosis aid must never take the node down
                log.exception("stall_dump failed")

    def describe(self) -> str:
        """Every thread's state, CPU, faults and innermost frames, and the load average."""
        names = {t.ident: (t.name, t.native_id) for t in threading.enumerate()}
        lines = [f"loadavg {_read('/proc/loadavg').strip()}"]
        for ident, frame in sys._current_frames().items():
            name, native = names.get(ident, ("?", None))
            mark = " (event loop)" if ident == self._loop_ident else ""
            lines.append(f"  thread {name}{mark} {_task_stat(native)}")
            for fs in traceback.extract_stack(frame)[-FRAMES_PER_THREAD:]:
                lines.append(f"    {fs.filename}:{fs.lineno} {fs.name}")
        return "\n".join(lines)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _task_stat(native_id: int | None) -> str:
    """'state=R cpu_ms=... majflt=...' of one thread of this process, from /proc."""
    if native_id is None:
        return ""
    raw = _read(f"/proc/self/task/{native_id}/stat")
    if not raw:
        return ""
    fields = raw[raw.rindex(")") + 2:].split()
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    cpu_ms = (int(fields[11]) + int(fields[12])) * tick_ms
    return f"state={fields[0]} cpu_ms={cpu_ms:.0f} majflt={fields[9]}"
