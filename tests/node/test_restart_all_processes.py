"""Every node SIGKILLed and started again under a library Producer and a plain produce (issue
29, item 7): a client that has reached the cluster waits for it within its timeout (10 s)
instead of failing with UNAVAILABLE while no node accepts connections. Every send is
delivered, the idempotent producer's retries write nothing twice (read back from every node),
and a subscription consumer (its fetches and commits, on a client of its own) reads on through
the restart."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from raft.cli.demo import verify
from raft.cli.localcluster import LocalCluster
from raft.client import Client, Consumer, Producer

pytestmark = pytest.mark.slow
DEADLINE_S = 120.0  # generous: three Python processes start on a loaded 2-core box


async def until(cond, what: str) -> None:  # noqa: ANN001
    """Poll a condition of this process's own client (its counters), under the deadline of
    the caller's fail_after."""
    while not cond():
        await trio.sleep(0.01)  # polling a condition, not waiting for time to pass


def kill_all(cluster: LocalCluster) -> None:
    for node_id in cluster.addresses:
        cluster.kill(node_id)


async def ride_through_restart(cluster: LocalCluster) -> dict[int, bytes]:
    acked: dict[int, bytes] = {}
    sent_idempotent: list[bytes] = []
    consumed: list[bytes] = []
    async with Client(cluster.servers, timeout=10) as client, \
            Client(cluster.servers, timeout=10) as reader_client, \
            Producer(client, acks="quorum", timeout=10) as producer, \
            trio.open_nursery() as nursery:
        # Both reach the cluster first: what they do after that is what is tested.
        acked[await producer.send(b"idem-before")] = b"idem-before"
        res = await client.produce([b"plain-before"], acks="quorum")
        acked[res.base_offset] = b"plain-before"
        stop, writer_done = trio.Event(), trio.Event()

        async def subscriber(task_status=trio.TASK_STATUS_IGNORED) -> None:
            """Reads the subscription until the end marker, committing as it goes."""
            async with Consumer(reader_client, subscription="through-restart",
                                auto_commit_ms=50, max_wait=0.2) as consumer:
                await consumer.open()
                task_status.started()
                async for record in consumer:
                    if record.value == b"end":
                        break
                    consumed.append(record.value)

        await nursery.start(subscriber)

        async def idempotent_writer() -> None:
            """One send at a time, across the kill and the restart: none may fail."""
            i = 0
            while not stop.is_set():
                value = f"idem-{i}".encode()
                sent_idempotent.append(value)
                acked[await producer.send(value)] = value
                i += 1
            writer_done.set()

        plain_done = trio.Event()

        async def plain_send() -> None:
            """A produce without a producer id, started while no node runs: nothing of it
            was written before the cluster is back, so it is delivered, once."""
            r = await client.produce([b"plain-during"], acks="quorum")
            acked[r.base_offset] = b"plain-during"
            plain_done.set()

        with trio.fail_after(DEADLINE_S):
            nursery.start_soon(idempotent_writer)
            await until(lambda: len(sent_idempotent) >= 20, "idempotent sends")
            await trio.to_thread.run_sync(kill_all, cluster)
            retries = client.retries
            await until(lambda: client.retries >= retries + 3, "the client retrying")
            nursery.start_soon(plain_send)
            retries = client.retries
            await until(lambda: client.retries >= retries + 3, "the client retrying")
            assert not plain_done.is_set()  # no node runs: nothing could answer it
            await trio.to_thread.run_sync(cluster.start)
            await plain_done.wait()
            count = len(sent_idempotent)
            await until(lambda: len(sent_idempotent) >= count + 20, "sends after the restart")
            stop.set()
            await writer_done.wait()
            acked[await producer.send(b"end")] = b"end"
    # Every idempotent send was acknowledged (a failure would have ended the writer, and the
    # test, with its error): each value is in `acked` exactly once.
    assert sorted(acked.values()) == sorted({*sent_idempotent, b"idem-before", b"plain-before",
                                             b"plain-during", b"end"})
    # The consumer read every record (at least once; it started at the log's start).
    assert set(acked.values()) - set(consumed) == {b"end"}
    return acked


def test_a_client_rides_through_a_restart_of_every_node(tmp_path: Path) -> None:
    with LocalCluster(tmp_path, nodes=3) as cluster:
        cluster.wait_leader(timeout=DEADLINE_S)
        acked = trio.run(ride_through_restart, cluster)
        leader = cluster.wait_leader(timeout=DEADLINE_S)
        for node_id in cluster.addresses:
            if node_id != leader:
                cluster.wait_caught_up(node_id, timeout=DEADLINE_S)
        # Each acknowledged record once, at its offset, on every node: nothing lost, and no
        # retry of the idempotent producer (or of the plain produce) written twice.
        assert verify(cluster, acked) == []
