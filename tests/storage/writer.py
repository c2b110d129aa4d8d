"""Child process for the SIGKILL test: append and flush forever, reporting flushed offsets.

Run as `python tests/storage/writer.py DIR SEED`. Each line `flushed N` on stdout is written only
after flush() returned, so the parent may rely on every reported offset surviving a SIGKILL.
Payloads are a pure function of the base offset (see `payload_for`) so the parent can check that
what it reads back is what was written, not merely CRC-consistent.
"""

from __future__ import annotations

import random
import sys
import threading

from storage import open_log
from storage.batch import Batch


def payload_for(base_offset: int, size: int) -> bytes:
    return (base_offset.to_bytes(8, "big") * (size // 8 + 1))[:size]


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    rng = random.Random(seed)
    log = open_log(path, map_size=1 << 20)
    term = max(1, log.last_term())
    out = sys.stdout
    while True:
        for _ in range(rng.randint(1, 20)):
            base = log.dirty_offset + 1
            count = rng.randint(1, 4)
            size = rng.choice([10, 200, 4000, 30000])
            term += rng.random() < 0.05
            log.append([Batch.create(payload_for(base, size), count).placed(base, term)])
        if rng.random() < 0.5:
            flushed = log.flush()
        else:  # flush in a worker thread while this thread keeps appending, as the node does
            result: list[int] = []
            t = threading.Thread(target=lambda: result.append(log.flush()))
            t.start()
            base = log.dirty_offset + 1
            log.append([Batch.create(payload_for(base, 100), 1).placed(base, term)])
            t.join()
            flushed = result[0]
        out.write(f"flushed {flushed}\n")
        out.flush()


if __name__ == "__main__":
    main()
