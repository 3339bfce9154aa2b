"""What a replica re-checks when a pub/sub channel is (re)subscribed (server and pusher)."""

from __future__ import annotations

from collections.abc import Callable

from delayq_server.dispatcher import Dispatcher
from delayq_server.store import Store
from delayq_server.timers.manager import Timers


def on_resubscribed(
    store: Store, timers: Timers, dispatcher: Dispatcher
) -> Callable[[str | None], None]:
    """The listener's ``on_subscribed``: events published while a channel was not
    subscribed are lost, so its shard is re-checked (``None``, the replica's own
    channel: everything). Queue events ride on shard 0's channel (store/queues.py),
    so that one also drops the queue's cached settings."""

    def resync(tag: str | None) -> None:
        if tag is None:
            store.queues.forget_all()  # "changed" events may have been lost
            timers.wake_all()
            dispatcher.wake_all()
            return
        namespace, _, rest = tag.partition("/")
        queue, _, shard = rest.rpartition("/")
        if shard == "0":
            store.queues.forget(namespace, queue)
        timers.recheck(tag)
        dispatcher.recheck(tag)

    return resync
