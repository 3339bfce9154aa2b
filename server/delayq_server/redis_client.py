"""Builds the server's Redis client: one node, or Redis Cluster by URL scheme.

``redis+cluster://host:port`` (or ``rediss+cluster://``) names any node of a
cluster; redis-py's cluster client learns the slot map from it and routes each
script by its first key. Every script's keys share one shard's hash tag
(docs/design.md, "Redis layout"), so no script ever spans two slots.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Both clients expose the same command API; the store takes either.
RedisClient = aioredis.Redis | RedisCluster

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
POOL_SIZE = 64  # per node


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"***@{netloc}").geturl()


RETRIES = 3
BACKOFF_CAP_S = 1.0
CONNECT_TIMEOUT_S = 2.0
# store/store.py asserts that a re-sent script still finds its first run's reply.


class _QuickWrite(AbstractConnection):
    """Packs a command in C and writes it at once; waits for the socket, bounded, only
    when it is full.

    redis-py's asyncio connection packs commands in Python: 17.6 us for an enqueue
    call's 17 arguments, against 2.4 us with ``hiredis.pack_command``, the packer its
    blocking client uses (the bytes are the same for every type both take). What
    hiredis refuses (bool, None, bytearray) goes through redis-py's packer, which
    raises its DataError or packs it.

    redis-py bounds every write with ``asyncio.wait_for(..., socket_timeout)``, which
    on Python 3.11 makes a Task per command: ~26 us of a ~120 us script call's CPU
    (issue 12: `make bench-pool`). A write lands in the transport's buffer without
    waiting unless Redis stopped reading and the buffer passed its high-water mark,
    so only then is there anything to bound. A failed or timed-out write drops the
    connection and raises what redis-py's own write raises (its retry policy handles
    both); connecting, health checks and reads stay redis-py's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # hiredis encodes str as UTF-8; redis-py as its encoder says (UTF-8 unless set).
        self._hiredis_packs = self.encoder.encoding.replace("-", "").lower() == "utf8"

    def pack_command(self, *args: Any) -> list[bytes]:
        first = args[0]
        if self._hiredis_packs and isinstance(first, str) and " " not in first:
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                pass
        return super().pack_command(*args)

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        writer = self._writer
        if writer is None or self._reader is None:  # redis-py connects first
            await super().send_packed_command(command, check_health)
            return
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]  # PING when due
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer.writelines(command)
            if writer.transport.get_write_buffer_size():
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
            else:
                await writer.drain()  # raises at once if the connection was lost
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {e}") from e
        except BaseException:
            await self.disconnect(nowait=True)
            raise


class QuickPool(aioredis.BlockingConnectionPool):
    """A BlockingConnectionPool whose uncontended take and release are plain list moves.

    redis-py's blocking pool spends ~18-40 us of CPU per command on its condition,
    timeout, deprecation-argument wrapper, liveness probe (a socket read) and
    metric recording (issue 12: `make bench-pool`, 103 -> 85 us of client CPU per
    script call). Here a free connection is taken and given back without them
    while nobody waits; once the pool is exhausted every caller goes through the
    blocking pool as before, and a release wakes them. The probe is
    not needed: redis-py disconnects a connection whose command was interrupted
    (read_response on any BaseException), and a connection Redis closed fails its
    next command, which the client's retry policy re-sends on a new connection
    (scripts are replay-safe: docs/decisions.md, "Lost replies").
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The URL's connection class (TCP, TLS or Unix socket) with _QuickWrite's methods.
        base = self.connection_class
        self.connection_class = type(f"Quick{base.__name__}", (_QuickWrite, base), {})
        self._waiting = 0  # callers inside the blocking pool's get_connection

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._available_connections and not self._waiting and not self._in_maintenance:
            # A connection given back disconnected connects on its next command
            # (redis-py's send_packed_command), so none is checked here.
            connection = self._available_connections.pop()
            self._in_use_connections.add(connection)
            return connection
        self._waiting += 1
        try:
            return await super().get_connection()  # type: ignore[no-untyped-call]
        finally:
            self._waiting -= 1

    async def release(self, connection: Any) -> None:
        if self._waiting or self._in_maintenance:
            await super().release(connection)  # notifies a waiter
            return
        self._in_use_connections.remove(connection)
        if connection.should_reconnect():
            await connection.disconnect()
        self._available_connections.append(connection)


async def run_script(
    client: RedisClient, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """``script(keys=keys, args=args)``, sent on a pooled connection directly.

    Scripts are the server's hot Redis calls. redis-py's command layer (its retry
    wrapper, metric hooks and response options) costs ~14 us of a ~43 us EVALSHA
    (issue 12: docs/decisions.md, "pack in C"). Here EVALSHA goes out and its
    reply is read on a QuickPool connection, reads still bounded by
    ``socket_timeout``. What that layer is for goes back to it: a dropped or timed-out
    connection (its retry policy re-sends; scripts are replay-safe) and a script
    Redis does not know (the script object loads it and sends it again). A script's
    own error is raised as through redis-py. The cluster client routes by key, so
    it always takes the script object's path.
    """
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, QuickPool):
        return await script(keys=keys, args=args)
    conn = await pool.get_connection()
    try:
        await conn.send_packed_command(
            conn.pack_command("EVALSHA", script.sha, len(keys), *keys, *args)
        )
        return await conn.read_response()
    except (RedisConnectionError, RedisTimeoutError, NoScriptError):
        pass  # redis-py's path below: a new connection, or the script loaded
    finally:
        await pool.release(conn)
    return await script(keys=keys, args=args)


def is_cluster(url: str) -> bool:
    return url.split("://", 1)[0] in CLUSTER_SCHEMES


def connect(url: str) -> RedisClient:
    """A ``redis.asyncio.Redis`` or ``RedisCluster`` (same command API) for ``url``.

    A command that fails on a dropped connection (Redis restarted, failover, a
    lost reply) is re-sent a few times on a fresh one. Every script carries a
    request id, so a re-sent script returns its first run's reply instead of
    running again (docs/decisions.md, "Lost replies"). The pool waits for a free connection:
    a batch spread over hundreds of queues (one script call per shard,
    concurrently) queues up instead of failing with "Too many connections".
    """
    retry = Retry(ExponentialBackoff(cap=BACKOFF_CAP_S, base=0.05), RETRIES)
    retry_on = [RedisConnectionError, RedisTimeoutError]
    scheme, rest = url.split("://", 1)
    if scheme in CLUSTER_SCHEMES:
        return RedisCluster.from_url(
            f"{CLUSTER_SCHEMES[scheme]}://{rest}",
            decode_responses=False,
            max_connections=POOL_SIZE,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            retry=retry,
            retry_on_error=retry_on,
        )
    pool = QuickPool.from_url(
        url,
        max_connections=POOL_SIZE,
        timeout=10,
        decode_responses=False,
        health_check_interval=30,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        retry=retry,
        retry_on_error=retry_on,
    )
    return aioredis.Redis.from_pool(pool)
