"""`raftlog token`: bearer tokens in a node's auth file (raft/node/auth.py).

    raftlog token create --auth-file auth.toml --principal reader --permissions consume
    raftlog token create --auth-file auth.toml --principal reader --replace   # rotate
    raftlog token create --auth-file auth.toml --principal app --topics produce:orders.*,consume:logs
    raftlog token revoke --auth-file auth.toml --principal reader

`create` prints the token once, on stdout, and stores only its SHA-256 digest; `--replace`
drops the principal's other tokens (rotation in one step). Copy the file to every node and send
them SIGHUP: the change applies without a restart, to open connections too.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from raft.controller.access import TopicGrant, parse_grant
from raft.node.auth import (AuthFileError, AuthTable, Permission, Principal, new_token,
                            token_digest)
from raft.node.config import ConfigError


def _load(path: Path) -> AuthTable:
    if not path.exists():
        return AuthTable({})
    try:
        return AuthTable.load(path)
    except AuthFileError as e:
        raise ConfigError(str(e)) from None


def _save(path: Path, table: AuthTable) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(table.to_toml())
    os.replace(tmp, path)


def _permissions(text: str | None) -> frozenset[Permission] | None:
    if text is None:
        return None
    try:
        return frozenset(Permission(p.strip()) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"--permissions {text!r}: each must be one of "
                          f"{', '.join(p.value for p in Permission)}") from None


def _grants(text: str | None) -> tuple[TopicGrant, ...] | None:
    """`--topics produce:orders.*,consume:logs` as grants; None when not given (keep the
    principal's); an empty string drops every grant."""
    if text is None:
        return None
    try:
        return tuple(parse_grant(g.strip()) for g in text.split(",") if g.strip())
    except ValueError as e:
        raise ConfigError(f"--topics: {e}") from None


def _rebuild(principals: dict[str, Principal]) -> AuthTable:
    """Through the loader's checks, so what is written is what a node will accept."""
    return AuthTable.from_dict({"principals": {
        name: {"permissions": sorted(x.value for x in p.permissions),
               "tokens": list(p.token_digests),
               **({"topics": [str(g) for g in p.grants]} if p.grants else {})}
        for name, p in principals.items()}})


def cmd_create(args: argparse.Namespace) -> int:
    path = Path(args.auth_file)
    table = _load(path)
    principals = dict(table.principals)
    old = principals.get(args.principal)
    perms = _permissions(args.permissions)
    grants = _grants(args.topics)
    if old is None and perms is None and grants is None:
        raise ConfigError(f"principal {args.principal!r} is new: say what it may do with "
                          f"--permissions (produce, consume, admin; comma-separated: on "
                          f"every topic) or --topics (e.g. produce:orders.*,consume:logs)")
    if old is None and perms is None:
        perms = frozenset()  # topic grants only
    token = new_token()
    digests = (() if args.replace or old is None else old.token_digests) + (token_digest(token),)
    principals[args.principal] = Principal(
        args.principal, perms if perms is not None else old.permissions, digests,  # type: ignore[union-attr]
        grants if grants is not None else (old.grants if old is not None else ()))
    try:
        _save(path, _rebuild(principals))
    except AuthFileError as e:
        raise ConfigError(str(e)) from None
    print(token)
    print(f"stored its digest for principal {args.principal!r} in {path}; copy the file to "
          f"the nodes and send them SIGHUP. The token is shown only now.", file=sys.stderr)
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    path = Path(args.auth_file)
    table = _load(path)
    principals = dict(table.principals)
    old = principals.get(args.principal)
    if old is None:
        raise ConfigError(f"{path} has no principal {args.principal!r}; known: "
                          f"{', '.join(sorted(principals)) or 'none'}")
    if args.delete:
        del principals[args.principal]
    else:
        principals[args.principal] = Principal(old.name, old.permissions, (), old.grants)
    _save(path, _rebuild(principals))
    print(f"{'deleted' if args.delete else 'revoked every token of'} principal "
          f"{args.principal!r} in {path}; send the nodes SIGHUP", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="create or revoke bearer tokens in an auth file")
    tokens = p.add_subparsers(dest="token_command", metavar="ACTION", required=True)

    q = tokens.add_parser("create", help="a new token for a principal (printed once)")
    q.add_argument("--auth-file", required=True, help="the nodes' auth file (created if "
                                                      "missing)")
    q.add_argument("--principal", required=True, help="who the token authenticates")
    q.add_argument("--permissions", metavar="LIST",
                   help="comma-separated: produce, consume, admin (required for a new "
                        "principal unless --topics is given; replaces the old list when given)")
    q.add_argument("--topics", metavar="GRANTS",
                   help="comma-separated topic grants PERMISSION:TOPIC or PERMISSION:PREFIX* "
                        "(e.g. produce:orders.*,consume:logs); replaces the principal's grants "
                        "when given, '' drops them (docs/SECURITY.md)")
    q.add_argument("--replace", action="store_true",
                   help="drop the principal's other tokens (rotation)")
    q.set_defaults(func=cmd_create)

    q = tokens.add_parser("revoke", help="remove a principal's tokens")
    q.add_argument("--auth-file", required=True)
    q.add_argument("--principal", required=True)
    q.add_argument("--delete", action="store_true",
                   help="remove the principal entirely (its certificate loses its "
                        "permissions too)")
    q.set_defaults(func=cmd_revoke)
