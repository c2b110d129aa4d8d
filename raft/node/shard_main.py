"""One shard process of a node (`python -m raft.node.shard_main`), started by its supervisor
(raft.node.supervisor) with its settings in the environment; never run by hand."""

from __future__ import annotations

import json
import os
import sys

from raft.node.serve import serve
from raft.node.supervisor import SETTINGS_ENV


def main() -> int:
    raw = os.environ.get(SETTINGS_ENV)
    if raw is None:
        print("raft.node.shard_main is started by `raftlog serve --shards N`; run that",
              file=sys.stderr)
        return 2
    settings = json.loads(raw)
    prog = f"raftlog serve (node {settings.get('node_id')} shard {settings.get('shard')})"
    return serve(settings, prog=prog, as_shard=True)


if __name__ == "__main__":
    raise SystemExit(main())
