"""The cluster's identity: which cluster a node's data belongs to, checked at every peer connect.

Raft assumes every node it talks to holds data of the same cluster. A node started on another
cluster's data directory (a wrong --data-dir) or pointed at another cluster's nodes (wrong
--peers) would otherwise take part: its log "conflicts" with the leader's, and a follower
truncates committed entries, or a foreign vote elects a leader. So every cluster has an id (128
random bits, hex), every node keeps it with its metadata (Meta.extra, so data directories of older
versions still open), and both sides of a peer connection compare ids in the hello: two nodes
that know different ids refuse each other before a single Raft message passes, and say so on
both sides, naming both ids and what to do.

Where the id comes from, so that all founding nodes agree on one:
- The lowest-numbered voter of --peers (not --join), starting on an empty data directory, mints a
  *tentative* id; it is saved with the first metadata save, which precedes any answer it sends.
- The other nodes of a brand-new cluster take the tentative id from that founder (its hello or its
  hello reply). A brand-new cluster elects no leader until every founder has answered every
  other's bootstrap probe or probed it (raft/core/incarnation.py), and the founder's answers and
  probes travel on its own connection, opened with a hello carrying its id: so every founder has
  its id before it counts the cluster as new.
- A node whose standing becomes `member` makes its tentative id *firm* (saved). From then on it
  refuses any peer with another firm id.
- A node without a firm id (an empty directory that lost its disk, a --join node, a directory of
  a version before cluster ids) adopts the firm id of the first peer it hears, and logs that.
  A cluster whose directories all predate cluster ids has none (compatible with any peer), and
  so no refusal either; docs/DESIGN.md says so.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("raftlog.node")

ID_KEY = "cluster_id"
FIRM_KEY = "cluster_id_firm"
MAX_REMEMBERED = 64  # refused peers kept for status and log counting
# In the refusal a node sends a peer it does not know; the refused side looks for it.
NOT_MEMBER_MARK = "is not a member of the cluster"


class IdState(enum.StrEnum):
    UNKNOWN = "unknown"
    TENTATIVE = "tentative"
    FIRM = "firm"


@dataclass(slots=True, frozen=True)
class Refusal:
    """Why a peer connection was refused (shown by `status` until a connect succeeds)."""

    peer_id: int
    message: str
    not_member: bool = False  # the peer refused us: this node is not a member


def not_member_message(node_id: int, peer_id: int, members: list[int]) -> str:
    return (f"node {peer_id} is not a peer of node {node_id}: it {NOT_MEMBER_MARK} "
            f"(members known to node {node_id}: {members}); "
            f"add it with `raftlog add-node --id {peer_id} --address HOST:PORT` (its "
            f"--listen address), or fix the --peers it was started with")


def new_cluster_id() -> str:
    return os.urandom(16).hex()


def mismatch_message(node_id: int, ours: str, peer_id: int, theirs: str) -> str:
    return (f"node {peer_id} belongs to cluster {theirs}, node {node_id} to cluster {ours}: "
            f"they hold data of different clusters and never talk. Check --data-dir and "
            f"--peers of the node that is wrong; to reuse its data directory for this cluster, "
            f"stop it, wipe the directory and start it again (it then joins as a new disk)")


class ClusterIdentity:
    """One node's view of its cluster id; the server and the peer links ask it at each hello.
    `save` asks the runtime to persist `extra` (the metadata's extra map) soon."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.cluster_id: str | None = None
        self.state = IdState.UNKNOWN
        self._founder: int | None = None  # the node whose tentative id founders take
        self._extra: dict | None = None
        self._save: Callable[[], None] = lambda: None
        self.refusals: dict[int, Refusal] = {}  # peer -> why its connection was refused
        self._logged: dict[tuple[int, str], int] = {}

    def load(self, extra: dict, *, fresh: bool, founder: int | None,
             save: Callable[[], None]) -> None:
        """From the metadata just loaded. `fresh`: an empty data directory; `founder`: the
        lowest voter of --peers (None for a --join node)."""
        self._extra, self._save, self._founder = extra, save, founder
        cid = extra.get(ID_KEY)
        if isinstance(cid, str) and cid:
            self.cluster_id = cid
            self.state = IdState.FIRM if extra.get(FIRM_KEY) else IdState.TENTATIVE
        elif fresh and founder == self.node_id:
            self._set(new_cluster_id(), IdState.TENTATIVE)
        log.info("cluster_id node=%d id=%s state=%s", self.node_id, self.cluster_id,
                 self.state.value)

    def _set(self, cid: str, state: IdState) -> None:
        self.cluster_id, self.state = cid, state
        if self._extra is not None:
            self._extra[ID_KEY] = cid
            self._extra[FIRM_KEY] = state is IdState.FIRM
        self._save()

    # -- the hello ---------------------------------------------------------------------------------
    def hello_fields(self) -> tuple[str | None, bool]:
        return self.cluster_id, self.state is IdState.FIRM

    def heard(self, peer_id: int, cid: str | None, firm: bool) -> str | None:
        """A peer's hello (or hello reply) said it belongs to `cid`: None to go on (adopting
        that id when this node has none firm), or why the connection must be refused."""
        if not cid:
            return None  # a node of an older version, or one that has no id yet
        if self.state is IdState.FIRM:
            if firm and cid != self.cluster_id:
                assert self.cluster_id is not None
                return mismatch_message(self.node_id, self.cluster_id, peer_id, cid)
            return None
        if firm:
            log.warning("cluster_id_adopted node=%d id=%s from=%d previous=%s: this data "
                        "directory now belongs to cluster %s", self.node_id, cid, peer_id,
                        self.cluster_id or "none", cid)
            self._set(cid, IdState.FIRM)
        elif peer_id == self._founder and cid != self.cluster_id:
            self._set(cid, IdState.TENTATIVE)
        return None

    def became_member(self) -> None:
        """The node's standing is `member`: a tentative id is the cluster's for good."""
        if self.state is IdState.TENTATIVE and self.cluster_id is not None:
            self._set(self.cluster_id, IdState.FIRM)
            log.info("cluster_id_firm node=%d id=%s", self.node_id, self.cluster_id)

    # -- refusals, for the log and `status` ---------------------------------------------------------
    def refused(self, peer_id: int, message: str, *, by_us: bool,
                not_member: bool = False) -> None:
        """A peer connection was refused (by us, or by the peer): logged (the first time and
        every 100th), shown by status until a connect with that peer succeeds."""
        # Bounded: any connection can claim any node id in its hello.
        self.refusals.pop(peer_id, None)
        self.refusals[peer_id] = Refusal(peer_id, message, not_member and not by_us)
        while len(self.refusals) > MAX_REMEMBERED:
            del self.refusals[next(iter(self.refusals))]
        key = (peer_id, message)
        n = self._logged.pop(key, 0) + 1
        self._logged[key] = n
        while len(self._logged) > MAX_REMEMBERED:
            del self._logged[next(iter(self._logged))]
        if n == 1 or n % 100 == 0:
            log.error("peer_refused node=%d peer=%d by=%s times=%d: %s", self.node_id,
                      peer_id, "us" if by_us else "peer", n, message)

    def connected(self, peer_id: int) -> None:
        self.refusals.pop(peer_id, None)

    def status(self) -> dict:
        out: dict = {"cluster_id": self.cluster_id, "cluster_id_state": self.state.value}
        if self.refusals:
            out["refused_peers"] = {str(k): r.message for k, r in sorted(self.refusals.items())}
        if any(r.not_member for r in self.refusals.values()):
            out["not_member"] = next(r.message for r in self.refusals.values() if r.not_member)
        return out
