"""The consensus core: a deterministic sans-IO Raft state machine (no trio, sockets, clocks or
global randomness). The runtime (raft/node/) and the simulation (raft/sim/) drive it; see
docs/DESIGN.md for one concern a file."""
