"""`make bench-pipeline`: 1M rows through delayq-pipeline schedule vs the Python client, one run.

Both send the same rows (100-byte payloads, due times spread over a day, one
idempotency key each) to one fresh server and Redis; Redis is flushed between
them. CPU seconds per process group (from /proc) say where the time went.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis

from delayq import Client, Message
from delayq_pipeline.prepare import ColumnMapping
from delayq_pipeline.schedule import schedule
from delayq_pipeline.sender import ClientSettings
from delayq_pipeline.session import SparkSettings, spark_session
from tests.support.servers import DelayqProcess, ManagedRedis

QUEUE = "bench"
DAY_MS = 86_400_000
STATS = f"dq:{{default/{QUEUE}/0}}:stats"  # the shard's counters (server store/keys.py)


def _ticks(pid: int) -> float:
    """CPU seconds (user + system) of one process, 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            child = int(stat.parent.name)
            out += [child, *_descendants(child)]
    return out


def _program(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def _is_java(pid: int) -> bool:
    return _program(pid).endswith("java")


class CpuMeter:
    """CPU seconds of the servers, Redis, the Spark JVM, its Python workers and this process.

    Sampled while Spark still runs: its Python workers are reused, so they are alive.
    """

    def __init__(self, servers: list[int], redis_pid: int) -> None:
        self.servers, self.redis_pid = servers, redis_pid
        self.start = self.sample()

    def sample(self) -> dict[str, float]:
        me = os.getpid()
        skip = {*self.servers, self.redis_pid}
        # Spark's JVM and its Python workers; not the servers, Redis or py-spy.
        mine = [p for p in _descendants(me) if p not in skip and not _program(p).endswith("py-spy")]
        return {
            "server": sum(_ticks(p) for p in self.servers),
            "redis": _ticks(self.redis_pid),
            "spark_jvm": sum(_ticks(p) for p in mine if _is_java(p)),
            "spark_python_workers": sum(_ticks(p) for p in mine if not _is_java(p)),
            "bench_process": _ticks(me),
        }

    def since(self) -> dict[str, float]:
        now = self.sample()
        return {k: round(now[k] - self.start[k], 1) for k in now}


def _load() -> float:
    """1-minute load average: the machine is shared, so every figure carries it."""
    return round(os.getloadavg()[0], 1)


def _bound(rows: int, cpu: dict[str, float]) -> float:
    """Rows/s if every process had the machine's cores to itself (CPU-bound estimate)."""
    total = sum(cpu.values())
    return round(rows / (total / (os.cpu_count() or 1)), 1) if total else 0.0


def rows(n: int, start: datetime) -> Iterator[tuple[str, str, int]]:
    """The same rows the Spark job reads: key, 100-byte payload, due ms."""
    base = int(start.timestamp() * 1000)
    for i in range(n):
        yield f"k{i}", f"{i:0100d}", base + (i * DAY_MS) // n


def write_dataset(spark: object, path: Path, n: int, start: datetime) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    assert isinstance(spark, SparkSession)
    base = int(start.timestamp() * 1000)
    df = spark.range(n, numPartitions=8).select(
        F.concat(F.lit("k"), F.col("id").cast("string")).alias("key"),
        F.lpad(F.col("id").cast("string"), 100, "0").alias("payload"),
        F.timestamp_millis(F.lit(base) + (F.col("id") * DAY_MS / n).cast("long")).alias("due"),
    )
    df.write.mode("overwrite").parquet(str(path))


def python_client(address: str, n: int, start: datetime) -> float:
    began = time.monotonic()
    chunk: list[Message] = []
    with Client(address, timeout=60) as client:
        for key, payload, due in rows(n, start):
            when = datetime.fromtimestamp(due / 1000, UTC)
            chunk.append(Message(payload.encode(), at=when, idempotency_key=key))
            if len(chunk) == 1000:
                client.enqueue_many(QUEUE, chunk)
                chunk = []
        if chunk:
            client.enqueue_many(QUEUE, chunk)
    return time.monotonic() - began


def _profile(on: bool, out: Path, pids: dict[str, int]) -> dict[str, subprocess.Popen[bytes]]:
    """py-spy (raw stacks) of the server and of Spark's Python workers (the JVM's children)."""
    if not on:
        return {}
    spy = Path(sys.executable).parent / "py-spy"
    return {
        name: subprocess.Popen(
            [
                str(spy),
                "record",
                "--format",
                "raw",
                "-r",
                "250",
                "-p",
                str(pid),
                "-o",
                str(out / f"profile-{name}.txt"),
                *(["--subprocesses"] if name == "spark" else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    }


def _stop(spies: dict[str, subprocess.Popen[bytes]], out: Path) -> None:
    from bench.harness.profiles import summarize

    for name, proc in spies.items():
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
        raw = out / f"profile-{name}.txt"
        if raw.exists():
            (out / f"profile-{name}-top.txt").write_text(summarize(raw))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--master", default="local[*]")
    p.add_argument("--partitions", type=int, help="repartition first (default: as read)")
    p.add_argument("--in-flight", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--out", default=".run/bench-pipeline")
    p.add_argument("--profile", action="store_true", help="py-spy the pipeline phase")
    p.add_argument("--servers", type=int, default=1, help="server replicas (one Redis)")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    start = datetime.now(UTC) + timedelta(minutes=10)
    results: dict[str, object] = {
        "rows": a.rows,
        "master": a.master,
        "servers": a.servers,
        "cpus": os.cpu_count(),
    }
    with (
        tempfile.TemporaryDirectory(prefix="delayq-bench-") as tmp,
        ManagedRedis(Path(tmp) / "redis", appendonly=False) as rds,
        contextlib.ExitStack() as stack,
    ):
        # Several stateless replicas on one Redis: the pipeline spreads its partitions
        # over all of them; the Python client (one process) uses the first.
        servers = [stack.enter_context(DelayqProcess(rds.url)) for _ in range(a.servers)]
        server = servers[0]
        pids = [s.proc.pid for s in servers if s.proc is not None]
        assert server.proc is not None and rds.proc is not None
        spark = spark_session(SparkSettings(master=a.master, driver_memory="1g"))
        t0 = time.monotonic()
        write_dataset(spark, Path(tmp) / "jobs", a.rows, start)
        results["generate_s"] = round(time.monotonic() - t0, 1)
        mapping = ColumnMapping(queue=QUEUE, payload_col="payload", due_col="due", key_col="key")
        settings = ClientSettings(
            target=",".join(s.address for s in servers),
            batch_size=a.batch_size,
            in_flight=a.in_flight,
        )
        meter = CpuMeter(pids, rds.proc.pid)
        load = _load()
        jvm = next(p for p in _descendants(os.getpid()) if _is_java(p))
        spies = _profile(a.profile, out, {"server": server.proc.pid, "spark": jvm})
        summary, _ = schedule(
            spark, [str(Path(tmp) / "jobs")], mapping, settings, partitions=a.partitions
        )
        cpu = meter.since()
        _stop(spies, out)
        db = redis.Redis.from_url(rds.url)
        results["pipeline"] = {
            **summary.as_dict(),
            "stored": int(db.hget(STATS, "enqueued") or 0),
            "cpu_s": cpu,
            "cpu_bound_rows_per_second": _bound(a.rows, cpu),
            "load_before_after": [load, _load()],
        }
        spark.stop()
        print(json.dumps(results["pipeline"]), flush=True)
        # Freeing a million jobs takes longer than a client's read timeout: lazily, then poll.
        db.flushall(asynchronous=True)
        while db.dbsize():
            time.sleep(0.2)
        meter = CpuMeter(pids, rds.proc.pid)
        load = _load()
        seconds = python_client(server.address, a.rows, start)
        cpu = meter.since()
        results["python_client"] = {
            "seconds": round(seconds, 2),
            "rows_per_second": round(a.rows / seconds, 1),
            "stored": int(db.hget(STATS, "enqueued") or 0),
            "cpu_s": cpu,
            "cpu_bound_rows_per_second": _bound(a.rows, cpu),
            "load_before_after": [load, _load()],
        }
        db.close()
    text = json.dumps(results, indent=2)
    (out / "results.json").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
