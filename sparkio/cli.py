"""`raftlog load`: bulk-load a file through a local (or remote) Spark job, exactly once.

    raftlog load --servers 127.0.0.1:7101,127.0.0.1:7102 --input rows.parquet --format parquet
    raftlog load --input rows.parquet --format parquet     # $RAFTLOG_SERVERS, else `up`'s cluster

The file's rows become records: a `value` column (binary or string) and optional `key` and
`headers` are written as they are; any other shape is first packed into a JSON `value` per row
(`--value-json`, the default when there is no `value` column). CSV columns keep their types
(inferred, or `--csv-schema`), so a number is a JSON number in the value. An input that is not in
the --format given is refused before Spark starts (sparkio/input_check.py). raft/cli/main.py
calls `register()` to add the subcommand.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid

from sparkio import input_check
from sparkio.input_check import FORMATS, InputMismatch, spark_message


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "load", help="bulk-load a parquet/csv/json file with Spark, exactly once",
        description="Bulk-load a file into raftlog with a Spark job (local[*] by default). "
                    "Re-running with the same --load-id after success writes nothing.")
    p.add_argument("--servers", default=None,
                   help="HOST:PORT,... of the cluster (default: $RAFTLOG_SERVERS, else the "
                        "local cluster `raftlog up` starts), like every other command")
    p.add_argument("--input", required=True, help="file or directory to load")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="the input's format: parquet, csv or json (JSON Lines); a file that "
                        "does not match is refused before Spark starts")
    p.add_argument("--acks", default="leader", choices=["leader", "quorum", "none"],
                   help="durability of staged batches (the publish step is always quorum)")
    p.add_argument("--load-id", default=None,
                   help="idempotency key: a re-run with the same id after success is a no-op "
                        "(default: a fresh id, printed)")
    p.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
    p.add_argument("--batch-bytes", type=int, default=1 << 20,  # writer.DEFAULT_BATCH_BYTES
                   help="bytes per staged request")
    p.add_argument("--csv-header", action="store_true", help="the CSV file has a header row")
    p.add_argument("--csv-schema", metavar="DDL", default=None,
                   help="CSV column names and types as Spark DDL, e.g. 'id INT, name STRING, "
                        "price DOUBLE' (default: types inferred from the data, so numbers and "
                        "booleans stay numbers and booleans in the JSON values)")
    p.add_argument("--value-json", action="store_true",
                   help="write every row as JSON in `value` even if a `value` column exists")
    from raft.cli.security import add_client_security_args
    add_client_security_args(p)
    p.set_defaults(func=run_load)


def _progress(spark, stop: threading.Event, started: float) -> None:  # noqa: ANN001
    tracker = spark.sparkContext.statusTracker()
    while not stop.wait(0.5):
        done = total = 0
        for sid in tracker.getActiveStageIds():
            info = tracker.getStageInfo(sid)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        if total:
            sys.stderr.write(f"\rloading: tasks {done}/{total}  {time.time() - started:6.1f}s ")
            sys.stderr.flush()


def run_load(args: argparse.Namespace) -> int:
    if not os.path.exists(args.input):
        print(f"raftlog load: input {args.input!r} does not exist; pass the path of a file "
              f"or directory", file=sys.stderr)
        return 2
    if args.csv_schema is not None and args.format != "csv":
        print(f"raftlog load: --csv-schema applies to --format csv, not {args.format} (parquet "
              f"carries its types; JSON's are read from the values)", file=sys.stderr)
        return 2
    try:
        input_check.check(args.input, args.format)
    except InputMismatch as e:
        print(f"raftlog load: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"raftlog load: cannot read {args.input}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("raftlog load needs pyspark: pip install 'raftlog[spark]'", file=sys.stderr)
        return 2
    import sparkio
    from raft.cli.security import client_options
    from sparkio.security import ConnSecurity
    from sparkio.staging import Session

    # Spark option names (the token travels via RAFTLOG_TOKEN in the environment, which the
    # local executors inherit, rather than as an option).
    security = client_options(args)
    if security.get("token"):
        os.environ["RAFTLOG_TOKEN"] = security["token"]
    tls_options = {opt: security[key] for key, opt in (("tls_ca", "tlsCa"),
                                                       ("tls_cert", "tlsCert"),
                                                       ("tls_key", "tlsKey")) if key in security}

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    load_id = args.load_id or f"load-{uuid.uuid4()}"
    owns_session = SparkSession.getActiveSession() is None  # embedded callers keep theirs
    spark = (SparkSession.builder.master(args.master).appName(f"raftlog load {load_id}")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    sparkio.register(spark)
    reader = spark.read.format(args.format)
    try:
        if args.format == "csv":
            reader = reader.option("header", str(args.csv_header).lower())
            # Column types: a CSV file has none, so Spark would make every column a string.
            reader = (reader.schema(args.csv_schema) if args.csv_schema
                      else reader.option("inferSchema", "true"))
        df = reader.load(args.input)
        cols = set(df.columns)
    except Exception as e:  # noqa: BLE001 (Spark's AnalysisException, ParseException, ...)
        print(f"raftlog load: cannot read {args.input} as {args.format}: {spark_message(e)}; "
              f"check --format (parquet, csv or json)"
              + (" and --csv-schema" if args.csv_schema else ""), file=sys.stderr)
        if owns_session:
            spark.stop()
        return 2
    if "_corrupt_record" in cols:
        print(f"raftlog load: {args.input} has lines that are not JSON objects; pass the "
              f"--format it is in (parquet, csv or json)", file=sys.stderr)
        if owns_session:
            spark.stop()
        return 2
    if args.value_json or "value" not in cols or not cols <= {"key", "value", "headers"}:
        df = df.selectExpr("to_json(struct(*)) AS value")
    started = time.time()
    stop = threading.Event()
    ticker = threading.Thread(target=_progress, args=(spark, stop, started), daemon=True)
    ticker.start()
    print(f"load id: {load_id}", file=sys.stderr)
    try:
        (df.write.format("raftlog").option("servers", args.servers).option("acks", args.acks)
         .option("loadId", load_id).option("batchBytes", str(args.batch_bytes))
         .options(**tls_options).mode("append").save())
    except Exception as e:  # noqa: BLE001 (one clear line for the user)
        stop.set()
        msg = str(e).strip().splitlines()
        print(f"\nload {load_id} failed: {msg[-1] if msg else e}\nre-run with --load-id "
              f"{load_id}: committed data is never written twice", file=sys.stderr)
        return 1
    finally:
        stop.set()
        ticker.join()
    secs = time.time() - started
    s = Session(args.servers, security=ConnSecurity.from_options(
        {k.lower(): v for k, v in tls_options.items()}))
    try:
        load = s.load_status(load_id) or {}
    finally:
        s.close()
        if owns_session:
            spark.stop()
    rows = int(load.get("rows", 0))
    print(f"\rload {load_id}: {load.get('state')} rows={rows} seconds={secs:.1f} "
          f"rows_per_s={rows / max(secs, 1e-9):.0f}", file=sys.stderr)
    return 0 if load.get("state") == "committed" else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m sparkio.cli load ...`: the same subcommand without the rest of the raftlog CLI."""
    parser = argparse.ArgumentParser(prog="raftlog")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
