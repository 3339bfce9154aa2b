"""Wake-ups travel on per-shard channels (SPUBLISH/SSUBSCRIBE): a listener hears
only the shards it asked for, and a (re)subscription re-checks that shard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from delayq_server import events
from delayq_server.store import ShardKeys, Store
from tests.store.test_background import until
from tests.support.seed import spec

A = ShardKeys("default", "a", 0)
B = ShardKeys("default", "b", 0)


class Heard:
    """Every event the hub fires and every (re)subscription the listener reports."""

    def __init__(self, hub: events.EventHub) -> None:
        self.events: list[tuple[str, str]] = []
        self.subscribed: list[str | None] = []
        for kind in (events.READY, events.DUE, events.LEASE):
            hub.listen(kind, self._recorder(kind))

    def _recorder(self, kind: str) -> Callable[[str, str], None]:
        return lambda tag, detail: self.events.append((kind, tag))


@pytest.fixture
async def listening(
    aredis: aioredis.Redis,
) -> AsyncIterator[tuple[events.PubSubListener, Heard]]:
    hub = events.EventHub()
    heard = Heard(hub)
    listener = events.PubSubListener(
        aredis, hub, "t1", lambda kind, items: None, on_subscribed=heard.subscribed.append
    )
    listener.start()
    await asyncio.wait_for(listener.ready.wait(), 10)
    yield listener, heard
    await listener.stop()


async def test_a_listener_hears_only_the_shards_it_wants(
    aredis: aioredis.Redis, listening: tuple[events.PubSubListener, Heard]
) -> None:
    listener, heard = listening
    listener.want([B])
    await until(lambda: B.tag in heard.subscribed)  # its channel is subscribed
    store = Store(aredis)
    await store.enqueue(A, [spec(delay_ms=0)])  # "ready" on A's channel: not ours
    await store.enqueue(B, [spec(delay_ms=0)])
    await until(lambda: (events.READY, B.tag) in heard.events)
    # A's events were published before B's last one: heard by now if at all.
    await store.enqueue(B, [spec(delay_ms=60_000)])
    await until(lambda: (events.DUE, B.tag) in heard.events)
    assert all(tag == B.tag for _, tag in heard.events), heard.events
    # Redis' view: one shard subscriber on B's channel, none on A's, and no
    # classic (broadcast) channel at all.
    numsub = dict(await aredis.pubsub_shardnumsub(A.channel, B.channel))
    assert numsub == {A.channel.encode(): 0, B.channel.encode(): 1}
    assert await aredis.pubsub_channels() == []


async def test_each_subscription_rechecks_its_shard(
    aredis: aioredis.Redis, listening: tuple[events.PubSubListener, Heard]
) -> None:
    listener, heard = listening
    assert heard.subscribed == [None]  # our own channel: re-check everything
    listener.want([A, B])
    await until(lambda: {A.tag, B.tag} <= set(heard.subscribed))
    assert listener.subscribed_tags == {A.tag, B.tag}
    heard.subscribed.clear()
    # redis-py reconnects and re-subscribes by itself: each channel is re-checked.
    await aredis.client_kill_filter(_type="pubsub")
    await until(lambda: {None, A.tag, B.tag} <= set(heard.subscribed))
