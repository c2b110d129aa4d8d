"""Through the real trio Node (the real core, one voter): a restarted node rebuilds its load table
from the log, so a committed load stays committed (re-runs write nothing) and its published
records, and only those, are served again."""

from __future__ import annotations

import tempfile
from pathlib import Path

import trio

from raft.node.config import NodeConfig
from raft.node.server import Node
from sparkio.staging import Session, Stager
from spark_cluster import _free_ports
from storage.memory import MemoryLog
from storage.records import decode_records, encode_values


async def _with_node(log: MemoryLog, fn) -> None:  # noqa: ANN001
    port = _free_ports(1)[0]
    addr = f"127.0.0.1:{port}"
    node = Node(NodeConfig(node_id=1, data_dir=Path(tempfile.mkdtemp()), peers={1: addr},
                           listen=addr), log_storage=log)
    async with trio.open_nursery() as nursery:
        await nursery.start(node.run)  # the real core, one voter
        with trio.fail_after(30):
            while not node.is_leader():
                await trio.sleep(0.01)  # polling the node's own state for its first election
        try:
            await trio.to_thread.run_sync(fn, addr)
        finally:
            node.abort()


def _visible(s: Session) -> list[bytes]:
    out, off = [], 0
    while True:
        r = s.fetch(off, 1 << 20)
        for b in r["batches"]:
            out += [rec.value for rec in decode_records(b["payload"])]
        if r["next_offset"] == off:
            return out
        off = r["next_offset"]


def test_committed_load_survives_a_restart():
    log = MemoryLog()
    seen: dict[str, object] = {}

    def first(addr: str) -> None:
        s = Session(addr, timeout_s=20)
        gen = s.load_begin("L")["gen"]
        zombie = Stager(s, "L", gen, 0, 1)  # an attempt Spark will not report
        zombie.send(encode_values([b"zombie"]), 1)
        zombie.finish()
        st = Stager(s, "L", gen, 0, 2)
        st.send(encode_values([b"a", b"b"]), 2)
        st.send(encode_values([b"c"]), 1)
        assert st.finish() == 2
        assert s.load_commit("L", gen, [(0, 2, 2, 3)])["state"] == "committed"
        seen["before"] = _visible(s)
        s.close()

    def second(addr: str) -> None:
        s = Session(addr, timeout_s=20)
        load = s.load_begin("L")
        seen["after_state"] = load["state"]
        seen["after"] = _visible(s)
        s.close()

    trio.run(_with_node, log, first)
    log.crash()  # keep only what was flushed: the quorum-acked commit is
    trio.run(_with_node, log, second)
    assert seen["before"] == [b"a", b"b", b"c"]
    assert seen["after_state"] == "committed"
    assert seen["after"] == [b"a", b"b", b"c"]
