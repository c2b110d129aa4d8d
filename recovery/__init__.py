"""Recovery: the RFC's catch-up machinery for lagging followers (Redpanda's raft-recovery RFC).

The Raft rules (who may commit what, which replies count) stay in the core (`raft/`); this
package holds how a lagging follower is brought back, as sans-IO code the core calls:

- `probe`: finding the match point with term hints (the follower's conflict hint, the leader's
  jump back a whole term per round trip);
- `stream`: planning the next chunk for a follower (chunk size, `flush=False` while recovering,
  the last chunk asking for a flush, a reset to the leader's log start);
- `window`: the per-follower in-flight window (requests and bytes pipelined);
- `deferred_flush`: when a follower flushes data that arrived with `flush=False`;
- `ratelimit`: the runtime's recovery throttle (a token bucket over a clock passed in).

Nothing here imports trio, sockets, clocks or the core: it reads a `storage.api.LogStorage`
and returns decisions.
"""
