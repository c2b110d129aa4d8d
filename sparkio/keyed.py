"""Which topic partition each row of a Spark write goes to (issue 26 item 8): the producer's
rule (raft.protocol.partitioner, docs/PARTITIONING.md), so a row written by Spark lands where
the same record sent by `raft.client.Producer` would.

- A row with a key: partition_for_key(key bytes, partitions) (a string key is its UTF-8
  bytes), Kafka's murmur2, so every row of a key is in one partition.
- A row without a key: the task's own partition, `spark_partition % partitions`: each task's
  keyless rows stay together (one partition per task, as the producer keeps one per batch),
  and the tasks of a job spread over the partitions.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from raft.protocol.partitioner import partition_for_key


def row_partitions(rb: pa.RecordBatch, partitions: int, keyless: int) -> list[int]:
    """The topic partition of each row of `rb` (its optional `key` column)."""
    if "key" not in rb.schema.names:
        return [keyless] * rb.num_rows
    out = []
    for key in rb.column("key").to_pylist():
        if key is None:
            out.append(keyless)
        else:
            out.append(partition_for_key(key.encode() if isinstance(key, str) else key,
                                         partitions))
    return out


def split_by_partition(rb: pa.RecordBatch, partitions: int,
                       keyless: int) -> dict[int, pa.RecordBatch]:
    """`rb`'s rows grouped by topic partition, each group in the rows' order."""
    parts = row_partitions(rb, partitions, keyless)
    if len(set(parts)) <= 1:
        return {parts[0]: rb} if parts else {}
    column = pa.array(parts, pa.int32())
    out = {}
    for tp in sorted(set(parts)):
        out[tp] = rb.filter(pc.equal(column, tp))
    return out


__all__ = ["row_partitions", "split_by_partition"]
