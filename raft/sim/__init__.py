"""Deterministic simulation of a raftlog cluster: the real sans-IO core on in-memory logs, a
simulated network, disk and clock, and a nemesis, all driven by one seed (same seed, same run).

Driven by a plain discrete-event loop (raft/sim/loop.py), not trio: trio randomises its
scheduler, and worker threads under a mock clock let simulated time leap. See
`python -m raft.sim --help` and the README's "Safety testing" section."""

from raft.sim.runner import PROFILES, SimConfig, SimResult, profile_config, run_simulation

__all__ = ["PROFILES", "SimConfig", "SimResult", "profile_config", "run_simulation"]
