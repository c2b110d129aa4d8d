"""A single raftlog node (the real trio Node and the real Raft core, one voter) on an
in-memory log, for the Spark tests that need the wire path but no replication.

Run: python tests/spark/solo_node.py PORT   (RAFTLOG_LOAD_TIMEOUT_MS is honoured)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

from raft.node.config import NodeConfig
from raft.node.server import Node
from storage.memory import MemoryLog


async def serve(port: int) -> None:
    addr = f"127.0.0.1:{port}"
    config = NodeConfig(node_id=1, data_dir=Path(tempfile.mkdtemp()), peers={1: addr},
                        listen=addr)
    node = Node(config, log_storage=MemoryLog())
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)


if __name__ == "__main__":
    trio.run(serve, int(sys.argv[1]))
