"""`raftlog recover` refusals and the typed confirmation, in process on a stopped node's LMDB
data directory (the full story with real processes: test_force_new_cluster_processes.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from cli_helpers import cli
from raft.cli.recover import AUDIT_FILE
from raft.core.membership import ClusterConfig
from storage import open_log
from storage.api import Meta
from storage.batch import Batch
from storage.records import encode_values


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def stopped_node(tmp_path: Path, node_id: int = 1, path: Path | None = None) -> Path:
    """A node's data directory with three flushed entries of term 2, as a stopped node leaves it."""
    path = path or tmp_path / f"node-{node_id}"
    log = open_log(path)
    try:
        boot = ClusterConfig((1, 2, 3))
        log.save_meta(Meta(2, 1, {"history": [{"offset": -1, "term": 0,
                                               "config": boot.to_dict()}], "commit": 1}))
        log.append([Batch.create(encode_values([f"v{i}".encode()]), 1).placed(i, 2)
                    for i in range(3)])
        log.flush()
    finally:
        log.close()
    return path


def recover(tmp_path: Path, *extra: str) -> tuple[int, str]:
    res = cli("recover", "--force-new-cluster", "--data-dir", str(tmp_path), "--node-id", "1",
              *extra)
    return res.returncode, res.stderr


def test_recover_says_what_is_missing() -> None:
    res = cli("recover", "--data-dir", "/nonexistent", "--node-id", "1")
    assert res.returncode == 2 and "--force-new-cluster" in res.stderr
    res = cli("recover", "--force-new-cluster", "--data-dir", "/nonexistent", "--node-id", "1")
    assert res.returncode == 2 and "no data directory for node 1" in res.stderr


def test_a_running_node_is_refused(tmp_path: Path) -> None:
    path = stopped_node(tmp_path)
    log = open_log(path)  # the node holds its data directory's lock while it runs
    try:
        code, err = recover(tmp_path, "--yes")
    finally:
        log.close()
    assert code == 2 and "node 1 is running" in err and "stop it first" in err
    assert not (path / AUDIT_FILE).exists()


def test_the_typed_confirmation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = stopped_node(tmp_path)
    monkeypatch.setattr(sys, "stdin", Tty("yes\n"))
    code, err = recover(tmp_path)
    assert code == 2 and "not confirmed: nothing was changed" in err
    assert "flushed log up to offset 2 (commit index it last knew: 1)" in err
    assert "LOST" in err and "nodes 2, 3 stop being members" in err
    assert not (path / AUDIT_FILE).exists()

    monkeypatch.setattr(sys, "stdin", Tty("force\n"))
    code, err = recover(tmp_path)
    assert code == 0, err
    assert "only voter of a new cluster (term 3" in err
    log = open_log(path)
    try:
        forced = log.read(3, 1 << 20)[0]
        assert ClusterConfig.from_batch(forced).voters == (1,) and forced.term == 3
        meta = log.load_meta()
        assert meta.term == 3 and meta.voted_for is None and "pending" not in meta.config
    finally:
        log.close()
    assert '"force-new-cluster"' in (path / AUDIT_FILE).read_text()


def test_a_node_of_two_shards_is_forced_in_every_shards_store(tmp_path: Path) -> None:
    node = tmp_path / "node-1"
    shards = [stopped_node(tmp_path, path=node / f"shard-{k}") for k in range(2)]
    (node / "shards").write_text("2\n")  # what the supervisor records (docs/SHARDS.md)
    log = open_log(shards[1])  # shard 1 still runs: refused, nothing changed
    try:
        code, err = recover(tmp_path, "--yes")
    finally:
        log.close()
    assert code == 2 and "node 1 is running" in err and str(shards[1]) in err
    assert not any((s / AUDIT_FILE).exists() for s in shards)
    code, err = recover(tmp_path, "--yes")
    assert code == 0, err
    assert "runs 2 shards" in err and not (node / "data.mdb").exists()
    for path in shards:
        log = open_log(path)
        try:
            forced = log.read(3, 1 << 20)[0]
            assert ClusterConfig.from_batch(forced).voters == (1,) and forced.term == 3
        finally:
            log.close()
        assert '"force-new-cluster"' in (path / AUDIT_FILE).read_text()
