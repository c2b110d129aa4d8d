"""`df.write.format("raftlog")`: exactly-once bulk loads through staged batches.

Driver (`RaftlogWriter.__init__`, in Spark's planning worker): `load_begin(loadId)` opens the
load (or finds it already committed: then every task writes nothing). Tasks (`write`): encode
Arrow batches in bulk (sparkio/encode.py) and stage them under (loadId, gen, partition, attempt,
seq). Driver (`commit`): one `load_commit` naming the successful attempts publishes them in one
replicated step; `abort` discards the load. See docs/SPARK.md for the guarantee and its limits.

Topics (issue 26 item 8): with option `topic`, each row goes to the topic partition the
producer would pick (sparkio/keyed.py: its key's murmur2 partition, keyless rows the task's),
and the load is one load per topic partition (each partition's group keeps its own load
table): the driver begins one per partition, tasks stage each partition's rows under that
partition's load, and the driver commits each with the attempts that staged there. Exactly
once holds per partition under task retries and job re-runs (a re-run skips the partitions
whose load already committed); the partitions are not published in one atomic step.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from sparkio.encode import SchemaError, check_columns, chunks
from sparkio.keyed import split_by_partition
from sparkio.security import ConnSecurity
from sparkio.staging import (LoadClosed, RaftlogError, Session, Stager, parse_servers,
                             topic_partitions)

log = logging.getLogger("sparkio.writer")

# The leader's AppendEntries carry about 1 MiB (raft max_append_bytes, at least one batch):
# 4 MiB staged batches made 4 MiB frames on every peer link, and at a load average of 7-16 on
# two cores the followers then heard nothing for over 0.5 s (an election) in 23 of 29 loads,
# aborting them (1 MiB: 2 of 32). The per-row CPU is the same (docs/PERFORMANCE.md).
DEFAULT_BATCH_BYTES = 1 << 20


class InjectedFailure(RuntimeError):
    """Raised by the test-only failOnce/failAlways options."""


@dataclass
class LoadCommitMessage(WriterCommitMessage):
    partition: int
    attempt: int
    batches: int
    rows: int
    bytes: int
    seconds: float
    skipped: str = ""  # why nothing was written (already committed / restarted), else ""
    staged: tuple[tuple[int, int, int], ...] = ()  # with a topic: (topic partition, batches, rows)


@dataclass(slots=True)
class WriteOptions:
    servers: list[str]
    acks: str
    load_id: str
    batch_bytes: int
    max_inflight: int
    timeout_s: float
    fail_once: int | None  # test only: partition whose first attempt fails midway
    fail_always: int | None  # test only: partition whose every attempt fails midway
    security: ConnSecurity = ConnSecurity()  # tlsCa/tlsCert/tlsKey/token options
    topic: str | None = None  # option topic: rows go to their key's partition of it

    @staticmethod
    def parse(options: dict[str, str]) -> "WriteOptions":
        # Spark hands options over case-insensitively (keys lower-cased).
        options = {k.lower(): v for k, v in options.items()}
        if "servers" not in options:
            raise ValueError("raftlog writer needs option servers='host:port,host:port,...'")
        acks = options.get("acks", "leader")
        if acks not in ("leader", "quorum", "none"):
            raise ValueError(f"acks must be leader, quorum or none, got {acks!r}")

        def opt_int(name: str) -> int | None:
            return int(options[name]) if options.get(name) not in (None, "") else None

        return WriteOptions(
            servers=parse_servers(options["servers"]), acks=acks,
            load_id=options.get("loadid") or f"spark-{uuid.uuid4()}",
            batch_bytes=int(options.get("batchbytes", DEFAULT_BATCH_BYTES)),
            max_inflight=int(options.get("maxinflight", 4)),
            timeout_s=int(options.get("requesttimeoutms", 60_000)) / 1000,
            fail_once=opt_int("failonce"), fail_always=opt_int("failalways"),
            security=ConnSecurity.from_options(options), topic=options.get("topic") or None)


def check_schema(schema: StructType) -> None:
    types = {}
    for f in schema.fields:
        if f.name in ("key", "value"):
            types[f.name] = ("binary" if isinstance(f.dataType, BinaryType) else
                             "string" if isinstance(f.dataType, StringType) else
                             f.dataType.simpleString())
    check_columns([f.name for f in schema.fields], types)


class RaftlogWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("raftlog is append-only: use .mode('append')")
        check_schema(schema)
        self.opts = WriteOptions.parse(dict(options))
        self.partitions = 1  # of the topic (option topic), else the default topic's one
        self.gens: dict[int, int] = {}  # topic partition -> its load's generation
        self.done: set[int] = set()  # topic partitions whose load already committed
        session = Session(self.opts.servers, self.opts.timeout_s, security=self.opts.security)
        try:
            if self.opts.topic is not None:
                self.partitions = topic_partitions(session, self.opts.topic)
            for tp in range(self.partitions):
                load = session.load_begin(self.opts.load_id, **self.where(tp))
                self.gens[tp] = int(load["gen"])
                if load["state"] == "committed":
                    self.done.add(tp)
        finally:
            session.close()
        self.gen = self.gens[0]
        self.already = len(self.done) == self.partitions
        self.started = time.time()
        if self.already:
            log.warning("load already committed load_id=%s rows=%s: writing nothing",
                        self.opts.load_id, load.get("rows"))
        else:
            log.info("load begin load_id=%s gen=%d", self.opts.load_id, self.gen)

    def where(self, tp: int) -> dict[str, object]:
        """The load requests' topic partition fields ({} without option topic)."""
        if self.opts.topic is None:
            return {}
        return {"topic": self.opts.topic, "topic_partition": tp}

    # -- executors ---------------------------------------------------------------------------
    def write(self, iterator: Iterator[pa.RecordBatch]) -> LoadCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx else 0
        # taskAttemptId is unique per attempt in the application; attemptNumber restarts at 0
        # when a whole stage is retried, so two attempts of a partition could share it.
        attempt = ctx.taskAttemptId() if ctx else 0
        first_try = ctx.attemptNumber() == 0 if ctx else True
        t0 = time.monotonic()
        o = self.opts
        if self.already:
            return LoadCommitMessage(part, attempt, 0, 0, 0, 0.0, "already committed")
        if o.topic is not None:
            return self._write_topic(iterator, part, attempt, first_try, t0)
        session = Session(o.servers, o.timeout_s, security=o.security)
        try:
            # Executors re-check: a re-run may have committed (or restarted) the load since.
            load = session.load_status(o.load_id)
            if load is not None and (load["gen"] != self.gen or load["state"] != "open"):
                why = (f"load {o.load_id!r} is {load['state']} (generation {load['gen']}, "
                       f"this job {self.gen})")
                log.warning("task skipped partition=%d attempt=%d reason=%s", part, attempt, why)
                return LoadCommitMessage(part, attempt, 0, 0, 0, 0.0, why)
            stager = Stager(session, o.load_id, self.gen, part, attempt, o.acks, o.max_inflight)
            rows = nbytes = 0
            fail = (o.fail_once == part and first_try) or o.fail_always == part
            try:
                for chunk in chunks(iterator, o.batch_bytes):
                    stager.send(chunk.payload, chunk.count)
                    rows += chunk.count
                    nbytes += len(chunk.payload)
                    if fail and stager.seq >= 1:
                        stager.finish()  # the partial data is really in the log
                        raise InjectedFailure(f"test-only failure of partition {part} attempt "
                                              f"{attempt} after {rows} rows")
                batches = stager.finish()
            except LoadClosed as e:
                log.warning("task stopped partition=%d attempt=%d reason=%s", part, attempt, e)
                return LoadCommitMessage(part, attempt, 0, 0, 0, time.monotonic() - t0, str(e))
            except RaftlogError as e:
                if e.code == "TOO_LARGE":
                    raise RaftlogError(e.code, f"the cluster refused a staged batch of about "
                                               f"{o.batch_bytes} bytes ({e.message}); set a "
                                               f"smaller .option('batchBytes', ...)") from e
                raise
        finally:
            session.close()
        secs = time.monotonic() - t0
        log.info("task staged load_id=%s partition=%d attempt=%d batches=%d rows=%d bytes=%d "
                 "seconds=%.2f", o.load_id, part, attempt, batches, rows, nbytes, secs)
        return LoadCommitMessage(part, attempt, batches, rows, nbytes, secs)

    def _write_topic(self, iterator: Iterator[pa.RecordBatch], part: int, attempt: int,
                     first_try: bool, t0: float) -> LoadCommitMessage:
        """Option topic: each row to its partition's load (one session and stager per topic
        partition, made when the first row for it comes)."""
        o = self.opts
        sessions: dict[int, Session] = {}
        stagers: dict[int, Stager] = {}
        counts: dict[int, int] = {}
        nbytes = 0
        fail = (o.fail_once == part and first_try) or o.fail_always == part
        try:
            for rb in iterator:
                if rb.num_rows == 0:
                    continue
                for tp, sub in split_by_partition(rb, self.partitions,
                                                  part % self.partitions).items():
                    if tp in self.done:
                        continue  # its load committed in an earlier run: written once already
                    stager = stagers.get(tp)
                    if stager is None:
                        session = sessions[tp] = Session(o.servers, o.timeout_s,
                                                         security=o.security)
                        load = session.load_status(o.load_id, **self.where(tp))
                        if load is not None and (load["gen"] != self.gens[tp]
                                                 or load["state"] != "open"):
                            why = (f"load {o.load_id!r} of partition {tp} is {load['state']} "
                                   f"(generation {load['gen']}, this job {self.gens[tp]})")
                            return LoadCommitMessage(part, attempt, 0, 0, 0, 0.0, why)
                        stager = stagers[tp] = Stager(session, o.load_id, self.gens[tp], part,
                                                      attempt, o.acks, o.max_inflight,
                                                      o.topic or "", tp)
                    for chunk in chunks(iter([sub]), o.batch_bytes):
                        stager.send(chunk.payload, chunk.count)
                        counts[tp] = counts.get(tp, 0) + chunk.count
                        nbytes += len(chunk.payload)
                    if fail and sum(s.seq for s in stagers.values()) >= 1:
                        for s in stagers.values():
                            s.finish()  # the partial data is really in the log
                        raise InjectedFailure(f"test-only failure of partition {part} attempt "
                                              f"{attempt}")
            staged = tuple((tp, stagers[tp].finish(), counts.get(tp, 0))
                           for tp in sorted(stagers))
        except LoadClosed as e:
            return LoadCommitMessage(part, attempt, 0, 0, 0, time.monotonic() - t0, str(e))
        finally:
            for session in sessions.values():
                session.close()
        rows = sum(r for _, _, r in staged)
        return LoadCommitMessage(part, attempt, sum(b for _, b, _ in staged), rows, nbytes,
                                 time.monotonic() - t0, staged=staged)

    # -- driver ------------------------------------------------------------------------------
    def commit(self, messages: list[LoadCommitMessage | None]) -> None:
        o = self.opts
        if self.already:
            log.warning("load_id=%s was already committed: nothing written", o.load_id)
            return
        msgs = [m for m in messages if m is not None]
        skipped = [m for m in msgs if m.skipped]
        if skipped:
            # Another run took this load over (or committed it): publishing a part would break
            # exactly-once, so this run publishes nothing and fails loudly.
            raise LoadClosed("LOAD_CLOSED", f"load {o.load_id!r} was taken over by another run "
                                            f"({skipped[0].skipped}); this run published "
                                            f"nothing")
        session = Session(o.servers, o.timeout_s, security=o.security)
        try:
            for tp in range(self.partitions):
                if tp in self.done:
                    continue
                if o.topic is None:
                    attempts = [(m.partition, m.attempt, m.batches, m.rows) for m in msgs]
                else:  # every partition's load is closed, with what was staged there
                    attempts = [(m.partition, m.attempt, b, r) for m in msgs
                                for t, b, r in m.staged if t == tp]
                load = session.load_commit(o.load_id, self.gens[tp], attempts,
                                           **self.where(tp))
                if load.get("state") != "committed" or load.get("gen") != self.gens[tp]:
                    raise LoadClosed("LOAD_CLOSED", f"load {o.load_id!r}"
                                     f"{f' of partition {tp}' if o.topic else ''} was not "
                                     f"committed: {load.get('reason') or load.get('state')}; "
                                     f"re-run the job with option loadId={o.load_id!r}")
        finally:
            session.close()
        rows = sum(m.rows for m in msgs)
        nbytes = sum(m.bytes for m in msgs)
        secs = max(time.time() - self.started, 1e-9)
        log.warning("load committed load_id=%s gen=%d tasks=%d rows=%d bytes=%d seconds=%.1f "
                    "rows_per_s=%.0f MB_per_s=%.1f", o.load_id, self.gen, len(msgs), rows,
                    nbytes, secs, rows / secs, nbytes / secs / 1e6)

    def abort(self, messages: list[LoadCommitMessage | None]) -> None:
        o = self.opts
        if self.already:
            return
        session = Session(o.servers, o.timeout_s, security=o.security)
        try:
            for tp in range(self.partitions):
                if tp in self.done:
                    continue
                load = session.load_abort(o.load_id, self.gens[tp], "the Spark job failed",
                                          **self.where(tp))
                log.warning("load aborted load_id=%s partition=%d gen=%d state=%s", o.load_id,
                            tp, self.gens[tp], load.get("state"))
        except Exception as e:  # the leader's timeout aborts it anyway
            log.warning("load abort failed load_id=%s err=%s (the leader aborts it after the "
                        "load timeout)", o.load_id, e)
        finally:
            session.close()


__all__ = ["RaftlogWriter", "LoadCommitMessage", "SchemaError"]
