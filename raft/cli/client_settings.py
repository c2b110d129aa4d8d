"""Where every client command's settings come from, in one place: the servers, TLS files,
token, timeout and ack level, each from the first of

    1. a flag            (--servers, --tls-ca, --tls-cert, --tls-key, --token/--token-file,
                          --timeout, --acks)
    2. an env variable   (RAFTLOG_SERVERS, RAFTLOG_TLS_CA, RAFTLOG_TLS_CERT, RAFTLOG_TLS_KEY,
                          RAFTLOG_TOKEN/RAFTLOG_TOKEN_FILE)
    3. the selected profile (--profile NAME, else $RAFTLOG_PROFILE, else the file's `current`;
                          raft/cli/profiles.py)
    4. the built-in default (the addresses `raftlog up` listens on, plaintext, no token)

the order rpk and the nats CLI use: what you type now beats what the shell exported, which
beats what was saved. main() calls `resolve_client` once after parsing; the commands then read
plain `args.servers`, `args.timeout`, `client_options(args)`. Each setting's source is kept in
`args.client_sources` for `raftlog config show` and `raftlog profile show`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from raft.cli.profiles import PROFILE_ENV, Profile, ProfileFile
from raft.client import parse_servers
from raft.node.config import ConfigError

DEFAULT_SERVERS = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
SERVERS_ENV = "RAFTLOG_SERVERS"
TLS_ENV = {"tls_ca": "RAFTLOG_TLS_CA", "tls_cert": "RAFTLOG_TLS_CERT",
           "tls_key": "RAFTLOG_TLS_KEY"}
TOKEN_ENV = "RAFTLOG_TOKEN"
TOKEN_FILE_ENV = "RAFTLOG_TOKEN_FILE"
ACKS_DEFAULT = "quorum"
# Kafka's words for the ack levels, accepted as aliases: acks=all is quorum, 1 the leader, 0 none.
ACKS_ALIASES = {"all": "quorum", "-1": "quorum", "1": "leader", "0": "none"}


def selected_profile(args: argparse.Namespace) -> tuple[Profile | None, str]:
    """The profile this command uses and why: `--profile`, $RAFTLOG_PROFILE, the file's
    `current`, or none (and "none selected")."""
    store = ProfileFile.load()
    flag = getattr(args, "profile", None)
    env = os.environ.get(PROFILE_ENV, "").strip()
    if flag:
        return store.get(flag), "flag --profile"
    if env:
        return store.get(env), f"env {PROFILE_ENV}"
    if store.current:
        try:
            return store.get(store.current), f"selected in {store.path}"
        except ConfigError as e:
            raise ConfigError(f"the selected profile (current = {store.current!r}) is gone: "
                              f"{e}; or select another with `raftlog profile use NAME`") \
                from None
    return None, "none selected"


def resolve_client(args: argparse.Namespace) -> None:
    """Fill in the client settings of a parsed command line (see the module docstring). A
    command without --servers (or one that says so, like `profile create`) is left alone."""
    if not hasattr(args, "servers") or not getattr(args, "client_settings", True):
        return
    profile, why = selected_profile(args)
    src: dict[str, str] = {}
    p_src = f"profile {profile.name}" if profile else ""
    args.profile_name = profile.name if profile else None
    src["profile"] = why

    if args.servers is not None:
        src["servers"] = "flag --servers"
    elif os.environ.get(SERVERS_ENV, "").strip():
        args.servers = _checked_servers(os.environ[SERVERS_ENV].strip(), f"{SERVERS_ENV}=")
        src["servers"] = f"env {SERVERS_ENV}"
    elif profile and profile.get("servers"):
        args.servers = _checked_servers(profile.get("servers"), f"{p_src}: servers ")
        src["servers"] = p_src
    else:
        args.servers, src["servers"] = DEFAULT_SERVERS, "default"

    if getattr(args, "client_security", False):
        for key, env in TLS_ENV.items():
            flag = "--" + key.replace("_", "-")
            if getattr(args, key, None):
                src[key] = f"flag {flag}"
            elif os.environ.get(env):
                setattr(args, key, os.environ[env])
                src[key] = f"env {env}"
            elif profile and profile.get(key):
                setattr(args, key, profile.get(key))
                src[key] = p_src
            else:
                setattr(args, key, None)
                src[key] = "default (none)"
        args.token, src["token"] = _token(args, profile, p_src)

    if hasattr(args, "timeout_default"):
        if args.timeout is not None:
            src["timeout"] = "flag --timeout"
        elif args.timeout_from_profile and profile and profile.get("timeout"):
            args.timeout, src["timeout"] = profile.get("timeout"), p_src
        else:
            args.timeout, src["timeout"] = args.timeout_default, "default"

    if hasattr(args, "acks_default"):
        if args.acks is not None:
            src["acks"] = "flag --acks"
        elif profile and profile.get("acks"):
            args.acks, src["acks"] = check_acks(profile.get("acks"), p_src), p_src
        else:
            args.acks, src["acks"] = args.acks_default, "default"
    args.client_sources = src
    args.servers_source = src["servers"]


def _token(args: argparse.Namespace, profile: Profile | None, p_src: str
           ) -> tuple[str | None, str]:
    if getattr(args, "token", None):
        return args.token, "flag --token"
    if getattr(args, "token_file", None):
        return read_token_file(args.token_file, "--token-file"), "flag --token-file"
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV], f"env {TOKEN_ENV}"
    if os.environ.get(TOKEN_FILE_ENV):
        return (read_token_file(os.environ[TOKEN_FILE_ENV], f"${TOKEN_FILE_ENV}"),
                f"env {TOKEN_FILE_ENV}")
    if profile and profile.get("token_file"):
        return read_token_file(profile.get("token_file"), f"{p_src}: token_file"), p_src
    return None, "default (none)"


def read_token_file(path: str, what: str) -> str:
    """The token in a file (as `raftlog token create > FILE` writes it), surrounding
    whitespace dropped."""
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror or e}); write the token "
                          f"there (`raftlog token create ...` prints it)") from None
    if not token:
        raise ConfigError(f"{what} {path} is empty; write the token there (`raftlog token "
                          f"create ...` prints it)")
    return token


def check_acks(text: str, where: str) -> str:
    """quorum | leader | none, or Kafka's all | 1 | 0, as quorum | leader | none."""
    value = ACKS_ALIASES.get(text.strip().lower(), text.strip().lower())
    if value not in ("quorum", "leader", "none"):
        raise ConfigError(f"{where}: acks {text!r} is not an ack level (choose from "
                          f"quorum/all, leader/1, none/0)")
    return value


def _checked_servers(text: str, where: str) -> str:
    try:
        parse_servers(text)
    except ConfigError as e:
        raise ConfigError(f"{where}{text!r}: {e}") from None
    return text


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for Client/BlockingClient from the resolved settings."""
    return {key: getattr(args, key) for key in (*TLS_ENV, "token") if getattr(args, key, None)}


__all__ = ["DEFAULT_SERVERS", "SERVERS_ENV", "client_options", "read_token_file",
           "resolve_client", "selected_profile"]
