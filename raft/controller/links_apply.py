"""Applying the link commands (link_commands.py) to the metadata: a mixin of ClusterMetadata.

As for every command, the verdict comes from the state and the command alone, the same on
every node; a refused command changes nothing. CreateLink is all or nothing: every mirror
topic is checked before any is created.
"""

from __future__ import annotations

from typing import Any

from raft.controller.command_fields import topic_name_error
from raft.controller.commands import CreateTopic
from raft.controller.link_commands import (CreateLink, DeleteLink, LinkEvent, PauseLink,
                                           PromoteTopic, ResumeLink)
from raft.controller.links import Gaps, Link, LinkState, Origin, link_name_error
from raft.controller.results import ApplyResult, Refusal, _refused


class LinkApply:
    """The link handlers of ClusterMetadata (state.py), which supplies `links`, `topics`,
    `_create_topic`, `_assignment_error` and `_unknown_topic`."""

    __slots__ = ()
    links: dict[str, Link]
    topics: dict[str, Any]

    def _unknown_link(self, name: str) -> ApplyResult:
        known = ", ".join(sorted(self.links)) or "none"
        return _refused(Refusal.UNKNOWN_LINK, f"no link named {name!r} (links: {known}); "
                                              f"`raftlog link list` shows them")

    def _create_link(self, offset: int, cmd: CreateLink) -> ApplyResult:
        why = link_name_error(cmd.name)
        if why is not None:
            return _refused(Refusal.INVALID_NAME, why)
        if cmd.name in self.links:
            return _refused(Refusal.LINK_EXISTS, f"link {cmd.name!r} exists; delete it first "
                                                 f"or choose another name")
        names = [m.name for m in cmd.mirrors]
        sources = [m.source_topic for m in cmd.mirrors]
        if len(set(names)) != len(names) or len(set(sources)) != len(sources):
            return _refused(Refusal.INVALID_NAME, f"link {cmd.name!r} names a topic twice; "
                                                  f"give each source topic once")
        for m in cmd.mirrors:
            why = topic_name_error(m.name)
            if why is not None:
                return _refused(Refusal.INVALID_NAME, f"mirror topic: {why}")
            if m.name in self.topics:
                return _refused(Refusal.TOPIC_EXISTS,
                                f"topic {m.name!r} exists on this cluster, so it cannot be the "
                                f"mirror of {m.source_topic!r}; use --prefix P to mirror it "
                                f"as P{m.source_topic}, or delete the topic first")
            err = self._assignment_error(m.replicas, m.name, 0)  # type: ignore[attr-defined]
            if err is not None:
                return err
        effects = []
        for m in cmd.mirrors:
            result = self._create_topic(offset, CreateTopic(m.name, m.replicas))  # type: ignore
            assert result.ok, result.reason  # checked above, on the same state
            topic = self.topics[m.name]
            topic.origin = Origin(cmd.name, cmd.source_cluster_id, m.source_topic)
            topic.mirror_active = True
            effects.extend(result.effects)
        self.links[cmd.name] = Link(cmd.name, cmd.source_servers, cmd.source_cluster_id,
                                    {m.source_topic: m.name for m in cmd.mirrors},
                                    LinkState.ACTIVE, cmd.tls_ca_pem, cmd.token,
                                    cmd.created_ms, offset)
        return ApplyResult(effects=tuple(effects))

    def _delete_link(self, offset: int, cmd: DeleteLink) -> ApplyResult:
        if self.links.pop(cmd.name, None) is None:
            return self._unknown_link(cmd.name)
        return ApplyResult()

    def _pause_link(self, offset: int, cmd: PauseLink) -> ApplyResult:
        return self._set_link_state(cmd.name, LinkState.PAUSED)

    def _resume_link(self, offset: int, cmd: ResumeLink) -> ApplyResult:
        return self._set_link_state(cmd.name, LinkState.ACTIVE)

    def _set_link_state(self, name: str, state: LinkState) -> ApplyResult:
        link = self.links.get(name)
        if link is None:
            return self._unknown_link(name)
        link.state = state
        return ApplyResult()

    def _promote_topic(self, offset: int, cmd: PromoteTopic) -> ApplyResult:
        topic = self.topics.get(cmd.name)
        if topic is None:
            return self._unknown_topic(cmd.name)  # type: ignore[attr-defined,no-any-return]
        if topic.origin is None:
            return _refused(Refusal.NOT_A_MIRROR, f"topic {cmd.name!r} is not a mirror (it has "
                                                  f"no origin); it is writable already")
        if not topic.mirror_active:
            return _refused(Refusal.NOT_A_MIRROR, f"topic {cmd.name!r} was promoted already; "
                                                  f"it is writable")
        topic.mirror_active = False
        return ApplyResult()

    def _link_event(self, offset: int, cmd: LinkEvent) -> ApplyResult:
        link = self.links.get(cmd.link)
        if link is None:
            return self._unknown_link(cmd.link)
        topic = self.topics.get(cmd.topic)
        if topic is None or topic.origin is None or topic.origin.link != cmd.link:
            return _refused(Refusal.NOT_A_MIRROR, f"topic {cmd.topic!r} is not a mirror of "
                                                  f"link {cmd.link!r}")
        if cmd.partition >= len(topic.partitions):
            return _refused(Refusal.UNKNOWN_PARTITION,
                            f"topic {cmd.topic!r} has partitions 0..{len(topic.partitions) - 1}"
                            f", not {cmd.partition}")
        link.gaps.setdefault((cmd.topic, cmd.partition), Gaps()).add(cmd.gap_from, cmd.gap_to)
        return ApplyResult()


def _by_name(name: str) -> Any:
    """A handler that looks the method up at call time (a patched method is the one called:
    tests/raft/test_mutants.py switches rules off this way)."""
    return lambda meta, offset, command: getattr(meta, name)(offset, command)


LINK_HANDLERS = {
    CreateLink: _by_name("_create_link"),
    DeleteLink: _by_name("_delete_link"),
    PauseLink: _by_name("_pause_link"),
    ResumeLink: _by_name("_resume_link"),
    PromoteTopic: _by_name("_promote_topic"),
    LinkEvent: _by_name("_link_event"),
}
