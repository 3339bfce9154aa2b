"""Measuring helpers of `make bench-scale`: CPU and memory readings of Redis and of
this process, and the enqueue/promote cost probe at a given backlog."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio.cluster import RedisCluster

from delayq_server.ids import new_job_id
from delayq_server.store import JobSpec, ShardKeys, Store

PROBES = 10  # probes per backlog size; the median is reported
PROBE_JOBS = 1000  # jobs per probe


def spec(due_ms: int, payload: bytes) -> JobSpec:
    return JobSpec(
        job_id=new_job_id(0, 1),
        payload=payload,
        headers={},
        delay_ms=None,
        due_at_ms=due_ms,
        ttl_ms=0,
        max_attempts=3,
        backoff_initial_ms=1000,
        backoff_max_ms=60_000,
        multiplier=2.0,
        jitter=0.0,
        idempotency_key="",
    )


def _per_node(info: Any, field: str) -> list[Any]:
    """INFO of one node, or a cluster's {node: INFO}: the field on every node."""
    if isinstance(info, dict) and field not in info:
        return [v[field] for v in info.values()]
    return [info[field]]


def every_node(store: Store) -> dict[str, Any]:
    """Keyword arguments that send a node command to every master of a cluster."""
    return {"target_nodes": RedisCluster.PRIMARIES} if isinstance(store.redis, RedisCluster) else {}


async def used_memory(store: Store) -> int:
    info = await store.redis.info("memory", **every_node(store))
    return sum(int(v) for v in _per_node(info, "used_memory"))


async def redis_cpu_s(store: Store) -> float:
    """CPU seconds (user + sys) that every Redis node has used so far."""
    info = await store.redis.info("cpu", **every_node(store))
    return sum(float(v) for v in _per_node(info, "used_cpu_user")) + sum(
        float(v) for v in _per_node(info, "used_cpu_sys")
    )


def proc_cpu_s(pid: int | None = None) -> float:
    """CPU seconds of a process (this one by default) from /proc (Linux)."""
    if pid is None:
        return time.process_time()
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Cost:
    """Cost per job of one operation: wall median (µs) and CPU (µs) of the store
    code in this process (what the server spends outside gRPC) plus Redis."""

    wall_us: float
    store_cpu_us: float
    redis_cpu_us: float

    @property
    def cpu_us(self) -> float:
        return self.store_cpu_us + self.redis_cpu_us

    @staticmethod
    def mean(costs: list[Cost]) -> Cost:
        n = len(costs)
        return Cost(
            sum(c.wall_us for c in costs) / n,
            sum(c.store_cpu_us for c in costs) / n,
            sum(c.redis_cpu_us for c in costs) / n,
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "wall_us": self.wall_us,
            "store_cpu_us": self.store_cpu_us,
            "redis_cpu_us": self.redis_cpu_us,
            "cpu_us": self.cpu_us,
        }


async def probe(store: Store, keys: ShardKeys, now: int, payload: bytes) -> tuple[Cost, Cost]:
    """Enqueue, then promote, PROBES x PROBE_JOBS jobs due before the whole backlog,
    so promote meets the backlog's buckets right behind them; the probe's jobs are
    removed afterwards so memory readings stay the backlog's."""
    enq_wall, pro_wall = [], []
    enq_cpu = pro_cpu = enq_redis = pro_redis = 0.0
    for p in range(PROBES):
        due = now + 1_000 + p
        jobs = [spec(due, payload) for _ in range(PROBE_JOBS)]
        r0, c0, t0 = await redis_cpu_s(store), proc_cpu_s(), time.perf_counter()
        await store.enqueue(keys, jobs, now)
        t1, c1 = time.perf_counter(), proc_cpu_s()
        r1 = await redis_cpu_s(store)
        enq_wall.append((t1 - t0) * 1e6 / PROBE_JOBS)
        enq_cpu += c1 - c0
        enq_redis += r1 - r0
        moved = 0
        c1, t1 = proc_cpu_s(), time.perf_counter()
        while moved < PROBE_JOBS:
            moved += (await store.promote(keys, now_ms=due)).moved
        t2, c2 = time.perf_counter(), proc_cpu_s()
        r2 = await redis_cpu_s(store)
        pro_wall.append((t2 - t1) * 1e6 / PROBE_JOBS)
        pro_cpu += c2 - c1
        pro_redis += r2 - r1
        await store.redis.delete(keys.ready)
        async with store.redis.pipeline(transaction=False) as pipe:
            for j in jobs:  # records live in groups (store/keys.py record_group)
                pipe.hdel(keys.record_group(j.job_id), j.job_id)
            await pipe.execute()
    n = PROBES * PROBE_JOBS
    return (
        Cost(statistics.median(enq_wall), enq_cpu * 1e6 / n, enq_redis * 1e6 / n),
        Cost(statistics.median(pro_wall), pro_cpu * 1e6 / n, pro_redis * 1e6 / n),
    )


async def probe_server(
    stub: Any, server_pid: int, store: Store, shards: list[ShardKeys], payload: bytes
) -> Cost:
    """Enqueue PROBES x PROBE_JOBS jobs through a server (EnqueueBatch, one delay per
    call as producers send them): wall median per job, and the CPU per job of the
    server process plus every Redis node, which is what an enqueue costs the system.
    The jobs fall due 5 s later, well before the backlog, and are removed
    afterwards (promoted, then dropped with their records)."""
    from delayq.v1 import service_pb2

    walls: list[float] = []
    cpu = redis = 0.0
    ids: list[str] = []
    for _ in range(PROBES):
        reqs = [
            service_pb2.EnqueueRequest(namespace=shards[0].namespace, queue=shards[0].queue)
            for _ in range(PROBE_JOBS)
        ]
        for r in reqs:
            r.payload = payload
            r.delay.FromMilliseconds(5_000)
        r0, c0, t0 = await redis_cpu_s(store), proc_cpu_s(server_pid), time.perf_counter()
        resp = await stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs))
        t1, c1 = time.perf_counter(), proc_cpu_s(server_pid)
        r1 = await redis_cpu_s(store)
        walls.append((t1 - t0) * 1e6 / PROBE_JOBS)
        cpu += c1 - c0
        redis += r1 - r0
        ids += [x.response.job_id for x in resp.results]
    until = await store.time_ms() + 10_000  # past every probe job, far before the backlog
    for keys in shards:
        while (await store.promote(keys, now_ms=until)).moved:
            pass
        # The ready list, and the server's lifecycle events of the probe's jobs.
        await store.redis.delete(keys.ready)
        await store.redis.delete(f"{keys.prefix}ev")
    async with store.redis.pipeline(transaction=False) as pipe:
        for job_id in ids:  # the id names its record group, in whichever shard it went
            for k in shards:
                pipe.hdel(k.record_group(job_id), job_id)
        await pipe.execute()
    n = PROBES * PROBE_JOBS
    return Cost(statistics.median(walls), cpu * 1e6 / n, redis * 1e6 / n)
