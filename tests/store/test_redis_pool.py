"""The server's Redis connection pool (delayq_server/redis_client.py, QuickPool).

The quick path must keep what BlockingConnectionPool promises: callers beyond
the pool's size wait for a connection instead of failing, every waiter is woken
by a release, and a connection Redis closed is replaced, all against the real
redis-server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis.asyncio as aioredis
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq_server.managed_redis import ManagedRedis
from delayq_server.redis_client import QuickPool, connect, run_script


async def test_the_server_client_uses_the_quick_pool(redis_url: str) -> None:
    client = connect(redis_url)
    try:
        assert isinstance(client, aioredis.Redis)
        assert isinstance(client.connection_pool, QuickPool)
        assert await client.ping()
    finally:
        await client.aclose()


async def test_an_uncontended_call_skips_the_condition(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick path takes a free connection without the pool's condition: the
    blocking pool's get_connection (condition, timeout, liveness probe) never runs."""
    pool = QuickPool.from_url(redis_url, max_connections=4, timeout=5)
    client = aioredis.Redis.from_pool(pool)
    slow = {"get": 0, "release": 0}
    blocking_get = aioredis.BlockingConnectionPool.get_connection
    blocking_release = aioredis.BlockingConnectionPool.release

    async def counting_get(self: aioredis.BlockingConnectionPool) -> Any:
        slow["get"] += 1
        return await blocking_get(self)  # type: ignore[no-untyped-call]

    async def counting_release(self: aioredis.BlockingConnectionPool, conn: Any) -> None:
        slow["release"] += 1
        await blocking_release(self, conn)

    monkeypatch.setattr(aioredis.BlockingConnectionPool, "get_connection", counting_get)
    monkeypatch.setattr(aioredis.BlockingConnectionPool, "release", counting_release)
    try:
        await client.ping()  # the first call makes the connection (slow path)
        first = dict(slow)
        for _ in range(50):
            await client.ping()
        assert slow == first
    finally:
        await client.aclose()


async def test_callers_beyond_the_pool_wait_and_all_finish(redis_url: str) -> None:
    """200 concurrent blocking calls through 3 connections: every one is answered,
    none fails with "No connection available" or "Too many connections"."""
    pool = QuickPool.from_url(redis_url, max_connections=3, timeout=20)
    client = aioredis.Redis.from_pool(pool)
    try:
        # BLPOP with a short timeout holds its connection inside Redis.
        results = await asyncio.gather(
            *(client.blpop([f"pool-test-{i}"], timeout=0.05) for i in range(200))
        )
        assert results == [None] * 200
        assert len(pool._in_use_connections) == 0
        assert len(pool._available_connections) <= 3
    finally:
        await client.aclose()


async def test_a_waiter_is_woken_by_a_quick_release(redis_url: str) -> None:
    """One connection, one holder, one waiter: the holder's release wakes the waiter
    at once (it would otherwise sit out the pool's 20 s timeout)."""
    pool = QuickPool.from_url(redis_url, max_connections=1, timeout=20)
    client = aioredis.Redis.from_pool(pool)
    try:
        await client.ping()
        held = await pool.get_connection()
        waiter = asyncio.ensure_future(client.ping())
        for _ in range(100):  # event-loop turns until the waiter queues in the slow path
            if pool._waiting:
                break
            await asyncio.sleep(0)
        assert pool._waiting == 1
        await pool.release(held)
        assert await asyncio.wait_for(waiter, 10)
    finally:
        await client.aclose()


async def _kill_pooled_connection(client: aioredis.Redis, redis_url: str) -> None:
    """CLIENT KILL, from another client, of the connection `client` uses next (its
    pool hands out the connection it was given back last)."""
    await client.client_setname("quick-pool-victim")
    victim = next(c["id"] for c in await client.client_list() if c["name"] == "quick-pool-victim")
    killer = aioredis.Redis.from_url(redis_url)
    try:
        await killer.client_kill_filter(_id=victim)
    finally:
        await killer.aclose()


async def test_a_connection_redis_closed_is_replaced(redis_url: str) -> None:
    """CLIENT KILL closes the pooled connection inside Redis; the next call is answered
    (the retry policy reconnects) rather than failing."""
    client = connect(redis_url)
    assert isinstance(client, aioredis.Redis)
    try:
        await _kill_pooled_connection(client, redis_url)
        assert await client.ping()
        assert await client.set("pool-test-after-kill", b"1")
        assert await client.get("pool-test-after-kill") == b"1"
    finally:
        await client.aclose()


@pytest.mark.parametrize("size", [1, 4])
async def test_cancelled_calls_leave_no_reply_behind(redis_url: str, size: int) -> None:
    """A call cancelled while Redis is answering must not leave its reply on a pooled
    connection for the next caller to read (redis-py disconnects on cancellation)."""
    pool = QuickPool.from_url(redis_url, max_connections=size, timeout=20)
    client = aioredis.Redis.from_pool(pool)
    try:
        await client.delete("pool-test-list")
        for i in range(20):
            task = asyncio.ensure_future(client.blpop(["pool-test-list"], timeout=0.2))
            await asyncio.sleep(0.01)
            task.cancel()
            await client.rpush("pool-test-list", f"v{i}")
            # The next call reads its own reply, never the cancelled BLPOP's.
            assert await client.lpop("pool-test-list") in (f"v{i}".encode(), None)
            assert await client.echo(f"e{i}") == f"e{i}".encode()
    finally:
        await client.aclose()


async def test_a_disconnected_connection_in_the_pool_connects_again(redis_url: str) -> None:
    """A connection given back disconnected (its command failed for good) is handed
    out again and connects on its next command; the pool does not grow for it."""
    pool = QuickPool.from_url(redis_url, max_connections=1, timeout=5)
    client = aioredis.Redis.from_pool(pool)
    try:
        await client.ping()
        conn = await pool.get_connection()
        await conn.disconnect()
        await pool.release(conn)
        assert not conn.is_connected
        assert await client.ping()
        assert conn.is_connected  # the same, only connection, connected again
        assert len(pool._available_connections) == 1 and not pool._in_use_connections
    finally:
        await client.aclose()


async def test_a_command_is_written_without_a_task_of_its_own(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py bounds every write with `asyncio.wait_for`, which makes a Task per
    command (~26 us of CPU of a ~120 us script call: `make bench-pool`). The
    server's connections write at once and wait, bounded, only when the socket
    buffer is full."""
    waits = 0
    wait_for = asyncio.wait_for

    async def counting_wait_for(*args: Any, **kwargs: Any) -> Any:
        nonlocal waits
        waits += 1
        return await wait_for(*args, **kwargs)

    client = connect(redis_url)
    try:
        await client.ping()  # connects
        monkeypatch.setattr(asyncio, "wait_for", counting_wait_for)
        for i in range(20):
            await client.set(f"quick-write-{i}", b"x" * 100)
        assert await client.get("quick-write-19") == b"x" * 100
        assert waits == 0
    finally:
        await client.delete(*(f"quick-write-{i}" for i in range(20)))
        await client.aclose()


async def test_a_write_redis_does_not_take_times_out(tmp_path: Path) -> None:
    """With Redis stopped (SIGSTOP), a write bigger than the socket buffers waits for
    `socket_timeout`, then fails as redis-py's own write does: a TimeoutError, which
    the retry policy handles, and the connection is dropped."""
    with ManagedRedis(tmp_path, appendonly=False) as server:
        assert server.proc is not None
        pool = QuickPool.from_url(server.url, max_connections=2, socket_timeout=0.5)
        client = aioredis.Redis.from_pool(pool)
        try:
            await client.ping()
            conn = await pool.get_connection()
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                big = conn.pack_command("SET", "big", b"x" * (64 << 20))
                with pytest.raises(RedisTimeoutError, match="Timeout writing"):
                    await conn.send_packed_command(big)
                assert not conn.is_connected
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            await pool.release(conn)
            assert await client.ping()  # a new connection serves the next command
        finally:
            await client.aclose()


async def test_commands_are_packed_by_hiredis(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's asyncio connection packs commands in Python (~17.6 us for an enqueue
    call's 17 arguments, against 2.4 us in hiredis, which its blocking client uses).
    The server's connections pack with hiredis, and the bytes on the wire stay
    redis-py's for every argument type it takes."""
    packed = 0
    pack = hiredis.pack_command

    def counting_pack(args: tuple[Any, ...]) -> bytes:
        nonlocal packed
        packed += 1
        packed_bytes: bytes = pack(args)
        return packed_bytes

    client = connect(redis_url)
    assert isinstance(client, aioredis.Redis)
    try:
        await client.ping()  # connects (its handshake is packed too)
        monkeypatch.setattr(hiredis, "pack_command", counting_pack)
        values: list[Any] = [b"\x00bytes", "héllo", 7, -(2**70), 0.1, 1e20, memoryview(b"mv")]
        for i, value in enumerate(values):
            await client.set(f"packed-{i}", value)
        assert packed == len(values)
        got = await client.mget([f"packed-{i}" for i in range(len(values))])
        assert got == [b"\x00bytes", "héllo".encode(), b"7", b"-1180591620717411303424",
                       b"0.1", b"1e+20", b"mv"]  # fmt: skip
        # What hiredis refuses still goes through redis-py's packer and its errors.
        with pytest.raises(DataError, match="Invalid input of type: 'bool'"):
            await client.set("packed-bool", True)
        await client.set("packed-bytearray", bytearray(b"ba"))
        assert await client.get("packed-bytearray") == b"ba"
        conn = await client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        try:  # a command name with a space is split, as redis-py does
            assert conn.pack_command("CONFIG GET", "maxmemory") == [
                b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$9\r\nmaxmemory\r\n"
            ]
        finally:
            await client.connection_pool.release(conn)
    finally:
        await client.delete(*(f"packed-{i}" for i in range(7)), "packed-bytearray")
        await client.aclose()


class _CommandCounter:
    """Counts calls of redis-py's command layer (Redis.execute_command)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        execute = aioredis.Redis.execute_command

        async def counting(client: aioredis.Redis, *args: Any, **options: Any) -> Any:
            self.calls += 1
            return await execute(client, *args, **options)  # type: ignore[no-untyped-call]

        monkeypatch.setattr(aioredis.Redis, "execute_command", counting)


async def test_a_script_call_skips_redis_pys_command_layer(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripts are the server's hot calls. redis-py's command layer (retry wrapper,
    metrics, response parsing options) costs ~14 us of a ~43 us call; run_script
    sends EVALSHA on a pooled connection itself and leaves the rest to that layer."""
    client = connect(redis_url)
    assert isinstance(client, aioredis.Redis)
    script = client.register_script("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1}")
    try:
        assert await run_script(client, script, ["k"], ["a", 1]) == [b"k", b"a", 2]
        counter = _CommandCounter(monkeypatch)
        for i in range(20):
            assert await run_script(client, script, ["k"], ["a", i]) == [b"k", b"a", i + 1]
        assert counter.calls == 0
        # A script's own error is the caller's, as through redis-py.
        failing = client.register_script("return redis.error_reply('boom')")
        with pytest.raises(ResponseError, match="boom"):
            await run_script(client, failing, [], [])
    finally:
        await client.aclose()


async def test_a_script_redis_forgot_is_loaded_again(redis_url: str) -> None:
    """After SCRIPT FLUSH (a restarted Redis) the call goes through redis-py's script
    object, which loads it and sends it again."""
    client = connect(redis_url)
    assert isinstance(client, aioredis.Redis)
    script = client.register_script("return 'forgotten ' .. ARGV[1]")
    try:
        assert await run_script(client, script, [], ["once"]) == b"forgotten once"
        await client.script_flush()
        assert await run_script(client, script, [], ["twice"]) == b"forgotten twice"
    finally:
        await client.aclose()


async def test_a_script_on_a_killed_connection_is_sent_again(redis_url: str) -> None:
    """CLIENT KILL closes the pooled connection; the script is sent again through
    redis-py's retry policy on a new one (scripts are replay-safe)."""
    client = connect(redis_url)
    assert isinstance(client, aioredis.Redis)
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    try:
        await client.delete("pool-test-incr")
        assert await run_script(client, script, ["pool-test-incr"], []) == 1
        await _kill_pooled_connection(client, redis_url)
        assert await run_script(client, script, ["pool-test-incr"], []) == 2
    finally:
        await client.delete("pool-test-incr")
        await client.aclose()


async def test_a_cancelled_script_leaves_no_reply_behind(redis_url: str) -> None:
    """A script call cancelled while Redis runs it must not leave its reply on the
    pooled connection for the next script to read."""
    pool = QuickPool.from_url(redis_url, max_connections=1, timeout=20)
    client = aioredis.Redis.from_pool(pool)
    # Busy for ~30 ms of Redis' clock (TIME advances within a script on Redis 7).
    slow = client.register_script(
        "local t = redis.call('TIME') local start = t[1] * 1e6 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] - start > 30000 "
        "return 'slow'"
    )
    echo = client.register_script("return ARGV[1]")
    try:
        await slow.__call__(keys=[], args=[])  # loaded
        for i in range(5):
            task = asyncio.ensure_future(run_script(client, slow, [], []))
            await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert await run_script(client, echo, [], [f"e{i}"]) == f"e{i}".encode()
    finally:
        await client.aclose()


async def test_an_idle_connection_is_checked_before_its_next_command(
    quiet_redis_url: str,
) -> None:
    """The quick write keeps redis-py's health check: a connection idle past
    `health_check_interval` sends a PING before its next command."""
    pool = QuickPool.from_url(quiet_redis_url, max_connections=1, health_check_interval=0.05)
    client = aioredis.Redis.from_pool(pool)
    try:
        await client.set("pool-test-health", b"1")
        await client.config_resetstat()
        await asyncio.sleep(0.2)
        assert await client.get("pool-test-health") == b"1"
        # Read through another client: the checked one would PING again after a stall.
        reader = aioredis.Redis.from_url(quiet_redis_url)
        try:
            stats = await reader.info("commandstats")
        finally:
            await reader.aclose()
        assert int(stats["cmdstat_ping"]["calls"]) == 1
    finally:
        await client.aclose()
