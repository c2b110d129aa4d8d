"""Storage bench: what the log alone can do, beside raw LMDB in the same run.

    python -m bench.storage_bench [--dir DIR] [--mib 64] [--out storage.json]

For 100 B and 16 KiB records (packed into ~64 KiB batches, as producers batch them):
- append only: appends into the in-memory tail, no flush (the dirty path's ceiling);
- flush per batch: append one batch, flush (one fsynced LMDB transaction per batch);
- group commit: appends continue while a worker thread flushes whatever has accumulated
  (what a node does: one fsync covers every batch appended before it started);
- raw LMDB: 64 KiB puts in fsynced 4 MiB transactions (the engine's own rate).
Every figure is MB/s of record bytes (10^6 bytes), median of --repeats, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from bench.probes import lmdb_append_mbps
from storage import open_log
from storage.batch import Batch
from storage.records import encode_values

MB = 1_000_000
BATCH_BYTES = 64 << 10
RECORD_SIZES = {"100B": 100, "16KiB": 16 << 10}


def _batches(record_size: int, total: int) -> list[Batch]:
    per = max(1, BATCH_BYTES // record_size)
    payload = encode_values([os.urandom(record_size)] * per)
    n = max(1, total // (per * record_size))
    return [Batch.create(payload, per) for _ in range(n)]


def _placed(log: Any, batches: list[Batch]) -> list[Batch]:
    out, nxt = [], log.dirty_offset + 1
    for b in batches:
        out.append(b.placed(nxt, 1))
        nxt += b.count
    return out


def append_only(d: str, batches: list[Batch]) -> float:
    log = open_log(d, max_tail_bytes=1 << 34)
    try:
        placed = _placed(log, batches)
        t0 = time.perf_counter()
        for b in placed:
            log.append([b])
        return time.perf_counter() - t0
    finally:
        log.close()


def flush_per_batch(d: str, batches: list[Batch]) -> float:
    log = open_log(d)
    try:
        placed = _placed(log, batches)
        t0 = time.perf_counter()
        for b in placed:
            log.append([b])
            log.flush()
        return time.perf_counter() - t0
    finally:
        log.close()


def group_commit(d: str, batches: list[Batch]) -> float:
    log = open_log(d, max_tail_bytes=1 << 34)
    try:
        placed = _placed(log, batches)
        target = placed[-1].last_offset
        done = threading.Event()
        wake = threading.Event()

        def flusher() -> None:
            while log.flushed_offset < target:
                wake.wait(0.05)
                wake.clear()
                log.flush()
            done.set()

        t0 = time.perf_counter()
        th = threading.Thread(target=flusher)
        th.start()
        for b in placed:
            log.append([b])
            wake.set()
        done.wait()
        th.join()
        return time.perf_counter() - t0
    finally:
        log.close()


def run(base_dir: str | None = None, mib: int = 64, repeats: int = 3,
        progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    total = mib << 20
    modes: dict[str, Callable[[str, list[Batch]], float]] = {
        "append_only": append_only, "group_commit": group_commit,
        "flush_per_batch": flush_per_batch}
    results: dict[str, Any] = {}

    def repeat(label: str, measure: Callable[[str], float]) -> dict[str, float]:
        """MB/s of `measure(fresh temp dir)`, median/min/max over the repeats."""
        rates = []
        for r in range(repeats):
            progress(f"{label} (repeat {r + 1})")
            d = tempfile.mkdtemp(prefix="raftlog-storage-bench-", dir=base_dir)
            try:
                rates.append(measure(d))
            finally:
                shutil.rmtree(d, ignore_errors=True)
        return _summary(rates)

    for name, size in RECORD_SIZES.items():
        for mode, fn in modes.items():
            # One fsync per 64 KiB batch is slow: measure it on a quarter of the bytes.
            n_bytes = total // 4 if mode == "flush_per_batch" else total
            batches = _batches(size, n_bytes)
            payload = sum(b.count for b in batches) * size
            results[f"{mode}.{name}"] = repeat(
                f"{mode} {name}", lambda d, fn=fn, b=batches, p=payload: p / MB / fn(d, b))
    # The engine's own rate, the same probe `raftlog bench` reports as a machine limit.
    results["raw_lmdb"] = repeat("raw LMDB", lambda d: lmdb_append_mbps(d, total))
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "mib": mib, "repeats": repeats, "batch_bytes": BATCH_BYTES, "MBps": results}


def _summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.table import Table

    p = argparse.ArgumentParser(prog="python -m bench.storage_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="where the test logs go (default: $TMPDIR)")
    p.add_argument("--mib", type=int, default=64, help="MiB written per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    console = Console()
    with console.status("storage bench...") as status:
        res = run(args.dir, args.mib, args.repeats, lambda s: status.update(s))
    table = Table(title=f"storage bench, {res['date']}, {res['machine']['cpus']} CPUs")
    table.add_column("mode")
    for name in RECORD_SIZES:
        table.add_column(f"{name} MB/s", justify="right")
    for mode in ("append_only", "group_commit", "flush_per_batch"):
        table.add_row(mode, *[_fmt(res["MBps"][f"{mode}.{n}"]) for n in RECORD_SIZES])
    table.add_row("raw LMDB (64 KiB puts, 4 MiB txns)", _fmt(res["MBps"]["raw_lmdb"]), "")
    console.print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def _fmt(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f} … {s['max']:,.0f})"


if __name__ == "__main__":
    raise SystemExit(main())
