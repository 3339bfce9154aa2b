"""`make pipeline-demo`: generate a dataset, schedule it, work it, export the events, report.

Runs against the server at DELAYQ_ADDR (started with --record-events) and its
Redis at DELAYQ_REDIS_URL, as `scripts/with_server.py` provides them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayq import Client, DeadLetter, Delivery, Retry, Worker
from delayq_pipeline import cli

# Most jobs fall due NEAR_S after generation, spread over SPREAD_S; the worker runs
# from the start, so lateness shows the server's, not the time scheduling took.
NEAR_S, SPREAD_S = 90, 30
FAR_SHARE = 0.2  # the rest wait up to a day: the report's backlog histogram


def generate(path: Path, rows: int, seed: int = 7) -> None:
    """JSON lines: emails and reports; every 997th row has a due time that is not one."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            queue = "emails" if i % 5 < 3 else "reports"
            if rng.random() < FAR_SHARE:
                due = now + timedelta(seconds=rng.uniform(3600, 86_400))
            else:
                due = now + timedelta(seconds=NEAR_S + rng.uniform(0, SPREAD_S))
            row = {"id": f"{queue}-{i}", "queue": queue, "to": f"user{i}@example.com",
                   "n": i, "due": due.isoformat()}  # fmt: skip
            if i % 997 == 0:
                row["due"] = "soon-ish"  # lands in rejects: not a timestamp
            f.write(json.dumps(row) + "\n")


def start_worker(address: str, queues: list[str], seed: int = 11) -> Worker:
    """A worker that acks most jobs, retries some and dead-letters a few (in a thread)."""
    rng = random.Random(seed)
    worker = Worker(address, concurrency=32, grace=5)

    def handle(d: Delivery) -> None:
        roll = rng.random()
        if d.job.queue == "emails" and roll < 0.03:
            raise DeadLetter("bad address")
        if roll < 0.12:
            raise Retry(reason="smtp timeout" if d.job.queue == "emails" else "renderer busy")

    for q in queues:
        worker.add_handler(q, handle)
    threading.Thread(target=lambda: worker.run(install_signal_handlers=False)).start()
    return worker


def _wait_idle(address: str, queues: list[str], until: datetime, deadline_s: float) -> None:
    """Until ``until`` has passed and nothing is ready, leased or due within a minute.

    ``until`` is when the last near job falls due: scheduling takes long enough that
    they may still be more than a minute out when it ends, and a look-ahead alone
    would stop the worker before any of them ran. The minute covers retries' backoff.
    """
    end = time.monotonic() + deadline_s
    with Client(address) as client:
        while time.monotonic() < end:
            now = datetime.now(UTC)
            busy = now < until
            for q in queues:
                st = client.stats(q)
                soon = st.next_due_time is not None and st.next_due_time < now + timedelta(
                    minutes=1
                )
                busy = busy or st.ready > 0 or st.leased > 0 or soon
            if not busy:
                return
            time.sleep(0.5)


QUEUES = ["emails", "reports"]


def work(address: str, until: datetime) -> int:
    """The demo's worker process: works the queues until the near jobs ran and settled."""
    worker = start_worker(address, QUEUES)
    try:
        _wait_idle(address, QUEUES, until, NEAR_S + SPREAD_S + 180)
    finally:
        worker.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".run/pipeline-demo")
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--chart", help="also copy the throughput chart here (README)")
    p.add_argument("--work-until", help=argparse.SUPPRESS)  # the worker process (below)
    a = p.parse_args(argv)
    address, redis_url = os.environ["DELAYQ_ADDR"], os.environ["DELAYQ_REDIS_URL"]
    if a.work_until:
        return work(address, datetime.fromisoformat(a.work_until))
    out = Path(a.out)
    data = out / "data" / "jobs.jsonl"
    near_end = datetime.now(UTC) + timedelta(seconds=NEAR_S + SPREAD_S)
    generate(data, a.rows)
    spark = ["--master", "local[2]"]
    # The worker runs in a process of its own: pyspark starts its JVM with a
    # preexec_fn, so fork() without exec, which a process with gRPC calls in flight
    # on other threads cannot do safely (JAVA_GATEWAY_EXITED, now and then).
    worker = subprocess.Popen(
        [sys.executable, "-m", "delayq_pipeline.demo", "--work-until", near_end.isoformat()]
    )
    try:
        step = ["schedule", str(data), "--queue-col", "queue", "--payload-cols", "to,n",
                "--due-col", "due", "--key-col", "id", "--max-attempts", "3",
                "--target", address, "--rejects", str(out / "rejects"),
                "--summary", str(out / "schedule.json"), *spark]  # fmt: skip
        print("+ delayq-pipeline", " ".join(step), flush=True)
        if cli.main(step) != 0:
            return 1
        print("+ worker on emails, reports until the near jobs ran and retries settled", flush=True)
        if worker.wait() != 0:
            return 1
    finally:
        if worker.poll() is None:
            worker.terminate()
            worker.wait()
    for step in (
        ["export", "--redis-url", redis_url, "--out", str(out / "events"), *spark],
        ["report", "--events", str(out / "events"), "--out", str(out / "report"),
         "--bin", "2s", *spark],
    ):  # fmt: skip
        print("+ delayq-pipeline", " ".join(step), flush=True)
        if cli.main(step) != 0:
            return 1
    if a.chart:
        Path(a.chart).write_bytes((out / "report" / "throughput.png").read_bytes())
    print(f"report: {out / 'report' / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
