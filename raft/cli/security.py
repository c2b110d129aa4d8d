"""The client-side security flags every command that talks to a cluster takes:

    --tls-ca FILE       trust the cluster CA (turns TLS on)      or RAFTLOG_TLS_CA
    --tls-cert FILE     client certificate (mutual TLS)          or RAFTLOG_TLS_CERT
    --tls-key FILE      its private key                          or RAFTLOG_TLS_KEY
    --token TOKEN       bearer token sent in the hello           or RAFTLOG_TOKEN
    --token-file FILE   the same, read from a file               or RAFTLOG_TOKEN_FILE
    --profile NAME      a saved set of these (and --servers)     or RAFTLOG_PROFILE

The environment variables let a shell (or `raftlog up --tls`'s printed `export` lines) set them
once; a flag wins over its variable, and both win over the profile
(raft/cli/client_settings.py resolves them). Prefer RAFTLOG_TOKEN or a token file to --token:
arguments show in `ps`.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    if "--profile" not in p._option_string_actions:
        p.add_argument("--profile", metavar="NAME", default=None,
                       help="use this saved client profile (`raftlog profile list`); flags "
                            "and env vars override its settings [env RAFTLOG_PROFILE]")


def add_client_security_args(p: argparse.ArgumentParser) -> None:
    add_profile_arg(p)
    g = p.add_argument_group("security (TLS and authentication)")
    g.add_argument("--tls-ca", metavar="FILE.pem",
                   help="connect with TLS, trusting this CA (the cluster's ca.pem) "
                        "[env RAFTLOG_TLS_CA]")
    g.add_argument("--tls-cert", metavar="FILE.pem",
                   help="client certificate for mutual TLS [env RAFTLOG_TLS_CERT]")
    g.add_argument("--tls-key", metavar="FILE.pem",
                   help="the client certificate's key [env RAFTLOG_TLS_KEY]")
    g.add_argument("--token", metavar="TOKEN",
                   help="bearer token (prefer the RAFTLOG_TOKEN environment variable or "
                        "--token-file: arguments are visible to other users in `ps`)")
    g.add_argument("--token-file", metavar="FILE",
                   help="read the bearer token from this file [env RAFTLOG_TOKEN_FILE]")
    p.set_defaults(client_security=True)


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for Client/BlockingClient: the settings main() resolved from flags,
    env vars and the profile."""
    from raft.cli.client_settings import client_options as resolved

    return resolved(args)
