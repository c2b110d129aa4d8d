"""The trio node: serves peers and clients on one port and runs its Raft groups.

One trio program per node. What is whose:
- here, the node: its lifecycle (start, graceful stop, abort), the listener (peers and clients
  on the same address; the first frame, `hello`, says which), peer frames handed to the group
  registry, client connections handed to raft.node.client_requests (each connection's request
  loop: pipelining limit, backpressure, routing each request to its group and handler); adding and
  removing groups at run time (`add_group` / `remove_group`, what the controller's reconciler
  calls). Node-level, whatever the number of groups: the event-loop lag monitor
  (raft.node.looplag), the metrics registry, the cluster identity (raft.node.identity, kept in
  the default topic's metadata and shared with the links);
- raft.node.registry.GroupRegistry: the groups by id, each group's tasks in a nursery of its own,
  the node's one ticker (every group ticks in the same step, so their heartbeats to a peer leave
  in one frame), and routing peer messages by their group id (unknown groups: dropped, counted);
- raft.node.group.RaftGroup: one Raft group's driver (Ready loop, the client requests waiting
  for the core's answers). From boot the node runs the controller (group 0,
  `node.controller_group`) and the default topic's partition (group 1, the store's legacy key
  space): `node.group`, `node.core` and `node.log` are the default topic's;
- raft.node.topic_runtime.TopicRuntime (`node.topics`): the controller's metadata, the
  reconciler that starts and stops partition groups, (topic, partition) routing;
- raft.node.transport.PeerTransport: the peer links (one per peer, carrying every group's
  messages) and the address book, which all of a node's groups share; the node keeps links to
  the union of what its groups' configurations name;
- raft.node.gate.Gate: what a connection passes before its hello is served (TLS, the peer's
  certificate, the client's authentication); the node checks each client request's permission
  with it before dispatch;
- raft.node.metrics.NodeMetrics: the node's Prometheus registry and `--metrics-listen` server;
- raft.node.serve: running a node as a program (`raftlog serve`, signals, logging).
"""

from __future__ import annotations

import functools
import logging
import os
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio

from raft.controller import section as controller_section
from raft.controller.state import NodeStatus
from raft.node import api, trace
from raft.node.config import ConfigError, NodeConfig, format_address
from raft.node.api.admin import status_map
from raft.node.api.fetch import visible_hw
from raft.node.auth import Session
from raft.node.client_requests import ClientRequests
from raft.node.connection_errors import discard_input, send_error, split_connection_errors
from raft.node.errors import NodeFailed
from raft.node.flusher import NodeFlusher
from raft.node.gate import Gate, remote_of
from raft.node.group import RaftGroup
from raft.node.identity import not_member_message
from raft.node.looplag import LoopLag
from raft.node.metrics import SUBSCRIPTION_SERIES_MAX, NodeMetrics
from raft.node.topic_settings import GroupSettings, SettingsInForce
from raft.node.peer import PeerLink
from raft.node.registry import GroupRegistry
from raft.node.scrub_scheduler import NodeScrubber
from raft.node.topic_runtime import DEFAULT_GROUP, TopicRuntime, partition_series
from raft.node.transport import PeerTransport
from raft.protocol.framing import FrameTooLarge, WireError, encode_frame
from raft.protocol.hello import CLIENT_HELLO_EXAMPLE, Hello, HelloReply, Speaker
from raft.protocol.raft_frames import messages_from_frame
from raft.protocol.requests import CONTROLLER_GROUP
from raft.protocol.streams import FrameReader
from raft.core.types import ErrorCode, Role
from recovery.budget import RecoveryBudget
from storage.api import IoMode, LogStorage

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("raftlog.node")

HELLO_TIMEOUT_S = 10.0


class Node:
    """One raftlog node. Start it with `await nursery.start(node.run)`; `node.address` is then
    the bound address (pass port 0 in `listen` to get a free port in tests)."""

    def __init__(self, config: NodeConfig, *, log_storage: LogStorage | None = None,
                 rng: random.Random | None = None,
                 before_serving: Callable[[], None] = lambda: None) -> None:
        self.config = config.validate()
        # The program's process-wide setup (raft.node.serve.tune_interpreter), run once the
        # node's state is loaded and before its tasks start: nobody waits on that step then.
        self._before_serving = before_serving
        self.node_id = config.node_id
        # One generator for the core and the links (each link draws its own from it).
        rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        self._rng = rng
        self.metrics = NodeMetrics()
        self.metrics.shard_info(config.shard, config.shards)  # docs/SHARDS.md
        self.gate = Gate(config, self.metrics)
        self.transport = PeerTransport(config, rng, tls=lambda: self.gate.tls)
        # One flusher for the node: group commit across its groups (raft.node.flusher).
        self.flusher = NodeFlusher(self.metrics)
        # One scrub task for the node: every group's log at one byte rate, several small logs
        # per worker-thread call (raft.node.scrub_scheduler).
        self.scrub_scheduler = NodeScrubber(config.scrub_rate, config.scrub_slice_kib * 1024)
        # One trio loop per node: one monitor, whatever the number of groups.
        # Its samples also feed the metrics histogram: one probe, not two timers.
        self.loop_lag = LoopLag(on_sample=self.metrics.loop_lag.observe)
        # The registry hears the node's failure detector (raft.node.liveness) and tells every
        # group's core; the transport owns the detector (its links ping).
        self.registry = GroupRegistry(self.node_id, self.metrics,
                                      liveness=self.transport.liveness)
        # Per-topic settings in force on each partition (retention, record size), read from
        # the controller metadata applied now (raft.node.topic_settings).
        self.settings = SettingsInForce(config.retention_policy(),
                                        lambda: self.topics.metadata, self.registry.groups)
        # Two groups from boot (issue 26): the default topic's partition, whose log is the
        # store's legacy key space (the data directory's unless a log is passed in; it keeps
        # the cluster id), and the controller, group 0, whose log comes from the same store.
        # Both take their voters from --peers (or join). `node.group`, `node.core` and
        # `node.log` are the default topic's.
        # One recovery budget for every group: at most recovery_streams followers caught up at
        # once and one byte rate (recovery/budget.py), on the node's tick clock.
        knobs, tick_ms = config.raft_kwargs(), config.tick_ms
        self.recovery_budget = RecoveryBudget(
            config.recovery_streams, knobs.get("recovery_rate_bytes_per_tick", 0),
            knobs.get("recovery_burst_bytes", 0), lambda: int(time.monotonic() * 1000) // tick_ms)
        self.group = self._new_group(DEFAULT_GROUP, log_storage, None, rng)
        self.group.keeps_identity = True
        self.group.metrics = self.metrics  # the node's role/term series are the default's
        self.controller_group = self._new_group(CONTROLLER_GROUP, None, None,
                                                random.Random(rng.getrandbits(64)))
        # The controller's log is cut like a partition's, by its own size limit
        # (--controller-retention-bytes), its metadata travelling in the state at the log start.
        self.controller_group.snapshot_sections = (controller_section.SECTION,)
        ctl_settings = GroupSettings(config.controller_retention_policy(), None)
        self.controller_group.settings_of = lambda: ctl_settings
        self.topics = TopicRuntime(self)
        # A node certificate authenticates only this cluster's nodes (raft.node.auth).
        self.gate.auth.members = self._cluster_members
        self.metrics_address: str | None = None  # where /metrics is served, once running
        self.api = self._context(self.group)
        self._running = False
        self._shutdown_requested = trio.Event()
        self._stopped = trio.Event()
        self.clients = ClientRequests(self)  # each client connection's request loop
        self._accept_scope: trio.CancelScope | None = None
        self._run_scope = trio.CancelScope()

    # -- making groups -----------------------------------------------------------------------------
    def _new_group(self, group_id: int, log_storage: LogStorage | None,
                   voters: list[int] | None, rng: random.Random) -> RaftGroup:
        group = RaftGroup(self.config, self.transport, log_storage=log_storage, rng=rng,
                          group_id=group_id, voters=voters)
        group.on_fatal = self.abort  # fail-stop is the process's, whichever group found it
        group.identity = self.transport.identity  # one cluster id, for links and groups
        group.on_membership_change = self._sync_links
        group.flusher = self.flusher
        group.recovery_budget = self.recovery_budget
        group.scrub_scheduler = self.scrub_scheduler
        if group_id != CONTROLLER_GROUP:  # a partition follows its topic's settings
            group.settings_of = functools.partial(self.settings.of, group_id)
        return group

    def _context(self, group: RaftGroup) -> api.ApiContext:
        return api.ApiContext(config=self.config, group=group, peers=self.transport,
                              loop_lag=self.loop_lag, cluster=getattr(self, "topics", None),
                              groups=self.registry.status)

    # -- groups at run time ------------------------------------------------------------------------
    async def add_group(self, group_id: int, voters: list[int], log_storage: LogStorage, *,
                        owns_log: bool = False, translated: bool = False) -> RaftGroup:
        """Start running Raft group `group_id` on this node, founded with `voters` (node ids;
        this node among them, or a learner added later through the group's log) on
        `log_storage` (its own log: the node's data directory holds group 0's). The group
        elects, replicates and serves client requests naming its id from now on; the node
        keeps links to its members. What the controller's reconciler calls for each replica
        it places here. `translated`: a mirror partition (raft.node.mirror_group), for good."""
        if not self._running or self._closing:
            raise RuntimeError(f"node {self.node_id} is not running: add groups once it has "
                               f"started (await nursery.start(node.run)) and before it stops")
        if group_id in self.registry:
            raise ValueError(f"group {group_id} already runs on node {self.node_id}")
        if log_storage is None:
            raise ValueError(f"group {group_id}: pass its log storage (the data directory "
                             f"holds group 0's log)")
        unknown = sorted(set(voters) - {self.node_id, *self.peer_addresses})
        if not voters or unknown:
            raise ValueError(f"group {group_id}: voters {sorted(voters)} must be a non-empty "
                             f"set of known nodes; unknown: {unknown}; known: "
                             f"{sorted({self.node_id, *self.peer_addresses})}")
        group = self._new_group(group_id, log_storage, list(voters),
                                random.Random(self._rng.getrandbits(64)))
        group.owns_log = owns_log  # the reconciler's groups: closed when removed
        group.translated = translated
        await group.open_log()
        group.start_core()
        self.registry.add(group_id, group, self._context(group))
        self._sync_links()
        log.info("group_added node=%d group=%d voters=%s", self.node_id, group_id,
                 sorted(voters))
        return group

    async def remove_group(self, group_id: int) -> None:
        """Stop running group `group_id` on this node: its tasks end (the node and its other
        groups go on), its waiting requests are answered SHUTTING_DOWN, its log is flushed
        (closed too if the group opened it), and peer messages and client requests for it are
        refused from now on. Group 0 is the node's own group and stops with the node."""
        if group_id in (CONTROLLER_GROUP, DEFAULT_GROUP):
            raise ValueError(f"group {group_id} (the controller, or the default topic's "
                             f"partition) runs as long as the node (request_shutdown)")
        group = await self.registry.remove(group_id)
        self.flusher.forget(group)  # its final flush below is its last
        try:
            if group.failure is None and group.log is not None:
                await group.final_flush()  # NodeFailed if the disk refuses it: the caller's
                if group.owns_log:
                    group.log.close()
        finally:
            self._sync_links()  # links follow the groups that remain
        log.info("group_removed node=%d group=%d", self.node_id, group_id)

    # -- the group and the peers, as tests and tools see them -------------------------------------
    @property
    def core(self) -> Any:
        return self.group.core

    @property
    def controller(self) -> RaftGroup:
        """The controller's group (group 0); its metadata is `node.topics.metadata`."""
        return self.controller_group

    @property
    def log(self) -> LogStorage | None:
        return self.group.log

    @property
    def loads(self) -> Any:
        """raft.node.load_service.LoadService once the log is open (None without one)."""
        return self.group.loads

    @property
    def address(self) -> str | None:
        return self.transport.address

    def _cluster_members(self) -> set[int]:
        """The node ids a node certificate may speak for here: the nodes registered active,
        those still holding a replica (a decommissioned node draining), and the Raft peers;
        not a retired node's. Asked only for requests of node sessions (gap reports)."""
        meta = self.topics.metadata
        out = {self.node_id, *self.peer_addresses}
        out.update(n for n, info in meta.nodes.items() if info.status is NodeStatus.ACTIVE)
        for partition in meta.groups.values():
            out.update(partition.replicas)
        return out

    @property
    def peer_addresses(self) -> dict[int, str]:
        return self.transport.peer_addresses

    @property
    def links(self) -> dict[int, PeerLink]:
        return self.transport.links

    @property
    def _closing(self) -> bool:
        return self.group.closing

    def is_leader(self) -> bool:
        return self.group.is_leader()

    # -- public control ----------------------------------------------------------------------------
    def request_shutdown(self) -> None:
        """Begin a graceful stop (what SIGTERM does); `run` returns when it is done."""
        self._shutdown_requested.set()

    def abort(self) -> None:
        """Stop at once without flushing (what SIGKILL does; tests pair it with
        MemoryLog.crash() to drop the unflushed tail)."""
        self._run_scope.cancel()

    def set_peer_address(self, peer_id: int, address: str) -> None:
        self.transport.set_peer_address(peer_id, address)

    def reload_security(self) -> None:
        """What SIGHUP does: re-read the auth file (tokens, permissions) and the TLS files.
        New connections use the new certificates; open connections keep theirs, but their
        permissions are looked up in the new table on every request."""
        self.gate.reload()

    def _metrics_state(self) -> dict[str, Any] | None:
        """The status map for a /metrics scrape (on the trio thread: see raft.node.metrics)."""
        if self.group.core is None or self.group.log is None:
            return None
        st = status_map(self.api)
        st["disk_full"] = self.group.disk_full
        if self.group.subs is not None:  # bounded per-subscription series (raft.node.metrics)
            st["subscription_lag"] = self.group.subs.lag_series(
                visible_hw(self.group), SUBSCRIPTION_SERIES_MAX)
        # Per-partition series, bounded (raft.node.topic_runtime.partition_series).
        st["partition_series"] = partition_series(self.topics, self.metrics.partition_series_max)
        st["mirror_pullers"] = self.topics.links.status()  # cross-cluster links (issue 30)
        core = self.group.core
        if core.role == Role.LEADER:  # bytes each follower acknowledged, for a rate()
            acked = {}
            for f in st.get("followers") or []:
                pr = core.progress(f["node_id"])
                acked[f["node_id"]] = pr.acked_bytes if pr is not None else 0
            st["acked_bytes"] = acked
        return st

    def peer_address(self, node_id: int | None) -> str | None:
        return self.transport.address_of(node_id)

    def _wanted_members(self) -> tuple[set[int], dict[int, str]]:
        """The nodes the node's groups need links to (the union of the members of their
        configurations in force) and the addresses those configurations carry."""
        members: set[int] = set()
        addresses: dict[int, str] = {}
        for group in self.registry.groups():
            cfg = group.membership()
            members.update(cfg.members)
            addresses.update(cfg.addresses)
        return members, addresses

    def _sync_links(self) -> None:
        """A group's configuration changed: links follow the union of what the groups need."""
        self.transport.sync_members(*self._wanted_members())

    # -- lifecycle ---------------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED) -> None:
        with self._run_scope:
            await self._run(task_status)
        failure = next((g.failure for g in (self.group, *self._all_groups())
                        if g.failure is not None), None)
        if failure is not None:
            raise NodeFailed(f"node {self.node_id} stopped: {type(failure).__name__}: "
                             f"{failure}") from failure

    def _all_groups(self) -> list[RaftGroup]:
        """Every group still registered (group 0 first)."""
        return list(self.registry.groups())

    async def _open_controller_log(self) -> None:
        """The controller's log, from the store the default topic's log lives in."""
        ctl = self.controller_group
        store = self.group.log.store
        if store.io_mode is IoMode.INLINE:
            ctl.log = store.open_log(CONTROLLER_GROUP)
        else:
            ctl.log = await trio.to_thread.run_sync(store.open_log, CONTROLLER_GROUP)
        ctl.owns_log = True
        await ctl.open_log()

    async def _run(self, task_status: trio.TaskStatus[Node]) -> None:
        group, ctl = self.group, self.controller_group
        await group.open_log()
        try:
            await self._open_controller_log()
            group.start_core()
            ctl.start_core()
            self.topics.controller.open()
            self.registry.add(CONTROLLER_GROUP, ctl, self._context(ctl))
            self.registry.add(DEFAULT_GROUP, group, self.api)
            host, port = self.config.listen_address
            try:
                listeners = await trio.open_tcp_listeners(port, host=host)
            except OSError as e:
                raise ConfigError(f"cannot listen on {format_address(host, port)}: "
                                  f"{e.strerror or e}; pick a free --listen address (or stop "
                                  f"the process using it)") from None
            bound = listeners[0].socket.getsockname()
            self.transport.address = format_address(host, bound[1])
            self.metrics.bind(self._metrics_state)
            if self.config.metrics_listen:
                self.metrics_address = self.metrics.start_http(self.config.metrics_listen)
            log.info("node_started node=%d address=%s peers=%s term=%d dirty=%d flushed=%d "
                     "tls=%s auth=%s metrics=%s cluster_id=%s(%s)", self.node_id, self.address,
                     self.peer_addresses, group.core.term, group.log.dirty_offset,
                     group.log.flushed_offset, self.gate.tls is not None,
                     self.gate.auth.enabled, self.metrics_address,
                     self.transport.identity.cluster_id or "none",
                     self.transport.identity.state.value)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.loop_lag.run)
                self.transport.start(nursery, *self._wanted_members())
                async with trio.open_nursery() as driver:
                    self._before_serving()
                    driver.start_soon(self.flusher.run)
                    driver.start_soon(self.scrub_scheduler.run)
                    # Each group's tasks in a nursery of its own, and the node's one ticker.
                    self.registry.attach(driver, self.config.tick_ms / 1000)
                    self._running = True
                    self.topics.start(driver)  # the controller, the reconciler
                    async with trio.open_nursery() as conn_nursery:
                        self._accept_scope = trio.CancelScope()
                        conn_nursery.start_soon(self.clients.hub.run)
                        conn_nursery.start_soon(self._accept, listeners, conn_nursery)
                        task_status.started(self)
                        await self._shutdown_requested.wait()
                        await self._graceful_stop()
                        conn_nursery.cancel_scope.cancel()
                    # Stopping the driver waits for a running save_meta/flush thread (those
                    # are not abandoned on cancel), so the final flushes below run alone.
                    driver.cancel_scope.cancel()
                for other in self._all_groups():  # the default last: it keeps the cluster id
                    if other is not group:
                        await other.final_flush()
                await group.final_flush()
                nursery.cancel_scope.cancel()
        finally:
            self._running = False
            with trio.CancelScope(shield=True):
                await self.metrics.stop_http()
            # The default's log last: opened from a data directory it owns the store.
            others = [g for g in dict.fromkeys([ctl, *self._all_groups()]) if g is not group]
            for other in [*others, group]:
                other.mark_closed()
                if other.owns_log and other.log is not None:
                    other.log.close()
            self._stopped.set()
            log.info("node_stopped node=%d", self.node_id)

    async def _accept(self, listeners: list[trio.SocketListener],
                      conn_nursery: trio.Nursery) -> None:
        assert self._accept_scope is not None
        with self._accept_scope:
            await trio.serve_listeners(self._handle_connection, listeners,
                                       handler_nursery=conn_nursery)

    async def _graceful_stop(self) -> None:
        """SIGTERM: stop accepting, hand leadership over (bounded), answer waiters."""
        log.info("node_stopping node=%d role=%s", self.node_id, self.core.role.value)
        assert self._accept_scope is not None
        self._accept_scope.cancel()  # closes the listeners
        groups = self._all_groups()
        async with trio.open_nursery() as handovers:  # each bounded; all at once
            for group in groups:
                handovers.start_soon(group.hand_over_leadership)
        for group in groups:
            group.begin_shutdown()
        with trio.move_on_after(2.0):
            await self.clients.idle.wait()

    # -- connections -------------------------------------------------------------------------------
    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        """One connection's task. Whatever goes wrong with one connection ends that connection
        only; a core invariant failure (AssertionError) or cancellation propagates (fail-stop)."""
        try:
            await self._connection(stream)
        except BaseException as exc:
            fatal = split_connection_errors(exc, self.node_id)
            if fatal is not None:
                raise fatal from None

    async def _connection(self, raw: trio.SocketStream) -> None:
        """Handshake, then serve the peer or the client; a frame that breaks the protocol
        gets an error frame and ends the connection."""
        conn = _Conn(raw)
        self.metrics.connections.labels(conn.role).inc()
        try:
            async with raw:
                try:
                    if await self._handshake(conn, remote_of(raw)):
                        await (self._serve_peer(conn) if conn.role == "peer"
                               else self.clients.serve(conn))
                except trio.TooSlowError:
                    if conn.stream is raw and self.gate.tls is not None:
                        return  # still in the TLS handshake: a frame would be garbage to it
                    await send_error(conn.stream, WireError(
                        f"no hello within {HELLO_TIMEOUT_S:.0f} s; open with "
                        f"{CLIENT_HELLO_EXAMPLE}"))
                except WireError as e:
                    log.info("bad_frame node=%d code=%s error=%s", self.node_id, e.code.name, e)
                    self.metrics.count_error(e.code.name)
                    await send_error(conn.stream, e)
                    if isinstance(e, FrameTooLarge):
                        await discard_input(conn.stream, e.size)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            self.metrics.connections.labels(conn.role).dec()

    async def _handshake(self, conn: _Conn, remote: str) -> bool:
        """The gate (TLS, certificates), the hello and its answer, within HELLO_TIMEOUT_S;
        False when the connection ended before a hello."""
        with trio.fail_after(HELLO_TIMEOUT_S):
            opened, identity = await self.gate.open(conn.stream)
            if opened is None:
                return False
            conn.stream = opened
            conn.reader = FrameReader(opened, self.config.max_frame_bytes)
            frame = await conn.reader.receive()
        if frame is None:
            return False
        hello = Hello.parse(frame)
        session = self._check_hello(hello, identity, remote)
        # The frame limit lets a client refuse an oversized request itself instead of having
        # it cut off mid-send.
        peer = hello.role is Speaker.PEER
        cluster = self.transport.identity.hello_fields() if peer else (None, False)
        reply = HelloReply(self.node_id, self.config.max_frame_bytes,
                           None if session is None else session.principal, *cluster,
                           boot=self.transport.liveness.boot_id if peer else None)
        await conn.stream.send_all(encode_frame(reply.to_frame()))
        self.metrics.connections.labels(conn.role).dec()
        conn.role, conn.session = hello.role.value, session
        conn.peer_id = hello.node_id or 0
        self.metrics.connections.labels(conn.role).inc()
        return True

    def _check_hello(self, hello: Hello, identity: Any, remote: str) -> Session | None:
        """Whether this speaker may go on: a peer must be a member (and, with TLS, hold its
        own certificate), a client must authenticate; the session of a client."""
        session = None
        if hello.role is Speaker.PEER:
            peer_id = hello.node_id
            assert peer_id is not None  # Hello.parse requires it of a peer
            self.gate.check_peer(peer_id, identity, remote)
            cluster = self.transport.identity
            if peer_id == self.node_id or peer_id not in self.peer_addresses:
                why = not_member_message(self.node_id, peer_id,
                                         sorted({*self.peer_addresses, self.node_id}))
                if self.gate.tls is not None:
                    log.warning("peer_refused node=%d remote=%s claimed=%d: not a member",
                                self.node_id, remote, peer_id)
                cluster.refused(peer_id, why, by_us=True, not_member=True)
                raise WireError(why)
            problem = cluster.heard(peer_id, hello.cluster_id, hello.cluster_firm)
            if problem is not None:
                # Another cluster's node: not one Raft message from it (it could make a
                # follower truncate committed entries, or elect a foreign leader).
                cluster.refused(peer_id, problem, by_us=True)
                raise WireError(problem)
            cluster.connected(peer_id)
            # A new boot id: it restarted, however fast (raft/node/liveness.py).
            self.transport.liveness.peer_booted(peer_id, hello.boot)
            # It reaches us: our link to it need not wait out its backoff (raft/node/peer.py).
            self.transport.heard_from(peer_id)
        else:
            session = self.gate.authenticate(hello.token, identity, remote)
        if self._closing:
            raise WireError("node is shutting down; connect to another node",
                            code=ErrorCode.SHUTTING_DOWN)
        return session

    async def _serve_peer(self, conn: _Conn) -> None:
        assert conn.reader is not None
        while (frame := await conn.reader.receive()) is not None:
            if frame["t"] != "raft":
                raise WireError(f'peer connections carry only "raft" frames, got '
                                f'{frame["t"]!r}')
            items = messages_from_frame(frame)
            self.transport.heard_from(conn.peer_id)
            if trace.ENABLED:
                trace.frame_read(items, conn.peer_id, "read")
            if self.core is not None and not self._closing:
                await self.registry.deliver_frame(items, from_peer=conn.peer_id)
                if trace.ENABLED:
                    trace.frame_read(items, conn.peer_id, "stepped")
                # The time spent stepping its frame (in slices, behind our run queue) is ours,
                # not the peer's silence: its next frame may wait unread in the socket.
                self.transport.liveness.heard(conn.peer_id)

@dataclass(slots=True, eq=False)
class _Conn:
    """One connection, as far as its handshake got."""

    stream: trio.abc.Stream
    reader: FrameReader | None = None
    role: str = "handshake"  # then "peer" or "client"
    peer_id: int = 0
    session: Session | None = None
    auth: Any = None  # the gate's authenticator while serving a client
    send_lock: trio.Lock = field(default_factory=trio.Lock)  # replies are written whole
