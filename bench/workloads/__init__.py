"""Workloads of `raftlog bench`. Each module offers `steps(cfg) -> int` (progress bar sizing)
and `run(ctx) -> (figures, details)`; the recovery and Spark issues plug in the same way."""
