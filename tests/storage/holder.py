"""Child process for the data-dir lock tests.

`python tests/storage/holder.py hold DIR`: open the log, print `ready PID`, then for each stdin
line `append` append one batch, flush and print `flushed N`; on EOF close the log and exit.
`python tests/storage/holder.py try DIR`: try to open the log once; print `locked MESSAGE` and
exit 3 on DataDirLocked, print `opened` and exit 0 if it opened.
"""

from __future__ import annotations

import os
import sys

from storage import DataDirLocked, open_log
from storage.batch import Batch


def main() -> int:
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "try":
        try:
            log = open_log(path)
        except DataDirLocked as e:
            print(f"locked {e}", flush=True)
            return 3
        log.close()
        print("opened", flush=True)
        return 0
    log = open_log(path)
    print(f"ready {os.getpid()}", flush=True)
    for line in sys.stdin:
        if line.strip() == "append":
            base = log.dirty_offset + 1
            log.append([Batch.create(b"held" * 8, 2).placed(base, max(1, log.last_term()))])
            print(f"flushed {log.flush()}", flush=True)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
