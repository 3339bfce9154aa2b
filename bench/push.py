"""Push delivery: callbacks/s to a local receiver and callback lateness (issue 15).

A real server with --push-config POSTs to an aiohttp receiver in this process
(tests/support/receiver.py). Throughput: a batch of jobs all due at one instant,
first to last callback, plus the server's CPU seconds per 1,000 callbacks (steadier
than rates on a shared machine). Lateness: jobs due at a steady rate, receive
wall time minus the body's due_time (one machine, one clock). Run: `make bench-push`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.receiver import Receiver
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until

SECRET = "bench-secret-0123456789"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks


def _due_s(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def throughput(
    stub: service_pb2_grpc.DelayQueueServiceStub, rx: Receiver, pid: int, n: int
) -> dict[str, float]:
    before = len(rx.hits)
    due = timestamp_pb2.Timestamp()
    due.FromMilliseconds(int(time.time() * 1000) + 3000)  # all due at once, after enqueueing
    for start in range(0, n, 1000):
        reqs = [
            service_pb2.EnqueueRequest(queue="push-bench", payload=b"x" * 100, due_time=due)
            for _ in range(min(1000, n - start))
        ]
        stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs), timeout=60)
    cpu0, rx_cpu0 = _cpu_s(pid), time.process_time()
    wait_until(lambda: len(rx.hits) >= before + n, timeout=600, interval=0.05)
    cpu, rx_cpu = _cpu_s(pid) - cpu0, time.process_time() - rx_cpu0
    hits = rx.hits[before : before + n]
    span = hits[-1].at - hits[0].at
    return {
        "jobs": n,
        "callbacks_per_s": round(n / span, 1) if span > 0 else 0.0,
        "server_cpu_s_per_1000": round(cpu / n * 1000, 3),
        "receiver_cpu_s_per_1000": round(rx_cpu / n * 1000, 3),  # this process
        "wall_s": round(span, 2),
    }


def lateness(
    stub: service_pb2_grpc.DelayQueueServiceStub, rx: Receiver, rate: int, duration: float
) -> dict[str, float]:
    before = len(rx.hits)
    n = int(rate * duration)
    start = time.monotonic()
    for i in range(n):
        pause = start + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing the producer, not a test wait
        req = service_pb2.EnqueueRequest(
            queue="push-late", payload=b"x" * 100, delay=duration_pb2.Duration(seconds=1)
        )
        stub.Enqueue(req, timeout=10)
    wait_until(lambda: len(rx.hits) >= before + n, timeout=600, interval=0.05)
    late = sorted(
        (h.wall - _due_s(json.loads(h.body)["due_time"])) * 1000
        for h in rx.hits[before : before + n]
    )
    return {
        "jobs": n,
        "rate_per_s": rate,
        "lateness_ms_p50": round(statistics.median(late), 1),
        "lateness_ms_p99": round(late[int(len(late) * 0.99) - 1], 1),
        "lateness_ms_max": round(late[-1], 1),
        "early": sum(1 for x in late if x < 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--json", default=".run/bench-push.json")
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ManagedRedis(tmp, appendonly=False) as redis,
        Receiver() as rx,
    ):
        targets = [
            {"queue": q, "url": rx.url, "allow_http": True, "allowlist": ["127.0.0.1"],
             "secret": SECRET, "concurrency": args.concurrency}
            for q in ("push-bench", "push-late")
        ]  # fmt: skip
        config = Path(tmp) / "push.json"
        config.write_text(json.dumps({"targets": targets}))
        with (
            DelayqProcess(
                redis.url, ["--push-config", str(config), "--log-level", "WARNING"]
            ) as proc,
            grpc.insecure_channel(proc.address) as ch,
        ):
            assert proc.proc is not None
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            result = {
                "concurrency": args.concurrency,
                "throughput": throughput(stub, rx, proc.proc.pid, args.jobs),
                "lateness": lateness(stub, rx, args.rate, args.duration),
            }
    print(json.dumps(result, indent=2))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
