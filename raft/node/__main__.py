"""`python -m raft.node --node-id 1 --data-dir DIR --peers ...`: one node without the full CLI."""

from raft.node.server import main

raise SystemExit(main())
