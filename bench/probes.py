"""Machine limits, measured in the same run as the cluster figures.

Why in the same run: a shared 2-core VM changes speed from minute to minute; a cluster figure
means something only next to the bound measured beside it. Each probe is small (a second or
two) and runs in the same temp directory (same file system) as the cluster's data dirs.

- fsync latency: write 4 KiB and fsync, many times: the floor of any quorum-acked latency.
- sequential write MB/s: 1 MiB writes, one fsync at the end: the disk's streaming rate.
- loopback TCP MB/s between two processes: the floor of any byte that crosses a socket.
- raw LMDB append MB/s: sequential puts committed (fsynced) in 4 MiB transactions, the
  group-commit rate our storage can at best reach.
- LMDB commit latency: one small record per fsynced LMDB transaction (LMDB syncs the data
  pages, then the meta page: two fsyncs): what a lone quorum write pays on every node.
- RPC floor: sequential request/reply round trips (trio + msgpack framing, loopback) against a
  server that does nothing: the client/transport share of every latency figure.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import tempfile
import time
from dataclasses import dataclass

import lmdb

from bench.stats import Histogram, Summary

MB = 1_000_000


@dataclass(slots=True)
class ProbeSizes:
    fsyncs: int = 200
    rpcs: int = 2000
    seq_write_bytes: int = 128 << 20
    tcp_bytes: int = 512 << 20
    lmdb_bytes: int = 64 << 20

    @staticmethod
    def quick() -> "ProbeSizes":
        return ProbeSizes(fsyncs=30, rpcs=200, seq_write_bytes=16 << 20, tcp_bytes=64 << 20,
                          lmdb_bytes=8 << 20)


def fsync_latency(dir_: str, n: int) -> Histogram:
    """Microseconds per (4 KiB pwrite + fsync) on a preallocated file, like a WAL append."""
    h = Histogram()
    path = os.path.join(dir_, "fsync.probe")
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(n):
            t0 = time.perf_counter()
            os.pwrite(fd, block, (i % 256) * 4096)
            os.fsync(fd)
            h.record((time.perf_counter() - t0) * 1e6)
    finally:
        os.close(fd)
        os.unlink(path)
    return h


def seq_write_mbps(dir_: str, total: int) -> float:
    path = os.path.join(dir_, "seq.probe")
    chunk = os.urandom(1 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        t0 = time.perf_counter()
        for _ in range(total // len(chunk)):
            os.write(fd, chunk)
        os.fsync(fd)
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return total / dt / MB


def _tcp_sender(port: int, total: int) -> None:
    chunk = b"\x5a" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as s:
        sent = 0
        while sent < total:
            s.sendall(chunk)
            sent += len(chunk)


def tcp_loopback_mbps(total: int) -> float:
    """A child process streams `total` bytes to us over 127.0.0.1; we time the receive side."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        proc = mp.get_context("spawn").Process(target=_tcp_sender, args=(port, total), daemon=True)
        proc.start()
        try:
            conn, _ = srv.accept()
            with conn:
                buf = bytearray(1 << 20)
                view = memoryview(buf)
                got = conn.recv_into(view)  # first bytes: start the clock once data flows
                t0 = time.perf_counter()
                while got < total:
                    n = conn.recv_into(view)
                    if not n:
                        break
                    got += n
                dt = time.perf_counter() - t0
        finally:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return got / dt / MB


def lmdb_append_mbps(dir_: str, total: int, value_bytes: int = 64 << 10,
                     txn_bytes: int = 4 << 20) -> float:
    """Sequential big-endian keys, fsynced commit every `txn_bytes` (group commit)."""
    path = os.path.join(dir_, "lmdb.probe")
    env = lmdb.open(path, map_size=max(4 * total, 64 << 20), sync=True, metasync=True,
                    writemap=False, subdir=True)
    value = os.urandom(value_bytes)
    per_txn = max(1, txn_bytes // value_bytes)
    n = max(1, total // value_bytes)
    try:
        t0 = time.perf_counter()
        key = 0
        while key < n:
            with env.begin(write=True) as txn:
                for _ in range(min(per_txn, n - key)):
                    txn.put(key.to_bytes(8, "big"), value, append=True)
                    key += 1
        dt = time.perf_counter() - t0
    finally:
        _remove_env(env, path)
    return n * value_bytes / dt / MB


def lmdb_commit_latency(dir_: str, n: int) -> Histogram:
    """Microseconds per LMDB write transaction holding one 100-byte put, committed durably
    (sync and metasync on, as storage/lmdb_log.py opens it)."""
    h = Histogram()
    path = os.path.join(dir_, "lmdb-commit.probe")
    env = lmdb.open(path, map_size=64 << 20, sync=True, metasync=True, subdir=True)
    value = os.urandom(100)
    try:
        for key in range(n):
            t0 = time.perf_counter()
            with env.begin(write=True) as txn:
                txn.put(key.to_bytes(8, "big"), value, append=True)
            h.record((time.perf_counter() - t0) * 1e6)
    finally:
        _remove_env(env, path)
    return h


def _remove_env(env: lmdb.Environment, path: str) -> None:
    env.close()
    for name in os.listdir(path):
        os.unlink(os.path.join(path, name))
    os.rmdir(path)


def rpc_floor(n: int) -> Histogram:
    """Round trips of single small produce-shaped requests against bench.echo in a child."""
    import trio

    from bench import echo
    from storage.records import encode_values

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    proc = mp.get_context("spawn").Process(target=echo.serve, args=(srv,), daemon=True)
    proc.start()
    srv.close()
    try:
        payload = encode_values([b"x" * 100])
        return trio.run(echo.ping, f"127.0.0.1:{port}", n, payload)
    finally:
        proc.kill()
        proc.join(5)


def run_probes(dir_: str | None, sizes: ProbeSizes, repeats: int,
               on_step=lambda name: None) -> dict:
    """Every limit: medians over `repeats` (fsync: one histogram over all repeats)."""
    with tempfile.TemporaryDirectory(prefix="raftlog-probe-", dir=dir_) as d:
        fs = Histogram()
        seq, tcp, lm = [], [], []
        rpc = Histogram()
        lc = Histogram()
        for _ in range(repeats):
            rpc.merge(rpc_floor(sizes.rpcs))
            on_step("rpc_floor")
            fs.merge(fsync_latency(d, sizes.fsyncs))
            on_step("fsync")
            lc.merge(lmdb_commit_latency(d, sizes.fsyncs))
            on_step("lmdb_commit")
            seq.append(seq_write_mbps(d, sizes.seq_write_bytes))
            on_step("seq_write")
            tcp.append(tcp_loopback_mbps(sizes.tcp_bytes))
            on_step("tcp")
            lm.append(lmdb_append_mbps(d, sizes.lmdb_bytes))
            on_step("lmdb")
    return {
        "fsync_ms": {"p50": fs.percentile(0.5) / 1e3, "p99": fs.percentile(0.99) / 1e3,
                     "max": fs.max / 1e3, "count": fs.count},
        "lmdb_commit_ms": {"p50": lc.percentile(0.5) / 1e3, "p99": lc.percentile(0.99) / 1e3,
                           "max": lc.max / 1e3, "count": lc.count},
        "rpc_floor_ms": {"p50": rpc.percentile(0.5) / 1e3, "p99": rpc.percentile(0.99) / 1e3,
                         "max": rpc.max / 1e3, "count": rpc.count},
        "seq_write_MBps": Summary.of(seq).to_json(),
        "tcp_loopback_MBps": Summary.of(tcp).to_json(),
        "lmdb_append_MBps": Summary.of(lm).to_json(),
    }


def disk_need(sizes: ProbeSizes) -> int:
    """Free space the probes need: one probe file at a time (each is removed after it), the
    LMDB one at up to twice its bytes, and 64 MiB to spare."""
    return max(sizes.seq_write_bytes, 2 * sizes.lmdb_bytes) + (64 << 20)


PROBE_STEPS = 6  # on_step calls per repeat (progress bar sizing)
