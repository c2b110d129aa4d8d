"""The controller: the cluster's metadata as a replicated state machine (Raft group 0).

Sans-IO and deterministic, like the core it sits on: commands.py (the log entries and their
bytes), state.py (ClusterMetadata: apply, snapshot), bootstrap.py (the founders and the default
topic), placement.py (replicas for new partitions), rebalance.py (bounded moves and leadership
transfers toward balance), reconcile.py (what one node should run), follower.py (the metadata
kept current from the controller's log), access.py (topic-scoped permissions), section.py (the
metadata as a section of the state at the log start); command_fields.py and results.py (shared by
the topic and the link commands); link_commands.py, links.py, links_apply.py (cross-cluster
links and mirror topics, docs/REPLICATION.md). See docs/DESIGN.md, "Controller".
"""
