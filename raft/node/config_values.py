"""Parsing single setting values (addresses, peer lists, sizes, durations, booleans) and the
error every bad value raises: the pieces of raft/node/config.py that know nothing of the
dataclass."""

from __future__ import annotations

import argparse
import difflib
from typing import Any


class ConfigError(ValueError):
    """A setting is wrong; the message names it and says what to write instead."""


def parse_address(text: str, *, what: str = "address", allow_port_zero: bool = True) -> tuple[str, int]:
    """'host:port' (or '[v6]:port') -> (host, port)."""
    if not isinstance(text, str) or ":" not in text:
        raise ConfigError(f"{what} {text!r} must look like HOST:PORT, e.g. 127.0.0.1:7101")
    host, _, port_s = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ConfigError(f"{what} {text!r} has no host; write HOST:PORT, e.g. 127.0.0.1:7101")
    try:
        port = int(port_s)
    except ValueError:
        raise ConfigError(f"{what} {text!r} has a non-numeric port {port_s!r}; write HOST:PORT, "
                          f"e.g. 127.0.0.1:7101") from None
    lo = 0 if allow_port_zero else 1
    if not lo <= port <= 65535:
        raise ConfigError(f"{what} {text!r}: port must be in {lo}..65535")
    return host, port


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_peers(spec: str | dict[Any, Any]) -> dict[int, str]:
    """'1=HOST:PORT,2=HOST:PORT' or a mapping -> {node_id: 'host:port'}."""
    items: list[tuple[Any, Any]]
    if isinstance(spec, dict):
        items = list(spec.items())
    elif isinstance(spec, str):
        items = []
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part:
                raise ConfigError(f"peer {part!r} must look like ID=HOST:PORT, e.g. "
                                  f"1=127.0.0.1:7101")
            k, _, v = part.partition("=")
            items.append((k.strip(), v.strip()))
    else:
        raise ConfigError(f"peers must be 'ID=HOST:PORT,...' or a table, got {type(spec).__name__}")
    peers: dict[int, str] = {}
    for k, v in items:
        try:
            node_id = int(k)
        except (TypeError, ValueError):
            raise ConfigError(f"peer id {k!r} must be a positive integer") from None
        if node_id <= 0:
            raise ConfigError(f"peer id {node_id} must be a positive integer (ids start at 1)")
        if node_id in peers:
            raise ConfigError(f"peer id {node_id} is listed twice in peers")
        host, port = parse_address(v, what=f"peer {node_id} address")
        peers[node_id] = format_address(host, port)
    return peers


def check_keys(values: dict[str, Any], known: set[str], source: str) -> None:
    """Refuse unknown keys (a typo must not fall back to a default silently), naming the
    closest known key for each."""
    unknown = sorted(set(values) - known)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hints.append(f"{key} (did you mean {close[0]}?)" if close else key)
    raise ConfigError(f"{source}: unknown setting(s) {', '.join(hints)}; known: "
                      f"{', '.join(sorted(known))}")


_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2,
               "mb": 1000**2, "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30,
               "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}
_DURATION_UNITS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
                   "d": 86_400_000, "w": 7 * 86_400_000}


def _number_with_unit(text: str, units: dict[str, int], name: str, example: str) -> int:
    t = text.strip().lower().replace(" ", "")
    i = len(t)
    while i and not t[i - 1].isdigit():
        i -= 1
    num, unit = t[:i], t[i:]
    if not num or unit not in units:
        raise ConfigError(f"{name} {text!r} must be a whole number with an optional unit "
                          f"({', '.join(u for u in units if u)}), e.g. {example}")
    try:
        return int(num) * units[unit]
    except ValueError:
        raise ConfigError(f"{name} {text!r} must be a whole number with an optional unit, "
                          f"e.g. {example}") from None


def parse_size(text: str, name: str = "size") -> int:
    """'64MiB' -> 67108864 (KiB/MiB/GiB/TiB are powers of 2, KB/MB/GB/TB of 10)."""
    return _number_with_unit(text, _SIZE_UNITS, name, "64MiB")


def parse_duration_ms(text: str, name: str = "duration") -> int:
    """'7d' -> 604800000; a bare number is milliseconds."""
    return _number_with_unit(text, _DURATION_UNITS, name, "7d or 3600000")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
