"""`python -m raft.cli ...` is `raftlog ...`."""

from raft.cli.main import main

raise SystemExit(main())
