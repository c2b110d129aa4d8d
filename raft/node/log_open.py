"""Opening a node's data directory: in a worker thread, with progress for long opens (a large
LMDB log may take a while to verify its tail), and the errors a starting node reports: a
directory another process holds (ConfigError: pick another --data-dir or stop that process),
a log it cannot open (NodeFailed: fail-stop with what was found)."""

from __future__ import annotations

import logging

import trio

from raft.node.config import ConfigError, NodeConfig
from raft.node.errors import NodeFailed
from storage import open_log
from storage.api import DataDirLocked, LogStorage, StorageError

log = logging.getLogger("raftlog.node")

OPEN_PROGRESS_EVERY_S = 2.0


async def open_log_with_progress(config: NodeConfig) -> LogStorage:
    """Open `<data_dir>/node-<id>/` in a worker thread, printing progress for long opens
    (a large LMDB log may take a while to verify its tail)."""
    path = config.check_data_dir()
    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        async def progress() -> None:
            while True:
                await trio.sleep(OPEN_PROGRESS_EVERY_S)
                log.warning("opening_log path=%s elapsed_s=%.0f", path,
                            trio.current_time() - started)
        nursery.start_soon(progress)
        try:
            opened = await trio.to_thread.run_sync(open_log, path)
        except DataDirLocked as e:
            raise ConfigError(str(e)) from None
        except StorageError as e:  # LogInconsistent, an I/O error
            raise NodeFailed(f"cannot open the log in {path}: {e}") from e
        nursery.cancel_scope.cancel()
    return opened
