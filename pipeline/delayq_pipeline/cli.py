"""`delayq-pipeline`: schedule a dataset, export lifecycle events, write the report."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from delayq._channel import resolve_target

__all__ = ["main", "parse_ms"]

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_ms(text: str) -> int:
    """'250ms', '30s', '5m', '2h', '1d' or plain seconds -> milliseconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 5m, 2h)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or "s"])


def _spark_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--driver-memory", default="1g", help="Spark driver memory (default 1g)")
    p.add_argument("--spark-ui", action="store_true", help="serve the Spark UI")
    p.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting"
    )


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=resolve_target(None),
        help="server host:port (env DELAYQ_ADDR); several, comma-separated, spread the "
        "partitions over them",
    )
    p.add_argument("--namespace", default="default")
    p.add_argument(
        "--token",
        default=os.environ.get("DELAYQ_TOKEN"),
        help="bearer token (env DELAYQ_TOKEN) sent as `authorization: Bearer ...`",
    )
    p.add_argument("--tls", action="store_true", help="TLS with the system roots")
    p.add_argument("--tls-ca", type=Path, help="PEM file of the CA to trust (implies --tls)")
    p.add_argument("--tls-server-name", help="expected server name in its certificate")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delayq-pipeline", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    s = sub.add_parser("schedule", help="enqueue every row of a dataset as a job")
    s.add_argument("inputs", nargs="+", help="Parquet/CSV/JSON-lines paths or globs")
    s.add_argument("--format", choices=["parquet", "csv", "json"], help="default: from extension")
    q = s.add_mutually_exclusive_group(required=True)
    q.add_argument("--queue-col", help="column holding each job's queue")
    q.add_argument("--queue", help="one queue for every row")
    pl = s.add_mutually_exclusive_group(required=True)
    pl.add_argument("--payload-col", help="payload column (binary, string, or struct -> JSON)")
    pl.add_argument("--payload-cols", help="comma-separated columns sent as one JSON object")
    d = s.add_mutually_exclusive_group(required=True)
    d.add_argument("--due-col", help="due-time column (timestamp, ISO string, epoch seconds)")
    d.add_argument("--delay", type=parse_ms, help="one delay for every row (e.g. 10m)")
    s.add_argument("--due-format", help="Spark datetime pattern of a string due-time column")
    s.add_argument("--key-col", help="idempotency key column (default: SHA-256 of the row)")
    s.add_argument("--headers-col", help="headers column (map, struct or JSON object string)")
    s.add_argument("--max-payload-bytes", type=int, default=256 * 1024)
    s.add_argument("--max-attempts", type=int, default=0, help="0: the server's default")
    s.add_argument("--rejects", help="write refused rows (Parquet) here")
    s.add_argument("--summary", help="also write the JSON summary to this file")
    s.add_argument("--partitions", type=int, help="repartition the input first")
    s.add_argument("--batch-size", type=int, default=500, help="jobs per EnqueueBatch")
    s.add_argument("--in-flight", type=int, default=4, help="EnqueueBatch calls per partition")
    _client_args(s)
    _spark_args(s)

    e = sub.add_parser("export", help="copy lifecycle event streams to Parquet (incremental)")
    e.add_argument(
        "--redis-url",
        default=os.environ.get("DELAYQ_REDIS_URL"),
        required=False,
        help="redis://, rediss:// or redis+cluster:// (the server's URL)",
    )
    e.add_argument("--out", required=True, help="export directory (Parquet + checkpoint)")
    e.add_argument("--batch", type=int, default=10_000, help="XRANGE page size")
    _spark_args(e)

    r = sub.add_parser("report", help="lifecycle report over an export: Parquet tables + HTML")
    r.add_argument("--events", required=True, help="the export directory")
    r.add_argument("--out", required=True, help="report directory")
    r.add_argument("--bin", type=parse_ms, default=60_000, help="throughput bin (default 1m)")
    _spark_args(r)
    return parser


def _settings(args: argparse.Namespace) -> object:
    from delayq_pipeline.session import SparkSettings

    extra = dict(kv.split("=", 1) for kv in args.conf)
    return SparkSettings(
        master=args.master, driver_memory=args.driver_memory, ui=args.spark_ui, extra=extra
    )


def _schedule(args: argparse.Namespace) -> int:
    from delayq_pipeline.prepare import ColumnMapping
    from delayq_pipeline.schedule import schedule
    from delayq_pipeline.sender import ClientSettings
    from delayq_pipeline.session import SparkSettings, spark_session

    mapping = ColumnMapping(
        queue_col=args.queue_col,
        queue=args.queue,
        payload_col=args.payload_col,
        payload_cols=tuple(c.strip() for c in args.payload_cols.split(","))
        if args.payload_cols
        else (),
        due_col=args.due_col,
        due_format=args.due_format,
        delay_ms=args.delay,
        key_col=args.key_col,
        headers_col=args.headers_col,
        max_payload_bytes=args.max_payload_bytes,
    )
    client = ClientSettings(
        target=args.target,
        namespace=args.namespace,
        token=args.token,
        tls=args.tls,
        ca_pem=args.tls_ca.read_bytes() if args.tls_ca else None,
        server_name=args.tls_server_name,
        batch_size=args.batch_size,
        in_flight=args.in_flight,
        max_attempts=args.max_attempts,
    )
    settings = _settings(args)
    assert isinstance(settings, SparkSettings)
    spark = spark_session(settings)
    try:
        # After Spark started its JVM: pyspark forks to start it, which a process with
        # gRPC calls in flight cannot do safely.
        problem = client.unreachable()
        if problem is not None:
            print(f"delayq-pipeline schedule: {problem}", file=sys.stderr)
            return 1
        summary, _ = schedule(
            spark,
            args.inputs,
            mapping,
            client,
            fmt=args.format,
            rejects_path=args.rejects,
            partitions=args.partitions,
        )
    finally:
        spark.stop()
    text = json.dumps(summary.as_dict(), indent=2)
    print(text)
    if args.summary:
        Path(args.summary).write_text(text + "\n")
    return 0


def _export(args: argparse.Namespace) -> int:
    import redis

    from delayq_pipeline.export import export, ping
    from delayq_pipeline.session import SparkSettings, spark_session
    from delayq_server.redis_client import safe_url

    if not args.redis_url:
        print("delayq-pipeline export: give --redis-url (or DELAYQ_REDIS_URL)", file=sys.stderr)
        return 2
    try:  # before Spark starts: a wrong URL is the usual mistake, and a quick one to fix
        ping(args.redis_url)
    except redis.RedisError as exc:
        print(
            f"delayq-pipeline export: cannot use Redis at {safe_url(args.redis_url)}: {exc} "
            "(give the server's --redis-url; `make run` logs its own as "
            '"started managed redis-server at redis://...")',
            file=sys.stderr,
        )
        return 1
    settings = _settings(args)
    assert isinstance(settings, SparkSettings)
    spark = spark_session(settings)
    try:
        result = export(spark, args.redis_url, args.out, page=args.batch)
    finally:
        spark.stop()
    print(json.dumps(result, indent=2))
    return 0


def _report(args: argparse.Namespace) -> int:
    from delayq_pipeline.report import report
    from delayq_pipeline.session import SparkSettings, spark_session

    settings = _settings(args)
    assert isinstance(settings, SparkSettings)
    spark = spark_session(settings)
    try:
        html = report(spark, args.events, args.out, bin_ms=args.bin)
    finally:
        spark.stop()
    print(html)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `delayq-pipeline` console script."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "schedule":
            return _schedule(args)
        if args.command == "export":
            return _export(args)
        return _report(args)
    except ValueError as exc:
        print(f"delayq-pipeline {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
