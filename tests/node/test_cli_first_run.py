"""A first run (issue 29, item 8): `make run` installs only the package (the demo needs none of
the dev extras), `make test` the dev extras; and `serve` says in one line at start whether TLS,
auth, metrics and retention are on, and where."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from cli_helpers import REPO, Running, env, free_base_port

# One node process (`serve` left alone runs one shard per usable core: docs/SHARDS.md).
SERVE = ("serve", "--shards", "1")

EXTRAS = ("pyspark", "pyarrow", "matplotlib", "hypothesis", "pytest")


def _make_dry_run(target: str, venv: Path) -> list[str]:
    res = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return [line for line in res.stdout.splitlines() if "pip install" in line
            and "--upgrade pip" not in line]


def test_make_run_installs_the_base_package_and_make_test_the_dev_extras(
        tmp_path: Path) -> None:
    run = _make_dry_run("run", tmp_path / "v")
    assert len(run) == 1 and re.search(r"pip install --quiet -e \.$", run[0]), run
    test = _make_dry_run("test", tmp_path / "v")
    assert len(test) == 1 and "-e '.[dev]'" in test[0], test


def test_the_demo_and_the_node_import_nothing_from_the_extras() -> None:
    """What `make run` runs (the CLI, the demo, the node processes it starts), with every dev
    extra made unimportable."""
    code = (
        "import sys\n"
        f"blocked = {EXTRAS!r}\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in blocked:\n"
        "            raise ImportError(f'{name} is a dev extra', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import raft.cli.main, raft.cli.demo, raft.cli.localcluster, raft.node.serve\n"
        "raise SystemExit(raft.cli.main.main(['demo', '--help']))\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "demo" in res.stdout


def test_serve_says_at_start_what_is_on_and_where(tmp_path: Path) -> None:
    port, metrics = free_base_port(1), free_base_port(1)
    node = Running(*SERVE, "--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                   f"1=127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics}",
                   "--retention-bytes", "64MiB", "--retention-ms", "7d")
    try:
        line = node.wait_line(r"^raftlog serve: TLS ").string
        assert "TLS off" in line and "auth off" in line
        assert f"metrics on at http://127.0.0.1:{metrics}/metrics" in line
        assert "retention on (keeps at most 67,108,864 bytes and batches younger than 7 d)" \
            in line
    finally:
        assert node.stop() == 0
    plain = Running(*SERVE, "--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                    f"1=127.0.0.1:{port}")
    try:
        line = plain.wait_line(r"^raftlog serve: TLS ").string
        assert "metrics off" in line and "retention off" in line
    finally:
        assert plain.stop() == 0


def test_ctrl_c_stops_serve_cleanly_with_130_and_sigterm_with_0(tmp_path: Path) -> None:
    port = free_base_port(1)
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 0)):
        node = Running(*SERVE, "--node-id", "1", "--data-dir", str(tmp_path), "--peers",
                       f"1=127.0.0.1:{port}")
        try:
            node.wait_line(r"^raftlog serve: TLS ")
            node.signal(sig)
            assert node.wait() == code, node.err[-5:]
        finally:
            node.stop()
