"""`raftlog profile`: create, list, show, select and delete client profiles (raft/cli/profiles.py
stores them, raft/cli/client_settings.py applies them).

    raftlog profile create staging --servers 10.0.0.1:7101 --tls-ca ca.pem --token-file tok
    raftlog profile use staging          # every client command now talks to staging
    raftlog produce --profile local      # ... except when told otherwise
    raftlog profile list [--json] | show [NAME] [--json] | delete NAME

A profile is checked when it is created (addresses parse, the files it names exist, a
certificate comes with its key), so a typo is found at once and not at the next produce. Paths
are stored absolute, so the profile works from any directory.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from raft.cli.args import ACKS_CHOICES, json_flag, positive_float
from raft.cli.client_settings import check_acks, read_token_file
from raft.cli.profiles import KEYS, PATH_KEYS, Profile, ProfileFile, check_name
from raft.client import parse_servers
from raft.node.config import ConfigError


def _settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    try:
        parse_servers(args.servers)
    except ConfigError as e:
        raise ConfigError(f"--servers {args.servers!r}: {e}") from None
    settings["servers"] = args.servers
    for key in PATH_KEYS:
        value = getattr(args, key)
        if value is None:
            continue
        path = Path(value).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"--{key.replace('_', '-')} {value}: no such file; give the path "
                              f"of an existing file (it is stored, not copied)")
        settings[key] = str(path)
    if ("tls_cert" in settings) != ("tls_key" in settings):
        raise ConfigError("a client certificate needs both --tls-cert and --tls-key")
    if "tls_cert" in settings and "tls_ca" not in settings:
        raise ConfigError("--tls-cert needs --tls-ca (the cluster CA)")
    if "token_file" in settings:
        read_token_file(settings["token_file"], "--token-file")  # readable and not empty
    if args.timeout is not None:
        settings["timeout"] = args.timeout
    if args.acks is not None:
        settings["acks"] = check_acks(args.acks, "--acks")
    return settings


def cmd_create(args: argparse.Namespace) -> int:
    name = check_name(args.name)
    store = ProfileFile.load()
    if name in store.profiles and not args.force:
        raise ConfigError(f"profile {name!r} exists already; pass --force to replace it, or "
                          f"`raftlog profile delete {name}` first")
    store.profiles[name] = Profile(name, _settings_from_args(args))
    if args.use:
        store.current = name
    store.save()
    if args.json:
        print(json.dumps({"created": name, "current": store.current, "path": str(store.path)}))
    else:
        selected = ("; selected" if args.use
                    else f"; use it with --profile {name} or `raftlog profile use {name}`")
        print(f"profile {name} saved in {store.path}{selected}")
    return 0


def _as_dict(store: ProfileFile, p: Profile) -> dict[str, Any]:
    return {"name": p.name, "current": p.name == store.current, **p.settings}


def cmd_list(args: argparse.Namespace) -> int:
    store = ProfileFile.load()
    if args.json:
        print(json.dumps({"path": str(store.path), "current": store.current,
                          "profiles": [_as_dict(store, store.profiles[n])
                                       for n in sorted(store.profiles)]}, indent=2))
        return 0
    if not store.profiles:
        print(f"no profiles in {store.path}; create one with `raftlog profile create NAME "
              f"--servers HOST:PORT,...`")
        return 0
    width = max(len(n) for n in store.profiles)
    for name in sorted(store.profiles):
        mark = "*" if name == store.current else " "
        p = store.profiles[name]
        extras = [k for k in ("tls_ca", "tls_cert", "token_file") if p.get(k)]
        tags = f"  ({', '.join(k.replace('_file', '').replace('_', ' ') for k in extras)})" \
            if extras else ""
        print(f"{mark} {name:<{width}}  {p.get('servers') or '-'}{tags}")
    print(f"(* selected; file {store.path})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store = ProfileFile.load()
    name = args.name or store.current
    if name is None:
        raise ConfigError("no profile is selected; name one (`raftlog profile show NAME`) or "
                          "select one with `raftlog profile use NAME`")
    p = store.get(name)
    if args.json:
        print(json.dumps({**_as_dict(store, p), "path": str(store.path)}, indent=2))
        return 0
    print(f"profile {name}{' (selected)' if name == store.current else ''}, in {store.path}")
    for key in KEYS:
        if p.get(key) is not None:
            print(f"  {key:<10}  {p.get(key)}")
    return 0


def cmd_use(args: argparse.Namespace) -> int:
    store = ProfileFile.load()
    store.get(args.name)
    store.current = args.name
    store.save()
    if args.json:
        print(json.dumps({"current": args.name, "path": str(store.path)}))
    else:
        print(f"profile {args.name} selected: client commands use it unless --profile, "
              f"flags or RAFTLOG_* variables say otherwise")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    store = ProfileFile.load()
    store.get(args.name)
    del store.profiles[args.name]
    was_current = store.current == args.name
    if was_current:
        store.current = None
    store.save()
    if args.json:
        print(json.dumps({"deleted": args.name, "current": store.current}))
    else:
        print(f"profile {args.name} deleted" + (
            "; no profile is selected now" if was_current else ""))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="named client settings: create, list, show, use, delete",
                       description="Client profiles: named servers, TLS files, token file, "
                                   "timeout and acks, kept in $RAFTLOG_CONFIG_DIR/profiles.toml "
                                   "(else $XDG_CONFIG_HOME/raftlog or ~/.config/raftlog). "
                                   "Flags beat env vars, which beat the profile.")
    p.set_defaults(client_settings=False)  # `create --servers` is data, not where to connect
    inner = p.add_subparsers(dest="profile_command", metavar="ACTION", required=True,
                             parser_class=type(p))
    create = inner.add_parser("create", help="save a profile (checked now)")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--servers", required=True, metavar="HOST:PORT,...",
                        help="any nodes of the cluster")
    create.add_argument("--tls-ca", metavar="FILE.pem", help="the cluster CA (turns TLS on)")
    create.add_argument("--tls-cert", metavar="FILE.pem", help="client certificate (mTLS)")
    create.add_argument("--tls-key", metavar="FILE.pem", help="the client certificate's key")
    create.add_argument("--token-file", metavar="FILE",
                        help="a file holding the token (the path is stored, never the token)")
    create.add_argument("--timeout", type=positive_float, default=None,
                        help="seconds per operation for produce, consume and subscriptions")
    create.add_argument("--acks", default=None, choices=ACKS_CHOICES,
                        help="produce's default ack level")
    create.add_argument("--use", action="store_true", help="select it too")
    create.add_argument("--force", action="store_true", help="replace a profile of that name")
    create.set_defaults(func=cmd_create)
    ls = inner.add_parser("list", help="the profiles (* marks the selected one)")
    ls.set_defaults(func=cmd_list)
    show = inner.add_parser("show", help="one profile's settings (default: the selected one)")
    show.add_argument("name", metavar="NAME", nargs="?")
    show.set_defaults(func=cmd_show)
    use = inner.add_parser("use", help="select a profile for every client command")
    use.add_argument("name", metavar="NAME")
    use.set_defaults(func=cmd_use)
    delete = inner.add_parser("delete", help="remove a profile")
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(func=cmd_delete)
    # --json after the action or before it (`raftlog profile --json list`), as `config` does.
    json_flag(p, "machine-readable output")
    for action in (create, ls, show, use, delete):
        json_flag(action, "machine-readable output")
        action._option_string_actions["--json"].default = argparse.SUPPRESS


__all__ = ["register"]
