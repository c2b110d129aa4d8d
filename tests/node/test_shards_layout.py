"""The shard layout of a data directory (raft/node/supervisor.py, docs/SHARDS.md): a node keeps
the shard count its data was written with; another is refused with what to do; each shard's
settings move its ports up by its index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raft.node.config import ConfigError, NodeConfig
from raft.node.supervisor import check_layout, shard_settings


def config(tmp_path: Path, shards: int, shard: int = 0) -> NodeConfig:
    return NodeConfig(node_id=1, data_dir=tmp_path, shards=shards, shard=shard,
                      peers={1: "127.0.0.1:7100", 2: "127.0.0.1:7200"},
                      metrics_listen="127.0.0.1:9100").validate()


def test_the_first_sharded_start_records_its_count_and_a_repeat_passes(tmp_path):
    check_layout(config(tmp_path, 2))
    assert (tmp_path / "node-1" / "shards").read_text().strip() == "2"
    check_layout(config(tmp_path, 2))


@pytest.mark.parametrize("first,then", [(2, 1), (2, 4), (1, 2)])
def test_another_count_is_refused_saying_how_to_change_it(tmp_path, first, then):
    if first == 1:  # a one-shard node's data: files directly in node-1/
        (tmp_path / "node-1").mkdir()
        (tmp_path / "node-1" / "data.mdb").write_bytes(b"x")
    else:
        check_layout(config(tmp_path, first))
    with pytest.raises(ConfigError) as e:
        check_layout(config(tmp_path, then))
    assert f"written with --shards {first}" in str(e.value)
    assert f"start it with --shards {first}" in str(e.value)
    assert "raftlog topic move" in str(e.value)


def test_a_one_shard_node_keeps_todays_layout(tmp_path):
    one = config(tmp_path, 1)
    check_layout(one)
    assert one.node_dir == tmp_path / "node-1"
    assert not (tmp_path / "node-1" / "shards").exists()


def test_shard_k_listens_and_reaches_peers_on_ports_plus_k(tmp_path):
    k1 = shard_settings(config(tmp_path, 3), 1)
    assert k1["peers"] == {"1": "127.0.0.1:7101", "2": "127.0.0.1:7201"}
    assert k1["metrics_listen"] == "127.0.0.1:9101" and k1["shard"] == 1
    c = NodeConfig.from_dict(k1)
    assert c.node_dir == tmp_path / "node-1" / "shard-1"
    assert c.listen_address == ("127.0.0.1", 7101)


def test_a_shard_index_outside_the_count_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="shards"):
        config(tmp_path, 2, shard=2)


def test_left_out_the_count_is_the_datas_else_the_usable_cores(tmp_path, monkeypatch):
    from raft.node import supervisor

    monkeypatch.setattr(supervisor, "usable_cores", lambda: 6)
    assert supervisor.default_shards(config(tmp_path / "new", 1)) == 6  # a new node
    check_layout(config(tmp_path / "two", 2))
    assert supervisor.default_shards(config(tmp_path / "two", 1)) == 2  # as recorded
    one = tmp_path / "one" / "node-1"
    one.mkdir(parents=True)
    (one / "data.mdb").write_bytes(b"x")  # a one-shard node's data: it stays one
    assert supervisor.default_shards(config(tmp_path / "one", 1)) == 1
    zero = NodeConfig(node_id=1, data_dir=tmp_path / "zero",
                      peers={1: "127.0.0.1:0"}).validate()
    assert supervisor.default_shards(zero) == 1  # port 0: no port + k to listen on
    # Nodes on one host closer than 6 ports: fewer shards, none on another node's port, and
    # the same count on every node of the same --peers.
    near = {1: "127.0.0.1:7101", 2: "127.0.0.1:7104", 3: "10.0.0.1:7102", 4: "127.0.0.1:7110"}
    for n in near:
        c = NodeConfig(node_id=n, data_dir=tmp_path / f"near{n}", peers=near).validate()
        assert supervisor.default_shards(c) == 3  # 7101 and 7104; 7102 is another host's
    consecutive = {1: "127.0.0.1:7101", 2: "127.0.0.1:7102", 3: "127.0.0.1:7103"}
    for n in consecutive:
        c = NodeConfig(node_id=n, data_dir=tmp_path / f"c{n}", peers=consecutive).validate()
        assert supervisor.default_shards(c) == 1


def test_shards_count_as_given_from_the_flag_or_the_config_file(tmp_path):
    from raft.node.serve import _shards_given

    toml = tmp_path / "node.toml"
    toml.write_text("shards = 2\n")
    plain = tmp_path / "plain.toml"
    plain.write_text("tick_ms = 20\n")
    assert _shards_given({"shards": 1})
    assert _shards_given({"shards": None, "config": str(toml)})
    assert not _shards_given({"shards": None, "config": str(plain)})
    assert not _shards_given({"shards": None})


@pytest.mark.parametrize("flag", ["--listen", "--metrics-listen"])
def test_a_taken_shard_port_is_refused_naming_the_flag(tmp_path, flag):
    import socket

    from raft.cli.localcluster import free_ports
    from raft.node.supervisor import check_ports

    base, metrics = free_ports(3, consecutive=True)[0], free_ports(3, consecutive=True)[0]
    c = NodeConfig(node_id=1, data_dir=tmp_path, shards=3, peers={1: f"127.0.0.1:{base}"},
                   metrics_listen=f"127.0.0.1:{metrics}").validate()
    check_ports(c)  # all free
    taken = (base if flag == "--listen" else metrics) + 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        with pytest.raises(ConfigError) as e:
            check_ports(c)
    text = str(e.value)
    assert f"shard 2 of 3 needs port {taken} ({flag} port" in text, text
    assert "fewer --shards" in text and "--shards 1" in text


def test_up_finds_a_sharded_node_by_its_shard_0s_parent(tmp_path):
    import os

    from raft.cli.adopted import _supervisor
    from storage.lmdb_log import LOCK_FILE

    assert _supervisor(tmp_path / "node-1") is None  # no shard 0 lock: no sharded node
    (tmp_path / "node-1" / "shard-0").mkdir(parents=True)
    (tmp_path / "node-1" / "shard-0" / LOCK_FILE).write_text(f"{os.getpid()}\n")
    assert _supervisor(tmp_path / "node-1") == os.getppid()


def test_a_shards_log_lines_say_which_shard():
    import json
    import logging

    from raft.node.logfmt import make_formatter

    record = logging.LogRecord("raftlog.node", logging.WARNING, __file__, 1,
                               "peer_down node=1 peer=3", None, None)
    assert " shard=1 event=peer_down" in make_formatter("text", shard=1).format(record)
    assert "shard=" not in make_formatter("text").format(record)
    line = json.loads(make_formatter("json", lambda: {"node": 1}, shard=1).format(record))
    assert line["shard"] == 1 and line["node"] == 1 and line["event"] == "peer_down"


def test_config_show_says_what_serve_runs_without_shards(tmp_path):
    from cli_helpers import cli

    consecutive = cli("config", "show", "--node-id", "1", "--data-dir", str(tmp_path),
                      "--peers", "1=127.0.0.1:7101,2=127.0.0.1:7102", "--json")
    rows = {r["setting"]: r for r in json.loads(consecutive.stdout)["settings"]}
    assert rows["shards"]["value"] == 1 and "usable cores" in rows["shards"]["source"]
    check_layout(config(tmp_path, 3))  # data written with 3 shards: that is what it runs
    recorded = cli("config", "show", "--node-id", "1", "--data-dir", str(tmp_path),
                   "--peers", "1=127.0.0.1:7101", "--json")
    assert {r["setting"]: r for r in json.loads(recorded.stdout)["settings"]}["shards"][
        "value"] == 3


def test_a_node_registered_with_another_shard_count_is_told_loudly():
    from raft.controller.bootstrap import bootstrap_commands
    from raft.controller.state import ClusterMetadata
    from raft.node.topic_runtime import shard_count_mismatch

    meta = ClusterMetadata()
    for i, c in enumerate(bootstrap_commands({1: "127.0.0.1:7101", 2: "127.0.0.1:7201"},
                                             shards=4)):
        assert meta.apply(i, c).ok
    assert shard_count_mismatch(meta, 2, 4) is None
    assert shard_count_mismatch(meta, 3, 2) is None  # not registered (yet)
    fewer = shard_count_mismatch(meta, 2, 2)
    assert "runs=2 registered=4" in fewer and "shards 2..3 have no process" in fewer
    assert "--shards 4" in fewer and "empty --data-dir" in fewer
    assert "its shards 4..7 get none" in shard_count_mismatch(meta, 2, 8)
