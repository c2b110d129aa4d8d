"""Cross-cluster links on real processes (issue 30): two 3-node clusters, a topic of 4
partitions on the source linked to the sink with `raftlog link create`; records produced on the
source while a sink mirror leader, then a source leader, are SIGKILLed, then while the link's
network is cut (the link reaches the source only through fault proxies,
tests/node/fault_proxy.py, named by an address map: `--source ADVERTISED=PROXY`); afterwards
every mirror partition holds exactly the source's batches (visible offsets, counts,
timestamps, payloads) up to the source's high watermark. A produce on the mirror is refused (MIRROR_READ_ONLY) until
`raftlog topic promote`, after which it is taken at the next offset; a subscription of the
source arrives on the mirror and, after the promote, resumes there with nothing skipped."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from raft.cli.localcluster import LocalCluster, free_ports, wait_for
from raft.cli.main import main as cli
from storage.records import encode_values
from tests.node.fault_proxy import FaultProxy
from tests.node.test_topics_processes import admin, call, produce

pytestmark = pytest.mark.slow
PARTITIONS = 4


def batches(address: str, topic: str, partition: int) -> tuple[int, list[tuple[Any, ...]]]:
    """Every committed batch one node serves (high watermark, [(base, count, ts, payload)])."""
    out: list[tuple[Any, ...]] = []
    offset, hw = 0, -1
    while True:
        reply = call(address, "fetch", offset=offset, topic=topic, partition=partition,
                     max_bytes=1 << 20)
        if not reply["ok"]:
            code = reply["error"]["code"]
            if code == "OFFSET_OUT_OF_RANGE" and offset == 0:
                offset = reply["error"]["start_offset"]
                continue
            raise AssertionError(reply)
        hw = reply["high_watermark"]
        out += [(b["base_offset"], b["count"], b["timestamp_ms"], bytes(b["payload"]))
                for b in reply["batches"]]
        if reply["next_offset"] > hw or not reply["batches"] and reply["next_offset"] == offset:
            return hw, out
        offset = reply["next_offset"]


def leader_address(cluster: LocalCluster, down: set[int], topic: str,
                   partition: int) -> str | None:
    for n, address in sorted(cluster.addresses.items()):
        if n in down:
            continue
        try:
            meta = call(address, "metadata", topics=[topic])
        except OSError:
            continue
        for t in meta.get("topics", []):
            p = t["partitions"][partition]
            if p["leader_address"]:
                return p["leader_address"]
    return None


def leader_id(cluster: LocalCluster, down: set[int], topic: str, partition: int) -> int | None:
    address = leader_address(cluster, down, topic, partition)
    return next((n for n, a in cluster.addresses.items() if a == address), None)


def knows(address: str, topic: str) -> bool:
    """Whether the node's metadata has the topic, every partition led."""
    try:
        meta = call(address, "metadata", topics=[topic])
    except OSError:
        return False
    return any(all(p["leader"] for p in t["partitions"]) for t in meta.get("topics", []))


def run_cli(*argv: str) -> tuple[int, str]:
    """Exit code and what it printed (stdout and stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = cli(list(argv))
    return code, out.getvalue()


def mirrored(source: LocalCluster, sink: LocalCluster, sink_down: set[int]) -> bool:
    """Every mirror partition's leader serves exactly the source's batches."""
    for p in range(PARTITIONS):
        src = leader_address(source, set(), "orders", p)
        dst = leader_address(sink, sink_down, "orders", p)
        if src is None or dst is None:
            return False
        try:
            (src_hw, want), (_, got) = batches(src, "orders", p), batches(dst, "orders", p)
        except OSError:
            return False
        if got != want or not want:
            return False
    return True


def behind(source: LocalCluster, sink: LocalCluster, p: int) -> bool:
    """The mirror partition lacks some of the source's batches (a moment's look)."""
    src, dst = leader_address(source, set(), "orders", p), leader_address(sink, set(), "orders", p)
    assert src is not None and dst is not None
    return batches(dst, "orders", p)[1] != batches(src, "orders", p)[1]


@dataclass
class Pair:
    source: LocalCluster
    sink: LocalCluster
    metrics: dict[int, int]  # sink node -> its /metrics port


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    """Two 3-node clusters shared by the tests of this module (each uses its own topics and
    link). The source's retention valve is 1 s (--retention-max-ms): a link's hold on a topic
    with a size limit gives way that soon, which the bootstrap test needs and which changes
    nothing for topics without a retention limit."""
    root = tmp_path_factory.mktemp("links")
    ports = dict(zip((1, 2, 3), free_ports(3)))
    with LocalCluster(root / "source", nodes=3,
                      extra_args=["--retention-max-ms", "1000"]) as source, \
            LocalCluster(root / "sink", nodes=3, node_args=lambda i: [
                "--metrics-listen", f"127.0.0.1:{ports[i]}"]) as sink:
        source.wait_leader(60)
        sink.wait_leader(60)
        yield Pair(source, sink, ports)


def test_a_link_mirrors_through_a_sink_leader_kill_then_promote(pair: Pair) -> None:
    source, sink = pair.source, pair.sink
    with contextlib.ExitStack() as proxies:
        # The link's network: one proxy per source node, which the source's advertised
        # addresses are mapped to, so every connection of the link goes through one.
        through = {a: proxies.enter_context(FaultProxy(a)) for a in source.addresses.values()}
        link_source = ",".join(f"{a}={p.address}" for a, p in through.items())
        created = admin(source, set(), "topic_create", name="orders", partitions=PARTITIONS,
                        replicas=3)
        assert created["ok"], created
        wait_for(lambda: all(knows(a, "orders") for a in source.addresses.values()),
                 "every source node to know the topic", 60)
        for p in range(PARTITIONS):
            for i in range(3):
                produce(source, set(), "orders", p, f"p{p}-a{i}".encode())
        code, text = run_cli("link", "create", "dr", "--source", link_source, "--topic",
                             "orders", "--servers", sink.servers, "--timeout", "60")
        assert code == 0, text
        assert "created link dr" in text
        wait_for(lambda: all(knows(a, "orders") for a in sink.addresses.values()),
                 "every sink node to know the mirror topic", 60)
        # Refused before anything is recorded: a name taken on the sink, a loop back.
        code, text = run_cli("link", "create", "again", "--source", source.servers, "--topic",
                             "orders", "--servers", sink.servers)
        assert code == 1 and "--prefix" in text, text
        code, text = run_cli("link", "create", "back", "--source", sink.servers, "--topic",
                             "orders", "--servers", source.servers)
        assert code == 1 and "itself a mirror" in text, text

        # Produce on the source while the sink's mirror leader of partition 0 is killed.
        down: set[int] = set()
        wait_for(lambda: leader_id(sink, down, "orders", 0) is not None,
                 "a sink leader for mirror partition 0", 60)
        victim = leader_id(sink, down, "orders", 0)
        assert victim is not None
        for p in range(PARTITIONS):
            produce(source, set(), "orders", p, f"p{p}-b0".encode())
        sink.kill(victim)
        down.add(victim)
        for p in range(PARTITIONS):
            for i in range(1, 4):
                produce(source, set(), "orders", p, f"p{p}-b{i}".encode())
        wait_for(lambda: mirrored(source, sink, down), "the mirrors to catch up with the "
                                                       "source while a sink node is down", 120)
        sink.start(victim)
        down.clear()
        for p in range(PARTITIONS):
            produce(source, set(), "orders", p, f"p{p}-c".encode())
        wait_for(lambda: mirrored(source, sink, down), "every mirror partition to equal its "
                                                       "source", 120)

        # A consumer's subscription on the source, part way into partition 1.
        src1 = leader_address(source, set(), "orders", 1)
        assert src1 is not None
        _, src_batches = batches(src1, "orders", 1)
        committed = src_batches[2][0]
        opened = call(src1, "sub_open", name="app", topic="orders", partition=1,
                      timeout_ms=5000, **{"from": committed})
        assert opened["ok"], opened

        # The source's leader of partition 2 fails: the pullers follow its new leader.
        src_victim = leader_id(source, set(), "orders", 2)
        assert src_victim is not None
        source.kill(src_victim)
        source_down = {src_victim}
        for p in range(PARTITIONS):
            produce(source, source_down, "orders", p, f"p{p}-d".encode())
        source.start(src_victim)
        wait_for(lambda: mirrored(source, sink, down), "the mirrors to follow the source's "
                                                       "new leader", 120)

        # The link's network is cut: records produced meanwhile do not reach the sink (so
        # nothing of the link went around the proxies); healed, the link catches up.
        assert all(p.connections for p in through.values()), "the link bypassed a proxy"
        for p in through.values():
            p.cut()
        for p in range(PARTITIONS):
            produce(source, set(), "orders", p, f"p{p}-e".encode())
        wait_for(lambda: sum(p.refused for p in through.values()) >= PARTITIONS,
                 "the link to retry while its network is cut", 60)
        assert all(behind(source, sink, p) for p in range(PARTITIONS))
        for p in through.values():
            p.heal()
        wait_for(lambda: mirrored(source, sink, down), "the mirrors to catch up once the "
                                                       "link's network is back", 120)

        code, text = run_cli("link", "describe", "dr", "--json", "--servers", sink.servers)
        assert code == 0, text
        assert '"bootstraps": 0' in text
        code, text = run_cli("topic", "describe", "orders", "--servers", sink.servers)
        assert code == 0 and "read-only while the link writes it" in text, text

        def sub_on_sink() -> int:
            dst = leader_address(sink, down, "orders", 1)
            got = call(dst, "sub_get", name="app", topic="orders", partition=1,
                       timeout_ms=5000) if dst else {"ok": False}
            return got["subscription"]["position"] if got["ok"] else -1

        wait_for(lambda: sub_on_sink() == committed, "the subscription to reach the mirror", 60)

        # A mirror refuses client writes until promoted; then offsets continue.
        dst = leader_address(sink, down, "orders", 1)
        assert dst is not None
        refused = call(dst, "produce", acks="quorum", timeout_ms=5000, topic="orders",
                       partition=1, payload=encode_values([b"local"]), count=1)
        assert not refused["ok"] and refused["error"]["code"] == "MIRROR_READ_ONLY", refused
        assert "raftlog topic promote orders" in refused["error"]["message"]
        _, source_batches = batches(leader_address(source, set(), "orders", 1) or "", "orders",
                                    1)
        last = source_batches[-1]
        code, text = run_cli("topic", "promote", "orders", "--servers", sink.servers)
        assert code == 0, text
        deadline = time.monotonic() + 60
        while True:
            dst = leader_address(sink, down, "orders", 1) or dst
            taken = call(dst, "produce", acks="quorum", timeout_ms=5000, topic="orders",
                         partition=1, payload=encode_values([b"local"]), count=1)
            if taken["ok"] or time.monotonic() > deadline:
                break
            assert taken["error"]["code"] in ("MIRROR_READ_ONLY", "NOT_LEADER", "TIMEOUT"), \
                taken
            time.sleep(0.1)  # the promote reaching the partition's leader: a retry's pause
        assert taken["ok"], taken
        assert taken["base_offset"] == last[0] + last[1], (taken, last)
        # The consumer moved to the sink resumes where it was: nothing skipped.
        assert sub_on_sink() == committed
        _, on_sink = batches(dst, "orders", 1)
        mirrored_part = [b for b in on_sink if committed <= b[0] <= last[0]]
        assert mirrored_part and mirrored_part == [b for b in source_batches
                                                   if b[0] >= committed]


def source_start_and_hw(source: LocalCluster, topic: str) -> tuple[int, int]:
    """The source partition 0's log start and high watermark (its leader's)."""
    address = leader_address(source, set(), topic, 0)
    assert address is not None
    reply = call(address, "fetch", offset=0, topic=topic, partition=0, max_bytes=1)
    if not reply["ok"]:
        assert reply["error"]["code"] == "OFFSET_OUT_OF_RANGE", reply
        return reply["error"]["start_offset"], reply["error"]["high_watermark"]
    return reply["start_offset"], reply["high_watermark"]


def gauge(port: int, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    m = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", text, re.M)
    return None if m is None else float(m.group(1))


def test_a_paused_link_past_the_sources_retention_bootstraps_and_reports_the_gap(
        pair: Pair) -> None:
    """A link paused while the source produces past its retention (the link's hold gives way
    at the source's 1 s valve): resumed, the mirror bootstraps at the source's log start, and
    `link describe` and /metrics report the gap; the data after it is the source's."""
    source, sink = pair.source, pair.sink
    created = admin(source, set(), "topic_create", name="small", partitions=1, replicas=3,
                    retention_bytes=2048)
    assert created["ok"], created
    wait_for(lambda: all(knows(a, "small") for a in source.addresses.values()),
             "every source node to know the topic", 60)
    last = [produce(source, set(), "small", 0, f"s-a{i}".encode()) for i in range(3)][-1]
    code, text = run_cli("link", "create", "boot", "--source", source.servers, "--topic",
                         "small", "--servers", sink.servers, "--timeout", "60")
    assert code == 0, text

    def row() -> dict[str, Any]:
        """The link's one partition as `link describe --json` shows it ({} while the node
        asked has not applied the link yet)."""
        code, text = run_cli("link", "describe", "boot", "--json", "--servers", sink.servers)
        if code != 0:
            assert "no link named" in text, text
            return {"mirrored_offset": None, "state": None, "bootstraps": None}
        [r] = json.loads(text)["partitions"]
        return r

    wait_for(lambda: row()["mirrored_offset"] == last, "the mirror to catch up", 60)
    mirrored_to = last
    code, text = run_cli("link", "pause", "boot", "--servers", sink.servers)
    assert code == 0, text
    wait_for(lambda: row()["state"] == "paused", "the link's puller to stop", 60)
    last = [produce(source, set(), "small", 0, (f"s-b{i}-" + "x" * 300).encode())
            for i in range(20)][-1]
    wait_for(lambda: source_start_and_hw(source, "small")[0] > mirrored_to + 1,
             "the source's retention to pass the paused link's position (its valve)", 60)
    code, text = run_cli("link", "resume", "boot", "--servers", sink.servers)
    assert code == 0, text
    wait_for(lambda: row()["bootstraps"] == 1 and row()["mirrored_offset"] == last,
             "the mirror to bootstrap and catch up", 60)
    r = row()
    [[gap_from, gap_to]] = r["gaps"]
    start, _ = source_start_and_hw(source, "small")
    # From the mirror's position to the source's log start then (it may have cut more since).
    assert gap_from == mirrored_to + 1 and gap_from <= gap_to < start, r
    assert r["offsets_lost"] == gap_to - gap_from + 1, r
    # What follows the gap is the source's, batch for batch.
    src = leader_address(source, set(), "small", 0)
    dst = leader_address(sink, set(), "small", 0)
    assert src is not None and dst is not None
    want = batches(src, "small", 0)[1]
    assert want and [b for b in batches(dst, "small", 0)[1] if b[0] >= want[0][0]] == want
    # The metric, on the node that pulls the partition (it leads it).
    puller = next(n for n, a in sink.addresses.items() if a == dst)
    labels = {"link": "boot", "topic": "small", "partition": "0"}
    wait_for(lambda: gauge(pair.metrics[puller], "raftlog_link_bootstraps", **labels) == 1,
             "the bootstrap in /metrics", 30)
    assert gauge(pair.metrics[puller], "raftlog_link_offsets_lost", **labels) == \
        r["offsets_lost"]
