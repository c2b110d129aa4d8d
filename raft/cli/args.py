"""Argument types and options shared by the `raftlog` commands: a bad value is a usage error
(exit 2, argparse's message) before anything connects."""

from __future__ import annotations

import argparse

from raft.cli.security import add_client_security_args
from raft.client import parse_servers
from raft.node.config import ConfigError

DEFAULT_SERVERS = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"


def servers_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", default=DEFAULT_SERVERS, type=_servers,
                   help=f"any nodes of the cluster (default {DEFAULT_SERVERS})")
    p.add_argument("--timeout", type=positive_float, default=10.0,
                   help="seconds per operation, retries included (default 10)")
    add_client_security_args(p)


def _servers(text: str) -> str:
    try:
        parse_servers(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return value
