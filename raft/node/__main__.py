"""`python -m raft.node --node-id 1 --data-dir DIR --peers ...`: one node without the full CLI."""

from raft.node.serve import main

raise SystemExit(main())
