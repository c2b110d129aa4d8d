"""Where a recovery's CPU goes, stage by stage, in one process: `python -m bench.recovery_stages
[MiB]` (default 100).

The leader's side (LmdbLog.read of a recovery chunk, the AppendEntries frame encoded) and the
follower's (the frame arriving in 64 KiB reads, msgpack, the batches decoded and CRC-checked,
appended, flushed every 8 MiB) of `bench recovery`'s data (1000-byte records, 32 per batch),
each timed with the thread's CPU clock, which holds up on a loaded machine where the cluster's
wall-clock figures do not. Sockets, the event loops and the core are not in it: compare its
totals with the nodes' CPU per GB in `bench recovery` to see what they cost
(docs/PERFORMANCE.md, "Issue 28: recovery").
"""
import os
import shutil
import sys
import tempfile
import time

import msgpack

from raft.core import messages as m
from raft.protocol import raft_frames as rf
from raft.protocol.framing import decode_body, FrameDecoder
from storage.batch import Batch
from storage.lmdb_log import LmdbLog


def main() -> None:
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    tdir = tempfile.mkdtemp(prefix="raftlog-stages-")
    try:
        src = LmdbLog(os.path.join(tdir, "src"))
        rec = os.urandom(1000)
        payload = msgpack.packb([[None, rec, None]] * 32, use_bin_type=True)
        off = 0
        n = mib * (1 << 20) // (1000 * 32)
        while off < n * 32:
            bs = []
            for _ in range(256):
                if off >= n * 32:
                    break
                bs.append(Batch.create(payload, 32, base_offset=off, term=1))
                off += 32
            src.append(bs)
            src.flush()
        total = src.retained_bytes
        gb = total / 1e9
        T = {}

        def clock(name, t0):
            T[name] = T.get(name, 0) + time.thread_time() - t0

        nxt = 0
        budget = (512 << 10) + (64 << 10)
        enc = rf.BatchEncodings()
        frames = []
        dst = LmdbLog(os.path.join(tdir, "dst"))
        unfl = 0
        while nxt <= src.dirty_offset:
            t0 = time.thread_time()
            bs = src.read(nxt, budget, 1024)
            clock("L read (LMDB+decode+CRC)", t0)
            t0 = time.thread_time()
            msg = m.AppendEntries(1, 2, 1, nxt - 1, 1, bs, 0, False, 1)
            pieces = rf.encode_raft_frame_pieces([(0, msg)], enc)
            clock("L encode frame", t0)
            frames.append(1)
            nxt = bs[-1].last_offset + 1
            del bs, msg
            dec = FrameDecoder(64 << 20)
            whole = b"".join(pieces)
            reads = [whole[i:i + 65536] for i in range(0, len(whole), 65536)]
            t0 = time.thread_time()
            for p in reads:
                dec.feed(p)
                body = dec.next_body()
            clock("F feed + next_body (64 KiB reads)", t0)
            t0 = time.thread_time()
            obj = decode_body(body)
            clock("F msgpack unpack", t0)
            t0 = time.thread_time()
            msgs = rf.messages_from_frame(obj)
            clock("F message_from_wire (Batch.decode+CRC)", t0)
            t0 = time.thread_time()
            dst.append(msgs[0][1].batches)
            clock("F log.append", t0)
            unfl += sum(b.size for b in msgs[0][1].batches)
            if unfl >= 8 << 20:
                t0 = time.thread_time()
                dst.flush()
                clock("F flush (encode_value + put + commit)", t0)
                unfl = 0
        t0 = time.thread_time()
        dst.flush()
        clock("F flush (encode_value + put + commit)", t0)
        print(f"{total / 1e6:.0f} MB, {len(frames)} frames")
        for k, v in T.items():
            print(f"{v / gb:7.3f} s/GB  {k}")
        print(f"{sum(v for k, v in T.items() if k.startswith('L')) / gb:7.3f} s/GB  leader total")
        print(f"{sum(v for k, v in T.items() if k.startswith('F')) / gb:7.3f} s/GB  follower total")
    finally:
        shutil.rmtree(tdir)


if __name__ == "__main__":
    main()
