"""The stall watch (raft/node/stall_watch.py): while a loop step runs long, it logs what every
thread is doing, the loop's own stack included, so a lag can be attributed."""

from __future__ import annotations

import logging
import threading
import time

from raft.node.stall_watch import StallWatch


class Caught(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("stall_dump"):
            self.records.append(record.getMessage())
            self.seen.set()


def test_a_long_step_is_dumped_with_the_loop_threads_stack() -> None:
    caught = Caught()
    logger = logging.getLogger("raftlog.node")
    logger.addHandler(caught)
    try:
        watch = StallWatch(threshold_s=0.02)

        def a_long_step() -> None:  # the loop's thread, held until the watch has looked
            watch.step_began("a_long_step_task", time.perf_counter())
            assert caught.seen.wait(30), "the watch never looked at the long step"
            watch.step_ended()

        a_long_step()
        dump = caught.records[0]
        assert "task=a_long_step_task" in dump and "loadavg" in dump
        loop = dump.split("(event loop)", 1)[1]  # the loop thread's line, then its frames
        assert "a_long_step" in loop.split("  thread ", 1)[0]
        assert "state=" in dump and "raftlog stall watch" in dump
    finally:
        logger.removeHandler(caught)
