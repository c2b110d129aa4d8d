"""Many commits, few requests: `sub_commit_many` on the wire (raft/node/api/subscribe.py)
and the client's coalescing of the commits of consumers that share a Client
(raft/client/commits.py). One refused item never fails the others; the item limit is a clear
error; coalescing is counted (client and leader counters), never timed; a coalesced,
acknowledged commit survives a leader crash."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from inproc_cluster import RawClient, running_cluster, trio_test
from raft.client import (BadRequestError, Client, Consumer, PositionBehind, RequestTimeout,
                         UnavailableError, UnknownSubscription)
from raft.client.commits import MAX_COMMIT_ITEMS, CommitCoalescer
from raft.node.api.subscribe import MAX_COMMIT_ITEMS as NODE_MAX_COMMIT_ITEMS
from test_subscriptions_inproc import _produce  # one helper for both files


def _codes(reply: dict[str, Any]) -> list[str]:
    assert reply["ok"], reply
    return ["OK" if r["ok"] else r["error"]["code"] for r in reply["results"]]


# -- the wire ----------------------------------------------------------------------------------
@trio_test
async def test_each_item_gets_its_own_verdict() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        base, last = await _produce(cl, 10)
        assert (await cl.request("sub_open", name="a", consumer="c1", lease_ms=60_000))["ok"]
        assert (await cl.request("sub_open", name="b"))["ok"]
        svc = leader.group.subs
        requests = svc.requests
        reply = await cl.request("sub_commit_many", commits=[
            {"name": "a", "position": base + 3, "consumer": "c1", "lease_ms": 60_000},
            {"name": "b", "position": base + 2},
            {"name": "missing", "position": 0},
            {"name": "a", "position": base + 4, "consumer": "c2"},  # c1 holds the lease
            {"name": "b", "position": base + 1},  # below b's position, committed just before
            {"name": "no spaces", "position": 0},
            {"name": "b", "position": last + 50},
            {"name": "b", "position": base + 2, "consumer": "x" * 300},
        ])
        assert _codes(reply) == ["OK", "OK", "UNKNOWN_SUBSCRIPTION", "SUBSCRIPTION_LEASED",
                                 "POSITION_BEHIND", "INVALID_SUBSCRIPTION_NAME",
                                 "POSITION_PAST_HIGH_WATERMARK", "BAD_REQUEST"]
        results = reply["results"]
        assert results[0]["subscription"]["position"] == base + 3
        assert results[1]["subscription"]["name"] == "b"
        assert results[3]["error"]["lease_holder"] == "c1"
        assert results[4]["error"]["position"] == base + 2  # the refusal carries the position
        assert results[6]["error"]["high_watermark"] >= last
        assert svc.requests - requests == 1  # one request brought all the accepted commits
        assert (await cl.request("sub_get", name="a"))["subscription"]["position"] == base + 3
        assert (await cl.request("sub_get", name="b"))["subscription"]["position"] == base + 2

        follower = next(n for n in c.live if n is not leader)
        fc = await RawClient.connect(follower.address)
        nl = await fc.request("sub_commit_many", commits=[{"name": "a", "position": base}])
        assert not nl["ok"] and nl["error"]["code"] == "NOT_LEADER"
        assert nl["error"]["leader_addr"] == leader.address
        # An item field of the wrong type is a malformed frame: error frame, then hang-up.
        await fc.send({"t": "sub_commit_many", "id": 9, "commits": [{"name": "a",
                                                                     "position": "7"}]})
        err = await fc.closed_after_error()
        assert err is not None and "commits[0]" in err["message"], err
        await cl.aclose()


@trio_test
async def test_the_item_limit_is_a_clear_error_and_the_connection_stays() -> None:
    assert NODE_MAX_COMMIT_ITEMS == MAX_COMMIT_ITEMS  # the client's bound is the node's
    async with running_cluster(1) as c:
        leader = await c.wait_leader()
        cl = await RawClient.connect(leader.address)
        item = {"name": "nobody", "position": 0}
        over = await cl.request("sub_commit_many", commits=[item] * (MAX_COMMIT_ITEMS + 1))
        assert not over["ok"] and over["error"]["code"] == "BAD_REQUEST"
        assert over["error"]["max_items"] == MAX_COMMIT_ITEMS
        assert "split" in over["error"]["message"]
        empty = await cl.request("sub_commit_many", commits=[])
        assert empty["error"]["code"] == "BAD_REQUEST"
        full = await cl.request("sub_commit_many", commits=[item] * MAX_COMMIT_ITEMS)
        assert _codes(full) == ["UNKNOWN_SUBSCRIPTION"] * MAX_COMMIT_ITEMS
        await cl.aclose()
    with pytest.raises(ValueError, match="max_commit_items"):
        Client("127.0.0.1:1", max_commit_items=MAX_COMMIT_ITEMS + 1)


# -- the client, on a cluster ------------------------------------------------------------------
@trio_test
async def test_consumers_sharing_a_client_commit_in_few_requests() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        servers = ",".join(n.address for n in c.nodes)
        async with Client(servers, max_commit_items=10) as client:
            res = await client.produce([f"r{i}".encode() for i in range(30)])
            consumers = [Consumer(client, f"s{i}", auto_commit_ms=0, follow=False)
                         for i in range(25)]
            for con in consumers:
                await con.open()
            answers: dict[int, dict] = {}

            async def commit(i: int, ahead: int = 1) -> None:
                answers[i] = await consumers[i].commit(res.base_offset + i + ahead)

            svc = leader.group.subs
            requests, leader_requests = client.coalescer.requests, svc.requests
            async with trio.open_nursery() as nursery:
                for i in range(25):
                    nursery.start_soon(commit, i)
            # All 25 started together: rounds of at most 10 commits, so 3 requests, not 25.
            assert client.coalescer.requests - requests == 3
            assert svc.requests - leader_requests == 3
            for i, con in enumerate(consumers):
                assert answers[i]["name"] == f"s{i}"
                assert answers[i]["position"] == con.committed == res.base_offset + i + 1

            # One refused commit in a round fails only its own caller.
            outcome: dict[str, Any] = {}

            async def behind() -> None:
                with pytest.raises(PositionBehind) as err:
                    await client.subscription_commit("s3", 0)
                outcome["behind"] = err.value

            async def unknown() -> None:
                with pytest.raises(UnknownSubscription):
                    await client.subscription_commit("nope", 1)
                outcome["unknown"] = True

            requests = client.coalescer.requests
            async with trio.open_nursery() as nursery:
                nursery.start_soon(behind)
                nursery.start_soon(unknown)
                for i in range(5, 10):
                    nursery.start_soon(commit, i, 2)  # one past the last commit: accepted
            assert client.coalescer.requests - requests == 1
            assert outcome["unknown"] and outcome["behind"].details["position"] == \
                res.base_offset + 4
            listed = {s["name"]: s["position"] for s in await client.subscriptions("s")}
            assert listed["s3"] == res.base_offset + 4
            assert listed["s9"] == res.base_offset + 11 == consumers[9].committed


@trio_test
async def test_a_coalesced_acknowledged_commit_survives_a_leader_crash() -> None:
    async with running_cluster(3) as c:
        leader = await c.wait_leader()
        servers = ",".join(n.address for n in c.nodes)
        async with Client(servers, timeout=20) as client:
            res = await client.produce([f"r{i}".encode() for i in range(20)])
            base = res.base_offset
            consumers = [Consumer(client, f"k{i}", auto_commit_ms=0, follow=False)
                         for i in range(8)]
            for con in consumers:
                await con.open()
            requests = client.coalescer.requests
            async with trio.open_nursery() as nursery:
                for i, con in enumerate(consumers):
                    nursery.start_soon(con.commit, base + i + 1)
            assert client.coalescer.requests - requests == 1  # acknowledged, together
            await c.stop(leader.node_id, crash=True)
            new = await c.wait_leader(exclude=leader.node_id)
            raw = await RawClient.connect(new.address)
            for i in range(8):
                got = await raw.request("sub_get", name=f"k{i}")
                assert got["subscription"]["position"] == base + i + 1, got
            # The same client carries on through the new leader.
            async with trio.open_nursery() as nursery:
                for i, con in enumerate(consumers):
                    nursery.start_soon(con.commit, base + 10 + i)
            for i in range(8):
                got = await raw.request("sub_get", name=f"k{i}")
                assert got["subscription"]["position"] == base + 10 + i, got
            await raw.aclose()


# -- the coalescer alone (a stand-in for Client.call) ------------------------------------------
class _FakeCluster:
    """Answers sub_commit_many from a table of positions; scripted failures first."""

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}
        self.sent: list[tuple[str, list[str]]] = []
        self.item_errors: dict[str, list[str]] = {}  # name -> codes to answer first
        self.request_error: Exception | None = None
        self.knows_many = True

    async def call(self, request: Any, *, timeout: float) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        fields = request.to_frame(0)  # what Client.call would send
        t = fields["t"]
        if self.request_error is not None:
            raise self.request_error
        if t == "sub_commit_many" and not self.knows_many:
            raise BadRequestError("unknown request type 'sub_commit_many'; known: ...",
                                  code="BAD_REQUEST")
        items = fields["commits"] if t == "sub_commit_many" else [fields]
        self.sent.append((t, [it["name"] for it in items]))
        results = []
        for it in items:
            scripted = self.item_errors.get(it["name"])
            if scripted:
                code = scripted.pop(0)
                results.append({"ok": False, "error": {"code": code, "message": code}})
                continue
            self.positions[it["name"]] = it["position"]
            results.append({"ok": True, "subscription": {"name": it["name"],
                                                         "position": it["position"]}})
        if t == "sub_commit":
            if not results[0]["ok"]:
                raise BadRequestError("scripted", code=results[0]["error"]["code"])
            return {"ok": True, **results[0]}
        return {"ok": True, "results": results}


def _run(fn: Any) -> None:
    # The clock jumps whenever every task waits (lingers and backoffs take no real time), except
    # while the test waits in wait_all_tasks_blocked, which trio serves first.
    trio.run(fn, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_cancelled_driver_hands_its_round_to_the_others() -> None:
    fake = _FakeCluster()

    async def main() -> None:
        co = CommitCoalescer(fake.call, linger_ms=1000, max_items=3)
        scope = trio.CancelScope()

        async def first() -> None:
            with scope:
                await co.commit("a", 1, timeout=100)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.testing.wait_all_tasks_blocked()  # "a" drives: it lingers
            nursery.start_soon(partial(co.commit, "b", 1, timeout=100))
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()  # "a"'s caller gives up before the round left
            await trio.testing.wait_all_tasks_blocked()
            assert fake.sent == []
            nursery.start_soon(partial(co.commit, "c", 1, timeout=100))
            nursery.start_soon(partial(co.commit, "d", 1, timeout=100))
        assert len(fake.sent) == 1 and fake.sent[0][0] == "sub_commit_many"
        assert sorted(fake.sent[0][1]) == ["b", "c", "d"]  # full at 3: no linger needed
        assert "a" not in fake.positions and co.requests == 1 and co.commits == 3

    _run(main)


def test_item_and_request_errors_reach_the_right_callers() -> None:
    fake = _FakeCluster()

    async def main() -> None:
        co = CommitCoalescer(fake.call, linger_ms=5)
        fake.item_errors = {"x": ["TIMEOUT", "BACKPRESSURE"], "y": ["POSITION_BEHIND"]}
        got: dict[str, Any] = {}

        async def commit(name: str) -> None:
            try:
                got[name] = await co.commit(name, 7, timeout=30)
            except Exception as e:  # noqa: BLE001 - the test looks at which
                got[name] = e

        async with trio.open_nursery() as nursery:
            for name in ("x", "y", "z"):
                nursery.start_soon(commit, name)
        # "x": retriable verdicts are retried for it alone until accepted; "y" is refused.
        assert got["x"]["position"] == 7 and got["z"]["position"] == 7
        assert isinstance(got["y"], PositionBehind)
        assert [names for _, names in fake.sent][1:] == [["x"], ["x"]]
        fake.request_error = UnavailableError("nobody home", code="UNAVAILABLE")
        async with trio.open_nursery() as nursery:
            for name in ("p", "q"):
                nursery.start_soon(commit, name)
        assert isinstance(got["p"], UnavailableError) and isinstance(got["q"], UnavailableError)
        assert got["p"] is not got["q"]  # each caller its own exception object
        fake.request_error = None
        fake.item_errors = {"slow": ["TIMEOUT"] * 1000}
        await commit("slow")
        assert isinstance(got["slow"], RequestTimeout) or got["slow"].code == "TIMEOUT"

    _run(main)


def test_an_older_node_gets_one_sub_commit_per_commit() -> None:
    fake = _FakeCluster()
    fake.knows_many = False

    async def main() -> None:
        co = CommitCoalescer(fake.call, linger_ms=5)
        async with trio.open_nursery() as nursery:
            for name in ("a", "b"):
                nursery.start_soon(partial(co.commit, name, 3, timeout=10))
        assert sorted(names[0] for t, names in fake.sent if t == "sub_commit") == ["a", "b"]
        assert fake.positions == {"a": 3, "b": 3}
        await co.commit("c", 4, timeout=10)  # from now on without trying the new request
        assert fake.sent[-1] == ("sub_commit", ["c"])

    _run(main)
