"""`raftlog link list|describe` read the links from the controller's leader: any node answers
`link_list` from the controller state it applied, and one still catching up (a node just
restarted) lacks links the cluster has (CI saw `no link named 'dr'` from such a node)."""

from __future__ import annotations

import argparse
from typing import Any

import trio

from raft.cli.link_cmd import _links
from raft.client.errors import UnavailableError


class StubSink:
    """A Client whose nodes disagree: node A (behind) has no link, the controller's leader B
    has it. Records which server each call went to."""

    def __init__(self, leader_answers: bool = True) -> None:
        self.calls: list[str | None] = []
        self.leader_answers = leader_answers

    async def cluster_metadata(self) -> Any:
        return argparse.Namespace(controller_address="B")

    async def call(self, request: Any, *, server: str | None = None, **kw: Any) -> dict:
        self.calls.append(server)
        if server == "B":
            if not self.leader_answers:
                raise UnavailableError("B is down")
            return {"links": [{"name": "dr"}], "mirrors": []}
        return {"links": [], "mirrors": []}  # any node: here the one that is behind


def test_the_links_come_from_the_controllers_leader_and_any_node_when_it_cannot_answer() -> None:
    args = argparse.Namespace(timeout=5.0)
    sink = StubSink()
    reply = trio.run(_links, sink, args)
    assert [ln["name"] for ln in reply["links"]] == ["dr"] and sink.calls == ["B"]
    down = StubSink(leader_answers=False)
    reply = trio.run(_links, down, args)
    assert reply["links"] == [] and down.calls == ["B", None]
