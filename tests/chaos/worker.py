"""A chaos worker process: consumes over gRPC, records every operation, acks or nacks.

Run by the chaos cluster as ``python -m tests.chaos.worker``; a separate process so
that the suite can SIGKILL and SIGSTOP it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import zlib
from pathlib import Path

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import job_pb2, service_pb2, service_pb2_grpc
from tests.chaos import payload
from tests.chaos.history import FAIL, INFO, INVOKE, OK, Recorder, outcome_of

ACK_BATCH = 200
CALL_TIMEOUT_S = 2.0
# Pings find a stopped or vanished server (the server allows one per 10 s); without
# max_pings_without_data 0 the client stops pinging an idle stream after two.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]


def ts_ms(t: timestamp_pb2.Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def dur(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rec = Recorder(Path(args.history), args.name)
        self.rng = random.Random(args.seed)
        self.acks: asyncio.Queue[str] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.released: set[str] = set()

    def _releases(self, key: str, attempt: int) -> bool:
        """Give back a fixed share of first attempts unstarted, once per key here."""
        if attempt != 1 or key in self.released:
            return False
        rate: float = self.args.release_rate
        return zlib.crc32(b"release " + key.encode()) % 1000 < rate * 1000

    def _nacks(self, key: str, attempt: int) -> bool:
        """Nack a fixed share of first attempts (chosen by key, so reruns agree)."""
        return attempt == 1 and zlib.crc32(key.encode()) % 1000 < self.args.nack_rate * 1000

    async def handle(
        self, stub: service_pb2_grpc.DelayQueueServiceAsyncStub, d: job_pb2.Delivery
    ) -> None:
        key, _ok = payload.verify(d.job.payload)
        if self._releases(key, d.attempt):
            self.released.add(key)
            await self.give_back(stub, d)
            return
        if self.args.hold_ms:
            await asyncio.sleep(self.rng.uniform(0, self.args.hold_ms) / 1000)  # the "work"
        if self._nacks(key, d.attempt):
            op = self.rec.next_op_id()
            self.rec.record(INVOKE, "nack", op=op, job=d.job.id, token=d.lease_token)
            try:
                resp = await stub.Nack(
                    service_pb2.NackRequest(
                        lease_token=d.lease_token, delay=dur(100), reason="chaos"
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                state = job_pb2.JobState.Name(resp.state)
                self.rec.record(OK, "nack", op=op, job=d.job.id, token=d.lease_token, result=state)
            except grpc.RpcError as err:
                kind, code = outcome_of(err)
                self.rec.record(kind, "nack", op=op, job=d.job.id, token=d.lease_token, result=code)
            return
        await self.acks.put(d.lease_token)

    async def give_back(
        self, stub: service_pb2_grpc.DelayQueueServiceAsyncStub, d: job_pb2.Delivery
    ) -> None:
        op = self.rec.next_op_id()
        self.rec.record(INVOKE, "release", op=op, job=d.job.id, token=d.lease_token)
        try:
            resp = await stub.Release(
                service_pb2.ReleaseRequest(lease_tokens=[d.lease_token]), timeout=CALL_TIMEOUT_S
            )
            name = service_pb2.ReleaseResult.Name(resp.results[0]).removeprefix("RELEASE_RESULT_")
            self.rec.record(OK, "release", op=op, job=d.job.id, token=d.lease_token, result=name)
        except grpc.RpcError as err:
            kind, code = outcome_of(err)
            self.rec.record(kind, "release", op=op, job=d.job.id, token=d.lease_token, result=code)

    async def ack_loop(self, stub: service_pb2_grpc.DelayQueueServiceAsyncStub) -> None:
        while True:
            tokens = [await self.acks.get()]
            while len(tokens) < ACK_BATCH and not self.acks.empty():
                tokens.append(self.acks.get_nowait())
            ops = [self.rec.next_op_id() for _ in tokens]
            for op, tok in zip(ops, tokens, strict=True):
                self.rec.record(INVOKE, "ack", op=op, token=tok)
            try:
                resp = await stub.Ack(
                    service_pb2.AckRequest(lease_tokens=tokens), timeout=CALL_TIMEOUT_S
                )
                for op, tok, res in zip(ops, tokens, resp.results, strict=True):
                    name = service_pb2.AckResult.Name(res).removeprefix("ACK_RESULT_")
                    self.rec.record(OK, "ack", op=op, token=tok, result=name)
            except grpc.RpcError as err:
                kind, code = outcome_of(err)
                for op, tok in zip(ops, tokens, strict=True):
                    self.rec.record(kind, "ack", op=op, token=tok, result=code)

    async def consume_once(self, target: str) -> None:
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            stub = service_pb2_grpc.DelayQueueServiceStub(channel)
            acker = asyncio.create_task(self.ack_loop(stub))
            tasks: set[asyncio.Task[None]] = set()
            call = stub.Consume(
                service_pb2.ConsumeRequest(
                    namespace=self.args.namespace,
                    queues=[self.args.queue],
                    max_outstanding=self.args.outstanding,
                    lease_duration=dur(self.args.lease_ms),
                )
            )
            op = self.rec.next_op_id()
            self.rec.record(INVOKE, "stream", op=op, result=target)
            try:
                async for resp in call:
                    for d in resp.deliveries:
                        key, intact = payload.verify(d.job.payload)
                        self.rec.record(
                            OK,
                            "deliver",
                            key=key,
                            job=d.job.id,
                            due=ts_ms(d.job.due_time),
                            claim=ts_ms(d.job.last_delivery_time),
                            deadline=ts_ms(d.lease_deadline),
                            token=d.lease_token,
                            attempt=d.attempt,
                            max_attempts=d.job.max_attempts,
                            payload_ok=intact,
                        )
                        task = asyncio.create_task(self.handle(stub, d))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                self.rec.record(INFO, "stream", op=op, result="ended by server")
            except grpc.RpcError as err:
                self.rec.record(FAIL, "stream", op=op, result=outcome_of(err)[1])
            finally:
                for t in [*tasks, acker]:
                    t.cancel()
                # Acks queued for this stream would be stale anyway: drop them.
                while not self.acks.empty():
                    self.acks.get_nowait()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        targets = self.args.targets.split(",")
        i = self.args.first
        while not self.stop.is_set():
            task = asyncio.create_task(self.consume_once(targets[i % len(targets)]))
            stopper = asyncio.create_task(self.stop.wait())
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            i += 1
            if not self.stop.is_set():  # a short pause before the next server
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), 0.1)
        self.rec.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--name", required=True)
    p.add_argument("--history", required=True)
    p.add_argument("--targets", required=True, help="host:port,host:port")
    p.add_argument("--first", type=int, default=0, help="index of the first target")
    p.add_argument("--namespace", default="chaos")
    p.add_argument("--queue", default="q")
    p.add_argument("--lease-ms", type=int, default=2_000)
    p.add_argument("--outstanding", type=int, default=50)
    p.add_argument("--hold-ms", type=int, default=50)
    p.add_argument("--nack-rate", type=float, default=0.05)
    p.add_argument("--release-rate", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    asyncio.run(Worker(p.parse_args()).run())


if __name__ == "__main__":
    main()
