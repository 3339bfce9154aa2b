"""Reads a dataset and maps its columns to jobs (queue, payload, due, key, headers) in Spark SQL."""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from delayq_pipeline.session import NANOS_AS_LONG

__all__ = ["ITEM_COLUMNS", "ColumnMapping", "prepare", "read_dataset", "row_json"]

# The server's limits (delayq_server.validation, config max_payload_bytes default).
MAX_IDEMPOTENCY_KEY = 256
DEFAULT_MAX_PAYLOAD = 256 * 1024

ITEM_COLUMNS = ("queue", "payload", "due_ms", "delay_ms", "key", "headers", "reject", "row")

_FORMATS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}


def read_dataset(spark: SparkSession, paths: Sequence[str], fmt: str | None = None) -> DataFrame:
    """Parquet, CSV (with a header line) or JSON lines, by path or glob.

    The format comes from the first path's extension unless `fmt` names it;
    a directory without one is read as Parquet (what Spark writes).
    """
    if not paths:
        raise ValueError("give at least one input path")
    kind = fmt or _FORMATS.get(PurePath(paths[0].rstrip("/*")).suffix.lower(), "parquet")
    reader = spark.read.format(kind)
    if kind == "csv":
        # Columns stay strings: the mapping parses due times itself, so an
        # unparsable value becomes a reject with its text instead of a null.
        reader = reader.option("header", "true").option("inferSchema", "false")
        # RFC 4180, as pandas, Excel and Python's csv write it: quotes inside a quoted
        # field are doubled (Spark's default escape is a backslash, which kept them
        # doubled in the payload), and a quoted field may hold line breaks. With
        # multiLine one task reads each file whole: split big CSVs, or use Parquet.
        reader = reader.option("escape", '"').option("multiLine", "true")
    try:
        df = reader.load(list(paths))
    except Exception as exc:  # Py4JJavaError: schema inference runs a Spark job
        illegal = _ILLEGAL_PARQUET_TYPE.search(str(exc))
        if illegal is None:
            raise
        raise ValueError(_unreadable(spark, paths, illegal.group(1))) from None
    return _nanos_as_timestamps(spark, df) if kind == "parquet" else df


_ILLEGAL_PARQUET_TYPE = re.compile(r"Illegal Parquet type: ([^\n]+?)\.?(?:\n|$)")


def _unreadable(spark: SparkSession, paths: Sequence[str], parquet_type: str) -> str:
    where = ", ".join(paths)
    text = f"cannot read {where}: Spark has no type for Parquet's {parquet_type}"
    if "TIMESTAMP(NANOS" in parquet_type:
        setting = spark.conf.get(NANOS_AS_LONG, "false")
        return (
            f"{text} (nanosecond timestamps, pandas' datetime64[ns]); reading them needs "
            f"{NANOS_AS_LONG}=true, which delayq-pipeline sets (here it is {setting})"
        )
    return f"{text}; write that column as a string or a timestamp, or leave it out"


def _nanos_as_timestamps(spark: SparkSession, df: DataFrame) -> DataFrame:
    """Top-level TIMESTAMP(NANOS) columns, read as longs (NANOS_AS_LONG), as timestamps again.

    Which columns those are comes from every input file's footer, never from the
    values. Sub-microsecond digits are dropped (floored), Spark's own precision; a
    column without time zone (isAdjustedToUTC=false) becomes timestamp_ntz, as
    Spark reads a microsecond one. Files that disagree on such a column's type are
    refused: Spark reads every file with one file's schema and would take one
    unit's integers for the other's.
    """
    candidates = [
        f.name
        for f in df.schema.fields
        if isinstance(f.dataType, T.LongType | T.TimestampType | T.TimestampNTZType)
    ]
    if not candidates:
        return df
    footers = _FooterReader(spark, candidates)
    seen: dict[str, dict[str, str]] = {}  # column -> its type in the footer -> first file
    uris = df.inputFiles()
    # Each file costs a few JVM round trips (ms each): read several at once. py4j
    # gives each Python thread its own connection, so the calls overlap.
    with ThreadPoolExecutor(max_workers=min(8, len(uris) or 1)) as pool:
        for uri, types in zip(uris, pool.map(footers.types, uris), strict=True):
            for name, kind in types.items():
                seen.setdefault(name, {}).setdefault(kind, uri)
    ntz_default = spark.conf.get("spark.sql.parquet.inferTimestampNTZ.enabled", "true") == "true"
    converted: dict[str, Column] = {}
    for name, kinds in seen.items():
        nanos = [k for k in kinds if k in _NANOS_KINDS]
        if not nanos:
            continue
        if len(kinds) > 1:
            ns_file = kinds[nanos[0]]
            other, other_file = next((k, f) for k, f in kinds.items() if k != nanos[0])
            raise ValueError(
                f"column {name} is {_NANOS_KINDS[nanos[0]]} in {ns_file} but "
                f"{_NANOS_KINDS.get(other, other)} in {other_file}; write every file with "
                "the same type (pandas: to_parquet(..., coerce_timestamps='us', "
                "allow_truncated_timestamps=True) writes microseconds)"
            )
        if isinstance(df.schema[name].dataType, T.LongType):
            converted[name] = _from_nanos(name, utc=nanos[0] == "ns-utc" or not ntz_default)
    return df.withColumns(converted) if converted else df


_NANOS_KINDS = {
    "ns-utc": "a nanosecond timestamp",
    "ns-local": "a nanosecond timestamp without time zone",
}


_NANOS_ANNOTATION = re.compile(r"\(TIMESTAMP\(NANOS,(true|false)\)\)$")


class _FooterReader:
    """The footer's type of each named top-level column: a _NANOS_KINDS key, or its text.

    Read through Spark's Hadoop file systems (the driver sees what Spark sees:
    HDFS, S3 with its credentials, local files). The classes are looked up once:
    each `jvm.a.b.C` is a round trip of its own.
    """

    def __init__(self, spark: SparkSession, names: Sequence[str]) -> None:
        jvm: Any = spark._jvm
        self.conf: Any = spark._jsc.hadoopConfiguration()
        self.path: Any = jvm.org.apache.hadoop.fs.Path
        self.input_file: Any = jvm.org.apache.parquet.hadoop.util.HadoopInputFile
        self.reader: Any = jvm.org.apache.parquet.hadoop.ParquetFileReader
        self.names = list(names)

    def types(self, uri: str) -> dict[str, str]:
        reader = self.reader.open(self.input_file.fromPath(self.path(uri), self.conf))
        try:
            schema = reader.getFileMetaData().getSchema()
        finally:
            reader.close()
        types: dict[str, str] = {}
        for name in self.names:
            if not schema.containsField(name):
                continue  # a partition column, or one this file lacks (Spark reads nulls)
            # One call: "optional int64 due (TIMESTAMP(NANOS,true))" for a primitive
            # (a group's text ends with its fields' closing brace instead).
            text = str(schema.getType(name).toString()).strip()
            nanos = _NANOS_ANNOTATION.search(text)
            if nanos is not None and not text.endswith("}"):
                types[name] = "ns-utc" if nanos.group(1) == "true" else "ns-local"
            else:
                types[name] = f"`{text}`"
        return types


def _from_nanos(name: str, *, utc: bool) -> Column:
    """A long of epoch nanoseconds as a timestamp, floored to microseconds (exact: no doubles)."""
    c = "`" + name.replace("`", "``") + "`"
    ts = f"timestamp_micros(({c} - pmod({c}, 1000)) div 1000)"
    if utc:
        return F.expr(ts)
    # The same wall clock without a zone, whatever the session's time zone.
    return F.expr(f"TIMESTAMP_NTZ'1970-01-01 00:00:00' + ({ts} - timestamp_micros(0))")


@dataclass(frozen=True)
class ColumnMapping:
    """Which columns make a job; each field is a column or a constant.

    Exactly one of `queue_col`/`queue`, and one of `due_col`/`delay_ms`.
    A payload column may be binary (sent as is), string (UTF-8) or a struct,
    map or array (JSON); `payload_cols` serialises several columns as one JSON
    object. Without `key_col` the idempotency key is a SHA-256 of the whole
    row, so rows identical in every column are one job.
    """

    queue_col: str | None = None
    queue: str | None = None
    payload_col: str | None = None
    payload_cols: tuple[str, ...] = ()
    due_col: str | None = None
    due_format: str | None = None  # Spark datetime pattern for string due times
    delay_ms: int | None = None
    key_col: str | None = None
    headers_col: str | None = None
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD

    def __post_init__(self) -> None:
        if (self.queue_col is None) == (self.queue is None):
            raise ValueError("give a queue column or a constant queue (one of them)")
        if (self.due_col is None) == (self.delay_ms is None):
            raise ValueError("give a due-time column or a delay (one of them)")
        if self.payload_col is not None and self.payload_cols:
            raise ValueError("give a payload column or payload columns, not both")
        if self.payload_col is None and not self.payload_cols:
            raise ValueError("give a payload column or payload columns")
        if self.delay_ms is not None and self.delay_ms < 0:
            raise ValueError("delay must not be negative")

    def columns(self) -> list[str]:
        named = [self.queue_col, self.payload_col, self.due_col, self.key_col, self.headers_col]
        return [c for c in named if c] + list(self.payload_cols)


def row_json(df: DataFrame) -> Column:
    """The whole input row as JSON (the stable input of the row hash, and of rejects)."""
    return F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]))


def _payload(df: DataFrame, m: ColumnMapping) -> Column:
    if m.payload_cols:
        return F.encode(F.to_json(F.struct(*[F.col(c) for c in m.payload_cols])), "UTF-8")
    assert m.payload_col is not None
    kind = df.schema[m.payload_col].dataType
    col = F.col(m.payload_col)
    if isinstance(kind, T.BinaryType):
        value = col
    elif isinstance(kind, T.StructType | T.MapType | T.ArrayType):
        value = F.encode(F.to_json(col), "UTF-8")
    else:
        value = F.encode(col.cast("string"), "UTF-8")
    return F.coalesce(value, F.lit(b"").cast("binary"))


def _due_ms(df: DataFrame, m: ColumnMapping) -> Column:
    """Epoch ms of the due column: timestamps, dates, strings (parsed), numbers (epoch s).

    Sub-millisecond parts are floored (unix_millis; numbers truncated toward zero).
    """
    assert m.due_col is not None
    kind = df.schema[m.due_col].dataType
    col = F.col(m.due_col)
    if isinstance(kind, T.TimestampType | T.TimestampNTZType | T.DateType):
        ts = col.cast("timestamp")
    elif isinstance(kind, T.NumericType):
        return (col.cast("double") * 1000).cast("long")
    elif m.due_format:
        ts = F.to_timestamp(col.cast("string"), m.due_format)
    else:
        ts = F.to_timestamp(col.cast("string"))
    return F.unix_millis(ts)


def _headers(df: DataFrame, m: ColumnMapping) -> Column:
    if m.headers_col is None:
        return F.lit(None).cast("map<string,string>")
    kind = df.schema[m.headers_col].dataType
    col = F.col(m.headers_col)
    if isinstance(kind, T.MapType):
        return col.cast("map<string,string>")
    if isinstance(kind, T.StringType):
        return F.from_json(col, "map<string,string>")
    return F.from_json(F.to_json(col), "map<string,string>")


def prepare(df: DataFrame, m: ColumnMapping) -> DataFrame:
    """One row per input row with the ITEM_COLUMNS; `reject` names why a row cannot be sent.

    Everything here runs in the JVM; only the narrow result crosses to Python.
    """
    missing = [c for c in m.columns() if c not in df.columns]
    if missing:
        raise ValueError(f"no such column(s): {', '.join(missing)}; the dataset has {df.columns}")
    whole = row_json(df)
    queue = F.col(m.queue_col).cast("string") if m.queue_col else F.lit(m.queue)
    payload = _payload(df, m)
    due = _due_ms(df, m) if m.due_col else F.lit(None).cast("long")
    key = F.col(m.key_col).cast("string") if m.key_col else F.sha2(whole, 256)
    checks: list[tuple[Column, Column]] = [
        (queue.isNull(), F.lit(f"queue is null (column {m.queue_col})")),
    ]
    if m.due_col:
        raw = F.col(m.due_col)
        checks += [
            (raw.isNull(), F.lit(f"due time is null (column {m.due_col})")),
            (
                due.isNull(),
                F.format_string(
                    "due time %s is not a timestamp (column %s)",
                    raw.cast("string"),
                    F.lit(m.due_col),
                ),
            ),
        ]
    if m.key_col:
        checks += [
            (key.isNull() | (F.length(key) == 0), F.lit(f"key is empty (column {m.key_col})")),
            (
                F.length(key) > MAX_IDEMPOTENCY_KEY,
                F.lit(f"key over {MAX_IDEMPOTENCY_KEY} chars (column {m.key_col})"),
            ),
        ]
    checks.append(
        (
            F.length(payload) > m.max_payload_bytes,
            F.format_string(
                "payload %d bytes is over the %d-byte limit",
                F.length(payload),
                F.lit(m.max_payload_bytes),
            ),
        )
    )
    reject: Column = F.lit(None).cast("string")
    for condition, reason in reversed(checks):  # the first failing check names the reason
        reject = F.when(condition, reason).otherwise(reject)
    return df.select(
        queue.alias("queue"),
        payload.alias("payload"),
        due.alias("due_ms"),
        F.lit(m.delay_ms).cast("long").alias("delay_ms"),
        key.alias("key"),
        _headers(df, m).alias("headers"),
        reject.alias("reject"),
        F.when(reject.isNotNull(), whole).alias("row"),
    )
