"""Worker against a real server process and real Redis: queues, retries, renewal, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import pytest

from delayq import AsyncClient, DeadLetter, Delivery, JobState, Retry, RetryPolicy, Worker
from delayq.errors import NotFoundError
from tests.support.proxy import CuttableProxy
from tests.support.servers import ROOT, DelayqProcess


async def eventually(predicate: Callable[[], bool], timeout: float = 20.0) -> None:  # noqa: ASYNC109
    """Poll `predicate` until true; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Run `worker.serve()` for the duration of the block, then stop it gracefully."""
    task = asyncio.create_task(worker.serve())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def test_worker_processes_jobs_from_several_queues(target: str) -> None:
    async with AsyncClient(target) as client:
        await client.enqueue_many("emails", [{"to": f"u{i}@x"} for i in range(40)])
        await client.enqueue_many("sms", [f"text {i}" for i in range(40)])
        await client.enqueue_many("raw", [bytes([i]) for i in range(40)])
        seen: dict[str, list[object]] = {"emails": [], "sms": [], "raw": []}
        lock = threading.Lock()
        worker = Worker(target, concurrency=8)

        @worker.handler("emails")
        async def emails(d: Delivery) -> None:
            await asyncio.sleep(0.001)
            seen["emails"].append(d.payload)

        @worker.handler("sms")
        def sms(d: Delivery) -> None:  # sync: runs in the thread pool
            with lock:
                seen["sms"].append(d.payload)

        @worker.handler("raw")
        def raw(d: Delivery) -> None:
            with lock:
                seen["raw"].append(d.payload)

        async with running(worker):
            await eventually(lambda: sum(map(len, seen.values())) == 120)
        assert sorted(p["to"] for p in seen["emails"]) == sorted(f"u{i}@x" for i in range(40))  # type: ignore[index]
        assert sorted(seen["sms"]) == sorted(f"text {i}" for i in range(40))  # type: ignore[type-var]
        assert sorted(seen["raw"]) == [bytes([i]) for i in range(40)]  # type: ignore[type-var]
        for q in ("emails", "sms", "raw"):
            stats = await client.stats(q)
            assert (stats.acked_total, stats.ready, stats.leased, stats.retried_total) == (
                40,
                0,
                0,
                0,
            )
        assert worker.stats.acked == 120
        assert worker.stats.succeeded == 120


async def test_failing_handler_is_retried_with_backoff_then_dead_lettered(target: str) -> None:
    async with AsyncClient(target) as client:
        policy = RetryPolicy(
            initial_backoff=timedelta(milliseconds=300),
            max_backoff=timedelta(seconds=5),
            multiplier=2.0,
            jitter=0.0,
        )
        res = await client.enqueue("jobs", {"n": 1}, max_attempts=3, retry=policy)
        attempts: list[tuple[int, float]] = []
        worker = Worker(target, concurrency=2)

        @worker.handler("jobs")
        async def fail(d: Delivery) -> None:
            attempts.append((d.attempt, time.monotonic()))
            raise RuntimeError(f"boom on attempt {d.attempt}")

        async with running(worker):
            await eventually(lambda: worker.stats.failed == 3)
            job = await client.get("jobs", res.job_id)
        assert [a for a, _ in attempts] == [1, 2, 3]
        gaps = [b - a for (_, a), (_, b) in itertools.pairwise(attempts)]
        assert gaps[0] >= 0.3 * 0.9, gaps  # initial_backoff
        assert gaps[1] >= 0.6 * 0.9, gaps  # doubled
        assert job.state == JobState.DEAD
        assert job.attempts == 3
        assert "boom on attempt 3" in job.last_error
        stats = await client.stats("jobs")
        assert (stats.dead, stats.dead_lettered_total, stats.retried_total) == (1, 1, 2)


async def test_retry_and_dead_letter_exceptions_choose_the_outcome(target: str) -> None:
    async with AsyncClient(target) as client:
        later = await client.enqueue("q", "later")
        doomed = await client.enqueue("q", "doomed")
        times: dict[str, list[float]] = {"later": [], "doomed": []}
        worker = Worker(target)

        @worker.handler("q")
        async def handle(d: Delivery) -> None:
            times[d.payload].append(time.monotonic())
            if d.payload == "doomed":
                raise DeadLetter("invalid address")
            if d.attempt == 1:
                raise Retry(delay=timedelta(milliseconds=500))

        async with running(worker):
            await eventually(lambda: len(times["later"]) == 2 and worker.stats.acked == 1)
        assert times["later"][1] - times["later"][0] >= 0.45
        assert len(times["doomed"]) == 1
        dead = await client.get("q", doomed.job_id)
        assert dead.state == JobState.DEAD
        assert dead.last_error == "invalid address"
        with pytest.raises(Exception, match="NOT_FOUND"):
            await client.get("q", later.job_id)  # acked and not retained


async def test_handler_three_times_longer_than_its_lease_completes_without_redelivery(
    target: str,
) -> None:
    async with AsyncClient(target) as client:
        await client.enqueue("slow", "async")
        await client.enqueue("slow-sync", "sync")
        deliveries: Counter[str] = Counter()
        # Renewed at half the lease: a 2 s lease leaves each renewal 1 s on a loaded
        # machine (1 s leases redelivered after a 0.5 s stall).
        worker = Worker(target, concurrency=4, lease=timedelta(seconds=2))

        @worker.handler("slow")
        async def slow(d: Delivery) -> None:
            deliveries[d.payload] += 1
            await asyncio.sleep(6.0)

        @worker.handler("slow-sync")
        def slow_sync(d: Delivery) -> None:
            deliveries[d.payload] += 1
            time.sleep(6.0)

        async with running(worker):
            await eventually(lambda: worker.stats.acked == 2)
        assert deliveries == {"async": 1, "sync": 1}
        assert worker.stats.leases_extended >= 4
        assert worker.stats.leases_lost == 0
        for q in ("slow", "slow-sync"):
            stats = await client.stats(q)
            assert (stats.acked_total, stats.retried_total) == (1, 0)


@pytest.mark.parametrize("how", ["kill", "terminate"])
async def test_server_restart_mid_stream_loses_nothing(
    delayq_server: DelayqProcess, how: str
) -> None:
    n = 1500
    target = delayq_server.address
    async with AsyncClient(target) as client:
        ids = {r.job_id for r in await client.enqueue_many("work", [{"i": i} for i in range(n)])}
        done: Counter[str] = Counter()
        worker = Worker(target, concurrency=20, lease=timedelta(seconds=2))

        @worker.handler("work")
        async def handle(d: Delivery) -> None:
            await asyncio.sleep(0.002)
            done[d.id] += 1

        async with running(worker):
            await eventually(lambda: len(done) >= n // 3)
            if how == "kill":
                delayq_server.kill()  # SIGKILL: no release, leases run out in Redis
            else:
                await asyncio.to_thread(delayq_server.terminate)
            seen_at_stop = len(done)
            assert seen_at_stop < n, "worker finished before the server went away"
            await asyncio.to_thread(delayq_server.start)  # same port
            await eventually(lambda: set(done) == ids, timeout=60)

            async def settled() -> bool:
                s = await client.stats("work")
                return (s.ready, s.leased, s.scheduled, s.dead) == (0, 0, 0, 0)

            deadline = time.monotonic() + 20
            while not await settled():
                assert time.monotonic() < deadline, await client.stats("work")
                await asyncio.sleep(0.05)
        stats = await client.stats("work")
        assert stats.acked_total == n  # every job acked exactly once on the server
        assert worker.stats.reconnects >= 1
        assert worker.stats.acked <= n


async def test_sigterm_finishes_in_flight_jobs_and_exits_zero(target: str) -> None:
    async with AsyncClient(target) as client:
        ids = [r.job_id for r in await client.enqueue_many("mail", [f"m{i}" for i in range(8)])]
        with subprocess.Popen(  # noqa: ASYNC220 - starting it is quick; waits go to a thread
            # Handlers of 5 s: SIGTERM reaches the worker while the first three run,
            # even when noticing them takes a loaded machine a while.
            [sys.executable, "-m", "tests.client.worker_app", target, "mail", "5", "3"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            lines: list[str] = []

            def read() -> None:
                assert proc.stdout is not None
                lines.extend(iter(proc.stdout.readline, ""))

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                await eventually(lambda: sum(x.startswith("started") for x in lines) == 3)
                proc.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(proc.wait, 30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            reader.join(5)
            stderr = proc.stderr.read() if proc.stderr else ""
        assert code == 0, stderr
        started = {x.split()[1] for x in lines if x.startswith("started")}
        finished = {x.split()[1] for x in lines if x.startswith("finished")}
        assert len(started) == 3 and started == finished, lines
        stats = await client.stats("mail")
        assert stats.acked_total == 3
        # The other 5 were never started and nothing was lost: closing the stream gives
        # them back (see test_stream_close_releases_every_lease for the "at once" part).
        assert stats.ready + stats.leased == 5, stats
        deadline = time.monotonic() + 15.0
        while (stats.ready, stats.leased) != (5, 0):
            assert time.monotonic() < deadline, stats
            await asyncio.sleep(0.05)
            stats = await client.stats("mail")
        for job_id in set(ids) - started:
            assert (await client.get("mail", job_id)).state == JobState.READY


# The race needs the Ack answer and the stream cancel to cross the server's
# dispatch loop (a claim in flight while the stream is cancelled); 60 trials.
async def test_stream_close_releases_every_lease(target: str) -> None:
    """Cancel a Consume stream right after an Ack freed credit: nothing may stay leased."""
    async with AsyncClient(target) as client:
        stuck = []
        for trial in range(60):
            q = f"close{trial}"
            await client.enqueue_many(q, [f"j{i}" for i in range(8)])
            call = client.consume_call([q], max_outstanding=3, lease=30)
            stream = call.__aiter__()
            tokens: list[str] = []
            while len(tokens) < 3:
                tokens += [d.lease_token for d in (await stream.__anext__()).deliveries]
            await client.ack(tokens)  # frees credit: the server claims 3 more
            call.cancel()  # ... while the stream closes
            # Well under the 30 s lease, well over a loaded machine's stall.
            deadline = time.monotonic() + 15.0
            while (s := await client.stats(q)).leased and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if s.leased:
                stuck.append((q, s.ready, s.leased))
        assert not stuck, f"leases not released within 15 s of stream close: {stuck}"


async def test_shutdown_gives_back_unstarted_deliveries_without_counting(target: str) -> None:
    async with AsyncClient(target) as client:
        ids = [r.job_id for r in await client.enqueue_many("held", [f"j{i}" for i in range(4)])]
        started: list[str] = []
        go = asyncio.Event()
        # One runs; three more wait leased behind it (prefetch): queued, never started.
        worker = Worker(target, concurrency=1, prefetch=3)

        @worker.handler("held")
        async def handle(d: Delivery) -> None:
            started.append(d.id)
            await go.wait()

        task = asyncio.create_task(worker.serve())
        await eventually(lambda: len(started) == 1 and worker.stats.received == 4)
        worker.stop()
        go.set()
        await asyncio.wait_for(task, 30)
        assert worker.stats.released_on_shutdown == 3
        assert (worker.stats.acked, worker.stats.abandoned_on_shutdown) == (1, 0)
        for job_id in set(ids) - set(started):
            job = await client.get("held", job_id)
            assert (job.state, job.attempts) == (JobState.READY, 0)
        stats = await client.stats("held")
        assert (stats.acked_total, stats.ready, stats.leased) == (1, 3, 0)


@pytest.mark.parametrize("grace", [5.0, 0.0])
async def test_a_transport_blip_mid_handler(target: str, grace: float) -> None:
    """With a release grace the running handler acks after the reconnect and its job
    runs once; without one the job is redelivered at once (and runs twice)."""
    proxy = await CuttableProxy(target).start()
    try:
        async with AsyncClient(target) as client:
            job_id = (await client.enqueue("blip", "x")).job_id
            runs: list[int] = []
            cut_done = asyncio.Event()
            worker = Worker(proxy.address, concurrency=2, release_grace=grace)

            @worker.handler("blip")
            async def handle(d: Delivery) -> None:
                runs.append(d.attempt)
                if len(runs) == 1:
                    await cut_done.wait()  # still running across the blip

            async with running(worker):
                await eventually(lambda: len(runs) == 1)
                proxy.cut()
                await eventually(lambda: worker.stats.reconnects >= 1)
                if grace:
                    # Unstarted work given back, running work kept: the handler
                    # finishes after the reconnect and its ack lands.
                    await eventually(lambda: worker.stats.leases_extended >= 1)
                    cut_done.set()
                    await eventually(lambda: worker.stats.acked == 1)
                else:
                    await eventually(lambda: len(runs) == 2)  # redelivered at once
                    cut_done.set()
                    await eventually(lambda: worker.stats.acked + worker.stats.ack_stale == 2)
            stats = await client.stats("blip")
            assert stats.acked_total == 1
            if grace:
                assert runs == [1] and worker.stats.ack_stale == 0
                with pytest.raises(NotFoundError):
                    await client.get("blip", job_id)  # acked (no retention)
            else:
                assert runs == [1, 2] and worker.stats.ack_stale == 1
    finally:
        await proxy.close()


class _AckCounting(Worker):
    """A Worker that records the size of every Ack call it makes."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.ack_call_sizes: list[int] = []

    async def _send_acks(self, batch: list[str]) -> None:
        self.ack_call_sizes.append(len(batch))
        await super()._send_acks(batch)


async def test_acks_gather_for_the_linger_into_one_call(target: str) -> None:
    """20 jobs handled together are acked in one call, not one call per job."""
    async with AsyncClient(target) as client:
        await client.enqueue_many("linger", [f"j{i}" for i in range(20)])
        worker = _AckCounting(target, concurrency=50, ack_linger=timedelta(milliseconds=300))
        go = asyncio.Event()
        handled: list[str] = []

        @worker.handler("linger")
        async def handle(d: Delivery) -> None:
            handled.append(d.id)
            await go.wait()  # all 20 finish at once, after all were received

        async with running(worker):
            await eventually(lambda: len(handled) == 20)
            go.set()
            await eventually(lambda: worker.stats.acked == 20)
        assert worker.ack_call_sizes == [20]
        assert (await client.stats("linger")).acked_total == 20


async def test_a_worker_without_credit_acks_at_once(target: str) -> None:
    """With concurrency 1 the next delivery waits for the ack: no linger then (an
    hour's linger would stop the worker after its first job)."""
    async with AsyncClient(target) as client:
        await client.enqueue_many("starved", [f"j{i}" for i in range(5)])
        worker = _AckCounting(target, concurrency=1, ack_linger=timedelta(hours=1))
        handled: list[str] = []

        @worker.handler("starved")
        async def handle(d: Delivery) -> None:
            handled.append(d.id)

        async with running(worker):
            await eventually(lambda: worker.stats.acked == 5)
        assert worker.ack_call_sizes == [1] * 5
        assert (await client.stats("starved")).acked_total == 5


async def test_shutdown_sends_lingering_acks_at_once(target: str) -> None:
    """Acks still lingering when the worker stops are sent before it exits."""
    async with AsyncClient(target) as client:
        await client.enqueue_many("flush", [f"j{i}" for i in range(3)])
        worker = _AckCounting(target, concurrency=10, ack_linger=timedelta(hours=1))

        @worker.handler("flush")
        async def handle(d: Delivery) -> None:
            pass

        task = asyncio.create_task(worker.serve())
        await eventually(lambda: worker.stats.succeeded == 3)
        assert worker.stats.acked == 0  # lingering
        worker.stop()
        await asyncio.wait_for(task, 30)
        assert worker.stats.acked == 3
        assert sum(worker.ack_call_sizes) == 3
        assert (await client.stats("flush")).acked_total == 3


def test_ack_linger_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="ack_linger must not be negative"):
        Worker("127.0.0.1:1", ack_linger=timedelta(milliseconds=-1))
