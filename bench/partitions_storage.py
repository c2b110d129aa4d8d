"""Partitions storage bench: fsyncs per second from 1 to 64 logs at the same total write rate.

    python -m bench.partitions_storage [--dir DIR] [--seconds 5] [--mbps 16] [--out p.json]

One LMDB store (storage/lmdb_store.py) holds P logs (P = 1, 8, 64). A producer thread appends
16 KiB batches (16 records of 1 KiB) round-robin across the logs, paced to --mbps in total
whatever P is; a flusher thread does what the node's flusher does (raft/node/flusher.py): one
flush at a time, taking every log with dirty data. Two flushers are compared:
- store: one `store.flush(dirty logs)` per round (one transaction, one fsync for all of them);
- per_log: one `log.flush()` per dirty log per round (what one flush loop per group would do).
Reported per P: fsyncs/s (store commits / elapsed), MB/s made durable, and the mean flush round
time. These are store-level figures (no network, no Raft); the ids partitions.fsyncs_ps.p1/p8/p64
are for the same question asked of a real cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import Any

from storage.batch import Batch
from storage.lmdb_store import LmdbStore
from storage.records import encode_values

MB = 1_000_000
RECORD = 1024
PER_BATCH = 16
PARTITIONS = (1, 8, 64)


def measure(base_dir: str | None, partitions: int, mode: str, seconds: float,
            mbps: float) -> dict[str, float]:
    d = tempfile.mkdtemp(prefix="raftlog-partitions-bench-", dir=base_dir)
    store = LmdbStore(d, max_tail_bytes=1 << 30)
    try:
        logs = [store.open_log(g) for g in range(partitions)]
        payload = encode_values([os.urandom(RECORD)] * PER_BATCH)
        proto = Batch.create(payload, PER_BATCH)
        batch_bytes = PER_BATCH * RECORD
        interval = batch_bytes / (mbps * MB)
        stop = threading.Event()
        rounds: list[float] = []

        def flusher() -> None:
            while not stop.is_set():
                dirty = [lg for lg in logs if lg.dirty_offset > lg.flushed_offset]
                if not dirty:
                    stop.wait(0.0005)
                    continue
                t0 = time.perf_counter()
                if mode == "store":
                    store.flush(dirty)
                else:
                    for lg in dirty:
                        lg.flush()
                rounds.append(time.perf_counter() - t0)

        commits0 = store.commits
        th = threading.Thread(target=flusher)
        th.start()
        t_start = time.perf_counter()
        sent = 0
        nxt = t_start
        while time.perf_counter() - t_start < seconds:
            lg = logs[sent % partitions]
            lg.append([proto.placed(lg.dirty_offset + 1, 1)])
            sent += 1
            nxt += interval
            delay = nxt - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        stop.set()
        th.join()
        elapsed = time.perf_counter() - t_start
        durable = sum(lg.flushed_offset + 1 for lg in logs) // PER_BATCH * batch_bytes
        return {"fsyncs_ps": (store.commits - commits0) / elapsed,
                "MBps_offered": sent * batch_bytes / MB / elapsed,
                "MBps_durable": durable / MB / elapsed,
                "flush_round_ms": 1000 * sum(rounds) / max(1, len(rounds))}
    finally:
        store.close()
        shutil.rmtree(d, ignore_errors=True)


def run(base_dir: str | None, seconds: float, mbps: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for mode in ("store", "per_log"):
        for p in PARTITIONS:
            results[f"{mode}.p{p}"] = measure(base_dir, p, mode, seconds, mbps)
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "seconds": seconds, "mbps": mbps, "record": RECORD, "per_batch": PER_BATCH,
            "results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.partitions_storage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=None, help="where the stores go (default: $TMPDIR)")
    p.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    p.add_argument("--mbps", type=float, default=16.0, help="total offered write rate")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    res = run(args.dir, args.seconds, args.mbps)
    print(f"partitions storage bench, {res['date']}, {res['machine']['cpus']} CPUs, "
          f"{args.mbps:g} MB/s offered")
    print(f"{'flusher':8} {'logs':>5} {'fsyncs/s':>9} {'MB/s durable':>13} {'round ms':>9}")
    for key, r in res["results"].items():
        mode, plabel = key.split(".")
        print(f"{mode:8} {plabel[1:]:>5} {r['fsyncs_ps']:>9.0f} {r['MBps_durable']:>13.1f} "
              f"{r['flush_round_ms']:>9.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
