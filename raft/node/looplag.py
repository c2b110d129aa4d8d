"""Event-loop lag: how late a short periodic timer fires on this node's trio loop.

Why measure it: every peer message, client request and tick of a node runs on one trio loop. A
step that holds the loop (a long synchronous read, encode or decode) delays everything behind
it; held longer than an election timeout, it deposes a healthy leader. The runtime bounds every
step it takes (docs/PERFORMANCE.md, "Bounded event-loop work"); this monitor is the proof on a
live node and the first thing to look at when heartbeats seem to go missing.

How: a task sleeps `interval_s` again and again; the lag of one sample is how much later than
asked it woke up. A step that holds the loop for D seconds shows up as a sample of at least
D - interval_s. Samples of the last `window_s` seconds give max and p99 (`snapshot`, shown by
`raftlog status --json` as `loop_lag` and read by the metrics endpoint); the lifetime maximum
is kept too. Each sample also goes to `on_sample` (seconds): the node's metrics histogram
raftlog_event_loop_lag_seconds, so one probe serves both.

The cost is one wake-up per interval, whatever else the node does: on an idle node of 1,000
quiesced partitions these wake-ups are most of what it spends (docs/PERFORMANCE.md). The
interval is 50 ms (20 wake-ups a second; it was 10 ms, 100 a second). What that keeps: a hold
of D is seen as a sample of at least D - 50 ms, so every hold over 70 ms is over the 20 ms warn
bound and counted in `over_bound`, and every hold approaching an election timeout (500 ms) is
reported within 50 ms of its length. A hold of D between 20 and 70 ms shows over the bound in
a fraction (D - 20) / 50 of cases (a 40 ms hold 40% of the time), where the 10 ms interval
caught every hold over 30 ms. Tests and tools that need finer resolution pass `interval_s`.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

log = logging.getLogger("raftlog.node")

DEFAULT_INTERVAL_S = 0.050  # see the module docstring: what this rate keeps and loses
DEFAULT_WINDOW_S = 10.0
# A single lag sample above this is logged (rate-limited): the documented bound on one step.
DEFAULT_WARN_MS = 20.0
WARN_EVERY_S = 10.0


@dataclass(slots=True, frozen=True)
class LagSnapshot:
    """Loop lag over the last `window_s` seconds (milliseconds), and since the node started."""

    window_s: float
    samples: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    max_1s_ms: float  # the last second only: what a poller twice a second needs
    lifetime_max_ms: float
    over_bound: int  # samples above bound_ms since the node started
    bound_ms: float

    def to_dict(self) -> dict[str, float | int | str | None]:
        out: dict[str, float | int | str | None] = {
            name: getattr(self, name) for name in self.__slots__}
        if _STEPS is not None:  # RAFTLOG_SLOW_STEP_MS: CPU per step, see SlowSteps
            ms, task = _STEPS.cpu_max(self.window_s)
            out["step_cpu_max_ms"] = _round(ms)
            out["step_cpu_max_task"] = task
            out["step_cpu_lifetime_max_ms"] = _round(_STEPS.cpu_lifetime_max_ms)
        return out


class LoopLag:
    """One per trio loop. `await run()` in a nursery; `snapshot()` from anywhere on the loop."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S,
                 window_s: float = DEFAULT_WINDOW_S, bound_ms: float = DEFAULT_WARN_MS,
                 clock: Callable[[], float] = trio.current_time,
                 on_sample: Callable[[float], object] | None = None) -> None:
        if interval_s <= 0 or window_s <= interval_s:
            raise ValueError("loop lag needs interval_s > 0 and window_s > interval_s")
        self.interval_s = interval_s
        self.window_s = window_s
        self.bound_ms = bound_ms
        self._clock = clock
        self._on_sample = on_sample  # each sample's lag in seconds (the metrics histogram)
        # (when, lag in ms); bounded: at most one sample per interval over the window.
        self._samples: deque[tuple[float, float]] = deque(
            maxlen=int(math.ceil(window_s / interval_s)) + 1)
        self.lifetime_max_ms = 0.0
        self.over_bound = 0
        self._last_warn = -math.inf

    def record(self, now: float, lag_ms: float) -> None:
        """One sample (the run loop calls this; tests may too)."""
        lag_ms = max(0.0, lag_ms)
        self._samples.append((now, lag_ms))
        if lag_ms > self.lifetime_max_ms:
            self.lifetime_max_ms = lag_ms
        if lag_ms > self.bound_ms:
            self.over_bound += 1
            if now - self._last_warn >= WARN_EVERY_S:
                self._last_warn = now
                log.warning("event_loop_lag lag_ms=%.1f bound_ms=%.0f over_bound_total=%d: "
                            "something held the event loop; if this repeats, see "
                            "docs/PERFORMANCE.md (bounded event-loop work)", lag_ms,
                            self.bound_ms, self.over_bound)

    async def run(self) -> None:
        if _STEPS is not None:
            _STEPS.armed = True
        interval = self.interval_s
        while True:
            asked = self._clock() + interval
            await trio.sleep_until(asked)
            now = self._clock()
            self.record(now, (now - asked) * 1000.0)
            if self._on_sample is not None:
                self._on_sample(max(0.0, now - asked))

    def snapshot(self, now: float | None = None) -> LagSnapshot:
        now = self._clock() if now is None else now
        lags = sorted(lag for t, lag in self._samples if now - t <= self.window_s)
        last_1s = max((lag for t, lag in self._samples if now - t <= 1.0), default=0.0)
        return LagSnapshot(self.window_s, len(lags), _round(_pct(lags, 0.50)),
                           _round(_pct(lags, 0.99)), _round(lags[-1] if lags else 0.0),
                           _round(last_1s), _round(self.lifetime_max_ms), self.over_bound,
                           self.bound_ms)


_STEPS: "SlowSteps | None" = None  # the process's step instrument, when enabled


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


def _round(ms: float) -> float:
    return round(ms, 2)


class SlowSteps(trio.abc.Instrument):
    """Diagnosis aid (off by default; `RAFTLOG_SLOW_STEP_MS=N` in a node's environment turns it
    on): logs every task step and every garbage collection that held the loop longer than N
    ms, with the task's name, so a lag figure can be traced to its cause.

    It also measures each step's CPU time (the thread's, so time the OS gave to other
    processes is not counted): on a shared machine the lag above includes waiting for a CPU,
    while the CPU a step used is what the code bounds. `status` shows the largest of the last
    window and since start as `loop_lag.step_cpu_max_ms` / `step_cpu_lifetime_max_ms`."""

    def __init__(self, threshold_ms: float) -> None:
        import gc
        import time

        self._now = time.perf_counter
        self._cpu = time.thread_time
        self.threshold_s = threshold_ms / 1000
        self._started = 0.0
        self._cpu_started = 0.0
        self._gc_started = 0.0
        # (when, cpu ms, task name) of steps over 1 ms CPU, bounded.
        self.cpu_steps: deque[tuple[float, float, str]] = deque(maxlen=4096)
        self.cpu_lifetime_max_ms = 0.0
        # Set once the node serves (LoopLag.run starts): startup (opening the log, building
        # the core, one full collection before freezing) is not a step anyone waits on.
        self.armed = False
        from raft.node.stall_watch import StallWatch

        self.watch = StallWatch(self.threshold_s)  # stacks of every thread while a step runs long
        gc.callbacks.append(self._gc)
        global _STEPS
        _STEPS = self

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._started = self._now()
        self._cpu_started = self._cpu()
        self.watch.step_began(task.name, self._started)

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.watch.step_ended()
        end = self._now()
        took = end - self._started
        cpu_ms = (self._cpu() - self._cpu_started) * 1000
        if cpu_ms > 1.0 and self.armed:
            self.cpu_steps.append((end, cpu_ms, task.name))
            self.cpu_lifetime_max_ms = max(self.cpu_lifetime_max_ms, cpu_ms)
        if took > self.threshold_s:
            log.warning("slow_step task=%s ms=%.1f cpu_ms=%.1f", task.name, took * 1000, cpu_ms)

    def cpu_max(self, window_s: float) -> tuple[float, str]:
        """The most CPU one step used in the last window_s seconds, and its task."""
        since = self._now() - window_s
        best = max(((ms, name) for t, ms, name in self.cpu_steps if t >= since),
                   default=(0.0, ""))
        return best

    def _gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = self._now()
            return
        took = self._now() - self._gc_started
        if took > self.threshold_s:
            log.warning("slow_gc generation=%s ms=%.1f collected=%s", info.get("generation"),
                        took * 1000, info.get("collected"))


def slow_step_instruments() -> list[trio.abc.Instrument]:
    """[SlowSteps] when RAFTLOG_SLOW_STEP_MS is set to a number of milliseconds, else []."""
    import os

    raw = os.environ.get("RAFTLOG_SLOW_STEP_MS", "").strip()
    if not raw:
        return []
    try:
        return [SlowSteps(float(raw))]
    except ValueError:
        log.warning("RAFTLOG_SLOW_STEP_MS=%r is not a number of milliseconds; ignored", raw)
        return []
