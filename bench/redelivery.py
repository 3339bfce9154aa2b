"""Redelivery time after a real worker crash, with and without the Worker's release grace.

A `delayq.Worker` process takes one job and is SIGKILLed mid-handler; another
consumer waits for the job. Run: `make bench-redelivery` (figures go to
docs/decisions.md, "release grace"). Bounded: a few trials per setting.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import grpc

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis

WORKER = textwrap.dedent(
    """
    import sys, time
    from delayq import Worker
    target, queue, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
    worker = Worker(target, concurrency=1, release_grace=grace)

    @worker.handler(queue)
    def handle(d):
        print("started", flush=True)
        time.sleep(3600)  # killed mid-job

    worker.run()
    """
)


def trial(
    address: str, stub: service_pb2_grpc.DelayQueueServiceStub, queue: str, grace: float
) -> float:
    stub.Enqueue(service_pb2.EnqueueRequest(queue=queue, payload=b"x"), timeout=10)
    with subprocess.Popen(
        [sys.executable, "-c", WORKER, address, queue, str(grace)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    ) as worker:
        assert worker.stdout is not None
        if worker.stdout.readline().strip() != "started":
            raise RuntimeError("worker did not start the job")
        worker.kill()  # SIGKILL: the TCP connection just drops
        killed = time.monotonic()
        worker.wait()
    call = stub.Consume(service_pb2.ConsumeRequest(queues=[queue], max_outstanding=1))
    try:
        resp = next(iter(call))
        waited = time.monotonic() - killed
        stub.Ack(service_pb2.AckRequest(lease_tokens=[resp.deliveries[0].lease_token]), timeout=10)
    finally:
        call.cancel()  # type: ignore[no-untyped-call]
    return waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--graces", default="0,5", help="release grace settings in seconds")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ManagedRedis(Path(tmp), appendonly=False) as redis_server,
        DelayqProcess(redis_server.url, ["--log-level", "WARNING"]) as server,
        grpc.insecure_channel(server.address) as ch,
    ):
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        print("release_grace_s  trials  min_s  median_s  max_s")
        for grace in (float(g) for g in args.graces.split(",")):
            waits = [
                trial(server.address, stub, f"redeliver-{grace:g}-{i}", grace)
                for i in range(args.trials)
            ]
            print(
                f"{grace:15g}  {len(waits):6d}  {min(waits):5.3f}  "
                f"{statistics.median(waits):8.3f}  {max(waits):5.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
