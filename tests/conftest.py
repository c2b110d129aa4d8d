"""What the whole test session shares.

The test process runs in-process nodes, so it tunes its interpreter once, as `raftlog serve`
does for a node's process (raft.node.serve.tune_interpreter). With Python's defaults a full
garbage collection walks everything a test session holds, which can stall an in-process node's
event loop past its (short, in tests) election timeout.

Client profiles (raft/cli/profiles.py) are read from an empty directory of the session's own,
so a developer's ~/.config/raftlog/profiles.toml (or exported RAFTLOG_PROFILE) cannot steer the
CLI processes the tests start; tests of profiles point RAFTLOG_CONFIG_DIR at their tmp_path.
"""

from __future__ import annotations

import os

import pytest

from raft.node.serve import tune_interpreter


@pytest.fixture(autouse=True, scope="session")
def _tuned_interpreter() -> None:
    tune_interpreter()


@pytest.fixture(autouse=True, scope="session")
def _no_user_profiles(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["RAFTLOG_CONFIG_DIR"] = str(tmp_path_factory.mktemp("no-profiles"))
    for name in ("RAFTLOG_PROFILE", "RAFTLOG_TOKEN_FILE"):
        os.environ.pop(name, None)
