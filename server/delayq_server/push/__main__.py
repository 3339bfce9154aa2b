"""`delayq-pusher`: push delivery as its own process, on the server's Redis (no gRPC port)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence

from redis.exceptions import RedisError, ResponseError

from delayq_server import config, events, redis_client, resync
from delayq_server.dispatcher import Dispatcher
from delayq_server.push import config as push_config
from delayq_server.push.pusher import Pusher
from delayq_server.store import Store, layout
from delayq_server.store.queues import QUEUE_EVENT
from delayq_server.timers.manager import Timers
from delayq_server.timers.promoter import Waiters

log = logging.getLogger("delayq.pusher")

STOP_TIMEOUT_S = 15.0


async def run(cfg: config.Config, targets: push_config.PushConfig | None, redis_url: str) -> None:
    """The server's store, dispatcher, timers and pub/sub listener, without the gRPC port:
    a replica that only pushes (its timers promote and reap like any replica's)."""
    server_id = os.urandom(4).hex()
    redis = redis_client.connect(redis_url)
    store = Store(
        redis,
        bucket_width_ms=cfg.bucket_width_ms,
        idempotency_window_ms=cfg.idempotency_window_ms,
        completed_retention_ms=cfg.completed_retention_ms,
        default_shards=cfg.shards_per_queue,
        events_maxlen=cfg.events_maxlen if cfg.record_events else 0,
    )
    hub = events.EventHub()
    timers: Timers
    dispatcher = Dispatcher(
        store,
        hub,
        server_id,
        on_leased=lambda keys, deadline_ms: timers.lease_taken(keys, deadline_ms),
        idle_fallback_s=cfg.wake_fallback_ms / 1000,
    )
    timers = Timers(
        store,
        hub,
        dispatcher.on_reaped,
        server_id,
        fallback_s=cfg.wake_fallback_ms / 1000,
        waiters=Waiters(dispatcher.board.has_idle, dispatcher.board.fire),
        coalesce_s=cfg.timer_coalesce_ms / 1000,
    )
    store.on_backlog_head = timers.backlog_seen  # as App: claims promote (promoter.py)

    background: set[asyncio.Task[None]] = set()

    def on_queue_event(tag: str, detail: str) -> None:
        # As App._on_queue_event: settings cached by the store (completed retention
        # at ack) follow AdminService changes made through any replica.
        namespace, _, queue = tag.partition("/")
        pusher.queue_changed(namespace, queue)  # its push target may have changed
        if detail != "deleted":
            store.queues.forget(namespace, queue)
            return
        store.forget_queue(namespace, queue)
        task = asyncio.create_task(timers.forget_queue(namespace, queue))
        background.add(task)
        task.add_done_callback(background.discard)

    pusher = Pusher(targets, store, dispatcher, timers.ensure)
    hub.listen(QUEUE_EVENT, on_queue_event)

    listener = events.PubSubListener(
        redis,
        hub,
        server_id,
        dispatcher.on_message,
        on_subscribed=resync.on_resubscribed(store, timers, dispatcher, pusher.resubscribed),
    )
    timers.on_known = listener.want
    try:
        await redis.ping()
        await store.load_scripts()
        await layout.check(redis)
    except layout.LayoutV1Data as exc:
        config.fail(str(exc))
    except RedisError as exc:
        config.fail(f"cannot use Redis: {exc}")
    try:  # wake-ups need sharded pub/sub (Redis 7.0), as the server's do
        await store.notify_server(server_id, "hello")
    except ResponseError as exc:
        config.fail(f"Redis refused SPUBLISH ({exc}): delayq needs Redis 7.0 or later")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listener.start()
    await asyncio.wait_for(listener.ready.wait(), 10)
    await timers.start()
    pusher.start()
    named = 0 if targets is None else len(targets.targets)
    print(
        f"delayq-pusher: pushing {named} queue(s) of the config file and every queue "
        "whose settings hold a push target",
        flush=True,
    )
    await stop.wait()
    log.info("shutting down")

    async def finish() -> None:
        await pusher.stop()
        dispatcher.close_all()
        await dispatcher.drain_releases()
        await timers.stop()
        await listener.stop()
        await redis.aclose()

    try:  # bounded, as the server's stop: a wedged Redis must not keep us from exiting
        await asyncio.wait_for(finish(), STOP_TIMEOUT_S)
    except TimeoutError:
        log.warning("shutdown did not finish in %ss", STOP_TIMEOUT_S)
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> None:
    """Takes the server's flags (the store ones matter: --redis-url, --completed-retention,
    --bucket-width ...) and needs --redis-url; --push-config is optional."""
    cfg = config.load(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if cfg.redis_url is None:
        config.fail("--redis-url: delayq-pusher needs the server's Redis (DELAYQ_REDIS_URL)")
    # Without --push-config it pushes the queues whose settings hold a target.
    targets = None if cfg.push_config is None else push_config.load(cfg.push_config)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(cfg, targets, cfg.redis_url))


if __name__ == "__main__":
    main()
