"""`raftlog produce` as a user runs it against a real cluster: it streams (a line is sent and
its offset printed before stdin closes; Ctrl-C keeps what was typed), reads bytes (binary
lines are values), answers a 20 MB line with TOO_LARGE in a short message, fails fast and once
when nothing is reachable, takes keys, headers and JSON input, Kafka's --acks words, and
prints errors as JSON with --json."""

from __future__ import annotations

import json
import re
import signal

import pytest

from cli_helpers import Running, cli, free_base_port, local_cluster, raftlog, wait_for
from raft.cli.localcluster import LocalCluster
from raft.client import BlockingClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("produce"), nodes=3) as c:
        yield c


def read_back(cluster: LocalCluster, offset: int, n: int = 1) -> list:
    """n committed records from `offset`. A fetch may answer before the serving node's high
    watermark covers them (a follower learns the commit index with the next heartbeat) or stop
    early, so long-poll and follow next_offset until they are there."""
    out: list = []
    with BlockingClient(cluster.servers) as c:
        pos = offset
        for _ in range(30):
            res = c.fetch(pos, max_wait=1.0)
            out += res.records
            if len(out) >= n:
                return out[:n]
            pos = max(pos, res.next_offset)
    raise AssertionError(f"only {len(out)} of {n} records from offset {offset} became readable")


def test_produce_sends_each_line_before_stdin_closes(cluster: LocalCluster) -> None:
    p = Running("produce", "--servers", cluster.servers, stdin=True)
    try:
        p.write(b"first\n")
        # Acknowledged and printed while stdin is still open (the old produce read to EOF).
        first = int(p.wait_line(r"^\d+$", stream="out").group(0))
        assert p.proc.poll() is None
        p.write(b"second\n")
        second = int(p.wait_line(r"^\d+$", stream="out", count=2).group(0))
        p.close_stdin()
        assert p.wait() == 0, p.err
    finally:
        p.stop()
    assert second > first
    assert [r.value for r in read_back(cluster, first)] == [b"first"]
    assert [r.value for r in read_back(cluster, second)] == [b"second"]


def test_ctrl_c_keeps_the_lines_already_typed(cluster: LocalCluster) -> None:
    p = Running("produce", "--servers", cluster.servers, "--json", stdin=True)
    try:
        p.write(b"typed-1\ntyped-2\n")
        p.wait_line(r'"typed-2"', stream="out")
        p.signal(signal.SIGINT)
        assert p.wait() == 130, p.err
    finally:
        p.stop()
    out = [json.loads(x) for x in p.out]
    assert [o["value"] for o in out] == ["typed-1", "typed-2"]
    assert [r.value for r in read_back(cluster, out[0]["offset"], 2)] == [b"typed-1", b"typed-2"]


def test_binary_lines_are_sent_as_bytes(cluster: LocalCluster) -> None:
    res = raftlog("produce", "--servers", cluster.servers, stdin=b"ok\n\xff\xfe\n")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    first, second = map(int, res.stdout.split())
    assert [r.value for r in read_back(cluster, first, 2)] == [b"ok", b"\xff\xfe"]
    res = raftlog("consume", "--servers", cluster.servers, "--from", str(first), "--count", "2")
    assert res.stdout == f"{first}\tok\n{second}\t\\xff\\xfe\n"


def test_a_20_mb_line_gets_too_large_in_a_short_message_and_the_rest_is_sent(
        cluster: LocalCluster) -> None:
    big = b"x" * (20 << 20)
    res = raftlog("produce", "--servers", cluster.servers, "--timeout", "3600",
                  stdin=b"before\n" + big + b"\nafter\n")
    assert res.returncode == 1
    assert "TOO_LARGE" in res.stderr and "line 2 (1 line, 20,971,520 bytes)" in res.stderr
    assert "max_frame_bytes" in res.stderr
    assert len(res.stderr) < 1000 and "xxxxxxxx" not in res.stderr  # never the payload
    before, after = map(int, res.stdout.split())
    assert read_back(cluster, before)[0].value == b"before"
    assert read_back(cluster, after)[0].value == b"after"


def test_an_unreachable_cluster_is_one_fast_summarised_error() -> None:
    base = free_base_port(3)
    servers = ",".join(f"127.0.0.1:{base + i}" for i in range(3))
    stdin = "".join(f"{i}\n" for i in range(1, 1001))
    # A long --timeout: returning at all (within the subprocess deadline) shows that refused
    # connections are not waited out.
    res = raftlog("produce", "--servers", servers, "--timeout", "3600", stdin=stdin)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    # One line for the lines read before it gave up, the hint, and where it stopped reading
    # (not one line per input line).
    assert len(lines) == 3, lines
    m = re.search(r"UNAVAILABLE: lines 1-(\d+) \(\1 lines, [\d,]+ bytes\) not acknowledged",
                  lines[0])
    assert m, lines[0]
    assert all(f"127.0.0.1:{base + i}" in lines[0] for i in range(3))
    assert "raftlog up" in lines[1] and "RAFTLOG_SERVERS" in lines[1]
    assert lines[2].endswith(f"stopped reading the input after line {m.group(1)}: no node is "
                             f"reachable")
    for args in (["status"], ["transfer-leader"], ["consume"]):  # the same, in this process
        res = cli(*args, "--servers", servers, "--timeout", "3600")
        assert res.returncode == 1, (args, res)
        assert "UNAVAILABLE" in res.stderr and "raftlog up" in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) <= 2, res.stderr


def test_keys_headers_and_json_input_round_trip_through_consume(cluster: LocalCluster) -> None:
    res = raftlog("produce", "--servers", cluster.servers, "--key", "k1", "--header", "h=v",
                  "--header", "h=w", "--acks", "all", stdin="plain\n")
    assert res.returncode == 0, res.stderr
    (rec,) = read_back(cluster, int(res.stdout))
    assert (rec.value, rec.key, rec.headers) == (b"plain", b"k1", (("h", b"v"), ("h", b"w")))

    lines = [json.dumps({"value": "j1", "key": "kj", "headers": {"a": "1"}}),
             json.dumps({"value_b64": "//4=", "headers": [{"key": "b", "value_b64": "/w=="}]}),
             "not json",
             json.dumps({"value": "j3", "colour": "red"})]
    res = raftlog("produce", "--servers", cluster.servers, "--input", "json", "--json",
                  "--acks", "1", stdin="\n".join(lines) + "\n")
    assert res.returncode == 1  # two bad lines
    out = [json.loads(x) for x in res.stdout.splitlines()]
    assert [o.get("line") for o in out] == [None, None, 3, 4]
    assert out[2]["error"]["code"] == "BAD_INPUT" and "not JSON" in out[2]["error"]["message"]
    assert "colour" in out[3]["error"]["message"]
    assert json.loads(res.stderr.splitlines()[0])["error"]["code"] == "BAD_INPUT"
    first = out[0]["offset"]
    # (acks 1 answers before the commit, and consume without --follow stops at the high
    # watermark: --follow waits until both are committed, ci33 read none once)
    res = cli("consume", "--servers", cluster.servers, "--from", str(first), "--count", "2",
              "--follow", "--json")
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert got[0]["value"] == "j1" and got[0]["key"] == "kj"
    assert got[0]["headers"] == [{"key": "a", "value": "1"}]
    assert got[1]["value_b64"] == "//4=" and got[1]["headers"] == [{"key": "b",
                                                                   "value_b64": "/w=="}]
    # What consume --json prints, produce --input json takes back.
    again = raftlog("produce", "--servers", cluster.servers, "--input", "json", "--acks", "0",
                    stdin=res.stdout)
    assert again.returncode == 0, again.stderr
    copies = [read_back(cluster, int(o))[0] for o in again.stdout.split()]
    assert [(r.value, r.key, r.headers) for r in copies] == [
        (b"j1", b"kj", (("a", b"1"),)), (b"\xff\xfe", None, (("b", b"\xff"),))]


def test_json_mode_errors_are_json_with_the_code(cluster: LocalCluster) -> None:
    res = raftlog("consume", "--servers", cluster.servers, "--from", "999999999", "--json")
    assert res.returncode == 1
    err = json.loads(res.stderr)["error"]
    assert err["code"] == "OFFSET_OUT_OF_RANGE" and "readable range" in err["message"]
    res = cli("consume", "--servers", cluster.servers, "--from", "5", "--to", "2", "--json")
    assert res.returncode == 2
    assert json.loads(res.stderr)["error"]["code"] == "CONFIG"
    res = cli("produce", "--acks", "most", "--json")
    assert res.returncode == 2
    assert json.loads(res.stderr)["error"]["code"] == "USAGE"


def test_a_second_ctrl_c_does_not_wait(cluster: LocalCluster) -> None:
    """Ctrl-C twice: produce stops without waiting for answers (exit 130)."""
    p = Running("produce", "--servers", cluster.servers, stdin=True)
    try:
        p.write(b"one\n")
        p.wait_line(r"^\d+$", stream="out")
        p.signal(signal.SIGINT)
        p.signal(signal.SIGINT)
        # 130 from produce itself; or, when the first Ctrl-C already let it finish (nothing was
        # pending) and the second lands while the interpreter exits, Python's own death by
        # SIGINT. Either way it stopped at once.
        assert p.wait() in (130, -signal.SIGINT)
    finally:
        p.stop()
    wait_for(lambda: p.proc.poll() is not None, "produce to exit")
