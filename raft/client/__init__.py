"""The raftlog client library: trio-native `Client` and `Producer`, and `BlockingClient` for
scripts and Spark executors.

What it takes off the caller: finding the leader (any node answers `status`; NOT_LEADER carries
the leader's address), reconnecting, retrying retriable errors with backoff inside the caller's
timeout, and, for producers, idempotence and batching. A `Producer` has a random 63-bit id and
numbers its requests; a retry after a timeout, a dropped connection or a leader change resends
the same (producer id, sequence), so the cluster writes the batch once and answers the retry
with the original offsets.

Errors are typed (`NotLeaderError`, `RequestTimeout`, `TooLargeError`, `OffsetOutOfRangeError`,
`ShuttingDownError`, `AuthenticationError`, `PermissionDeniedError`, `TLSError`, ...), all
subclasses of `RaftlogError` carrying the server's code and message; the public API never raises
an ExceptionGroup. `RequestTimeout` is the "unknown" outcome: a write that may or may not be in
the log. When no node listens at any of the addresses given, calls fail at once with one
`UnavailableError` naming them all.

Topics (issue 26): `Producer(client, topic="orders")` picks each record's partition (its key's
murmur2 hash, Kafka's default; keyless records sticky per batch; docs/PARTITIONING.md) and
sends it to that partition's leader; `TopicConsumer(client, "orders")` reads every partition
(or some), each in order; `Client.create_topic`, `alter_topic`, `delete_topic`, `list_topics`,
`describe_topic` manage them (raft/client/topic_calls.py). The client keeps the cluster's
metadata (raft/client/metadata.py) and routes each request to its partition's leader
(raft/client/routing.py). Without a topic everything is as before topics: the default topic's
partition 0.

Security: `Client(..., tls_ca=, tls_cert=, tls_key=, token=)` (raft.client.security).

Subscriptions (named positions kept by the cluster): `Consumer(client, subscription="orders")`
iterates a subscription's records and commits the position as it goes; `Client.subscription_*`
and `Client.subscriptions()` manage them (raft/client/subscription_calls.py).

Layout: errors.py (the typed errors), results.py (what operations return), connection.py (one
connection to one node), client.py (`Client`), producer.py (`Producer`), blocking.py
(`BlockingClient`), subscriptions.py (the subscription calls), commits.py (the consumers of one
client commit together: one `sub_commit_many` request for many commits), consumer.py
(`Consumer`), topic_subscription.py (`TopicSubscription`: members sharing a topic's
partitions), metadata.py, routing.py, topic_calls.py, topic_consumer.py (topics).
"""

from raft.client.blocking import BlockingClient
from raft.client.client import Client, parse_servers
from raft.client.errors import (AuthenticationError, BackpressureError, BadRequestError,
                                DiskFullError, LeadershipLostError, NotLeaderError,
                                OffsetOutOfRangeError, PermissionDeniedError, RaftlogError,
                                RequestTimeout, ShuttingDownError, TooLargeError,
                                TopicExistsError, UnavailableError, UndecodableBatchError,
                                UnknownTopicError, error_from_reply)
from raft.client.consumer import BlockingConsumer, Consumer
from raft.client.errors import (InvalidSubscriptionName, PositionBehind,
                                PositionPastHighWatermark, SubscriptionError, SubscriptionLeased,
                                SubscriptionPositionRemoved, UnknownSubscription)
from raft.client.metadata import Metadata, PartitionInfo, TopicInfo
from raft.client.producer import Delivery, Producer
from raft.client.results import FetchedRecord, FetchResult, ProduceResult, UndecodableBatch
from raft.client.security import ClientSecurity, TLSError
from raft.client.topic_consumer import TopicConsumer
from raft.client.topic_subscription import TopicSubscription

__all__ = [
    "AuthenticationError", "ClientSecurity", "PermissionDeniedError", "TLSError",
    "BackpressureError", "BadRequestError", "BlockingClient", "Client", "Delivery",
    "DiskFullError", "FetchResult",
    "FetchedRecord", "LeadershipLostError", "NotLeaderError", "OffsetOutOfRangeError",
    "ProduceResult", "Producer", "RaftlogError", "RequestTimeout", "ShuttingDownError",
    "TooLargeError", "UnavailableError", "UndecodableBatch", "UndecodableBatchError",
    "error_from_reply", "parse_servers",
    "BlockingConsumer", "Consumer", "InvalidSubscriptionName", "PositionBehind",
    "PositionPastHighWatermark", "SubscriptionError", "SubscriptionLeased",
    "SubscriptionPositionRemoved",
    "UnknownSubscription", "Metadata", "PartitionInfo", "TopicConsumer", "TopicSubscription", "TopicExistsError",
    "TopicInfo", "UnknownTopicError",
]
