"""What the whole test session shares.

The test process runs in-process nodes, so it tunes its interpreter once, as `raftlog serve`
does for a node's process (raft.node.serve.tune_interpreter). With Python's defaults a full
garbage collection walks everything a test session holds, which can stall an in-process node's
event loop past its (short, in tests) election timeout.
"""

from __future__ import annotations

import pytest

from raft.node.serve import tune_interpreter


@pytest.fixture(autouse=True, scope="session")
def _tuned_interpreter() -> None:
    tune_interpreter()
