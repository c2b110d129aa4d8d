"""The raftlog client library: `Client` (trio), `Producer` (idempotent batching) and
`BlockingClient` (a private trio loop in a thread, for scripts and Spark executors)."""

from raft.client.client import *  # noqa: F401,F403
from raft.client.client import __all__  # noqa: F401
