"""Addresses a client dials instead of the ones a cluster advertises (behind NAT, through a
proxy or a port forward).

A cluster's nodes advertise their addresses in `metadata` and in NOT_LEADER hints, and a
client follows them: a client that can reach the cluster only at other addresses would dial
the advertised ones and fail, or go around the proxy it was meant to use. An address map
says, per advertised address, where to dial it. The router keeps working in advertised
addresses (leaders, redirects, the metadata cache); only the TCP connect goes elsewhere, and
TLS still checks the certificate against the advertised host (the name the node's
certificate carries).

It is written in a server list as `ADVERTISED=HOST:PORT` entries (`raftlog link create
--source`, docs/REPLICATION.md); a plain `HOST:PORT` entry is dialled as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from raft.node.config import ConfigError, parse_address


def split_servers(entries: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(the addresses to dial first, advertised -> dialled) from `HOST:PORT` and
    `ADVERTISED=HOST:PORT` entries; ConfigError names a malformed entry."""
    servers: list[str] = []
    mapping: dict[str, str] = {}
    for entry in entries:
        advertised, sep, dial = entry.strip().partition("=")
        if not sep:
            dial = advertised
        for part, what in ((advertised, "advertised address"), (dial, "address")):
            parse_address(part.strip(), what=f"{what} in {entry!r}")
        advertised, dial = advertised.strip(), dial.strip()
        if sep:
            if mapping.get(advertised, dial) != dial:
                raise ConfigError(f"{advertised} is mapped twice ({mapping[advertised]} and "
                                  f"{dial}); give one ADVERTISED=HOST:PORT per address")
            mapping[advertised] = dial
        if dial not in servers:
            servers.append(dial)
    if not servers:
        raise ConfigError("no servers given: pass HOST:PORT[,HOST:PORT...] (or "
                          "ADVERTISED=HOST:PORT entries), e.g. 127.0.0.1:7101")
    return servers, mapping


__all__ = ["split_servers"]
