"""Field checks for request frames: each names the request and the field the sender got wrong
(`WireError`, BAD_REQUEST), so a bad client learns what to fix from the error itself."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raft.protocol.framing import WireError


def type_name(value: Any) -> str:
    return "nil" if value is None else type(value).__name__


def get_int(obj: dict[str, Any], key: str, *, default: int | None = None,
            minimum: int | None = None, maximum: int | None = None,
            request_id: int | None = None, where: str = "request") -> int:
    """A required (or defaulted) integer field, bools refused (msgpack keeps them distinct)."""
    value = obj.get(key)
    if value is None:
        if default is not None:
            return default
        raise WireError(f'{where} is missing integer field "{key}"', request_id=request_id)
    if isinstance(value, bool) or not isinstance(value, int):
        raise WireError(f'{where} field "{key}" must be an integer, got {type_name(value)}',
                        request_id=request_id)
    if minimum is not None and value < minimum:
        raise WireError(f'{where} field "{key}"={value} must be >= {minimum}',
                        request_id=request_id)
    if maximum is not None and value > maximum:
        raise WireError(f'{where} field "{key}"={value} must be <= {maximum}',
                        request_id=request_id)
    return value


def get_opt_int(obj: dict[str, Any], key: str, *, request_id: int | None = None,
                where: str = "request") -> int | None:
    if obj.get(key) is None:
        return None
    return get_int(obj, key, request_id=request_id, where=where)


def get_bytes(obj: dict[str, Any], key: str, *, request_id: int | None = None,
              where: str = "request") -> bytes:
    value = obj.get(key)
    if not isinstance(value, (bytes, bytearray)):
        raise WireError(f'{where} field "{key}" must be msgpack bin (bytes), got '
                        f'{type_name(value)}', request_id=request_id)
    return bytes(value)


def get_str(obj: dict[str, Any], key: str, *, default: str | None = None,
            choices: Iterable[str] | None = None, request_id: int | None = None,
            where: str = "request") -> str:
    value = obj.get(key)
    if value is None and default is not None:
        return default
    if not isinstance(value, str):
        raise WireError(f'{where} field "{key}" must be a string, got {type_name(value)}',
                        request_id=request_id)
    if choices is not None:
        allowed = list(choices)
        if value not in allowed:
            raise WireError(f'{where} field "{key}"={value!r} must be one of {allowed}',
                            request_id=request_id)
    return value


