"""The `raftlog` command: build the parser, run the chosen command, map errors to exit codes.

    raftlog up                               # a local 3-node cluster (Ctrl-C stops it)
    echo hello | raftlog produce             # stream stdin lines as records
    raftlog consume --from -10               # the last 10 records
    raftlog status                           # roles, offsets, follower progress
    raftlog consume --subscription orders    # resume where the last run committed
    raftlog subscriptions                    # positions, lag, leases (docs/SUBSCRIPTIONS.md)
    raftlog topic create orders --partitions 8 --replicas 3; raftlog topic list|describe|alter|delete
    raftlog produce --topic orders --key-separator :   # keyed: one partition per key
    raftlog certs init|issue|show | token create|revoke  # TLS and tokens (docs/SECURITY.md)
    raftlog profile create prod --servers ... --tls-ca ca.pem --token-file tok; raftlog profile use prod

Each command group is its own module in this package with a `register(subparsers)`: serve.py
(serve, up), produce.py, consume.py, subscriptions_cmd.py, topic_cmd.py, status.py, demo.py, membership.py,
config_cmd.py, profile_cmd.py, recover.py, completion.py. Other packages add their commands the same way,
as plugins that may be missing: bench.cli (`raftlog bench`) and sparkio.cli (`raftlog load`).
`raftlog serve` registers its own command only (LEAN_COMMANDS): a restarting node imports
nothing the other commands need.

Exit codes: 0 success, 1 the operation failed, 2 bad usage or configuration (an unknown topic
or partition too: the error names those that exist), 130 interrupted.
Errors are one line on stderr (`raftlog CMD: CODE: message`), or one JSON object
(`{"error": {"code": ..., "message": ...}}`) when the command was given --json.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import re
import signal
import sys
from typing import TYPE_CHECKING

from raft.cli.output import print_error
from raft.node.config import ConfigError

if TYPE_CHECKING:
    from raft.client import RaftlogError

# Optional packages whose commands join `raftlog` when they (and their extras) are installed.
PLUGINS = ("bench.cli", "sparkio.cli")
# `raftlog serve` builds a parser of its own command only: a node restarted to catch up
# answers its leader sooner without importing what the other commands and the plugins need
# (cryptography, rich, the client, the bench: ~0.1 s of CPU of a ~0.35 s start-up,
# docs/PERFORMANCE.md "start28"). Every other command line gets the whole parser.
LEAN_COMMANDS = ("serve",)


class UsageError(Exception):
    """A command line argparse refused; main() prints it (as text or JSON) and exits 2."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.message, self.prog = message, prog


class Parser(argparse.ArgumentParser):
    """argparse, raising UsageError instead of printing and exiting, so main() can suggest the
    closest command or flag and answer in JSON when asked."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message, self.prog)


def version() -> str:
    from importlib import metadata

    from raft.protocol.framing import PROTOCOL_VERSION

    try:
        v = metadata.version("raftlog")
    except metadata.PackageNotFoundError:
        v = "(not installed)"
    return f"raftlog {v} (wire protocol v{PROTOCOL_VERSION}, Python {sys.version.split()[0]})"


class _Version(argparse.Action):
    """--version: the version is looked up (importlib.metadata, ~30 ms) only when asked."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show program's version number and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(version())  # on stdout, as argparse's own version action prints it
        parser.exit()


def command_word(argv: list[str]) -> str | None:
    """The command of a command line: the first word that is not one of raftlog's own
    options (--version, -h and -v take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(only: str | None = None) -> Parser:
    """Every command's parser; `only` (one of LEAN_COMMANDS) registers just that command's
    module, so the others and the plugins are not imported."""
    from raft.cli import serve

    parser = Parser(
        prog="raftlog", description="A Raft-replicated log of record batches.",
        epilog="Start with `raftlog demo`, or `raftlog up` and then produce/consume/status "
               "(they find `up`'s cluster by default, or through --servers / RAFTLOG_SERVERS).")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more (-v info, -vv debug); quiet by default")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    if only == "serve":
        serve.register(sub)
        _sub_verbose(sub)
        return parser
    from raft.cli import (certs, completion, config_cmd, consume, demo, link_cmd, membership,
                          produce, profile_cmd, recover, status, subscriptions_cmd, tokens,
                          topic_cmd)

    for module in (serve, produce, consume, subscriptions_cmd, topic_cmd, link_cmd, status, demo,
                   certs, tokens):
        module.register(sub)
    for name in PLUGINS:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            if e.name and (e.name == name or name.startswith(e.name)):
                continue  # that package (or its extra) is not installed
            raise
        register = getattr(mod, "register", None)
        if register is not None:
            register(sub)
    # After the plugins' commands: the order `raftlog --help` has always shown.
    membership.register(sub)
    config_cmd.register(sub)
    profile_cmd.register(sub)
    recover.register(sub)
    completion.register(sub, parser)
    _sub_verbose(sub)
    return parser


def _sub_verbose(sub: argparse._SubParsersAction) -> None:
    for p in _all_parsers(sub):
        # -v works after the subcommand too (`raftlog produce -v`).
        if "-v" not in p._option_string_actions:
            p.add_argument("-v", "--verbose", action="count", dest="sub_verbose",
                           default=argparse.SUPPRESS, help="log more (-v info, -vv debug)")


def _all_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    out = []
    for p in dict.fromkeys(sub.choices.values()):
        out.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.extend(_all_parsers(action))
    return out


def _suggest(parser: Parser, argv: list[str], message: str) -> str:
    """'did you mean ...?' for a mistyped command, choice or flag."""
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if m:
        choices = re.findall(r"'([^']*)'", m.group(2))
        close = difflib.get_close_matches(m.group(1), choices, n=1)
        return f"; did you mean {close[0]!r}?" if close else ""
    m = re.search(r"unrecognized arguments: (.*)", message)
    if m:
        options = set(parser._option_string_actions)
        sub = _subparser_for(parser, argv)
        if sub is not None:
            options |= set(sub._option_string_actions)
        for word in m.group(1).split():
            if word.startswith("-"):
                close = difflib.get_close_matches(word.split("=")[0], sorted(options), n=1)
                if close:
                    return f"; did you mean {close[0]}?"
    return ""


def _subparser_for(parser: argparse.ArgumentParser,
                   argv: list[str]) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word in argv:
                if word in action.choices:
                    deeper = _subparser_for(action.choices[word], argv)
                    return deeper or action.choices[word]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    word = command_word(argv)
    parser = build_parser(only=word if word in LEAN_COMMANDS else None)
    as_json = "--json" in argv
    try:
        args = parser.parse_args(argv)
    except UsageError as e:
        message = e.message + _suggest(parser, argv, e.message)
        if as_json:
            print_error(e.prog.removeprefix("raftlog ").strip() or "raftlog", "USAGE",
                        message, as_json=True)
        else:
            sub = _subparser_for(parser, argv) or parser
            sub.print_usage(sys.stderr)
            print(f"{e.prog}: error: {message}", file=sys.stderr)
        return 2
    verbose = args.verbose + getattr(args, "sub_verbose", 0)
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    as_json = bool(getattr(args, "json", False))
    command = args.command
    if command in ("topic", "link") and getattr(args, "action", None):
        command = f"topic {args.action}"  # errors say `raftlog topic create: ...`
    try:
        if hasattr(args, "servers"):  # a client command (serve has no --servers)
            from raft.cli.client_settings import resolve_client

            resolve_client(args)
        return int(func(args) or 0)
    except ConfigError as e:
        print_error(command, "CONFIG", str(e), as_json=as_json)
        return 2
    except _client_error("UnknownTopicError") as e:  # a usage error: it names what exists
        print_error(command, e.code, e.message, as_json=as_json)
        return 2
    except _client_error("RaftlogError") as e:
        print_error(command, e.code, e.message, as_json=as_json)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()
    except BaseExceptionGroup as group:  # from a command's task group
        matched, rest = group.split(BrokenPipeError)
        if matched is not None and rest is None:
            return _reader_gone()
        matched, rest = group.split(KeyboardInterrupt)
        if matched is not None and rest is None:
            return 130  # Ctrl-C reached a command's task group
        raise


def _client_error(name: str) -> "tuple[type[RaftlogError], ...]":
    """raft.client's error class `name` (for an except clause) once the command has loaded
    the client; before that no error can be one (and `serve` does not load the client to find
    out: the empty tuple matches nothing)."""
    cls = getattr(sys.modules.get("raft.client"), name, None)
    return (cls,) if cls is not None else ()


def _reader_gone() -> int:
    """stdout's reader went away (`raftlog consume | head`): stop quietly with the code of a
    process ended by SIGPIPE, as `cat` would, and keep Python from failing on the final
    flush."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    raise SystemExit(main())
