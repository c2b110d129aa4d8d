"""Issue 24 item 3 with real `raftlog serve` processes and the `raftlog` command.

1. The issue's produce (`payload=b"\\xc1not msgpack records", count=3` on a plain client
   connection) is refused with BAD_REQUEST; before the fix it was acknowledged and committed.
2. A committed batch whose payload cannot be decoded, as a node before the fix committed it
   (written here into every stopped node's LMDB log with a valid checksum, so the nodes serve
   it as ordinary committed data), is reported by `raftlog consume` on stderr with its offsets;
   the records before and after it are printed and the exit status is 1. Before the fix
   consume printed nothing and died with a msgpack traceback.
"""

from __future__ import annotations

import json
import socket
import struct
from pathlib import Path

import lmdb
import msgpack
import pytest

from cli_helpers import local_cluster, raftlog
from raft.cli.localcluster import LocalCluster, wait_for
from raft.client import BlockingClient
from storage.batch import Batch
from storage.lmdb_format import TRAILER, encode_value, key

pytestmark = pytest.mark.slow

ISSUE_PAYLOAD = b"\xc1not msgpack records"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("malformed"), nodes=3) as c:
        yield c


def raw_request(address: str, frame: dict) -> dict:
    """One request on a plain client connection, as the issue's reporter sent it."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        def send(obj: dict) -> None:
            body = msgpack.packb({"v": 1, **obj}, use_bin_type=True)
            sock.sendall(struct.pack(">I", len(body)) + body)

        def recv() -> dict:
            buf = b""
            while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
                chunk = sock.recv(65536)
                assert chunk, "the node closed the connection"
                buf += chunk
            return msgpack.unpackb(buf[4:], raw=False)

        send({"t": "hello", "role": "client"})
        assert recv()["t"] == "hello"
        send({"id": 1, **frame})
        return recv()


def consume_lines(cluster: LocalCluster, *args: str) -> tuple[int, list[str], list[str]]:
    res = raftlog("consume", "--servers", cluster.servers, *args)
    return res.returncode, res.stdout.splitlines(), res.stderr.splitlines()


def test_the_issues_malformed_produce_is_refused(cluster: LocalCluster) -> None:
    leader = cluster.addresses[cluster.wait_leader(timeout=60)]
    reply = raw_request(leader, {"t": "produce", "payload": ISSUE_PAYLOAD, "count": 3,
                                 "acks": "quorum"})
    assert reply["ok"] is False, reply
    assert reply["error"]["code"] == "BAD_REQUEST"
    assert "0xc1" in reply["error"]["message"]
    assert "docs/PROTOCOL.md" in reply["error"]["message"]
    with BlockingClient(cluster.servers) as client:
        ok = client.produce([b"fine"])
    code, out, err = consume_lines(cluster, "--from", "0")
    assert code == 0, err
    assert out == [f"{ok.base_offset}\tfine"]  # nothing of the refused batch


def rewrite_payload(node_dir: Path, base: int, payload: bytes) -> None:
    """Replace the payload of the batch stored at `base` in a stopped node's log, with a valid
    checksum: what a node that appended it without the check has on disk."""
    env = lmdb.open(str(node_dir), subdir=True, max_dbs=4, map_size=64 << 20)
    try:
        db = env.open_db(b"log", create=False)
        with env.begin(db=db, write=True) as txn:
            raw = txn.get(key(base))
            assert raw is not None, f"no batch at {base} in {node_dir}"
            old = Batch.decode(bytes(raw)[:-TRAILER])
            assert len(payload) == len(old.payload)  # the same size: byte counts stay right
            new = Batch.create(payload, old.count, kind=old.kind, timestamp_ms=old.timestamp_ms,
                               producer_id=old.producer_id, sequence=old.sequence)
            txn.put(key(base), encode_value(new.placed(base, old.term)))
    finally:
        env.close()


def test_consume_reports_a_committed_undecodable_batch_and_prints_what_follows(
        cluster: LocalCluster) -> None:
    with BlockingClient(cluster.servers) as client:
        before = client.produce([b"before-0", b"before-1"])
        victim = client.produce([b"victim-0", b"victim-1", b"victim-2"])
        after = client.produce([b"after-0", b"after-1"])
    for node_id in cluster.addresses:
        cluster.wait_caught_up(node_id)
    cluster.stop()
    stored = len(msgpack.packb([[None, b"victim-0", None]] * 3, use_bin_type=True))
    bad = ISSUE_PAYLOAD + b"!" * (stored - len(ISSUE_PAYLOAD))
    for node_id in cluster.addresses:
        rewrite_payload(cluster.data_dir / f"node-{node_id}", victim.base_offset, bad)
    cluster.start()
    cluster.wait_leader(timeout=60)
    wait_for(lambda: (cluster.status_of(cluster.leader() or 1) or {}).get(
        "commit_index", -1) >= after.last_offset, "the restarted leader to commit the log", 60)

    code, out, err = consume_lines(cluster, "--from", "0")
    assert code == 1, (out, err)
    first, last = victim.base_offset, victim.last_offset
    records = [line for line in out if line.split("\t")[1].startswith(("before", "after"))]
    assert records == [f"{before.base_offset}\tbefore-0", f"{before.base_offset + 1}\tbefore-1",
                       f"{after.base_offset}\tafter-0", f"{after.base_offset + 1}\tafter-1"]
    assert not any("victim" in line for line in out)
    assert len(err) == 1, err
    assert f"offsets {first}-{last}" in err[0] and "0xc1" in err[0]
    assert f"reading goes on at offset {last + 1}" in err[0]
    assert "Traceback" not in "\n".join(err)

    # The last records, and a subscription reading through it, report it the same way.
    code, out, err = consume_lines(cluster, "--from", "-4")
    assert code == 1 and len(err) == 1 and f"offsets {first}-{last}" in err[0], err
    assert [line.split("\t")[1] for line in out] == ["before-0", "before-1", "after-0",
                                                     "after-1"]
    code, out, err = consume_lines(cluster, "--from", "0", "--json")
    assert code == 1 and len(err) == 1, err
    assert json.loads(err[0])["undecodable"]["first_offset"] == first
    assert json.loads(err[0])["undecodable"]["last_offset"] == last
    assert [json.loads(line)["value"] for line in out][-2:] == ["after-0", "after-1"]
    code, out, err = consume_lines(cluster, "--subscription", "through-bad", "--from", "0")
    assert code == 1 and len(err) == 1 and f"offsets {first}-{last}" in err[0], err
    assert [line.split("\t")[1] for line in out][-2:] == ["after-0", "after-1"]
