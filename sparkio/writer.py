"""`df.write.format("raftlog")`: exactly-once bulk loads through staged batches.

Driver (`RaftlogWriter.__init__`, in Spark's planning worker): `load_begin(loadId)` opens the
load (or finds it already committed: then every task writes nothing). Tasks (`write`): encode
Arrow batches in bulk (sparkio/encode.py) and stage them under (loadId, gen, partition, attempt,
seq). Driver (`commit`): one `load_commit` naming the successful attempts publishes them in one
replicated step; `abort` discards the load. See docs/SPARK.md for the guarantee and its limits.
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
from sparkio.security import ConnSecurity
from sparkio.staging import LoadClosed, RaftlogError, Session, Stager, parse_servers

log = logging.getLogger("sparkio.writer")

DEFAULT_BATCH_BYTES = 4 << 20


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
            security=ConnSecurity.from_options(options))


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
        session = Session(self.opts.servers, self.opts.timeout_s, security=self.opts.security)
        try:
            load = session.load_begin(self.opts.load_id)
        finally:
            session.close()
        self.gen = int(load["gen"])
        self.already = load["state"] == "committed"
        self.started = time.time()
        if self.already:
            log.warning("load already committed load_id=%s rows=%s: writing nothing",
                        self.opts.load_id, load.get("rows"))
        else:
            log.info("load begin load_id=%s gen=%d", self.opts.load_id, self.gen)

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
        attempts = [(m.partition, m.attempt, m.batches, m.rows) for m in msgs]
        session = Session(o.servers, o.timeout_s, security=o.security)
        try:
            load = session.load_commit(o.load_id, self.gen, attempts)
        finally:
            session.close()
        if load.get("state") != "committed" or load.get("gen") != self.gen:
            raise LoadClosed("LOAD_CLOSED", f"load {o.load_id!r} was not committed: "
                             f"{load.get('reason') or load.get('state')}; re-run the job with "
                             f"option loadId={o.load_id!r}")
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
            load = session.load_abort(o.load_id, self.gen, "the Spark job failed")
            log.warning("load aborted load_id=%s gen=%d state=%s", o.load_id, self.gen,
                        load.get("state"))
        except Exception as e:  # the leader's timeout aborts it anyway
            log.warning("load abort failed load_id=%s err=%s (the leader aborts it after the "
                        "load timeout)", o.load_id, e)
        finally:
            session.close()


__all__ = ["RaftlogWriter", "LoadCommitMessage", "SchemaError"]
