"""`raftlog certs`: a cluster CA and its certificates, for operators (raft/cli/pki.py does the
work, with `cryptography`).

    raftlog certs init  --dir tls/                              # ca.pem, ca-key.pem
    raftlog certs issue --dir tls/ --node-id 1 --host n1.example.com --host 10.0.0.1
    raftlog certs issue --dir tls/ --client spark-writer         # mutual-TLS client
    raftlog certs show  tls/node-1.pem

Then each node runs with `--tls-cert tls/node-<id>.pem --tls-key tls/node-<id>-key.pem
--tls-ca tls/ca.pem`, and clients pass `--tls-ca tls/ca.pem` (plus their own certificate, or a
token). Keep ca-key.pem off the nodes: it can mint any identity. See docs/SECURITY.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from raft.cli import pki
from raft.cli.args import positive_int
from raft.node.config import ConfigError


def cmd_init(args: argparse.Namespace) -> int:
    try:
        paths = pki.init_ca(Path(args.dir), days=args.days, force=args.force)
    except pki.PkiError as e:
        raise ConfigError(str(e)) from None
    print(f"CA certificate: {paths.cert}  (give it to nodes and clients as --tls-ca)")
    print(f"CA key:         {paths.key}  (keep it secret and off the nodes)")
    return 0


def cmd_issue(args: argparse.Namespace) -> int:
    directory = Path(args.dir)
    try:
        if args.node_id is not None:
            hosts = args.host or list(pki.LOCAL_HOSTS)
            paths = pki.issue_node(directory, args.node_id, hosts, days=args.days)
            print(f"node {args.node_id} certificate: {paths.cert}  (names: "
                  f"{', '.join(hosts)})")
            print(f"node {args.node_id} key:         {paths.key}")
            print(f"run it with: --tls-cert {paths.cert} --tls-key {paths.key} "
                  f"--tls-ca {pki.ca_paths(directory).cert}")
        else:
            paths = pki.issue_client(directory, args.client, days=args.days)
            print(f"client {args.client!r} certificate: {paths.cert}")
            print(f"client {args.client!r} key:         {paths.key}")
            print(f"connect with: --tls-ca {pki.ca_paths(directory).cert} --tls-cert "
                  f"{paths.cert} --tls-key {paths.key}  (principal {args.client!r}: give it "
                  f"permissions in the nodes' auth file)")
    except pki.PkiError as e:
        raise ConfigError(str(e)) from None
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    try:
        info = pki.describe(Path(args.file))
    except pki.PkiError as e:
        raise ConfigError(str(e)) from None
    print(json.dumps(info, indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("certs", help="make a cluster CA and node/client certificates for TLS")
    certs = p.add_subparsers(dest="certs_command", metavar="ACTION", required=True)

    q = certs.add_parser("init", help="create a CA (ca.pem, ca-key.pem) in --dir")
    q.add_argument("--dir", required=True, help="directory for the CA files")
    q.add_argument("--days", type=positive_int, default=pki.CA_DAYS,
                   help=f"validity in days (default {pki.CA_DAYS})")
    q.add_argument("--force", action="store_true",
                   help="replace an existing CA (certificates it signed stop working)")
    q.set_defaults(func=cmd_init)

    q = certs.add_parser("issue", help="issue a node or client certificate signed by the CA")
    q.add_argument("--dir", required=True, help="directory holding ca.pem and ca-key.pem; "
                                                "the new files go there too")
    who = q.add_mutually_exclusive_group(required=True)
    who.add_argument("--node-id", type=positive_int, help="a node certificate for this id")
    who.add_argument("--client", metavar="NAME", help="a client certificate; NAME is the "
                                                      "principal the auth file names")
    q.add_argument("--host", action="append", metavar="NAME_OR_IP",
                   help="a host name or IP address clients dial the node by (repeatable; "
                        f"default {', '.join(pki.LOCAL_HOSTS)})")
    q.add_argument("--days", type=positive_int, default=pki.LEAF_DAYS,
                   help=f"validity in days (default {pki.LEAF_DAYS})")
    q.set_defaults(func=cmd_issue)

    q = certs.add_parser("show", help="print a certificate's names and validity")
    q.add_argument("file", help="a PEM certificate")
    q.set_defaults(func=cmd_show)
