"""A worker process for the SIGTERM test: sleeps in each handler and reports on stdout.

Usage: python -m tests.client.worker_app TARGET QUEUE SECONDS CONCURRENCY
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from delayq import Delivery, Worker

_out = threading.Lock()


def say(line: str) -> None:
    """One whole line per write: handlers print from several threads."""
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main() -> None:
    target, queue, seconds, concurrency = sys.argv[1:5]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    worker = Worker(target, concurrency=int(concurrency), lease=5, grace=30)

    @worker.handler(queue)
    def handle(d: Delivery) -> None:  # a sync handler: runs in the thread pool
        say(f"started {d.id}")
        time.sleep(float(seconds))
        say(f"finished {d.id}")

    say("worker: ready")
    worker.run()
    say(f"worker: exited {worker.stats}")


if __name__ == "__main__":
    main()
