"""`raftlog config show`: the effective settings and where each comes from.

It takes what `raftlog serve` takes (flags and/or --config FILE.toml) and prints every node
setting with its value and source: `flag --tick-ms`, `file node.toml`, `default`, or
`default (core)` for the Raft knobs whose default lives in raft.core.config.RaftConfig. The client
side follows: the client profile in use, and the servers the other commands would use (`flag
--servers`, `env RAFTLOG_SERVERS`, `profile NAME` or `default`), their timeout, TLS files and token (its
source only: the value is never printed). Unknown keys are refused with the closest
known one; when the settings are complete they are validated as `serve` would.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from raft.cli.args import json_flag, servers_arg
from raft.cli.client_settings import resolve_client
from raft.node.config import (check_keys, ConfigError, NodeConfig, _parse_raft_options,
                              raft_default, read_toml)

_CLI_ONLY = ("func", "command", "verbose", "sub_verbose", "config", "json", "servers",
             "servers_source", "timeout", "config_command", "profile", "profile_name",
             "client_sources", "timeout_default", "timeout_from_profile")


def effective(args: argparse.Namespace) -> list[dict[str, Any]]:
    """[{setting, value, source}] for every node setting, then the client's."""
    flags = {k: v for k, v in vars(args).items() if k not in _CLI_ONLY}
    raft_flags = _parse_raft_options(flags["raft"]) if flags.get("raft") else {}
    fields = [f for f in dataclasses.fields(NodeConfig) if not f.name.startswith("_")]
    file_values: dict[str, Any] = read_toml(args.config) if args.config else {}
    if args.config:
        check_keys(file_values, {f.name for f in fields}, args.config)
    rows: list[dict[str, Any]] = []
    for f in fields:
        if f.name == "raft":
            continue
        flag = "--" + f.name.replace("_", "-")
        if flags.get(f.name) is not None:
            value, source = flags[f.name], f"flag {flag}"
        elif f.name in file_values:
            value, source = file_values[f.name], f"file {args.config}"
        elif f.name in ("node_id", "data_dir", "peers"):
            value, source = None, f"not set (required: {flag})"
        elif f.name == "shards":
            value, source = _default_shards(flags, file_values)
        elif f.default is None and f.name in NodeConfig._RAFT_KNOBS:
            value, source = raft_default(f.name), "default (core)"
        else:
            value, source = f.default, "default"
        rows.append({"setting": f.name, "value": value, "source": source})
    file_raft = file_values.get("raft") or {}
    for key in sorted(set(file_raft) | set(raft_flags)):
        if key in raft_flags:
            rows.append({"setting": f"raft.{key}", "value": raft_flags[key],
                         "source": "flag --raft"})
        else:
            rows.append({"setting": f"raft.{key}", "value": file_raft[key],
                         "source": f"file {args.config}"})
    sources = args.client_sources
    rows.append({"setting": "profile (client)", "value": args.profile_name,
                 "source": sources["profile"]})
    rows.append({"setting": "servers (client)", "value": args.servers,
                 "source": sources["servers"]})
    rows.append({"setting": "timeout (client)", "value": args.timeout,
                 "source": sources["timeout"]})
    rows += _client_security_rows(args)
    return rows


def _default_shards(flags: dict[str, Any], file_values: dict[str, Any]) -> tuple[int, str]:
    """What `serve` runs when --shards is left out (raft.node.supervisor.default_shards): the
    count the node's data was written with, else the usable cores (capped by the port gap
    between nodes of --peers on one host)."""
    from raft.node.config import usable_cores
    from raft.node.supervisor import default_shards

    why = "default: the data's count, else the usable cores (docs/SHARDS.md)"
    values = {**file_values, **{k: v for k, v in flags.items() if v is not None}}
    values.pop("raft", None)
    try:
        return default_shards(NodeConfig.from_dict(values)), why
    except (ConfigError, TypeError, ValueError):
        return usable_cores(), why


def _client_security_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The TLS files and token the client commands would use (this command's own --tls-*
    flags are the node's): env vars, else the profile. The token's value is never shown."""
    probe = argparse.Namespace(servers=args.servers, profile=args.profile, client_security=True,
                               tls_ca=None, tls_cert=None, tls_key=None, token=None,
                               token_file=None)
    resolve_client(probe)
    rows = []
    for key in ("tls_ca", "tls_cert", "tls_key", "token"):
        value = getattr(probe, key)
        if key == "token" and value:
            value = "(set, hidden)"
        rows.append({"setting": f"{key} (client)", "value": value,
                     "source": probe.client_sources[key]})
    return rows


def _validate(args: argparse.Namespace) -> str | None:
    """None when `serve` would accept these settings; else why not (or what is missing)."""
    settings = {k: v for k, v in vars(args).items() if k not in _CLI_ONLY or k == "config"}
    try:
        NodeConfig.from_args(settings)
    except ConfigError as e:
        return str(e)
    return None


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def cmd_config_show(args: argparse.Namespace) -> int:
    rows = effective(args)
    problem = _validate(args)
    missing = [r["setting"] for r in rows if str(r["source"]).startswith("not set")]
    if args.json:
        print(json.dumps({"settings": [{**r, "value": r["value"] if not isinstance(
            r["value"], dict) else {str(k): v for k, v in r["value"].items()}} for r in rows],
            "valid_for_serve": problem is None, "problem": problem}, default=str, indent=2))
    else:
        width = max(len(r["setting"]) for r in rows)
        vwidth = min(40, max(len(_text(r["value"])) for r in rows))
        for r in rows:
            print(f"{r['setting']:<{width}}  {_text(r['value']):<{vwidth}}  {r['source']}")
        if problem and not missing:
            print(f"\nnot valid for `raftlog serve`: {problem}")
    if problem and not missing:
        return 2
    return 0


_DEFAULT_TIMEOUT = 10.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the effective settings and their sources")
    inner = p.add_subparsers(dest="config_command", metavar="ACTION", required=True,
                             parser_class=type(p))
    show = inner.add_parser(
        "show", help="every setting's value and source (flag, file, env, default)",
        description="Print every setting `raftlog serve` would run with (give it the same "
                    "flags or --config), with its source, and the servers the client "
                    "commands use. Exit 2 when complete settings would be refused.")
    NodeConfig.add_arguments(show)
    servers_arg(show, timeout=_DEFAULT_TIMEOUT, security=False)  # the node's TLS flags serve
    json_flag(show, "print the settings as JSON")
    # --json before the action too (`raftlog config --json show`); the action's own flag must
    # not reset it to False.
    json_flag(p, "print the settings as JSON")
    show._option_string_actions["--json"].default = argparse.SUPPRESS
    show.set_defaults(func=cmd_config_show)
