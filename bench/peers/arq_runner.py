"""arq side of the benchmark: one scenario per process, arq's own asyncio API.

Runs in bench/peers/.venv (arq pins redis<6, .venv has redis 8): from the repo root,
`bench/peers/.venv/bin/python -m bench.peers.arq_runner SCENARIO --redis-url URL ...`.
Worker options stay at arq's defaults except max_jobs (the harness' concurrency flag).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

from arq import Worker, create_pool  # type: ignore[import-not-found, unused-ignore]
from arq.connections import RedisSettings  # type: ignore[import-not-found, unused-ignore]
from arq.worker import func  # type: ignore[import-not-found, unused-ignore]

from bench.harness.common import (
    PAYLOAD,
    QUEUE,
    Holder,
    LatenessLog,
    Progress,
    due_times_ms,
    runner_args,
    write_result,
)

Ctx = dict[str, Any]


def settings_of(url: str) -> Any:
    u = urlparse(url)
    return RedisSettings(host=u.hostname or "127.0.0.1", port=u.port or 6379)


async def _noop(_ctx: Ctx, _payload: str) -> None:
    return None


def worker_of(
    url: str, handler: Any, *, max_jobs: int, burst: bool = False, queue: str = QUEUE
) -> Any:
    return Worker(
        functions=[func(handler, name="job")],
        redis_settings=settings_of(url),
        queue_name=queue,
        max_jobs=max_jobs,
        burst=burst,
        handle_signals=False,
    )


async def stop_worker(worker: Any, running: asyncio.Task[None]) -> None:
    """Let in-flight jobs finish (they are no-ops), then stop the worker and its pool."""
    if worker.tasks:
        await asyncio.wait(list(worker.tasks.values()), timeout=5)
    running.cancel()
    # close() cancels and gathers the worker's tasks; a cancelled one re-raises here.
    with contextlib.suppress(asyncio.CancelledError):
        await worker.close()


async def enqueue_concurrently(
    pool: Any, jobs: int, concurrency: int, kwargs_of: Any, on_done: Any = None
) -> None:
    """arq has no batch API: `concurrency` enqueue_job calls in flight."""
    next_index = 0

    async def loop() -> None:
        nonlocal next_index
        while next_index < jobs:
            i = next_index
            next_index += 1
            await pool.enqueue_job("job", PAYLOAD, _queue_name=QUEUE, **kwargs_of(i))
            if on_done is not None:
                on_done(i, time.time())

    await asyncio.gather(*(loop() for _ in range(concurrency)))


async def scenario_enqueue(url: str, p: dict[str, Any]) -> dict[str, Any]:
    jobs = int(p["jobs"])
    delay_s = float(p.get("delay_s", 3600))
    spread = float(p.get("spread_s", 0))
    rng = random.Random(12)
    delays = [60 + rng.random() * spread if spread else delay_s for _ in range(jobs)]
    pool = await create_pool(settings_of(url))
    progress = Progress("arq enqueue (enqueue_job)", jobs)
    start = time.perf_counter()
    if p["mode"] == "latency":
        lat = []
        for _ in range(jobs):
            t = time.perf_counter()
            await pool.enqueue_job("job", PAYLOAD, _queue_name=QUEUE, _defer_by=delay_s)
            lat.append((time.perf_counter() - t) * 1000)
        seconds = time.perf_counter() - start
        await pool.aclose()
        return {
            "jobs": jobs,
            "seconds": seconds,
            "rate": jobs / seconds,
            "p50_ms": sorted(lat)[jobs // 2],
        }
    await enqueue_concurrently(
        pool,
        jobs,
        int(p["concurrency"]),
        lambda i: {"_defer_by": delays[i]},
        lambda i, _t: progress.update(i + 1),
    )
    seconds = time.perf_counter() - start
    await pool.aclose()
    return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds}


async def scenario_lateness(url: str, p: dict[str, Any]) -> dict[str, Any]:
    rate = float(p["rate"])
    jobs = int(p["jobs"])
    due = [ms / 1000 for ms in due_times_ms(float(p["lead_s"]), jobs, rate)]
    done = asyncio.Event()
    log = LatenessLog(
        f"arq lateness @{rate:,.0f}/s",
        jobs,
        "consumer: handler start (time.time) - job score (the requested whole-ms due time)",
    )

    async def handler(ctx: Ctx, _payload: str) -> None:
        # arq's own record of the due time is the job's score (ms); it exposes no start time
        # to the job, so the handler's first instruction stands for the delivery.
        log.record(ctx["job_id"], time.time() * 1000 - float(ctx["score"]))
        if log.complete:
            done.set()

    worker = worker_of(url, handler, max_jobs=int(p["concurrency"]))
    running = asyncio.create_task(worker.main())
    pool = await create_pool(settings_of(url))

    def on_done(i: int, at: float) -> None:
        if at > due[i]:
            log.late_enqueues += 1

    await enqueue_concurrently(
        pool,
        jobs,
        int(p["enqueue_concurrency"]),
        lambda i: {"_defer_until": datetime.fromtimestamp(due[i], tz=UTC)},
        on_done,
    )
    timeout = float(p["lead_s"]) + jobs / rate + float(p.get("grace_s", 60))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout)
    await stop_worker(worker, running)
    await pool.aclose()
    return log.result()


async def scenario_drain(url: str, p: dict[str, Any]) -> dict[str, Any]:
    jobs = int(p["jobs"])
    pool = await create_pool(settings_of(url))
    await enqueue_concurrently(pool, jobs, int(p["enqueue_concurrency"]), lambda _i: {})
    await pool.aclose()
    done = 0
    progress = Progress("arq drain", jobs)

    async def handler(_ctx: Ctx, _payload: str) -> None:
        nonlocal done
        done += 1
        progress.update(done)

    worker = worker_of(url, handler, max_jobs=int(p["concurrency"]), burst=True)
    start = time.perf_counter()
    await worker.main()
    seconds = time.perf_counter() - start
    complete = int(worker.jobs_complete)
    await worker.close()
    return {"jobs": jobs, "acked": complete, "seconds": seconds, "rate": complete / seconds}


async def scenario_hold(url: str) -> None:
    """Worker A of the redelivery scenario: take the job and never finish it."""

    async def handler(ctx: Ctx, _payload: str) -> None:
        print(f"held {ctx['job_id']}", flush=True)
        await asyncio.sleep(10**6)

    await worker_of(url, handler, max_jobs=1).main()


async def scenario_redelivery(url: str, p: dict[str, Any]) -> dict[str, Any]:
    timeout = float(p["timeout_s"])
    async with Holder(
        sys.executable, "-m", "bench.peers.arq_runner", "hold", "--redis-url", url
    ) as holder:
        pool = await create_pool(settings_of(url))
        job = await pool.enqueue_job("job", PAYLOAD, _queue_name=QUEUE)
        if await holder.held() != job.job_id:
            raise RuntimeError("worker A took another job")
        got: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def handler(_ctx: Ctx, _payload: str) -> None:
            if not got.done():
                got.set_result(time.perf_counter())

        # Worker B, with arq's default job timeout, idle before A dies.
        worker = worker_of(url, handler, max_jobs=1)
        running = asyncio.create_task(worker.main())
        await asyncio.sleep(0.5)
        killed = holder.kill(str(p.get("signal", "KILL")))
        try:
            seconds: float | None = await asyncio.wait_for(got, timeout) - killed
        except TimeoutError:
            seconds = None
        await stop_worker(worker, running)
        await pool.aclose()
        return {"seconds": seconds, "timeout_s": timeout}


async def main() -> None:
    args = runner_args(__doc__ or "")
    params: dict[str, Any] = json.loads(args.params)
    url = args.redis_url
    if args.scenario == "enqueue":
        result = await scenario_enqueue(url, params)
    elif args.scenario == "lateness":
        result = await scenario_lateness(url, params)
    elif args.scenario == "drain":
        result = await scenario_drain(url, params)
    elif args.scenario == "redelivery":
        result = await scenario_redelivery(url, params)
    elif args.scenario == "hold":
        await scenario_hold(url)
        return
    else:
        raise SystemExit(f"unknown scenario {args.scenario!r}")
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    asyncio.run(main())
