"""Which partition a record goes to: Kafka's default partitioner, so users' keys land where
they expect (issue 26 item 5; docs/PARTITIONING.md has the hash step by step).

- A record with a key: `to_positive(murmur2(key)) % partitions`, murmur2 being the 32-bit
  MurmurHash2 variant of Kafka's Java client (seed 0x9747b28c, the key's bytes as given), and
  to_positive clearing the sign bit (not abs: abs(-2**31) overflows in Java). Every record of
  a key goes to one partition while the partition count stays the same, so per-key order
  holds; the Spark writer and any other client computing the same hash agree with the producer.
- A record without a key: sticky per batch (Kafka's KIP-480). A producer fills one batch for
  one partition, then picks another partition for the next batch; spreading record by record
  would make many small batches. The choice comes from a seeded RNG, so a test (or the
  simulation) replays it exactly.

Pure: no clocks, no global random.
"""

from __future__ import annotations

import random

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """The 32-bit MurmurHash2 of `data` as Kafka's Java client computes it, as a signed
    32-bit integer (what Java's int holds)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = length % 4
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h ^= data[whole]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """The value with its sign bit cleared (Kafka's Utils.toPositive)."""
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed record among `partitions` (Kafka's default partitioner)."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, got {partitions}")
    return to_positive(murmur2(key)) % partitions


class StickyPartitioner:
    """Partitions for one producer of one topic: keyed records by their hash, keyless ones all
    to the current sticky partition until `next_batch` moves it (to another partition when
    there is more than one), the choice drawn from a seeded RNG."""

    __slots__ = ("partitions", "_rng", "_sticky")

    def __init__(self, partitions: int, seed: int | None = 0,
                 rng: random.Random | None = None) -> None:
        if partitions < 1:
            raise ValueError(f"a topic has at least one partition, got {partitions}")
        self.partitions = partitions
        self._rng = rng if rng is not None else random.Random(seed)
        self._sticky = self._rng.randrange(partitions)

    @property
    def sticky(self) -> int:
        """Where keyless records go until the current batch is done."""
        return self._sticky

    def partition(self, key: bytes | None) -> int:
        return self._sticky if key is None else partition_for_key(key, self.partitions)

    def next_batch(self) -> int:
        """The keyless batch was sent: stick to another partition for the next one."""
        if self.partitions > 1:
            step = self._rng.randrange(1, self.partitions)
            self._sticky = (self._sticky + step) % self.partitions
        return self._sticky

    def resize(self, partitions: int) -> None:
        """The topic grew (metadata refresh): keys hash over the new count from now on."""
        if partitions < 1:
            raise ValueError(f"a topic has at least one partition, got {partitions}")
        self.partitions = partitions
        self._sticky %= partitions
