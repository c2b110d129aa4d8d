"""`Client`: a connection pool to one cluster. It finds the leader (any node answers
`status`; NOT_LEADER carries the leader's address), reconnects, and retries retriable errors
and lost connections with backoff (raft/client/backoff.py) inside the caller's timeout, so a
client that has reached the cluster once rides through a restart of every node; produce, fetch,
status and the admin requests are built on its `call`."""

from __future__ import annotations

import itertools
import random
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import trio

from raft.client.backoff import RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S, Backoff
from raft.client.commits import DEFAULT_COMMIT_LINGER_MS, MAX_COMMIT_ITEMS, CommitCoalescer
from raft.client.connection import RequestNotSent, _Connection
from raft.client.errors import (NotLeaderError, OffsetOutOfRangeError,
                                RaftlogError, RequestTimeout,
                                ShuttingDownError, TooLargeError, UnavailableError,
                                UnknownTopicError, error_from_reply)
from raft.client.metadata import (DEFAULT_TOPIC, METADATA_MAX_AGE_S, METADATA_MIN_INTERVAL_S, Metadata,
                                  MetadataCache)
from raft.client.results import FetchedRecord, FetchResult, ProduceResult, UndecodableBatch
from raft.client.security import ClientSecurity
from raft.client.routing import (CLUSTER, DEFAULT_PARTITION, Route, Router, is_partition,
                                 route_of)
from raft.client.subscription_calls import SubscriptionCalls
from raft.client.topic_calls import TopicCalls, where_fields
from raft.node.config import ConfigError, parse_address
from raft.protocol.errors import may_retry, may_retry_lost_connection
from raft.protocol.framing import WireError
from raft.protocol.requests import (AddNode, Fetch, Produce, RawRequest, RemoveNode, Status,
                                    TransferLeader, acks_named, type_of)
from storage.records import MalformedRecords, Record, decode_records, encode_records

DEFAULT_TIMEOUT_S = 10.0
# The longest wait a request asks a node for (the nodes' default max_timeout_ms): a longer
# client timeout is spent in retries, which are safe where the client retries at all.
MAX_SERVER_TIMEOUT_MS = 120_000


def server_timeout_ms(budget_s: float) -> int:
    return max(1, min(MAX_SERVER_TIMEOUT_MS, int(budget_s * 1000)))


class Client(SubscriptionCalls, TopicCalls):
    """A connection pool to one cluster. Use as `async with Client("h:p,h:p") as c:`.
    With `tls_ca` (and optionally `tls_cert`/`tls_key`) it speaks TLS; `token` authenticates
    (raft.client.security).

    Subscription commits of the consumers that share a client travel together: they wait
    `commit_linger_ms` (default 5 ms) for each other and leave as one `sub_commit_many` request
    of at most `max_commit_items` (raft/client/commits.py). Share one client among the
    consumers of a process: that is what makes many commits cost few requests.

    Retries: a request is retried, until its timeout, after a retryable error
    (raft.protocol.errors) and after a connection failure before the request was written
    (nothing listens, the node hung up before the send); a connection lost after a produce was
    written is retried only when the produce is idempotent (a producer id: `Producer`). The
    pauses between attempts grow from `retry_backoff` (0.01 s) to `retry_backoff_max` (1 s),
    with jitter (raft/client/backoff.py). One exception, first contact: while this client has
    never reached any node, an address that refuses the connection is not waited for, and when
    every address refuses, the call fails at once naming them all ("no raftlog node answers
    at ..."): a cluster that was never seen is more likely not running, or the addresses
    wrong, than restarting. `retry_refused=True` waits for it anyway (a script that starts a
    cluster and its client together).

    Topics (issue 26): a request about a partition goes to that partition's leader, found in
    the client's metadata cache (raft/client/metadata.py: refreshed when stale, after
    NOT_LEADER without a leader named, UNKNOWN_TOPIC, or a lost connection to a partition's
    leader, at most once per `metadata_min_interval`); raft/client/routing.py has the rules.
    Requests that name no topic go to the default topic's partition 0, as before topics."""

    def __init__(self, servers: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S,
                 max_frame_bytes: int = 64 << 20, rng: random.Random | None = None,
                 tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, token: str | None = None,
                 retry_refused: bool = False, retry_backoff: float = RETRY_BACKOFF_S,
                 retry_backoff_max: float = RETRY_BACKOFF_MAX_S,
                 commit_linger_ms: float = DEFAULT_COMMIT_LINGER_MS,
                 max_commit_items: int = MAX_COMMIT_ITEMS,
                 metadata_min_interval: float = METADATA_MIN_INTERVAL_S,
                 metadata_max_age: float = METADATA_MAX_AGE_S,
                 address_map: dict[str, str] | None = None) -> None:
        self.servers = parse_servers(servers)
        # Advertised address -> where to dial it (raft/client/address_map.py): behind NAT or a
        # proxy, the addresses the cluster names are not the ones this client reaches.
        self.address_map = dict(address_map or {})
        self._rng = rng or random.Random()
        self.security = ClientSecurity.create(tls_ca=tls_ca, tls_cert=tls_cert,
                                              tls_key=tls_key, token=token)
        self.timeout = timeout
        # Keep retrying addresses that refuse connections until the timeout even before any
        # node was reached (a script that starts the cluster and the client together); by
        # default first contact with a cluster where nothing listens fails at once.
        self.retry_refused = retry_refused
        Backoff(self._rng, retry_backoff, retry_backoff_max)  # refuses bad bounds now
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        # Some node answered a hello on this client: from then on a refused connection is a
        # node restarting, not a cluster that is not there, and is retried like any other.
        self.reached = False
        self.retries = 0  # attempts that were retried (any cause): for tests and diagnostics
        self.max_frame_bytes = max_frame_bytes
        self._conns: dict[str, _Connection] = {}
        # One opener per address: tasks making their first call at once share one connection
        # (each used to open its own, and all but the last leaked).
        self._opening: dict[str, trio.Lock] = {}
        self.metadata = MetadataCache(self._metadata_request,
                                      min_interval=metadata_min_interval,
                                      max_age=metadata_max_age)
        self.router = Router(self.servers, self._rng, self.metadata)
        self.metadata.on_refresh = self.router.metadata_changed
        self._ids = itertools.count(1)
        self.coalescer = CommitCoalescer(self.call, linger_ms=commit_linger_ms,
                                         max_items=max_commit_items, rng=self._rng)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.aclose()

    # -- plumbing ------------------------------------------------------------------------------
    async def _conn(self, address: str) -> _Connection:
        conn = self._conns.get(address)
        if conn is not None and not conn.peer_closed():
            return conn
        async with self._opening.setdefault(address, trio.Lock()):
            conn = self._conns.get(address)  # another task may have opened it meanwhile
            if conn is not None and not conn.peer_closed():
                return conn
            if conn is not None:  # hung up while idle (the node restarted): open another
                await self._drop(address)
            conn = await _Connection.open(address, self.max_frame_bytes, self.security,
                                          dial=self.address_map.get(address))
            self._conns[address] = conn
            self.reached = True
            return conn

    async def _drop(self, address: str) -> None:
        conn = self._conns.pop(address, None)
        if conn is not None:
            await conn.aclose()

    async def _forget(self, address: str) -> None:
        await self._drop(address)
        self.router.forget_address(address)

    async def _metadata_request(self) -> dict[str, Any]:
        from raft.client.topic_calls import metadata_request
        return await self.call(metadata_request(), leader=False,
                               timeout=min(self.timeout, 5.0))

    async def refresh_metadata(self, deadline: float | None = None) -> Metadata | None:
        """Refresh the metadata cache (rate-bounded, raft/client/metadata.py) within
        `deadline` (trio time); None when the cluster could not answer (or has no topics:
        a node that predates them). Never raises a RaftlogError: the caller is routing a
        request and goes on with what it knows."""
        if not self.metadata.supported:
            return None
        with trio.move_on_after(max(0.0, (deadline if deadline is not None
                                          else trio.current_time() + self.timeout)
                                    - trio.current_time())):
            try:
                meta = await self.metadata.refresh()
            except RaftlogError:
                return None
            return meta
        return None

    async def _unknown_topic(self, route: Route, err: RaftlogError,
                             deadline: float) -> RaftlogError | None:
        """UNKNOWN_TOPIC for `route`: ask the metadata again. The error to raise when fresh
        metadata agrees the topic or partition does not exist (naming what does), or None
        to retry (the topic exists: the node that answered has not applied it yet)."""
        if not is_partition(route):
            return err
        meta = await self.refresh_metadata(deadline)
        if meta is None:
            return err
        assert isinstance(route, tuple)
        try:
            (await self.controllers_view(meta, route[0])).partition(*route)
        except UnknownTopicError as fresh:
            return fresh
        return None

    async def call(self, request: Any, *, timeout: float | None = None, leader: bool = True,
                   server: str | None = None, attempt_timeout: float | None = None,
                   **fields: Any) -> dict[str, Any]:
        """Send one request and return its OK reply. `request` is one of raft.protocol's
        typed requests (which own the field names); a type name with raw `fields` is for a
        request this client has no type for (a newer node's, a test's). With `leader`, follow NOT_LEADER redirects;
        retriable errors and connection failures are retried with backoff until `timeout`.
        `server` pins the request to one node (no redirects). One attempt waits at most
        `attempt_timeout` (default a third of the budget, at least 2 s), so a hung node does
        not eat the whole budget.

        When every address refuses the connection (nothing listens there) and this client has
        never reached any node, the call fails at once with one UnavailableError naming them
        all: waiting out the timeout would not help a cluster that is not running (pass
        `retry_refused=True` to the Client to wait for one that is starting). Once a node has
        answered, refused connections are retried with backoff until `timeout`: the cluster
        is restarting. A call pinned to one `server` reports a refused connection at once
        either way (it asks about that node, which is down).

        A produce without a producer id is not idempotent: once it may have reached the
        server, an ambiguous failure (no answer, connection lost, leadership lost) is raised
        as RequestTimeout ("unknown outcome") instead of retried, since a retry could write
        the batch twice, and never as an earlier, definite error such as NOT_LEADER."""
        budget = self.timeout if timeout is None else timeout
        per_attempt = attempt_timeout if attempt_timeout is not None else max(2.0, budget / 3)
        deadline = trio.current_time() + budget
        if isinstance(request, str):
            request = RawRequest(request, fields)
        elif fields:
            raise TypeError(f"fields {sorted(fields)} given with a typed request")
        t = type_of(request)
        route = route_of(request)
        if is_partition(route) and route != DEFAULT_PARTITION and self.metadata.supported \
                and self.metadata.current is None:
            await self.refresh_metadata(deadline)  # where the partition's leader is
        safe_to_retry = not isinstance(request, Produce) or bool(request.producer_id)
        backoff = Backoff(self._rng, self.retry_backoff, self.retry_backoff_max)
        last: RaftlogError | None = None
        refused: dict[str, str] = {}  # address -> why nothing answered there
        while True:
            target = server or self.router.target(route)
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            sent = False
            conn: _Connection | None = None
            try:
                with trio.fail_after(min(remaining, per_attempt)):
                    conn = await self._conn(target)
                    sent = True
                    reply = await conn.request(request, next(self._ids))
            except trio.TooSlowError:
                # Abandon this request only (its late reply is dropped): the connection carries
                # other callers' requests too, and closing it would fail them all. A broken
                # one, or one that never opened, is forgotten as before.
                if conn is None or conn.broken:
                    await self._forget(target)
                else:  # a slow leader may be gone: look for it again
                    self.router.forget_route(route, target)
                waited = min(remaining, per_attempt)
                if sent and not safe_to_retry:
                    raise RequestTimeout(
                        f"no answer from {target} to {t} within {waited:.1f} s; the batch may "
                        f"or may not be in the log: read it back before resending, or use an "
                        f"idempotent Producer, whose retries are safe") from None
                if last is not None and remaining <= per_attempt:
                    break  # out of time: report the more telling earlier error
                last = RequestTimeout(f"no answer from {target} to {t} within {waited:.1f} s")
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    WireError) as e:
                await self._forget(target)
                sent = sent and not isinstance(e, RequestNotSent)
                if not may_retry_lost_connection(written=sent, idempotent=safe_to_retry):
                    raise RequestTimeout(
                        f"lost the connection to {target} after sending {t} ({e}); the batch "
                        f"may or may not be in the log: read it back before resending, or use "
                        f"an idempotent Producer, whose retries are safe") from None
                why = None if sent else _unreachable(e)
                if why is not None and not self.retry_refused \
                        and (not self.reached or server is not None):
                    refused[target] = why
                    if server is not None or set(self.servers) <= set(refused):
                        raise UnavailableError(_summary(refused), details={
                            "addresses": sorted(refused)}) from None
                if last is None or isinstance(last, (UnavailableError, RequestTimeout)):
                    # A live node's answer (BACKPRESSURE from a leader that cannot take the
                    # write yet, NOT_LEADER, ...) says more than a down node's refusal: the
                    # rotation may end on the down one (ci16: UNAVAILABLE reported for a
                    # leader that kept answering BACKPRESSURE while another node was down).
                    last = UnavailableError(f"{target}: {e}; check the node is running")
                if is_partition(route) and server is None:
                    await self.refresh_metadata(deadline)  # the partition's leader may move
            except TooLargeError:
                raise  # refused before sending: the connection is fine
            except RaftlogError as e:  # the server hung up on our frame: not retriable
                await self._drop(target)
                raise e
            else:
                if reply.get("ok"):
                    if leader and not server:
                        self.router.succeeded(route, target)
                    return reply
                err = error_from_reply(reply.get("error") or {})
                if isinstance(err, NotLeaderError) and server:
                    raise err  # pinned to this node: no redirect to follow
                if isinstance(err, NotLeaderError) and leader and not server:
                    hint = err.leader_addr if err.leader_addr != target else None
                    self.router.redirected(route, err.leader_id, hint)
                    last = err
                    if hint:
                        continue  # follow the redirect at once
                    if is_partition(route):
                        await self.refresh_metadata(deadline)  # who leads it now?
                elif isinstance(err, UnknownTopicError) and not server:
                    final = await self._unknown_topic(route, err, deadline)
                    if final is not None:
                        raise final
                    last = err
                elif not may_retry(err.code, idempotent=safe_to_retry):
                    raise err  # not transient, or it may have been written: the caller decides
                else:
                    last = err
                    if isinstance(err, ShuttingDownError):
                        self.router.forget_route(route, target)
            self.retries += 1
            await trio.sleep(backoff.next_pause(deadline - trio.current_time()))
        if last is None:
            last = RequestTimeout(f"{t} did not complete within {budget:.1f} s")
        if not isinstance(last, RequestTimeout):
            last = type(last)(f"{last.message} (gave up after {budget:.1f} s; is a majority of "
                              f"the cluster up?)", code=last.code, details=last.details)
        raise last

    # -- operations ----------------------------------------------------------------------------
    async def produce(self, records: Iterable[bytes | str | Record], *, acks: str = "quorum",
                      timeout: float | None = None, producer_id: int = 0,
                      sequence: int = -1, timestamp_ms: int = 0, topic: str | None = None,
                      partition: int = 0) -> ProduceResult:
        """Write records as one batch to one partition (`topic`, default the default topic;
        `partition`, default 0), through that partition's leader. Returns its offsets (with
        acks="none" too: the leader assigns them on acceptance). Retries are only safe with a
        producer id (use Producer, which also picks partitions by key); without one, an
        ambiguous failure after the send is raised, not retried."""
        recs = [as_record(r) for r in records]
        if not recs:
            raise ValueError("produce needs at least one record")
        budget = self.timeout if timeout is None else timeout
        request = Produce(encode_records(recs), len(recs), acks_named(acks),
                          server_timeout_ms(budget), producer_id,
                          sequence if producer_id else -1, timestamp_ms or None,
                          **where_fields(topic, partition))
        reply = await self.call(request, timeout=budget)
        return ProduceResult(reply["base_offset"], reply["last_offset"],
                             bool(reply.get("duplicate", False)))

    async def fetch(self, offset: int, *, max_bytes: int = 1 << 20, max_wait: float = 0.0,
                    address: str | None = None, timeout: float | None = None,
                    topic: str | None = None, partition: int = 0) -> FetchResult:
        """Committed records from `offset` (long-polls up to `max_wait` s when there is nothing
        new) of one partition (`topic`, default the default topic; `partition`, default 0).
        Reads from the partition's leader unless `address` names a node. A batch whose payload cannot
        be decoded is not raised: it is listed in the result's `undecodable` with its offsets,
        and the records after it are returned as usual (Consumer and `raftlog consume` report
        it; code calling fetch directly should check the list)."""
        budget = (self.timeout if timeout is None else timeout) + max_wait
        reply = await self.call(Fetch(offset, max_bytes, int(max_wait * 1000),
                                      **where_fields(topic, partition)), timeout=budget,
                                server=address, attempt_timeout=max_wait + max(2.0, budget / 3))
        out: list[FetchedRecord] = []
        bad: list[UndecodableBatch] = []
        for b in reply.get("batches", []):
            base = b["base_offset"]
            try:
                records = decode_records(b["payload"], b.get("count"))
            except MalformedRecords as e:
                last = base + max(1, b.get("count") or 1) - 1
                if last >= offset:
                    bad.append(UndecodableBatch(base, last, e.reason,
                                                b.get("timestamp_ms", 0)))
                continue
            for i, r in enumerate(records):
                if base + i >= offset:
                    out.append(FetchedRecord(base + i, r.value, r.key, r.headers,
                                             b.get("timestamp_ms", 0), partition,
                                             topic or DEFAULT_TOPIC))
        return FetchResult(out, reply["high_watermark"], reply["start_offset"],
                           reply["next_offset"], bad)

    async def status(self, address: str | None = None) -> dict[str, Any]:
        """One node's status (the leader's when no address is given)."""
        reply = await self.call(Status(), server=address, leader=address is None)
        return reply["status"]

    async def cluster_status(self, timeout: float = 2.0) -> dict[str, dict[str, Any]]:
        """Every known node's status, keyed by address (an `error` entry, with the error's
        `code`, for unreachable ones). Nodes are found from the servers given and each node's
        peer list; they are asked at the same time, so a node that is down costs one timeout
        at most, and a refused connection none."""
        seen: dict[str, dict[str, Any]] = {}
        todo = list(dict.fromkeys(self.servers))
        while todo:
            async def one(addr: str) -> None:
                try:
                    st = await self.call(Status(), server=addr, leader=False, timeout=timeout)
                    seen[addr] = st["status"]
                except RaftlogError as e:
                    seen[addr] = {"error": f"{e.code}: {e.message}", "code": e.code}

            async with trio.open_nursery() as nursery:
                for addr in todo:
                    seen[addr] = {}
                    nursery.start_soon(one, addr)
            todo = [peer for st in list(seen.values())
                    for peer in (st.get("peers") or {}).values() if peer and peer not in seen]
            todo = list(dict.fromkeys(todo))
        return seen

    async def transfer_leader(self, to: int | None = None, *,
                              timeout: float | None = None) -> dict[str, Any]:
        """Move leadership (to `to`, or the most caught-up voter) and return the new
        `leader_id` and `leader_addr`. The old leader answers as soon as it has stepped down,
        often before it knows its successor; the new leader is then looked up (within the
        same timeout), and the answer's `leader_id` is None only if none emerged in time."""
        budget = self.timeout if timeout is None else timeout
        deadline = trio.current_time() + budget
        reply = await self.call(TransferLeader(to, server_timeout_ms(budget)), timeout=budget)
        if reply.get("leader_id") is not None and reply.get("leader_addr"):
            return reply
        while trio.current_time() < deadline:
            statuses = await self.cluster_status(
                timeout=max(0.1, min(1.0, deadline - trio.current_time())))
            leaders = [st for st in statuses.values() if st.get("role") == "leader"]
            if leaders:
                st = max(leaders, key=lambda x: x.get("term", 0))
                self.router.succeeded(CLUSTER, st.get("address"))
                return {**reply, "leader_id": st.get("node_id"), "leader_addr": st.get("address")}
            await trio.sleep(0.05)  # an election takes a few ticks: poll the cluster
        return reply

    async def offset_for_time(self, timestamp_ms: int, *, address: str | None = None,
                              timeout: float | None = None, topic: str | None = None,
                              partition: int = 0) -> int:
        """The first offset to read for records stamped at or after `timestamp_ms`: the
        offset of the first record whose batch timestamp is >= it (high watermark + 1 when
        no committed record is that recent), like Kafka's offsetsForTimes.

        A binary search by batch timestamp with one-batch fetches (about log2 of the log's
        batch count) in one partition (`topic`, `partition`): no server index. The answer is exact when timestamps grow with
        offsets, as they do when the leader stamps batches (the default); batches a
        producer stamped itself out of order can move it to where the timestamps cross."""
        try:
            head = await self.fetch(0, max_bytes=1, address=address, timeout=timeout,
                                    topic=topic, partition=partition)
            lo, hi = head.start_offset, head.high_watermark + 1
        except OffsetOutOfRangeError as e:
            lo = e.start_offset if e.start_offset is not None else 0
            hi = (e.high_watermark if e.high_watermark is not None else lo - 1) + 1
        hw_end = hi
        # f(x) = timestamp of the first record at or after x: non-decreasing; find the least
        # x in [lo, hi] with f(x) >= timestamp_ms (f(hi) counts as infinite).
        while lo < hi:
            mid = (lo + hi) // 2
            res = await self.fetch(mid, max_bytes=1, address=address, timeout=timeout,
                                   topic=topic, partition=partition)
            # An undecodable batch still has its timestamp and offsets: it counts like the
            # records it would hold.
            seen = sorted([*((r.offset, r.offset, r.timestamp_ms) for r in res.records),
                           *((u.first_offset, u.last_offset, u.timestamp_ms)
                             for u in res.undecodable)])
            older = list(itertools.takewhile(lambda r: r[2] < timestamp_ms, seen))
            if not older:
                hi = mid
            else:  # the records of a batch share its timestamp: skip the whole batch
                lo = min(hi, older[-1][1] + 1)
        if lo < hw_end:  # lo may be a control entry's offset: name the record itself
            res = await self.fetch(lo, max_bytes=1, address=address, timeout=timeout,
                                   topic=topic, partition=partition)
            firsts = [r.offset for r in res.records[:1]]
            firsts += [max(lo, u.first_offset) for u in res.undecodable]  # reported from there
            if firsts:
                return min(firsts)
        return lo

    async def add_node(self, node_id: int, address: str, *,
                       timeout: float | None = None) -> dict[str, Any]:
        return await self.call(AddNode(node_id, address), timeout=timeout)

    async def remove_node(self, node_id: int, *, timeout: float | None = None) -> dict[str, Any]:
        return await self.call(RemoveNode(node_id), timeout=timeout)


def _unreachable(e: BaseException) -> str | None:
    """Why nothing can answer at an address whose connection failed this way ("connection
    refused", "unknown host"), or None when the failure may pass (a reset, a timeout)."""
    leaves: list[BaseException] = [e]
    cause = e.__cause__
    if isinstance(cause, BaseExceptionGroup):  # trio.open_tcp_stream: one per address tried
        leaves = list(cause.exceptions)
    elif cause is not None:
        leaves = [cause]
    if all(isinstance(x, ConnectionRefusedError) for x in leaves):
        return "connection refused"
    if all(isinstance(x, socket.gaierror) for x in leaves):
        return "unknown host"
    return None


def _summary(refused: dict[str, str]) -> str:
    reasons = sorted(set(refused.values()))
    return (f"no raftlog node answers at {', '.join(sorted(refused))} ({'; '.join(reasons)}); "
            f"is the cluster running, and are these its addresses?")


def parse_servers(servers: str | Sequence[str]) -> list[str]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s and s.strip()]
    if not out:
        raise ConfigError("no servers given: pass --servers HOST:PORT[,HOST:PORT...], e.g. "
                          "127.0.0.1:7101")
    for s in out:
        parse_address(s, what="server address")
    return out


def as_record(r: bytes | str | Record) -> Record:
    if isinstance(r, Record):
        return r
    if isinstance(r, str):
        return Record(r.encode())
    if isinstance(r, (bytes, bytearray, memoryview)):
        return Record(bytes(r))
    raise TypeError(f"a record is bytes, str or storage.records.Record, not {type(r).__name__}")


__all__ = ["DEFAULT_TIMEOUT_S", "Client", "as_record", "parse_servers"]
