"""The bench's nodes start from compiled bytecode, as an installed raftlog does, even where the
environment says PYTHONDONTWRITEBYTECODE (bench/harness.py ensure_bytecode; start28,
docs/PERFORMANCE.md): otherwise each node start compiled its modules again, inside the
figures that time a restart (`bench recovery`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from bench import harness


def test_the_node_packages_are_compiled_once_before_nodes_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "s28_node_pkg"
    (pkg / "sub").mkdir(parents=True)
    for rel in ("__init__.py", "mod.py", "sub/__init__.py", "sub/deep.py"):
        (pkg / rel).write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE=1
    monkeypatch.setattr(harness, "NODE_PACKAGES", ("s28_node_pkg",))
    monkeypatch.setattr(harness, "_compiled", False)
    harness.ensure_bytecode()
    for rel in ("mod.py", "sub/deep.py"):
        assert Path(importlib.util.cache_from_source(str(pkg / rel))).is_file(), rel
    # Once per bench process: a second cluster does not walk the packages again.
    (pkg / "late.py").write_text("VALUE = 2\n")
    harness.ensure_bytecode()
    assert not Path(importlib.util.cache_from_source(str(pkg / "late.py"))).exists()


def test_the_node_packages_are_the_ones_a_node_imports() -> None:
    for name in harness.NODE_PACKAGES:
        assert importlib.util.find_spec(name) is not None, name
