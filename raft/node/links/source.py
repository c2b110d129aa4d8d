"""One client per link to the source cluster, shared by the link's pullers on this node.

The link's TLS CA arrives as PEM text in the metadata; the client reads a file, so it is
written under the node's directory (`links/<name>.ca.pem`). A link whose servers, CA or token
changed (deleted and created again under the same name) gets a new client.

The link's servers may carry an address map (`ADVERTISED=HOST:PORT` entries,
raft/client/address_map.py): the source's nodes advertise addresses the sink may not reach
(NAT, a proxy), and the client dials the mapped ones for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raft.client.address_map import split_servers
from raft.client.client import Client
from raft.controller.links import Link

SOURCE_TIMEOUT_S = 10.0


class SourceClients:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._clients: dict[str, tuple[tuple[Any, ...], Client]] = {}

    def client(self, link: Link) -> Client:
        key = (link.source_servers, link.tls_ca_pem, link.token, link.created_at)
        held = self._clients.get(link.name)
        if held is not None and held[0] == key:
            return held[1]
        client = self.make(link)
        self._clients[link.name] = (key, client)
        return client

    def make(self, link: Link) -> Client:
        """A new client to the link's source, not kept here (the caller closes it)."""
        ca = None
        if link.tls_ca_pem:
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"{link.name}.ca.pem"
            path.write_text(link.tls_ca_pem)
            ca = str(path)
        servers, address_map = split_servers(link.source_servers)
        return Client(servers, timeout=SOURCE_TIMEOUT_S, tls_ca=ca,
                      token=link.token or None, retry_refused=True, address_map=address_map)

    async def forget_except(self, names: set[str]) -> None:
        """Close the clients of links that are gone."""
        for name in [n for n in self._clients if n not in names]:
            _, client = self._clients.pop(name)
            await client.aclose()

    async def aclose(self) -> None:
        await self.forget_except(set())
