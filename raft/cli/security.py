"""The client-side security flags every command that talks to a cluster takes:

    --tls-ca FILE     trust the cluster CA (turns TLS on)      or RAFTLOG_TLS_CA
    --tls-cert FILE   client certificate (mutual TLS)          or RAFTLOG_TLS_CERT
    --tls-key FILE    its private key                          or RAFTLOG_TLS_KEY
    --token TOKEN     bearer token sent in the hello           or RAFTLOG_TOKEN

The environment variables let a shell (or `raftlog up --tls`'s printed `export` lines) set them
once; a flag wins over its variable. Prefer RAFTLOG_TOKEN to --token: arguments show in `ps`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

ENV = {"tls_ca": "RAFTLOG_TLS_CA", "tls_cert": "RAFTLOG_TLS_CERT",
       "tls_key": "RAFTLOG_TLS_KEY", "token": "RAFTLOG_TOKEN"}


def add_client_security_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (TLS and authentication)")
    g.add_argument("--tls-ca", metavar="FILE.pem",
                   help="connect with TLS, trusting this CA (the cluster's ca.pem) "
                        "[env RAFTLOG_TLS_CA]")
    g.add_argument("--tls-cert", metavar="FILE.pem",
                   help="client certificate for mutual TLS [env RAFTLOG_TLS_CERT]")
    g.add_argument("--tls-key", metavar="FILE.pem",
                   help="the client certificate's key [env RAFTLOG_TLS_KEY]")
    g.add_argument("--token", metavar="TOKEN",
                   help="bearer token (prefer the RAFTLOG_TOKEN environment variable: "
                        "arguments are visible to other users in `ps`)")


def client_options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for Client/BlockingClient from the flags, else the environment."""
    out: dict[str, Any] = {}
    for name, env in ENV.items():
        value = getattr(args, name, None) or os.environ.get(env) or None
        if value:
            out[name] = value
    return out
