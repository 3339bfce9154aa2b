"""Wiring: Redis client, store, timers, dispatcher and the grpc.aio server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from redis.exceptions import RedisError, ResponseError

from delayq.v1 import admin_pb2, admin_pb2_grpc, service_pb2, service_pb2_grpc
from delayq_server import clock, dashboard, events, redis_client, resync, telemetry
from delayq_server import reflection as described_reflection
from delayq_server.admin.common import Deps
from delayq_server.admin.jobs import JobOps
from delayq_server.admin.queues import QueueOps
from delayq_server.admin_service import AdminService
from delayq_server.auth import bootstrap
from delayq_server.auth.certs import CertRoles
from delayq_server.auth.interceptor import AuthInterceptor
from delayq_server.auth.tokens import TokenAuthenticator
from delayq_server.config import Config
from delayq_server.dashboard import DashboardApi
from delayq_server.decode_guard import DecodeGuard, guarded
from delayq_server.dispatcher import Dispatcher
from delayq_server.http_port import HttpPort
from delayq_server.http_port import metrics as metrics_route
from delayq_server.otel_providers import TelemetryConfigError
from delayq_server.push import config as push_config
from delayq_server.push.pusher import Pusher
from delayq_server.queue_gauges import QueueGauges
from delayq_server.quotas import Limits, Quotas
from delayq_server.service import DelayQueueService
from delayq_server.store import LeaseRef, ShardKeys, Store, layout
from delayq_server.store.jobs_admin import JobAdmin
from delayq_server.store.queues import QUEUE_EVENT
from delayq_server.store.quotas import QuotaStore
from delayq_server.store.tokens import TokenStore
from delayq_server.timers.manager import Timers
from delayq_server.timers.promoter import Waiters

log = logging.getLogger(__name__)

SERVICE_NAME = service_pb2.DESCRIPTOR.services_by_name["DelayQueueService"].full_name
ADMIN_SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


def server_options(cfg: Config) -> list[tuple[str, int]]:
    """Keepalive, size and port options of the gRPC server (README "Quotas and limits")."""
    return [
        # Long-lived worker streams sit behind NATs and load balancers: the
        # server pings idle connections every 60 s so they are not cut, and
        # lets clients ping too ...
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # ... but no more often than every 10 s: after 2 faster pings the
        # connection is closed with GOAWAY (too_many_pings).
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        # gRPC Python sets SO_REUSEPORT by default: a second server on the same port
        # would start silently and split the traffic. Binding must fail instead,
        # except for the workers of one --workers group (workers.py).
        ("grpc.so_reuseport", 1 if cfg.reuse_port else 0),
    ]


FINISH_TIMEOUT_S = 5.0


class StartupError(Exception):
    """The server cannot start; the message is the one line printed to the operator."""


def check_bind(listen: str) -> None:
    """Refuses an address another process listens on, with one clear line
    (gRPC's own bind failure also logs a core error line first)."""
    host, _, port = listen.rpartition(":")
    if port == "0":
        return
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        raise StartupError(f"cannot listen on {listen}: {exc}") from exc
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            raise StartupError(f"cannot listen on {listen}: {exc.strerror}") from exc


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise StartupError(f"{flag}: cannot read {path}: {exc.strerror}") from exc


class App:
    """One delayq server replica."""

    def __init__(self, cfg: Config, redis_url: str) -> None:
        self.cfg = cfg
        self.server_id = os.urandom(4).hex()
        if cfg.clock_skew_ms:
            log.warning("local clock skewed by %d ms (test setting)", cfg.clock_skew_ms)
        clock.set_skew_ms(cfg.clock_skew_ms)
        self.redis_url = redis_url
        try:
            self.telemetry = telemetry.setup(
                cfg.otel, cfg.http_listen is not None, {"service.instance.id": self.server_id}
            )
        except TelemetryConfigError as exc:
            raise StartupError(str(exc)) from exc
        self.redis = redis_client.connect(redis_url)
        self.store = Store(
            self.redis,
            bucket_width_ms=cfg.bucket_width_ms,
            idempotency_window_ms=cfg.idempotency_window_ms,
            completed_retention_ms=cfg.completed_retention_ms,
            default_shards=cfg.shards_per_queue,
            events_maxlen=cfg.events_maxlen if cfg.record_events else 0,
            observe=self.telemetry.observe_script if self.telemetry.metering else None,
        )
        self.hub = events.EventHub()
        self.dispatcher = Dispatcher(
            self.store,
            self.hub,
            self.server_id,
            on_leased=lambda keys, deadline_ms: self.timers.lease_taken(keys, deadline_ms),
            idle_fallback_s=cfg.wake_fallback_ms / 1000,
        )
        if self.telemetry.metering:
            self.dispatcher.on_released = self.telemetry.on_released
        self.timers = Timers(
            self.store,
            self.hub,
            self._on_reaped,
            self.server_id,
            fallback_s=cfg.wake_fallback_ms / 1000,
            waiters=Waiters(self.dispatcher.board.has_idle, self.dispatcher.board.fire),
            coalesce_s=cfg.timer_coalesce_ms / 1000,
        )
        self.store.on_backlog_head = self.timers.backlog_seen
        self.listener = events.PubSubListener(
            self.redis,
            self.hub,
            self.server_id,
            self.dispatcher.on_message,
            on_subscribed=resync.on_resubscribed(
                self.store, self.timers, self.dispatcher, self._push_resubscribed
            ),
        )
        self.timers.on_known = self.listener.want
        self.health = health_aio.HealthServicer()
        self.token_store = TokenStore(self.redis)
        self.authenticator: TokenAuthenticator | None = None
        interceptors = [*self.telemetry.interceptors()]
        if cfg.auth:
            self.authenticator = TokenAuthenticator(self.token_store)
            certs = None
            if cfg.tls_client_roles:
                try:
                    certs = CertRoles.load(cfg.tls_client_roles)
                except (OSError, ValueError) as exc:
                    raise StartupError(f"--tls-client-roles: {exc}") from exc
            interceptors.append(AuthInterceptor(self.authenticator, certs))
        self._intercepted = bool(interceptors)
        if interceptors:  # first: later interceptors (auth) see decoded requests
            interceptors.insert(0, DecodeGuard())
        self.server = grpc.aio.server(
            options=server_options(cfg),
            interceptors=interceptors or None,
            maximum_concurrent_rpcs=cfg.max_concurrent_rpcs or None,
        )
        self.quotas = Quotas(
            QuotaStore(self.redis),
            Limits(
                enqueue_rate=cfg.quota_enqueue_rate,
                enqueue_burst=cfg.quota_enqueue_burst,
                max_jobs=cfg.quota_jobs,
                max_queues=cfg.quota_queues,
                max_streams=cfg.quota_streams,
            ),
            self.server_id,
        )
        deps = Deps(
            cfg, self.store, JobAdmin(self.store), self.timers, self.dispatcher, self.quotas
        )
        self.queue_ops, self.job_ops = QueueOps(deps), JobOps(deps)
        self.hub.listen(QUEUE_EVENT, self._on_queue_event)
        self._background: set[asyncio.Task[None]] = set()
        self.port = 0
        # Features add their routes to http.app before start() (http_port/server.py).
        self.http = HttpPort(cfg.http_listen) if cfg.http_listen else None
        if self.http is not None:
            dashboard.add_routes(
                self.http.app, DashboardApi(self.queue_ops, self.job_ops, self.authenticator)
            )
        self.http_port = 0
        self.pusher: Pusher | None = None
        self.servicer: DelayQueueService | None = None  # set by start()
        if cfg.push_config is not None or cfg.push:
            targets = None
            if cfg.push_config is not None:
                try:
                    targets = push_config.load(cfg.push_config)
                except push_config.PushConfigError as exc:
                    raise StartupError(f"--push-config: {exc}") from exc
            self.pusher = Pusher(targets, self.store, self.dispatcher, self.timers.ensure)
        self.gauges: QueueGauges | None = None
        if self.telemetry.metering:
            self.gauges = QueueGauges(
                self.store,
                self.telemetry,
                self.timers.queues,
                self.dispatcher.stream_count,
                self.dispatcher.leases_in_flight,
            )
            registry = self.telemetry.providers.prometheus_registry
            if self.http is not None and registry is not None:
                metrics_route.add_routes(self.http.app, registry, self.gauges)

    def _on_reaped(self, keys: ShardKeys, leases: list[LeaseRef]) -> None:
        self.telemetry.on_reaped(keys, leases)
        self.dispatcher.on_reaped(keys, leases)

    def _push_resubscribed(self, tag: str | None) -> None:
        if self.pusher is not None:  # queue events may have been lost: targets too
            self.pusher.resubscribed(tag)

    def _on_queue_event(self, tag: str, detail: str) -> None:
        """A queue's settings changed or it was deleted, through any replica."""
        namespace, _, queue = tag.partition("/")
        if self.pusher is not None:  # its push target may have changed
            self.pusher.queue_changed(namespace, queue)
        if detail != "deleted":
            self.store.queues.forget(namespace, queue)
            return
        self.store.forget_queue(namespace, queue)
        task = asyncio.create_task(self.timers.forget_queue(namespace, queue))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> int:
        """Checks the port and Redis, starts loops, binds and serves; returns the port."""
        # The port first: a server that cannot listen must not join the replicas
        # (heartbeat, timer ownership) even for a moment.
        if not self.cfg.reuse_port:  # a worker: its supervisor checked the port
            check_bind(self.cfg.listen)
        try:
            await self.redis.ping()
            await self.store.load_scripts()
            await layout.check(self.redis)
            await layout.warn_if_not_compact(self.redis)
        except layout.LayoutV1Data as exc:
            raise StartupError(str(exc)) from exc
        except RedisError as exc:
            where = redis_client.safe_url(self.redis_url)
            raise StartupError(f"cannot use Redis at {where}: {exc}") from exc
        try:  # wake-ups need sharded pub/sub (Redis 7.0); an ACL user may lack it too
            await self.store.notify_server(self.server_id, "hello")
        except ResponseError as exc:
            where = redis_client.safe_url(self.redis_url)
            raise StartupError(
                f"Redis at {where} refused SPUBLISH ({exc}): delayq needs "
                "Redis 7.0 or later, and an ACL user needs +spublish +ssubscribe"
            ) from exc
        self.listener.start()
        await asyncio.wait_for(self.listener.ready.wait(), 10)
        await self.timers.start()
        if self.gauges is not None and self.telemetry.providers.push_metrics:
            self.gauges.start_background()
        service = self.servicer = DelayQueueService(
            self.cfg, self.store, self.dispatcher, self.timers, self.telemetry, self.quotas
        )
        # Without interceptors the handlers themselves decode (cheaper per call:
        # grpc.aio then skips its interceptor chain); with interceptors the
        # DecodeGuard interceptor comes first, so auth sees decoded requests.
        registrar = self.server if self._intercepted else guarded(self.server)
        service_pb2_grpc.add_DelayQueueServiceServicer_to_server(service, registrar)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminService(self.token_store, self.authenticator, self.queue_ops, self.job_ops),
            registrar,
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, registrar)
        if self.cfg.reflection:
            described_reflection.enable(
                (SERVICE_NAME, ADMIN_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
                registrar,
            )
        try:
            self.port = self._bind()
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise StartupError(
                f"cannot listen on {self.cfg.listen}: address in use or not available"
            )
        if self.http is not None:
            try:
                self.http_port = await self.http.start()
            except OSError as exc:
                raise StartupError(
                    f"--http-listen: cannot listen on {self.cfg.http_listen}: {exc.strerror}"
                ) from exc
        # After the bind: a refused start stays one line (test_operations.py).
        if self.cfg.auth:
            await bootstrap.ensure_admin(self.token_store, self.cfg.auth_bootstrap_token_file)
        else:
            log.warning(
                "auth is OFF: any client that reaches %s may use every namespace "
                "(start with --auth or DELAYQ_AUTH=1 outside local development)",
                f"{self.cfg.listen.rsplit(':', 1)[0]}:{self.port}",  # port 0: the one bound
            )
        await self.server.start()
        if self.pusher is not None:
            self.pusher.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        return self.port

    def _bind(self) -> int:
        """Plaintext, TLS, or mutual TLS (client certificate required) on one port."""
        cfg = self.cfg
        if cfg.tls_cert is None or cfg.tls_key is None:
            return self.server.add_insecure_port(cfg.listen)
        key, chain = _read("--tls-key", cfg.tls_key), _read("--tls-cert", cfg.tls_cert)
        client_ca = _read("--tls-client-ca", cfg.tls_client_ca) if cfg.tls_client_ca else None
        creds = grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
        return self.server.add_secure_port(cfg.listen, creds)

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful: refuse new work, end streams (releasing their leases), drain, close."""
        grace = self.cfg.grace_ms / 1000 if grace_s is None else grace_s
        await self.health.enter_graceful_shutdown()
        if self.pusher is not None:  # before the streams close: its own settle first
            await self.pusher.stop()
        self.dispatcher.close_all()
        if self.servicer is not None:
            self.servicer.close_enqueue_streams()
        await self.server.stop(grace)
        if self.http is not None:
            await self.http.stop()
        try:
            # Bounded: a wedged Redis must not keep the process from exiting.
            await asyncio.wait_for(self._finish(), timeout=FINISH_TIMEOUT_S)
        except TimeoutError:
            log.warning("shutdown: Redis clean-up did not finish in %ss", FINISH_TIMEOUT_S)

    async def abort(self) -> None:
        """Undoes a start that failed half-way (nothing was served)."""
        if self.pusher is not None:
            with contextlib.suppress(Exception):
                await self.pusher.stop()
        if self.http is not None:
            with contextlib.suppress(Exception):
                await self.http.stop()
        if self.gauges is not None:
            with contextlib.suppress(Exception):
                await self.gauges.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.timers.stop(), FINISH_TIMEOUT_S)
        with contextlib.suppress(Exception):
            await self.listener.stop()
        with contextlib.suppress(Exception):
            await self.redis.aclose()

    async def _finish(self) -> None:
        if self.gauges is not None:
            await self.gauges.stop()
        await self.dispatcher.drain_releases()
        await self.timers.stop()
        await self.listener.stop()
        await self.redis.aclose()
        await asyncio.to_thread(self.telemetry.shutdown)  # flushes spans and metrics
