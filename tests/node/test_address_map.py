"""The address map of a server list (raft/client/address_map.py): `ADVERTISED=HOST:PORT`
entries say where to dial an address a cluster advertises; plain entries are dialled as
given."""

from __future__ import annotations

import pytest

from raft.client.address_map import split_servers
from raft.node.config import ConfigError


def test_entries_give_the_seeds_and_the_map() -> None:
    servers, mapping = split_servers(["n1:7101=127.0.0.1:9001", "10.0.0.2:7101",
                                      "n3:7101=127.0.0.1:9003"])
    assert servers == ["127.0.0.1:9001", "10.0.0.2:7101", "127.0.0.1:9003"]
    assert mapping == {"n1:7101": "127.0.0.1:9001", "n3:7101": "127.0.0.1:9003"}


@pytest.mark.parametrize("entries, says", [
    (["n1:7101=nowhere"], "HOST:PORT"),
    (["n1=127.0.0.1:9001"], "HOST:PORT"),
    (["n1:1=127.0.0.1:2", "n1:1=127.0.0.1:3"], "mapped twice"),
    ([], "no servers"),
])
def test_a_malformed_entry_is_named(entries: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        split_servers(entries)
