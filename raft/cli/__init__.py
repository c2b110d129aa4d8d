"""`raftlog`, the command line: serve, up, produce, consume, status, demo, membership commands,
config show and completion, plus the commands bench and sparkio plug in. It uses the client
library and starts nodes as processes (or calls `raft.node.serve.serve`); the runtime never
imports it."""


def main(argv: list[str] | None = None) -> int:
    from raft.cli.main import main as _main

    return _main(argv)
