"""Key -> partition by Kafka's default partitioner, checked against published answers, and
the sticky partitioner for keyless records."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raft.protocol.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
    to_positive,
)

# Kafka's UtilsTest.testMurmur2 (the Java client's own test; the same values appear in the
# test suites of ports that match it, e.g. kafkajs's default partitioner), plus the empty key.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
}
# Akka's Murmur2Spec, checked against Kafka's implementation (every tail length 1..3 and 0).
AKKA_VECTORS = {b"1": -1993445489, b"12": 126087238, b"123": -267702483,
                b"1234": -1614185708, b"12345": -1188365604}
# Not used: kafkajs's "legacy" partitioner vectors, which differ from the Java client (kafkajs
# renamed it when it made its default partitioner Java-compatible).


@pytest.mark.parametrize("key,expected", [*KAFKA_VECTORS.items(), *AKKA_VECTORS.items()])
def test_murmur2_matches_kafkas_java_client(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_is_to_positive_hash_modulo_count() -> None:
    # toPositive(-790332482) = 1357151166; 1357151166 % 50 = 16.
    assert to_positive(-790332482) == 1357151166
    assert partition_for_key(b"foobar", 50) == 16
    assert to_positive(-2**31) == 0  # not abs(): Java's abs(MIN_VALUE) is negative
    with pytest.raises(ValueError):
        partition_for_key(b"x", 0)


@given(st.binary(max_size=64), st.integers(1, 1000))
def test_a_key_always_lands_in_one_partition_in_range(key: bytes, n: int) -> None:
    p = partition_for_key(key, n)
    assert 0 <= p < n and partition_for_key(key, n) == p
    assert -2**31 <= murmur2(key) < 2**31


def test_keys_spread_over_partitions() -> None:
    counts = Counter(partition_for_key(f"key-{i}".encode(), 8) for i in range(8000))
    assert set(counts) == set(range(8)) and max(counts.values()) < 1.2 * 1000


def test_keyless_records_stick_to_one_partition_per_batch() -> None:
    sp = StickyPartitioner(6, seed=42)
    first = sp.sticky
    assert {sp.partition(None) for _ in range(100)} == {first}
    assert sp.partition(b"foobar") == partition_for_key(b"foobar", 6)
    seen = [first]
    for _ in range(200):
        nxt = sp.next_batch()
        assert nxt != seen[-1] and sp.partition(None) == nxt  # a new partition each batch
        seen.append(nxt)
    assert set(seen) == set(range(6))  # and every partition gets batches


def test_the_sticky_choice_replays_from_its_seed() -> None:
    def walk(sp: StickyPartitioner) -> list[int]:
        return [sp.sticky] + [sp.next_batch() for _ in range(50)]

    assert walk(StickyPartitioner(5, seed=7)) == walk(StickyPartitioner(5, seed=7))
    assert walk(StickyPartitioner(5, seed=7)) == walk(StickyPartitioner(5, rng=random.Random(7)))
    one = StickyPartitioner(1, seed=3)
    assert [one.next_batch() for _ in range(3)] == [0, 0, 0]


def test_a_grown_topic_hashes_over_the_new_count() -> None:
    sp = StickyPartitioner(2, seed=1)
    sp.resize(50)
    assert sp.partition(b"foobar") == 16 and 0 <= sp.sticky < 50
