"""`python -m raft.sim --seed N [--nodes 3|5] [--runs K]`: replay one schedule (or K from N)."""

from __future__ import annotations

import argparse
import sys
import time

from raft.sim.runner import PROFILES, profile_config, run_simulation


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raft.sim",
                                description="Run seeded simulations of a raftlog cluster.")
    p.add_argument("--seed", type=int, default=1, help="schedule seed (default 1)")
    p.add_argument("--nodes", type=int, choices=[3, 5], default=3)
    p.add_argument("--runs", type=int, default=1, help="run seeds seed..seed+runs-1")
    p.add_argument("--fault-ms", type=int, default=2000, help="fault window (default 2000)")
    p.add_argument("--profile", choices=sorted(PROFILES), default="mixed",
                   help="fault mix (default mixed)")
    p.add_argument("--verbose", action="store_true", help="print every run's summary")
    p.add_argument("--no-quiesce", action="store_true",
                   help="run without quiescence and node liveness (quiesce_ticks=0)")
    p.add_argument("--shards", type=int, default=1,
                   help="shard processes per node (the topics profile; default 1)")
    args = p.parse_args(argv)
    extra: dict = {"quiesce": False} if args.no_quiesce else {}
    if args.shards != 1:
        extra["shards"] = args.shards
    failed = 0
    t0 = time.monotonic()
    for seed in range(args.seed, args.seed + args.runs):
        res = run_simulation(profile_config(seed, args.nodes, args.profile,
                                            fault_time_us=args.fault_ms * 1000, **extra))
        if not res.ok or args.verbose or args.runs == 1:
            print(res.describe())
        failed += not res.ok
    print(f"{args.runs} run(s), {failed} failed, {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
