"""Record formats at the command line (issue 29, item 6): `produce --key-separator` gives each
line its own key (a line without the separator fails alone, reported like any failed line), and
`consume --format TEMPLATE` shows keys, values, offsets, partition, timestamps and headers in
the layout asked for, escaped like the default output."""

from __future__ import annotations

import json

import pytest

from cli_helpers import cli, local_cluster, raftlog
from raft.cli.localcluster import LocalCluster
from raft.client import BlockingClient
from storage.records import Record

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("formats"), nodes=1) as c:
        yield c


def test_key_separator_keys_each_line_and_a_line_without_it_fails_alone(
        cluster: LocalCluster) -> None:
    res = raftlog("produce", "--servers", cluster.servers, "--key-separator", ":",
                  stdin="user-1:hello\nno separator here\nuser-2:a:b\n:keyless\n")
    assert res.returncode == 1, res  # one line failed
    offsets = [int(x) for x in res.stdout.split()]
    assert len(offsets) == 3
    assert res.stderr.startswith("raftlog produce: BAD_INPUT: line 2 (1 line, 17 bytes) not "
                                 "acknowledged: no key separator ':' in the line"), res.stderr
    assert "no separator here" not in res.stderr  # never the data
    got = [json.loads(x) for x in raftlog(
        "consume", "--servers", cluster.servers, "--from", str(offsets[0]), "--json"
    ).stdout.splitlines()]
    assert [(r.get("key"), r["value"]) for r in got] == [
        ("user-1", "hello"), ("user-2", "a:b"), ("", "keyless")]
    # A tab, written as \t.
    res = raftlog("produce", "--servers", cluster.servers, "--key-separator", "\\t",
                  stdin="k\tv\n")
    assert res.returncode == 0, res.stderr
    got = json.loads(raftlog("consume", "--servers", cluster.servers, "--from", res.stdout.strip(),
                             "--json").stdout)
    assert (got["key"], got["value"]) == ("k", "v")


@pytest.mark.parametrize("args, message", [
    (["--key", "k", "--key-separator", ":"], "give --key (one key for every record) or "
                                             "--key-separator"),
    (["--input", "json", "--key-separator", ":"], "--key-separator splits plain lines"),
    (["--key-separator", ""], "--key-separator must not be empty"),
])
def test_key_separator_conflicts_are_usage_errors(args: list[str], message: str) -> None:
    res = cli("produce", "--servers", "127.0.0.1:1", *args)
    assert res.returncode == 2, res
    assert message in res.stderr


def test_format_template_shows_every_field_escaped(cluster: LocalCluster) -> None:
    with BlockingClient(cluster.servers) as c:
        headers = (("src", b"a,b"), ("n", b"1"))
        res = c.produce([Record(b"line\none", b"k=1", headers),
                         Record(b"\xff", b"k=1", headers)],
                        producer_id=0, timestamp_ms=1_700_000_000_123)
    first = res.base_offset
    got = raftlog("consume", "--servers", cluster.servers, "--from", str(first), "--format",
                  "{offset}|{partition}|{key}|{value}|{timestamp}|{time}|{headers}").stdout
    assert got.splitlines() == [
        f"{first}|0|k=1|line\\none|1700000000123|2023-11-14T22:13:20.123Z|src=a\\x2cb,n=1",
        f"{first + 1}|0|k=1|\\xff|1700000000123|2023-11-14T22:13:20.123Z|src=a\\x2cb,n=1"]
    got = raftlog("consume", "--servers", cluster.servers, "--from", str(first), "--count", "1",
                  "--format", "{{{offset:>6}}}\\t{value}").stdout
    assert got == f"{{{first:>6}}}\tline\\none\n"
    # A record without a key prints nothing for {key}.
    with BlockingClient(cluster.servers) as c:
        off = c.produce([b"v"], producer_id=0).base_offset
    got = raftlog("consume", "--servers", cluster.servers, "--from", str(off), "--format",
                  "[{key}] {value}").stdout
    assert got == "[] v\n"


@pytest.mark.parametrize("args, message", [
    (["--format", "{offset} {valu}"], "unknown placeholder {valu}; use {key}, {value}"),
    (["--format", "{value}", "--json"], "give one of them"),
    (["--format", "{value"], "write {{ and }} for literal braces"),
])
def test_format_mistakes_are_usage_errors(args: list[str], message: str) -> None:
    res = cli("consume", "--servers", "127.0.0.1:1", *args)
    assert res.returncode == 2, res
    assert message in res.stderr
