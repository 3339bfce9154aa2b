"""Entry point: `python -m delayq_server` (or the `delayq-server` script)."""

from __future__ import annotations

import os

# Before grpc is imported: grpcio 1.80+ serves accepted connections through
# EventEngine's listener, whose thread hand-offs cost this server ~15% more CPU
# per unary call and ~0.1 ms of p50 than the iomgr listener it replaced
# (docs/decisions.md, "the gRPC listener"). A GRPC_EXPERIMENTS the operator
# sets wins.
os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_listener")

import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Sequence

from delayq_server import config, cpu_affinity, logs
from delayq_server.app import App, StartupError
from delayq_server.managed_redis import ManagedRedis

log = logging.getLogger("delayq")


async def serve(cfg: config.Config, redis_url: str) -> None:
    app = App(cfg, redis_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        port = await app.start()
    except BaseException:
        await app.abort()
        raise
    # Every RPC allocates many short-lived objects and almost no cycles: the
    # default gen-0 threshold (700) ran a collection every few calls (~3% of a
    # unary Enqueue in py-spy --native). Freeze what start-up built and collect
    # gen 0 less often (docs/decisions.md, issue 12).
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    host = cfg.listen.rsplit(":", 1)[0]
    # Tests and scripts wait for this exact line (and may signal right after it).
    if app.http is not None:  # before the line below, which tests treat as "ready"
        http_host = app.http.listen.rsplit(":", 1)[0]
        print(f"delayq: admin http on {http_host}:{app.http_port}", flush=True)
    print(f"delayq: listening on {host}:{port}", flush=True)
    await stop.wait()
    log.info("shutting down (grace %.1fs)", cfg.grace_ms / 1000)
    await app.stop()
    log.info("stopped")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = config.load(argv)
    logs.setup(cfg.log_level, cfg.log_format)
    managed: ManagedRedis | None = None
    url = cfg.redis_url
    try:
        if url is None:
            try:
                managed = ManagedRedis(cfg.data_dir, port=0).start()
            except (RuntimeError, OSError) as exc:
                config.fail(str(exc).splitlines()[0])
            url = managed.url
            log.info("started managed redis-server at %s (data in %s)", url, cfg.data_dir)
        if cfg.workers > 1:
            from delayq_server.workers import Supervisor

            sys.exit(Supervisor(cfg, argv, url).run())
        # After the managed redis-server started: it would inherit the mask.
        cpu_affinity.pin(cfg.cpu_affinity)
        import uvloop

        uvloop.run(serve(cfg, url))
    except KeyboardInterrupt:
        pass
    except StartupError as exc:
        config.fail(str(exc))
    finally:
        if managed is not None:
            managed.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
