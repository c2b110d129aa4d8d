"""The trio runtime that drives the sans-IO core: the node server, one Raft group's driver, peer
links, the wire protocol and the node's configuration.

Nothing is imported here eagerly, so a client that needs only the wire protocol
(`raft.node.wire`) or address parsing (`raft.node.config`) does not load the server. The server
is `raft.node.server.Node`; `python -m raft.node` runs one node.
"""
