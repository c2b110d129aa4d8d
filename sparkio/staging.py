"""Blocking wire client for Spark drivers and executors: staged-load requests and fetches.

Spark calls our writer and reader from plain threads (no trio loop), and pipelines staged writes
in a way the public client does not offer, so this keeps its own blocking connection; the frames,
their limits and the retry rules are the protocol's (raft.protocol: framing over a blocking socket
in raft.protocol.blocking, raft.protocol.errors.may_retry). It follows the leader (NOT_LEADER
carries its address), reconnects after a dropped connection and retries retryable errors with
backoff until the caller's deadline. Every request here is idempotent, which is why all
retryable codes are retried (not only those certainly not written): staged writes carry their
(partition, attempt, seq) tag, the load's begin/commit/abort are answered from the load's state
when they already happened, and the rest are reads. Staged writes are pipelined (a few
requests in flight) and every one carries its (partition, attempt, seq) tag, so resending after
a failure can never publish a batch twice: the server keeps the first copy of each seq.

Load operations on the wire (typed in raft/protocol/load_requests.py, served by
raft/node/load_service.py):
  load_begin  {load_id}                                   -> {"load": {state, gen, rows, ...}}
  load_stage  {load_id, gen, partition, attempt, seq, count, payload, acks, timeout_ms}
                                                          -> {base_offset, last_offset}
  load_commit {load_id, gen, attempts: [[p, a, batches, rows]]} -> {"load": {...}}
  load_abort  {load_id, gen, reason}                      -> {"load": {...}}
  load_status {load_id}                                   -> {"load": {...} | None}
"""

from __future__ import annotations

import itertools
import logging
import random
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from raft.protocol.blocking import FrameSocket, connect
from raft.protocol.errors import may_retry
from raft.protocol.framing import WireError
from raft.protocol.hello import HelloReply
from raft.protocol.load_requests import LoadAbort, LoadBegin, LoadCommit, LoadStage, LoadStatus
from raft.protocol.requests import DEFAULT_TOPIC, Fetch, RawRequest, Status, acks_named
from raft.protocol.topic_requests import Metadata
from sparkio.security import ConnSecurity

log = logging.getLogger("sparkio.staging")


class RaftlogError(Exception):
    """An error reply (code = raft.core.types.ErrorCode name) or the deadline passing."""

    def __init__(self, code: str, message: str, reply: dict | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.reply = code, message, reply or {}


class LoadClosed(RaftlogError):
    """The load is committed, aborted or was restarted by a newer run: stop writing."""


def parse_servers(servers: str | list[str]) -> list[str]:
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out = [s.strip() for s in items if s.strip()]
    if not out:
        raise ValueError("no servers given: pass option servers='host:port,host:port'")
    for s in out:
        host, _, port = s.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"bad server address {s!r}: expected host:port")
    return out


class _Conn:
    def __init__(self, addr: str, timeout: float, security: ConnSecurity | None = None) -> None:
        security = security or ConnSecurity()
        host = addr.rpartition(":")[0]
        self.addr = addr
        sock = connect(addr, timeout)
        try:
            self.frames = FrameSocket(security.wrap(sock, host.strip("[]")), addr)
            self.frames.send(security.hello().to_frame())
            hello = self.frames.receive()
        except ssl.SSLCertVerificationError as e:
            sock.close()
            # Not retried: every node would fail the same way.
            raise RaftlogError("TLS_ERROR", f"{addr}: the node's certificate is not trusted "
                                            f"({e.verify_message}); check option tlsCa") from None
        except ssl.SSLError as e:
            sock.close()
            raise RaftlogError("TLS_ERROR", f"{addr}: TLS failed ({e.reason or e}); check "
                                            f"options tlsCa/tlsCert/tlsKey and that the "
                                            f"cluster runs with TLS") from None
        except WireError as e:
            sock.close()
            raise ConnectionError(f"{addr} answered the hello with a bad frame: {e}") from None
        except BaseException:
            sock.close()
            raise
        if hello.get("t") == "error" and hello.get("code") == "UNAUTHENTICATED":
            self.close()
            raise RaftlogError("UNAUTHENTICATED", str(hello.get("message")), hello)
        try:
            HelloReply.parse(hello)
        except WireError:
            self.close()
            raise ConnectionError(f"{addr} answered the hello with {hello!r}") from None

    def send(self, obj: dict) -> None:
        self.frames.send(obj)

    def recv(self) -> dict:
        try:
            obj = self.frames.receive()
        except WireError as e:  # a frame we cannot read: this connection is done
            raise ConnectionError(f"{self.addr} sent a bad frame: {e}") from None
        if obj.get("t") == "error":
            raise ConnectionError(f"{self.addr} rejected our frame: {obj.get('message')}")
        return obj

    def close(self) -> None:
        self.frames.close()


@dataclass(slots=True)
class _Pending:
    req: LoadStage
    id: int


class Session:
    """One connection to the current leader (or any node for reads), re-established as needed."""

    def __init__(self, servers: str | list[str], timeout_s: float = 60.0,
                 io_timeout_s: float = 30.0, security: ConnSecurity | None = None) -> None:
        self.servers = parse_servers(servers)
        self.security = security or ConnSecurity()
        self.timeout_s = timeout_s
        self.io_timeout_s = io_timeout_s
        self._conn: _Conn | None = None
        self._hint: str | None = None
        self._ids = itertools.count(1)
        self._rr = random.Random().randrange(len(self.servers))

    # -- connection management ---------------------------------------------------------------
    def _connect(self, deadline: float) -> _Conn:
        if self._conn is not None:
            return self._conn
        last: Exception | None = None
        attempt = 0
        while time.monotonic() < deadline:
            addr = self._hint or self.servers[self._rr % len(self.servers)]
            self._hint = None
            self._rr += 1
            try:
                self._conn = _Conn(addr, min(self.io_timeout_s, max(0.1, deadline -
                                                                     time.monotonic())),
                                   self.security)
                return self._conn
            except OSError as e:
                last = e
                attempt += 1
                if attempt % len(self.servers) == 0:
                    time.sleep(min(1.0, 0.05 * attempt))
        raise RaftlogError("TIMEOUT", f"could not connect to any of {self.servers}: {last}; "
                                      f"check the servers option and that the cluster is up")

    def _drop(self, hint: str | None = None) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._hint = hint

    def close(self) -> None:
        self._drop()

    # -- single requests ---------------------------------------------------------------------
    def call(self, request: Any, timeout_s: float | None = None) -> dict:
        """Send one request, follow the leader and retry retriable errors until the deadline.
        `request` is one of raft.protocol's typed requests (they own the field names); a raw
        map with its "t" is for a request that has no type (a test's)."""
        if isinstance(request, dict):
            fields = dict(request)
            request = RawRequest(fields.pop("t"), fields)
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        backoff = 0.02
        while True:
            try:
                conn = self._connect(deadline)
                rid = next(self._ids)
                conn.send(request.to_frame(rid))
                while True:
                    reply = conn.recv()
                    if reply.get("id") == rid:
                        break
                if reply.get("ok"):
                    return reply
                err = reply.get("error") or {}
                code = str(err.get("code"))
                if code == "LOAD_CLOSED":
                    raise LoadClosed(code, str(err.get("message")), reply)
                if not may_retry(code, idempotent=True):
                    raise RaftlogError(code, str(err.get("message")), reply)
                self._drop(err.get("leader_addr") if code == "NOT_LEADER" else None)
                last = RaftlogError(code, str(err.get("message")), reply)
            except (OSError, ConnectionError, ValueError) as e:
                self._drop()
                last = RaftlogError("TIMEOUT", f"connection problem: {e}")
            if time.monotonic() + backoff > deadline:
                raise RaftlogError(last.code, f"{last.message} (gave up after "
                                              f"{timeout_s or self.timeout_s:.0f}s)", last.reply)
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.5)

    # -- load operations -----------------------------------------------------------------------
    # `where` names the topic partition the load writes to ({"topic", "topic_partition"}); none:
    # the default topic's partition 0. A load is per partition: each has its own load table.
    def load_begin(self, load_id: str, **where: Any) -> dict:
        return self.call(LoadBegin(load_id, **where))["load"]

    def load_status(self, load_id: str, **where: Any) -> dict | None:
        return self.call(LoadStatus(load_id, **where)).get("load")

    def load_commit(self, load_id: str, gen: int,
                    attempts: list[tuple[int, int, int, int]], **where: Any) -> dict:
        return self.call(LoadCommit(load_id, gen, list(attempts), **where))["load"]

    def load_abort(self, load_id: str, gen: int, reason: str, **where: Any) -> dict:
        return self.call(LoadAbort(load_id, gen, reason, **where))["load"]

    def fetch(self, offset: int, max_bytes: int = 4 << 20, max_wait_ms: int = 0,
              topic: str = DEFAULT_TOPIC, partition: int = 0) -> dict:
        """Committed batches of one topic partition (the default topic's 0 unless named)."""
        return self.call(Fetch(offset, max_bytes, max_wait_ms, topic=topic,
                               partition=partition))

    def status(self) -> dict:
        return self.call(Status())["status"]


def topic_partitions(session: Session, topic: str) -> int:
    """How many partitions `topic` has (ValueError naming the topics that exist)."""
    reply = session.call(Metadata())
    names = {t["name"]: len(t.get("partitions") or []) for t in reply.get("topics") or []}
    if topic not in names:
        raise ValueError(f"no topic {topic!r}; the cluster has "
                         f"{', '.join(sorted(names)) or 'none'} (raftlog topic list)")
    return names[topic]


class Stager:
    """Pipelined staged writes of one task attempt. `send` numbers batches 0, 1, 2, ...;
    `finish` waits for every acknowledgement and returns how many batches were sent."""

    def __init__(self, session: Session, load_id: str, gen: int, partition: int, attempt: int,
                 acks: str = "leader", max_inflight: int = 4, topic: str = DEFAULT_TOPIC,
                 topic_partition: int = 0) -> None:
        self.s = session
        self.topic, self.topic_partition = topic, topic_partition
        self.load_id, self.gen, self.partition, self.attempt = load_id, gen, partition, attempt
        self.acks = acks_named(acks)
        self.max_inflight = max_inflight
        self.seq = 0
        self._inflight: deque[_Pending] = deque()

    def send(self, payload: bytes, count: int) -> None:
        # No timestamp: the leader's clock stamps staged batches (raft/node/load_service.py).
        req = LoadStage(self.load_id, self.gen, self.partition, self.attempt, self.seq, count,
                        payload, self.acks, topic=self.topic,
                        topic_partition=self.topic_partition)
        self.seq += 1
        while len(self._inflight) >= self.max_inflight:
            self._await_one()
        self._inflight.append(_Pending(req, 0))
        self._transmit(self._inflight[-1])

    def finish(self) -> int:
        while self._inflight:
            self._await_one()
        return self.seq

    def _transmit(self, p: _Pending) -> None:
        deadline = time.monotonic() + self.s.timeout_s
        try:
            conn = self.s._connect(deadline)
            p.id = next(self.s._ids)
            conn.send(p.req.to_frame(p.id))
        except (OSError, ConnectionError) as e:
            self.s._drop()
            p.id = 0  # resent by _await_one
            log.debug("stage send failed err=%s", e)

    def _resend_all(self, hint: str | None, why: str) -> None:
        self.s._drop(hint)
        log.info("staging reconnect reason=%s inflight=%d", why, len(self._inflight))
        for p in self._inflight:
            self._transmit(p)

    def _await_one(self) -> None:
        deadline = time.monotonic() + self.s.timeout_s
        backoff = 0.02
        while True:
            head = self._inflight[0]
            if time.monotonic() > deadline:
                raise RaftlogError("TIMEOUT", f"staged batch seq={head.req.seq} not "
                                              f"acknowledged within {self.s.timeout_s:.0f}s")
            if head.id == 0 or self.s._conn is None:
                time.sleep(backoff)
                backoff = min(backoff * 2, 0.5)
                self._resend_all(None, "no connection")
                continue
            try:
                reply = self.s._conn.recv()
            except (OSError, ConnectionError, ValueError) as e:
                self._resend_all(None, f"connection: {e}")
                continue
            p = next((x for x in self._inflight if x.id == reply.get("id")), None)
            if p is None:
                continue  # a reply to a request we already resent elsewhere
            if reply.get("ok"):
                self._inflight.remove(p)
                if p is head:
                    return
                continue
            err = reply.get("error") or {}
            code = str(err.get("code"))
            if code == "LOAD_CLOSED":
                raise LoadClosed(code, str(err.get("message")), reply)
            if not may_retry(code, idempotent=True):
                raise RaftlogError(code, str(err.get("message")), reply)
            time.sleep(backoff)
            backoff = min(backoff * 2, 0.5)
            self._resend_all(err.get("leader_addr") if code == "NOT_LEADER" else None, code)

