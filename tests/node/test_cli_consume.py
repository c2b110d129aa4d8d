"""`raftlog consume` against a real cluster: negative offsets read the last N records (across
the offsets control entries take), an inverted range is a usage error, --since finds records by
batch timestamp (a duration or an ISO time), and text output is one unambiguous line per record.

The module's cluster starts with three batches stamped 3 h, 2 h and 30 min ago, so batch
timestamps grow with offsets through the whole log (later batches are stamped now)."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from cli_helpers import cli, local_cluster, raftlog
from raft.cli.localcluster import LocalCluster
from raft.client import BlockingClient

pytestmark = pytest.mark.slow
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with local_cluster(tmp_path_factory.mktemp("consume"), nodes=3) as c:
        now = int(time.time() * 1000)
        with BlockingClient(c.servers) as client:
            c.stamped = {}  # type: ignore[attr-defined]
            for name, age in (("3h", 3 * HOUR_MS), ("2h", 2 * HOUR_MS), ("30m", HOUR_MS // 2)):
                res = client.produce([f"{name}-a", f"{name}-b"], producer_id=0,
                                     timestamp_ms=now - age)
                c.stamped[name] = res.base_offset  # type: ignore[attr-defined]
        yield c


def consume(cluster: LocalCluster, *args: str, process: bool = False) -> list[tuple[int, str]]:
    """`raftlog consume ARGS` as a process, or (to spare a Python start-up per call) the same
    command in this process."""
    run = raftlog if process else cli
    res = run("consume", "--servers", cluster.servers, *args)
    assert res.returncode == 0, res.stderr
    return [(int(o), v) for o, v in (line.split("\t", 1) for line in res.stdout.splitlines())]


def test_since_a_duration_or_an_iso_time_starts_at_the_first_batch_stamped_after_it(
        cluster: LocalCluster) -> None:
    stamped = cluster.stamped  # type: ignore[attr-defined]
    got = consume(cluster, "--since", "1h", process=True)
    assert got[:2] == [(stamped["30m"], "30m-a"), (stamped["30m"] + 1, "30m-b")]
    got = consume(cluster, "--since", "150m", "--count", "3")
    assert [v for _, v in got] == ["2h-a", "2h-b", "30m-a"]
    iso = (dt.datetime.now() - dt.timedelta(hours=2, minutes=30)).isoformat(timespec="minutes")
    got = consume(cluster, "--since", iso, "--count", "1")
    assert got == [(stamped["2h"], "2h-a")]
    utc = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=4)
    got = consume(cluster, "--since", utc.isoformat(), "--count", "1")
    assert got == [(stamped["3h"], "3h-a")]
    # Nothing that recent: nothing printed, exit 0.
    future = (dt.datetime.now() + dt.timedelta(days=1)).isoformat()
    assert consume(cluster, "--since", future) == []
    res = cli("consume", "--servers", cluster.servers, "--since", "yesterday")
    assert res.returncode == 2 and "neither a duration" in res.stderr


def test_negative_from_reads_the_last_records_across_control_offsets(
        cluster: LocalCluster) -> None:
    with BlockingClient(cluster.servers) as c:
        c.produce_idempotent([f"tail-{i}".encode() for i in range(5)])
        # A leader change puts the new leader's no-op (a control entry) between records.
        c.transfer_leader()
        c.produce_idempotent([b"tail-5", b"tail-6"])
    got = consume(cluster, "--from", "-3", process=True)
    assert [v for _, v in got] == ["tail-4", "tail-5", "tail-6"]
    offsets = [o for o, _ in got]
    assert offsets[1] > offsets[0] + 1  # the new leader's no-op took an offset between them
    assert [v for _, v in consume(cluster, "--from", "-1")] == ["tail-6"]
    everything = consume(cluster, "--from", "start")
    assert consume(cluster, "--from", "-100000") == everything
    assert everything[0] == (1, "3h-a")  # offset 0 is the first leader's no-op
    assert consume(cluster, "--from", "end") == []


def test_inverted_or_bad_ranges_are_refused(cluster: LocalCluster) -> None:
    res = raftlog("consume", "--servers", cluster.servers, "--from", "5", "--to", "2")
    assert res.returncode == 2 and "--to 2 must be above --from 5" in res.stderr
    # The same checks in this process (they never reach the cluster).
    res = cli("consume", "--servers", cluster.servers, "--from", "5", "--to", "5")
    assert res.returncode == 2
    res = cli("consume", "--servers", cluster.servers, "--from", "five")
    assert res.returncode == 2 and "not an offset" in res.stderr
    res = cli("consume", "--servers", cluster.servers, "--from", "1", "--since", "1h")
    assert res.returncode == 2 and "not allowed with" in res.stderr


def test_text_output_is_one_unambiguous_line_per_record(cluster: LocalCluster) -> None:
    values = [b"two\nlines", b"b64:AAAA", b"\xff\xfe", b"back\\slash\ttab", "caf\u00e9".encode()]
    with BlockingClient(cluster.servers) as c:
        offsets = c.produce_idempotent(values)
    res = raftlog("consume", "--servers", cluster.servers, "--from", str(offsets[0]),
                  "--count", str(len(values)))
    assert res.stdout.splitlines() == [
        f"{offsets[0]}\ttwo\\nlines", f"{offsets[1]}\tb64:AAAA", f"{offsets[2]}\t\\xff\\xfe",
        f"{offsets[3]}\tback\\\\slash\\ttab", f"{offsets[4]}\tcaf\u00e9"]
    res = raftlog("consume", "--servers", cluster.servers, "--from", str(offsets[0]),
                  "--count", "3", "--json")
    got = [json.loads(x) for x in res.stdout.splitlines()]
    assert got[0]["value"] == "two\nlines" and got[1]["value"] == "b64:AAAA"
    assert got[2]["value_b64"] == "//4=" and "value" not in got[2]


def test_consume_help_explains_offsets() -> None:
    res = cli("consume", "--help")
    text = " ".join(res.stdout.split())
    assert "first record is at offset 1" in text and "gaps" in text
    assert "-N: the last N records" in text and "--since TIME" in text
