"""A restarted node answers its leader sooner when its start-up imports only what serving needs
(start28, docs/PERFORMANCE.md): `raftlog serve` builds the parser of its own command alone,
and nothing on its path imports the other commands, the plugins (bench, sparkio), the dev
extras, cryptography (the CLI's certificate tools) or rich (the CLI's tables)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli_helpers import REPO, env, free_base_port

# Packages `raftlog serve` must not import before it serves (with TLS off).
NOT_FOR_SERVE = ("pyspark", "pyarrow", "matplotlib", "hypothesis", "pytest", "cryptography",
                 "rich", "bench", "sparkio")
# The CLI modules serve's start-up may load; every other raft.cli module is another command's.
SERVE_CLI = {"raft.cli", "raft.cli.main", "raft.cli.serve", "raft.cli.argtypes",
             "raft.cli.output"}

# The node runs until it is about to serve (its log open, its port bound): the hook the program
# runs then (raft.node.serve.tune_interpreter) prints what is loaded and stops the node cleanly.
PROBE = """\
import os, signal, sys
blocked = {blocked!r}
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in blocked:
            raise ImportError(f'{{name}} is not for serve', name=name)
sys.meta_path.insert(0, Block())
import raft.node.serve
def probe():
    print(' '.join(sorted(sys.modules)), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
raft.node.serve.tune_interpreter = probe
from raft.cli.main import main
raise SystemExit(main({argv!r}))
"""


def test_serve_imports_only_what_serving_needs(tmp_path: Path) -> None:
    port = free_base_port(1)
    argv = ["serve", "--shards", "1", "--node-id", "1", "--data-dir", str(tmp_path),
            "--listen", f"127.0.0.1:{port}", "--peers", f"1=127.0.0.1:{port}"]
    code = PROBE.format(blocked=NOT_FOR_SERVE, argv=argv)
    # The probe imports raft.node.serve before main does: what main adds is checked below.
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    loaded = set(res.stdout.split())
    assert "raft.node.server" in loaded and "storage.lmdb_log" in loaded, res.stdout
    assert not {m for m in loaded if m.split(".")[0] in NOT_FOR_SERVE}
    cli = {m for m in loaded if m == "raft.cli" or m.startswith("raft.cli.")}
    assert cli <= SERVE_CLI, sorted(cli - SERVE_CLI)
    assert "importlib.metadata" not in loaded  # --version's lookup, made when asked
