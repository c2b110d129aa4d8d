"""Subscriptions on in-process nodes (raft/node/subscription_service.py, api/subscriptions.py):
the wire requests and their typed errors, many commits sharing entries, positions kept across a
leader crash and rebuilt by a restart, expiry, the retention hook; and the client's Consumer
(raft/client/consumer.py): resume, commit semantics, the exclusive lease."""

from __future__ import annotations


import pytest
import trio

from inproc_cluster import DEADLINE_S, RawClient, running_cluster, trio_test, values_payload
from raft.core.snapshot import section_raw
from raft.client import (BlockingClient, Client, Consumer, InvalidSubscriptionName,
                         PositionBehind, PositionPastHighWatermark, SubscriptionLeased,
                         SubscriptionPositionRemoved, UnknownSubscription)


async def _produce(client: RawClient, n: int, tag: str = "v") -> tuple[int, int]:
    r = await client.request("produce", payload=values_payload(
        [f"{tag}{i}".encode() for i in range(n)]), count=n)
    assert r["ok"], r
    return r["base_offset"], r["last_offset"]


async def _until(cond, what: str) -> None:  # noqa: ANN001
    with trio.fail_after(DEADLINE_S):
        while not cond():
            await trio.sleep(0.02)


@trio_test
async def test_requests_and_typed_errors_on_the_wire() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        base, last = await _produce(cl, 10)
        opened = await cl.request("sub_open", name="s", consumer="c1", lease_ms=60_000)
        assert opened["ok"] and opened["subscription"]["position"] == 0
        at_end = await cl.request("sub_open", name="tail", **{"from": "end"})
        assert at_end["subscription"]["position"] > last  # after everything committed
        ok = await cl.request("sub_commit", name="s", consumer="c1", position=base + 5)
        assert ok["subscription"]["position"] == base + 5

        def code(reply: dict) -> str:
            assert not reply["ok"], reply
            return reply["error"]["code"]

        leased = await cl.request("sub_commit", name="s", consumer="c2", position=base + 6)
        assert code(leased) == "SUBSCRIPTION_LEASED"
        assert leased["error"]["lease_holder"] == "c1" and leased["error"]["position"] == base + 5
        behind = await cl.request("sub_commit", name="s", consumer="c1", position=base + 1)
        assert code(behind) == "POSITION_BEHIND" and "reset" in behind["error"]["message"]
        past = await cl.request("sub_commit", name="s", consumer="c1", position=last + 50)
        assert code(past) == "POSITION_PAST_HIGH_WATERMARK"
        assert past["error"]["high_watermark"] >= last
        for name in ("", "x" * 129, "no spaces", "ü"):
            assert code(await cl.request("sub_open", name=name)) == "INVALID_SUBSCRIPTION_NAME"
        for t, extra in (("sub_commit", {"position": 0}), ("sub_get", {}),
                         ("sub_delete", {}), ("sub_release", {"consumer": "c1"})):
            assert code(await cl.request(t, name="missing", **extra)) == "UNKNOWN_SUBSCRIPTION"
        assert code(await cl.request("sub_reset", name="s", to=last + 99)) == \
            "POSITION_PAST_HIGH_WATERMARK"
        # The reply keeps the connection usable; the leader's view with lag:
        got = await cl.request("sub_get", name="s")
        assert got["subscription"]["lag_records"] == 5 and got["subscription"]["lease_holder"]
        follower = next(n for n in c.live if n is not leader)
        fc = await RawClient.connect(follower.address)
        nl = await fc.request("sub_commit", name="s", consumer="c1", position=base + 6)
        assert code(nl) == "NOT_LEADER" and nl["error"]["leader_addr"] == leader.address
        # A field of the wrong type is a malformed frame: error frame, then hang-up.
        await fc.send({"t": "sub_commit", "id": 99, "name": "s", "position": "7"})
        err = await fc.closed_after_error()
        assert err is not None and "position" in err["message"]
        await cl.aclose()


@trio_test
async def test_many_consumers_commits_share_entries() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        await _produce(cl, 50)
        n = 200
        for i in range(n):
            await cl.send({"t": "sub_open", "id": 10_000 + i, "name": f"c{i}", "consumer": "x"})
        for _ in range(n):
            r = await cl.recv()
            assert r is not None and r["ok"], r
        svc = leader.group.subs
        before = svc.entries_committed
        for i in range(n):  # pipelined on one connection: all in flight together
            await cl.send({"t": "sub_commit", "id": i + 1, "name": f"c{i}", "consumer": "x",
                           "position": 1 + i % 50})
        replies = [await cl.recv() for _ in range(n)]
        assert all(r is not None and r["ok"] for r in replies)
        entries = svc.entries_committed - before
        assert 1 <= entries <= n // 2, f"{n} commits took {entries} log entries"
        assert svc.batcher.pending == 0 and svc.batcher.inflight == 0
        await cl.aclose()


@trio_test
async def test_positions_survive_a_leader_crash_and_a_restart_rebuilds_the_table() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        base, _ = await _produce(cl, 20)
        await cl.request("sub_open", name="s", consumer="a")
        r = await cl.request("sub_commit", name="s", consumer="a", position=base + 12)
        assert r["ok"]
        await cl.aclose()
        old = leader.node_id
        await c.stop(old, crash=True)  # acknowledged at quorum: survives losing the leader
        new = await c.wait_leader(exclude=old)
        nc = await RawClient.connect(new.address)
        got = await nc.request("sub_get", name="s")
        assert got["subscription"]["position"] == base + 12, got
        assert (await nc.request("sub_commit", name="s", consumer="b",
                                 position=base + 15))["ok"]
        restarted = await c.restart(old)
        await c.wait_hw(new.core.commit_index, [restarted])

        def rebuilt() -> bool:
            sub = restarted.group.subs.table.get("s")  # applied by its maintenance task
            return sub is not None and sub.position == base + 15

        await _until(rebuilt, "the restarted node's table, rebuilt from its log")
        await nc.aclose()


@trio_test
async def test_unused_subscriptions_expire_but_leased_ones_stay() -> None:
    async with running_cluster(1, subscription_expiry_ms=1000) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        await _produce(cl, 3)
        await cl.request("sub_open", name="idle")
        await cl.request("sub_open", name="held", consumer="k", lease_ms=600_000)
        table = leader.group.subs.table
        await _until(lambda: table.get("idle") is None, "the idle subscription to expire")
        assert table.get("held") is not None
        await cl.aclose()


@trio_test
async def test_retention_holds_follow_the_setting() -> None:
    async with running_cluster(1) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        base, _ = await _produce(cl, 10)
        await cl.request("sub_open", name="slow", **{"from": base + 2})
        await cl.request("sub_open", name="fast", **{"from": "end"})
        svc = leader.group.subs
        assert svc.retention_holds() == []  # off by default
        svc.respect_retention = True
        holds = svc.retention_holds()
        assert holds[0][0] == "subscriptions table (not applied yet)" and not holds[0][2]
        assert holds[1] == ("subscription 'slow'", base + 2, True)
        assert svc.status()["lowest"] == {"name": "slow", "position": base + 2}
        await cl.aclose()


@trio_test
async def test_retention_keeps_what_the_lowest_subscription_still_needs() -> None:
    """With --retention-respect-subscriptions, the retention task (issue 15) deletes up to the
    lowest subscription position and no further, names that subscription as what holds it
    back, and moves on once the subscription commits; the table itself travels in the state
    at the new log start."""
    async with running_cluster(1, retention_bytes=1, retention_respect_subscriptions=True) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        await cl.request("sub_open", name="slow", **{"from": "end"})  # holds from here on
        bases = [(await _produce(cl, 2, tag=f"b{k}-"))[0] for k in range(6)]
        r = await cl.request("sub_commit", name="slow", position=bases[3])
        assert r["ok"], r
        lg, ret = leader.group.log, leader.group.retention

        def held() -> bool:  # and never past it, checked on every look (fails at once)
            assert lg.start_offset <= bases[3], f"retention deleted {bases[3]}, unread"
            return ret.report().get("held_by") == "subscription 'slow'"

        await _until(held, "retention to stop at the subscription")
        assert lg.start_offset == bases[3]  # everything below it deleted, nothing it needs
        assert section_raw(lg.snapshot, "subscriptions")["subs"]  # the table at the new start
        r = await cl.request("sub_commit", name="slow", position=bases[5])
        assert r["ok"], r
        await _until(lambda: lg.start_offset >= bases[5], "retention to follow the commit")
        assert lg.start_offset == bases[5]
        await cl.aclose()


@trio_test
async def test_a_consumer_applies_the_stored_reset_policy_when_retention_passed_it() -> None:
    """Issue 29: retention (not told to respect subscriptions) deletes what three subscriptions
    had not read. Policy none raises the error naming the fix and moves nothing; `latest`,
    stored by an earlier open, resets to the end for a consumer that names no policy; the
    lag series for /metrics are capped (the furthest behind first) and say how many were
    left out."""
    async with running_cluster(1, retention_bytes=1) as c:
        leader = await c.wait_leader()
        async with Client(leader.address) as client:
            await client.produce([b"a", b"b"])
            for name, policy in (("none", None), ("late", "latest"), ("early", "earliest")):
                sub = await client.subscription_open(name, start="start", auto_reset=policy)
                assert sub["auto_reset"] == (policy or "none")
            stuck_at = (await client.subscription("none"))["position"]
            for k in range(5):
                await client.produce([f"r{k}".encode()])
            lg = leader.group.log
            await _until(lambda: lg.start_offset > stuck_at + 3, "retention to pass them")
            hw = leader.group.core.high_watermark

            with pytest.raises(SubscriptionPositionRemoved) as err:
                async with Consumer(client, "none", follow=False) as con:
                    [r async for r in con]
            assert "raftlog consume --subscription none --auto-reset earliest" in str(err.value)
            assert err.value.position == stuck_at
            assert (await client.subscription("none"))["position"] == stuck_at

            resets: list[dict] = []
            async with Consumer(client, "late", follow=False, on_reset=resets.append) as con:
                assert [r async for r in con] == []  # latest: nothing of what is there
            (reset,) = resets
            # (past every record: the subscription entries since take offsets too)
            assert reset["policy"] == "latest" and reset["to"] > hw
            late = await client.subscription("late")
            assert late["position"] >= reset["to"] and late["resets"] == 1
            assert late["skipped_offsets"] == reset["to"] - stuck_at

            hw = leader.group.core.high_watermark
            series = leader.group.subs.lag_series(hw, 1)
            assert [s["name"] for s in series["series"]] == ["early"]  # furthest behind
            assert series["left_out"] == 2
            assert series["skipped_offsets"] == late["skipped_offsets"]
            everything = leader.group.subs.lag_series(hw, 100)
            assert {s["name"] for s in everything["series"]} == {"none", "late", "early"}


# -- the client -------------------------------------------------------------------------------
@trio_test
async def test_consumer_resumes_commits_what_was_processed_and_lists_lag() -> None:
    async with running_cluster(3) as c:
        await c.wait_leader()
        servers = ",".join(n.address for n in c.nodes)
        async with Client(servers) as client:
            for k in range(3):
                await client.produce([f"r{k * 10 + i}".encode() for i in range(10)])
            seen: list[bytes] = []
            async with Consumer(client, "s", auto_commit_ms=0, follow=False) as con:
                async for rec in con:
                    seen.append(rec.value)
                    if len(seen) == 12:
                        break  # leaving the loop: the 12th counts as processed
            assert (await client.subscription("s"))["lag_records"] == 18
            try:
                async with Consumer(client, "s", follow=False) as con:
                    async for rec in con:
                        seen.append(rec.value)
                        if rec.value == b"r15":
                            raise RuntimeError("processing failed")
            except RuntimeError:
                pass
            # r15 failed: it is read again; r12..r14 were done and are not.
            async with Consumer(client, "s", follow=False) as con:
                rest = [rec.value async for rec in con]
            assert rest[0] == b"r15" and seen + rest[1:] == [f"r{i}".encode()
                                                            for i in range(30)]
            listed = await client.subscriptions()
            assert [s["name"] for s in listed] == ["s"] and listed[0]["lag_records"] == 0
            with pytest.raises(PositionBehind):
                await client.subscription_commit("s", 1)
            with pytest.raises(PositionPastHighWatermark):
                await client.subscription_commit("s", 10_000)
            with pytest.raises(InvalidSubscriptionName):
                await client.subscription_open("bad name")
            await client.subscription_delete("s")
            with pytest.raises(UnknownSubscription):
                await client.subscription("s")


@trio_test
async def test_a_consumer_carries_on_across_a_leader_crash() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        servers = ",".join(n.address for n in c.nodes)
        async with Client(servers, timeout=20) as client:
            for k in range(4):
                await client.produce([f"f{k * 50 + i}".encode() for i in range(50)])
            got: list[bytes] = []
            async with Consumer(client, "fo", auto_commit_ms=0, follow=False,
                                exclusive=True, max_bytes=512) as con:
                async for rec in con:
                    got.append(rec.value)
                    if len(got) == 100:
                        await con.commit()
                        await c.stop(leader.node_id, crash=True)
            assert got == [f"f{i}".encode() for i in range(200)]  # no gap, no repeat
            # Closing committed everything through the last record, on the new leader.
            assert (await client.subscription("fo"))["position"] == con.committed > 200


@trio_test
async def test_exclusive_consumer_fences_a_second_one_until_it_closes() -> None:
    async with running_cluster(3) as c:
        await c.wait_leader()
        servers = ",".join(n.address for n in c.nodes)
        async with Client(servers) as client:
            await client.produce([b"a", b"b", b"c"])
            first = Consumer(client, "ex", exclusive=True, lease_ms=60_000, follow=False)
            assert (await first.__anext__()).value == b"a"
            second = Consumer(client, "ex", exclusive=True, follow=False)
            with pytest.raises(SubscriptionLeased) as err:
                await second.__anext__()
            assert err.value.lease_holder == first.consumer_id
            await first.aclose()  # commits through b"a" and releases the lease
            assert [r.value async for r in Consumer(client, "ex", exclusive=True,
                                                    follow=False)] == [b"b", b"c"]


def test_blocking_consumer() -> None:
    async def serve(servers_ready: trio.MemorySendChannel, stop: trio.Event) -> None:
        async with running_cluster(1) as c:
            await c.wait_leader()
            await servers_ready.send(c.nodes[0].address)
            await stop.wait()

    results: dict = {}

    async def main() -> None:
        send, recv = trio.open_memory_channel(1)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve, send, stop)
            address = await recv.receive()

            def use() -> None:
                with BlockingClient(address) as bc:
                    bc.produce([b"x", b"y", b"z"])
                    with bc.consumer("b", follow=False) as con:
                        results["first"] = next(iter(con)).value
                        con.commit()
                    with bc.consumer("b", follow=False) as con:
                        results["rest"] = [r.value for r in con]
                    results["sub"] = bc.subscription("b")
                    results["through_coalescer"] = bc._client.coalescer.commits

            await trio.to_thread.run_sync(use)
            stop.set()

    trio.run(main)
    assert results["first"] == b"x" and results["rest"] == [b"y", b"z"]
    assert results["sub"]["lag_records"] == 0
    assert results["through_coalescer"] >= 2  # commit() and the second consumer's close


@pytest.mark.parametrize("values, fragment", [
    ({"subscription_expiry_ms": -1}, "subscription_expiry_ms must be an integer >= 0"),
    ({"subscription_expiry_ms": 500}, "under a second"),
    ({"retention_respect_subscriptions": "yes"}, "must be true or false"),
])
def test_subscription_settings_are_checked(values: dict, fragment: str) -> None:
    from raft.node.config import ConfigError, NodeConfig

    with pytest.raises(ConfigError, match=fragment):
        NodeConfig.from_dict({"node_id": 1, "data_dir": "d", "peers": "1=127.0.0.1:7101",
                              **values})


def test_subscription_settings_as_flags_and_toml(tmp_path) -> None:  # noqa: ANN001
    import argparse

    from raft.node.config import NodeConfig

    parser = argparse.ArgumentParser()
    NodeConfig.add_arguments(parser)
    args = parser.parse_args(["--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                              "1=127.0.0.1:7101", "--retention-respect-subscriptions", "true",
                              "--subscription-expiry-ms", "604800000"])
    cfg = NodeConfig.from_args(args)
    assert cfg.retention_respect_subscriptions is True
    assert cfg.subscription_expiry_ms == 604_800_000
    toml = tmp_path / "n.toml"
    toml.write_text(f'node_id = 1\ndata_dir = "{tmp_path}"\nsubscription_expiry_ms = 3600000\n'
                    f'retention_respect_subscriptions = true\n[peers]\n1 = "127.0.0.1:7101"\n')
    cfg = NodeConfig.from_toml(toml)
    assert cfg.subscription_expiry_ms == 3_600_000 and cfg.retention_respect_subscriptions
    default = NodeConfig.from_dict({"node_id": 1, "data_dir": "d", "peers": "1=127.0.0.1:7101"})
    assert (default.subscription_expiry_ms, default.retention_respect_subscriptions) == (0, False)


def test_cli_arguments() -> None:
    from raft.cli.main import UsageError, build_parser

    parser = build_parser()
    with pytest.raises(UsageError, match="is not an offset, 'start' or 'end'"):
        parser.parse_args(["subscriptions", "reset", "x", "--to", "soon"])
    # --servers before the action is kept (the action's own default does not override it).
    args = parser.parse_args(["subscriptions", "--servers", "127.0.0.1:1", "reset", "x",
                              "--to", "end"])
    assert (args.servers, args.name, args.to) == ("127.0.0.1:1", "x", "end")
    args = parser.parse_args(["subscriptions", "delete", "x", "--servers", "127.0.0.1:2"])
    assert args.servers == "127.0.0.1:2"
    args = parser.parse_args(["consume", "--subscription", "s", "--from-end", "--exclusive"])
    assert (args.subscription, args.sub_start, args.exclusive) == ("s", "end", True)
    with pytest.raises(UsageError):
        parser.parse_args(["consume", "--from-start", "--from-end"])
