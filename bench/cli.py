"""`raftlog bench`: argument parsing. raft/cli/main.py calls `register(subparsers)`; this module
also runs alone as `python -m bench.cli ...` (same arguments)."""

from __future__ import annotations

import argparse
import logging
import sys

from rich.console import Console

from bench.catalogue import MEASURES, WORKLOADS, available_workloads
from bench.workloads.common import BenchConfig

DEFAULT_OUT = "bench-results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                   help=f"workloads to run (default: {' '.join(WORKLOADS)}; others found in "
                        f"bench/workloads, e.g. recovery or spark, run when named)")
    p.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    p.add_argument("--duration", type=float, default=None,
                   help="measured seconds per point (default 2; 0.5 with --quick)")
    p.add_argument("--repeats", type=int, default=None,
                   help="repetitions per figure; the median is reported with min and max "
                        "(default 3; 1 with --quick)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"directory for results.json and the PNG plots (default ./{DEFAULT_OUT})")
    p.add_argument("--compare", metavar="OLD.json",
                   help="print each figure beside the one in an earlier results.json")
    p.add_argument("--quick", action="store_true",
                   help="a tiny version of every workload (about a minute; the smoke test)")
    p.add_argument("--data-dir", default=None,
                   help="parent directory for the clusters' temp data dirs (default $TMPDIR); "
                        "put it on the disk you want to measure")
    p.add_argument("--batch-bytes", type=int, default=256 << 10,
                   help="record bytes per produce request (client batching, default 256 KiB)")
    p.add_argument("--window", type=int, default=8,
                   help="produce requests in flight per producer (default 8)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument passed to every `raftlog serve` (repeatable)")
    p.add_argument("--keep-data", "--keep", dest="keep", action="store_true",
                   help="keep the clusters' data dirs and logs (default: each workload's are "
                        "removed when it ends; the next one starts with the space back)")
    p.add_argument("--only", default="", metavar="A,B",
                   help="run only these measures of a workload that has several (partitions: "
                        "throughput,keyed,fsyncs,idle,create,failover; trace: closed, 64 "
                         "closed-loop writers instead of 200 writes/s; latency: closed64, the "
                         "closed-loop writers without the open-loop rates; produce: its points "
                         "as ACKS.SIZE.pN, e.g. quorum.1KiB.p8)")
    p.add_argument("--partitions", type=int, default=None,
                   help="the large partition count of `partitions` (default 1000; 4 with "
                        "--quick)")
    p.add_argument("--producers", type=int, default=None,
                   help="load generator processes of `scale` (default 4; 2 with --quick)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.nodes < 1:
        raise SystemExit("bench: --nodes must be at least 1")
    known = available_workloads()
    unknown = [w for w in args.workloads if w not in known]
    if unknown:
        raise SystemExit(f"bench: unknown workload {unknown[0]!r}; choose from "
                         f"{', '.join(known)}")
    only = [m.strip() for m in args.only.split(",") if m.strip()]
    bad = [m for m in only if m not in MEASURES]
    if bad:
        raise SystemExit(f"bench: unknown measure {bad[0]!r} for --only; choose from "
                         f"{', '.join(MEASURES)}")
    if args.partitions is not None and args.partitions < 1:
        raise SystemExit("bench: --partitions must be at least 1")
    if args.producers is not None and args.producers < 1:
        raise SystemExit("bench: --producers must be at least 1")
    return BenchConfig(
        workloads=list(args.workloads) or list(WORKLOADS), nodes=args.nodes,
        duration=args.duration if args.duration is not None else (0.5 if args.quick else 2.0),
        repeats=args.repeats if args.repeats is not None else (1 if args.quick else 3),
        quick=args.quick, base_dir=args.data_dir, server_args=list(args.server_arg),
        batch_bytes=args.batch_bytes, window=args.window, keep=args.keep,
        only=only,
        partitions=args.partitions or (4 if args.quick else 1000),
        producers=args.producers)


def command(args: argparse.Namespace) -> int:
    """Run the bench described by parsed arguments. Exit code 0 when every workload completed;
    1 when one failed or was refused (the summary says which and why), or nothing fit."""
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else
                        logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # logs and CI: wide enough for one row per figure
    old = None
    if args.compare:
        from bench.results import load

        try:
            old = load(args.compare)
        except (OSError, ValueError) as e:
            console.print(f"[red]bench: cannot read --compare file {args.compare}: {e}[/]")
            return 2
    # bench.runner pulls in matplotlib (plots): imported only when a bench runs, so `raftlog
    # serve` and every other command start without it.
    from bench.disk import DiskTooSmall
    from bench.runner import failed_workloads, finish, run

    cfg = config_from_args(args)
    try:
        results = run(cfg, console, command=["raftlog", "bench", *_argv_of(args)])
    except KeyboardInterrupt:
        console.print("[yellow]bench: interrupted; clusters stopped[/]")
        return 130
    except DiskTooSmall as e:
        console.print(f"[red]bench: refused: {e}[/]")
        return 1
    finish(results, args.out, console, old)
    # Non-zero when any workload failed or was refused: a script or CI must not read a run
    # that measured nothing (the disk full, the cluster never caught up) as a success.
    return 1 if failed_workloads(results) else 0


def _argv_of(args: argparse.Namespace) -> list[str]:
    """The arguments as typed (for results.json's `command`)."""
    return list(getattr(args, "_bench_argv", None) or sys.argv[2:])


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="benchmark a fresh local cluster and write results.json and plots",
        description="Start a fresh cluster of real `raftlog serve` processes on 127.0.0.1, "
                    "probe the machine's limits, run the workloads, stop the cluster, and write "
                    "results.json and PNG plots into --out.")
    add_arguments(p)
    p.set_defaults(func=command, handler=command)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="raftlog bench")
    add_arguments(parser)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    args._bench_argv = argv
    return command(args)


if __name__ == "__main__":
    sys.exit(main())
