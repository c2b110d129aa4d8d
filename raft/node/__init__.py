"""The trio runtime that drives the sans-IO core: the node server, one Raft group's driver, peer
links and the node's configuration. The wire protocol itself is raft.protocol.

Nothing is imported here eagerly, so a client that needs only address parsing (`raft.node.config`) does not load the server. The server
is `raft.node.server.Node`; `python -m raft.node` runs one node.
"""
