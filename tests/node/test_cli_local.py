"""The `raftlog` command without a cluster: --version, shell completion, `config show` with
sources, closest-key suggestions, help texts that agree with behaviour (README's commands parse,
docs/PROTOCOL.md lists every request type), and the pieces the CLI is built from (value
escaping, time and offset parsing, the line reader, JSON input, status layout, `up`'s
ownership checks, the demo's failover timer)."""

from __future__ import annotations

import fcntl
import io
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import trio

from cli_helpers import REPO, Running, cli, free_base_port
from raft.cli.args import since, start_offset
from raft.cli.demo import FailoverTimer
from raft.cli.localcluster import LocalCluster
from raft.cli.main import UsageError, build_parser
from raft.cli.output import escape_value
from raft.cli.produce_input import RecordMaker, read_lines
from raft.cli.status import render_status
from raft.cli.up import check_free
from raft.node import api
from raft.node.config import ConfigError
from raft.node.load_service import OPS
from storage.lmdb_log import LOCK_FILE

# One node process (`serve` left alone runs one shard per usable core: docs/SHARDS.md).
SERVE = ("serve", "--shards", "1")


# Commands that touch no cluster run in this process (cli_helpers.cli); `serve` runs as a
# process where it starts a node.


def test_version_is_the_package_version() -> None:
    res = cli("--version")
    assert res.returncode == 0
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert res.stdout.startswith(f"raftlog {version} (wire protocol v1")


def complete(script: str, words: list[str]) -> list[str]:
    """What the bash completion offers for `words` (the last one being typed)."""
    line = " ".join(shlex.quote(w) for w in words)
    prog = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _raftlog; "
            f'printf "%s\\n" "${{COMPREPLY[@]}}"')
    res = subprocess.run(["bash", "--norc", "-c", prog], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return [w for w in res.stdout.splitlines() if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_knows_commands_flags_and_choices() -> None:
    res = cli("completion", "bash")
    assert res.returncode == 0
    script = res.stdout
    assert complete(script, ["raftlog", "pro"]) == ["produce", "profile"]
    assert complete(script, ["raftlog", "prod"]) == ["produce"]
    assert complete(script, ["raftlog", "profile", "u"]) == ["use"]
    assert "--acks" in complete(script, ["raftlog", "produce", "--ac"])
    assert complete(script, ["raftlog", "produce", "--acks", ""]) == [
        "quorum", "leader", "none", "all", "1", "0"]
    assert complete(script, ["raftlog", "produce", "--input", "j"]) == ["json"]
    assert complete(script, ["raftlog", "config", "s"]) == ["show"]
    assert "--tick-ms" in complete(script, ["raftlog", "config", "show", "--tick"])
    assert complete(script, ["raftlog", "completion", "z"]) == ["zsh"]
    # A flag's value is not taken for a command: `--key status` stays in produce.
    assert "--acks" in complete(script, ["raftlog", "produce", "--key", "status", "--a"])
    zsh = cli("completion", "zsh").stdout
    assert zsh.startswith("#compdef raftlog") and "bashcompinit" in zsh
    if shutil.which("zsh"):
        check = subprocess.run(["zsh", "-n"], input=zsh, text=True, capture_output=True)
        assert check.returncode == 0, check.stderr


def test_config_show_prints_every_setting_with_its_source(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text('node_id = 1\ndata_dir = "d"\npeers = "1=127.0.0.1:7101"\n'
                    'tick_ms = 20\n[raft]\nproducer_window = 16\n')
    res = cli("config", "show", "--config", str(toml), "--election-ticks", "12", "--json",
                  extra_env={"RAFTLOG_SERVERS": "127.0.0.1:9"})
    assert res.returncode == 0, res.stderr
    out = __import__("json").loads(res.stdout)
    rows = {r["setting"]: (r["value"], r["source"]) for r in out["settings"]}
    assert rows["tick_ms"] == (20, f"file {toml}")
    assert rows["election_ticks"] == (12, "flag --election-ticks")
    assert rows["heartbeat_ticks"] == (1, "default (core)")
    assert rows["max_frame_bytes"] == (16 << 20, "default")
    assert rows["raft.producer_window"] == (16, f"file {toml}")
    assert rows["servers (client)"] == ("127.0.0.1:9", "env RAFTLOG_SERVERS")
    assert out["valid_for_serve"] is True
    text = cli("config", "show").stdout
    assert re.search(r"^node_id\s+-\s+not set \(required: --node-id\)$", text, re.M)
    assert re.search(r"^tick_ms\s+50\s+default$", text, re.M)
    assert re.search(r"^servers \(client\)\s+127\.0\.0\.1:7101,\S+\s+default$", text, re.M)


def test_a_mistyped_setting_is_refused_with_the_closest_key(tmp_path: Path) -> None:
    toml = tmp_path / "node.toml"
    toml.write_text('node_id = 1\ndata_dir = "d"\npeers = "1=127.0.0.1:7101"\ntick_msx = 20\n')
    for cmd in (["config", "show"], ["serve"]):
        res = cli(*cmd, "--config", str(toml))
        assert res.returncode == 2, res
        assert "tick_msx (did you mean tick_ms?)" in res.stderr
    res = cli(*SERVE, "--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                  "1=127.0.0.1:7101", "--raft", "producer_windw=4")
    assert res.returncode == 2
    assert "producer_windw (did you mean producer_window?)" in res.stderr
    res = cli("prodce")
    assert res.returncode == 2 and "did you mean 'produce'?" in res.stderr
    res = cli("produce", "--acsk", "1")
    assert res.returncode == 2 and "did you mean --acks?" in res.stderr


def test_help_says_what_each_flag_does_and_its_default() -> None:
    serve_help = " ".join(cli("serve", "--help").stdout.split())
    assert "core default" not in serve_help
    for flag, default in (("--election-ticks", "10"), ("--max-inflight", "4"),
                          ("--pre-vote", "true"), ("--tick-ms", "50"),
                          ("--shutdown-transfer-ms", "1000")):
        # The flag, its metavar, then its help up to the next flag, ending in the default.
        assert re.search(rf"{flag} \S+ (?:(?!--\w).)*?\(default {default}\)", serve_help), flag
    up_help = " ".join(cli("up", "--help").stdout.split())
    assert "(default ./data)" in up_help and "--restart" in up_help
    # -v is accepted after the subcommand too.
    args = build_parser().parse_args(["produce", "-v", "--json"])
    assert args.sub_verbose == 1


def test_every_request_type_is_in_the_protocol_doc() -> None:
    doc = (REPO / "docs" / "PROTOCOL.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", doc, re.M))
    assert set(api.REQUESTS) | set(OPS) <= rows
    assert "not supported" not in doc


def readme_commands() -> list[list[str]]:
    text = (REPO / "README.md").read_text()
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            for part in line.split("#")[0].split("|"):
                words = shlex.split(part.replace("<(", "( "))
                if words[:1] == ["raftlog"]:
                    cut = next((i for i, w in enumerate(words) if w in ("<", ">", "&", ")")),
                               len(words))
                    out.append(words[1:cut])
    return out


def test_every_raftlog_command_in_the_readme_parses() -> None:
    parser = build_parser()
    known = set(next(a for a in parser._actions if a.dest == "command").choices)
    commands = readme_commands()
    assert len(commands) >= 10
    for words in commands:
        if words[0] not in known:
            continue  # a plugin (bench, load) whose extra is not installed here
        try:
            parser.parse_args(words)
        except UsageError as e:
            raise AssertionError(f"README: raftlog {shlex.join(words)}: {e}") from None


@pytest.mark.parametrize("value, shown", [
    (b"plain text", "plain text"),
    ("café ✓".encode(), "café ✓"),
    (b"two\nlines", "two\\nlines"),
    (b"tab\there\r", "tab\\there\\r"),
    (b"back\\slash", "back\\\\slash"),
    (b"\xff\xfe", "\\xff\\xfe"),
    (b"b64:AAAA", "b64:AAAA"),
    (b"\x00\x1b[31m", "\\x00\\x1b[31m"),
    ("line\u2028sep".encode(), "line\\u2028sep"),
])
def test_text_values_are_escaped_unambiguously(value: bytes, shown: str) -> None:
    assert escape_value(value) == shown


def test_since_and_from_parse_what_users_write() -> None:
    now = 1_800_000_000_000
    assert since("10m", now) == now - 600_000
    assert since("1h30m", now) == now - 5_400_000
    assert since("90s", now) == now - 90_000
    assert since("2d", now) == now - 2 * 86_400_000
    assert since("2026-11-23T10:00:00+00:00") == 1_795_428_000_000
    assert start_offset("-3") == -3 and start_offset("start") == "start"
    assert start_offset("END") == "end" and start_offset("7") == 7


def test_read_lines_yields_each_line_as_it_arrives_and_bounds_long_ones() -> None:
    async def main() -> None:
        r, w = os.pipe()
        got = []

        async def reader() -> None:
            async for lines in read_lines(r, max_line=10):
                got.extend((line.number, line.data, line.size) for line in lines)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            os.write(w, b"one\n")
            with trio.fail_after(30):
                while not got:  # delivered before the writer closes
                    await trio.sleep(0.01)
            os.write(w, b"x" * 25 + b"\n\xff\r\nlast")
            os.close(w)
        os.close(r)
        assert got == [(1, b"one", 3), (2, None, 25), (3, b"\xff\r", 2), (4, b"last", 4)]

    trio.run(main)


def test_json_input_records_and_their_errors() -> None:
    maker = RecordMaker("json", key=b"dflt", headers=[("h", b"1")])
    rec = maker.make(b'{"value": "v", "headers": {"a": "b"}}')
    assert (rec.value, rec.key, rec.headers) == (b"v", b"dflt", (("h", b"1"), ("a", b"b")))
    rec = maker.make(b'{"value_b64": "AP8=", "key": "k", "offset": 3, "timestamp_ms": 1}')
    assert (rec.value, rec.key) == (b"\x00\xff", b"k")
    for bad, why in ((b"[1]", "JSON object"), (b'{"key": "k"}', "no \"value\""),
                     (b'{"value": 1}', "must be a string"), (b'{"value_b64": "%%"}', "base64"),
                     (b'{"value": "v", "x": 1}', "unknown field"), (b"{", "not JSON")):
        with pytest.raises(ValueError, match=why):
            maker.make(bad)


@pytest.mark.parametrize("width", [80, 100])
def test_status_is_never_cut_off_at_narrow_widths(width: int) -> None:
    from rich.console import Console

    big = 123_456_789_012
    statuses = {f"10.200.300.{i}:7101": {
        "node_id": i, "role": "pre-candidate" if i == 3 else "leader" if i == 1 else "follower",
        "term": 12345, "leader_id": 1, "dirty_offset": big, "flushed_offset": big,
        "commit_index": big, "high_watermark": big, "peers": {}, "followers": [
            {"node_id": 2, "match_index": big, "next_index": big + 1, "dirty_offset": big,
             "flushed_offset": big, "inflight": 4, "inflight_bytes": 8 << 20,
             "recovering": True, "bytes_behind": big, "catchup_bytes_per_s": 1.5e8,
             "learner": False, "last_heard_ticks": 3}] if i == 1 else []}
        for i in (1, 2, 3)}
    statuses["10.200.300.4:7101"] = {"error": "UNAVAILABLE: connection refused",
                                     "code": "UNAVAILABLE"}
    out = io.StringIO()
    render_status(statuses, Console(file=out, width=width, force_terminal=False))
    text = out.getvalue()
    assert "…" not in text
    for addr in statuses:
        assert addr in text
    for role in ("leader", "follower", "pre-candidate"):
        assert role in text
    assert "10.200.300.4:7101 did not answer: UNAVAILABLE" in text.replace("\n", " ")


def test_status_shows_what_holds_retention_back_the_scrubber_and_subscriptions() -> None:
    from rich.console import Console

    statuses = {"127.0.0.1:7101": {
        "node_id": 1, "role": "leader", "term": 3, "leader_id": 1, "dirty_offset": 900,
        "flushed_offset": 900, "commit_index": 900, "high_watermark": 900, "peers": {},
        "start_offset": 400, "retained_bytes": 123_456,
        "retention": {"active": True, "held_by": "subscription 'etl'", "deleted_bytes": 9_000},
        "scrub": {"passes": 7, "found": 1}, "subscriptions": {"subscriptions": 2, "applied": 900}},
        "127.0.0.1:7102": {
        "node_id": 2, "role": "follower", "term": 3, "leader_id": 1, "dirty_offset": 900,
        "flushed_offset": 900, "commit_index": 900, "high_watermark": 900, "peers": {},
        "retention": {"active": False}}}
    out = io.StringIO()
    render_status(statuses, Console(file=out, width=200, force_terminal=False))
    text = out.getvalue()
    assert "subscription 'etl'" in text and "123,456 B" in text and "9,000 B" in text
    assert "retention off" in text and "2 (applied to 900)" in text


def test_up_refuses_a_data_dir_a_running_node_owns(tmp_path: Path) -> None:
    node_dir = tmp_path / "node-2"
    node_dir.mkdir()
    fd = os.open(node_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    os.write(fd, b"4242\n")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a live node holds it
    try:
        with pytest.raises(ConfigError, match=r"node 2's data .* in use by a running node "
                                              r"\(pid 4242\)"):
            check_free(LocalCluster(tmp_path, nodes=3))
    finally:
        os.close(fd)
    check_free(LocalCluster(tmp_path, nodes=3))  # free once the owner is gone


def test_failover_counts_only_writes_sent_after_the_kill() -> None:
    timer = FailoverTimer()
    timer.write_acked(sent_at=1.0, acked_at=1.1)  # before the kill: ignored
    timer.killed(2.0)
    timer.write_acked(sent_at=1.9, acked_at=2.05)  # sent before, acked by the dying leader
    assert timer.seconds is None
    timer.write_acked(sent_at=2.3, acked_at=2.8)
    timer.write_acked(sent_at=2.9, acked_at=3.0)  # later ones do not move the figure
    assert timer.seconds == pytest.approx(0.8)
    assert timer.wait(timeout=0)


def test_serve_says_where_it_listens_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_base_port(1)
    node = Running(*SERVE, "--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                   f"1=127.0.0.1:{port}")
    try:
        line = node.wait_line(r"listening on").string
        assert f"node 1 listening on 127.0.0.1:{port}; data in {tmp_path / 'node-1'}" in line
        assert "SIGTERM or Ctrl-C stops it cleanly" in line
    finally:
        assert node.stop() == 0


def test_load_finds_the_cluster_like_every_other_command(monkeypatch) -> None:
    from raft.cli.client_settings import resolve_client
    from raft.cli.main import build_parser

    monkeypatch.setenv("RAFTLOG_SERVERS", "127.0.0.1:7201,127.0.0.1:7202")
    args = build_parser().parse_args(["load", "--input", "rows.csv", "--format", "csv"])
    resolve_client(args)
    assert args.servers == "127.0.0.1:7201,127.0.0.1:7202"
    assert args.servers_source == "env RAFTLOG_SERVERS"


def test_status_names_the_voters_a_damaged_leader_waits_for() -> None:
    """docs/DISK-LOSS.md: a leader whose copy of a committed batch is damaged, and that knows no
    voter holding it, waits for the voters that have not answered; status names them."""
    from rich.console import Console

    statuses = {"127.0.0.1:7103": {
        "node_id": 3, "role": "leader", "term": 4, "leader_id": 3, "dirty_offset": 77,
        "flushed_offset": 77, "commit_index": 62, "high_watermark": 62, "peers": {},
        "damaged": [[46, 46]], "damage_waiting_for": [2]}}
    out = io.StringIO()
    render_status(statuses, Console(file=out, width=200, force_terminal=False))
    text = out.getvalue()
    assert "damaged: 46..46" in text and "waiting for voters 2" in text
