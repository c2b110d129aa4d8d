"""NodeConfig: flags and TOML in, one validated object out, errors that say what to fix."""

from __future__ import annotations

import argparse

import pytest

from raft.node.config import ConfigError, NodeConfig, parse_address, parse_peers

PEERS = "1=127.0.0.1:7101,2=127.0.0.1:7102,3=127.0.0.1:7103"


def test_defaults_and_derived_values(tmp_path) -> None:
    cfg = NodeConfig.from_dict({"node_id": 2, "data_dir": str(tmp_path), "peers": PEERS})
    assert cfg.peers == {1: "127.0.0.1:7101", 2: "127.0.0.1:7102", 3: "127.0.0.1:7103"}
    assert cfg.listen_address == ("127.0.0.1", 7102)
    assert cfg.node_dir == tmp_path / "node-2"
    assert cfg.tick_ms == 50 and cfg.max_frame_bytes == 16 << 20 and cfg.log_level == "WARNING"
    assert cfg.raft_kwargs() == {}
    assert cfg.scrub_rate == 2.0 and cfg.scrub_slice_kib == 256  # on by default, at a low rate
    cfg = NodeConfig.from_dict({"node_id": 1, "data_dir": "d", "peers": PEERS,
                                "election_ticks": 7, "pre_vote": False,
                                "raft": {"max_inflight": 2}, "listen": "0.0.0.0:9000",
                                "log_level": "debug"})
    assert cfg.raft_kwargs() == {"election_ticks": 7, "pre_vote": False, "max_inflight": 2}
    assert cfg.listen_address == ("0.0.0.0", 9000) and cfg.log_level == "DEBUG"


@pytest.mark.parametrize("values, fragment", [
    ({"node_id": 4, "peers": PEERS}, "node id 4 is not in peers [1, 2, 3]"),
    ({"node_id": 1, "peers": ""}, "no peers given"),
    ({"node_id": 1}, "missing peers (--peers)"),
    ({"node_id": 1, "peers": "1=localhost"}, "must look like HOST:PORT"),
    ({"node_id": 1, "peers": "1=h:70000"}, "port must be in"),
    ({"node_id": 1, "peers": "1=h:x"}, "non-numeric port"),
    ({"node_id": 1, "peers": "one=h:1"}, "peer id 'one' must be a positive integer"),
    ({"node_id": 1, "peers": "1=h:1,1=h:2"}, "listed twice"),
    ({"node_id": 1, "peers": "1h:1"}, "must look like ID=HOST:PORT"),
    ({"node_id": 0, "peers": PEERS}, "must be a positive integer"),
    ({"node_id": 1, "peers": PEERS, "tick_ms": 0}, "tick_ms must be a positive integer"),
    ({"node_id": 1, "peers": PEERS, "tickms": 5}, "unknown setting(s) tickms"),
    ({"node_id": 1, "peers": PEERS, "log_level": "loud"}, "log level 'loud' must be one of"),
    ({"node_id": 1, "peers": PEERS, "max_frame_bytes": 1000}, "below the 65536-byte minimum"),
    ({"node_id": 1, "peers": PEERS, "pre_vote": "yes"}, "pre_vote must be true or false"),
    ({"node_id": 1, "peers": PEERS, "listen": "nope"}, "listen address 'nope'"),
    ({"node_id": 1, "peers": PEERS, "scrub_rate": -1}, "scrub_rate must be a number >= 0"),
    ({"node_id": 1, "peers": PEERS, "scrub_slice_kib": 0}, "scrub_slice_kib must be a positive"),
])
def test_errors_name_the_setting(values: dict, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        NodeConfig.from_dict({"data_dir": "d", **values})
    assert fragment in str(info.value)


def test_toml_and_flag_overrides(tmp_path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f'node_id = 1\ndata_dir = "{tmp_path}"\ntick_ms = 20\n'
                    f'[peers]\n1 = "127.0.0.1:7101"\n2 = "127.0.0.1:7102"\n')
    cfg = NodeConfig.from_toml(path)
    assert cfg.tick_ms == 20 and cfg.peers == {1: "127.0.0.1:7101", 2: "127.0.0.1:7102"}
    parser = argparse.ArgumentParser()
    NodeConfig.add_arguments(parser)
    args = parser.parse_args(["--config", str(path), "--tick-ms", "30", "--node-id", "2"])
    cfg = NodeConfig.from_args(args)
    assert cfg.tick_ms == 30 and cfg.node_id == 2
    args = parser.parse_args(["--node-id", "1", "--data-dir", str(tmp_path), "--peers", PEERS,
                              "--max-frame-bytes", "1048576"])
    assert NodeConfig.from_args(args).max_frame_bytes == 1 << 20
    bad = tmp_path / "bad.toml"
    bad.write_text("node_id = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        NodeConfig.from_toml(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        NodeConfig.from_toml(tmp_path / "missing.toml")


def test_unwritable_data_dir(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cfg = NodeConfig.from_dict({"node_id": 1, "data_dir": str(blocker), "peers": PEERS})
    with pytest.raises(ConfigError, match="is not usable .*writable --data-dir"):
        cfg.check_data_dir()
    ok = NodeConfig.from_dict({"node_id": 1, "data_dir": str(tmp_path / "d"), "peers": PEERS})
    assert ok.check_data_dir() == tmp_path / "d" / "node-1"
    assert list((tmp_path / "d" / "node-1").iterdir()) == []


def test_address_helpers() -> None:
    assert parse_address("[::1]:80") == ("::1", 80)
    assert parse_peers({"1": "h:1", 2: "h:2"}) == {1: "h:1", 2: "h:2"}
