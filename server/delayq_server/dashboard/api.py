"""The dashboard's JSON API under /api/ on the admin HTTP port (issue 14).

It calls the same QueueOps / JobOps as AdminService, with proto requests and
proto responses rendered as JSON. Reads need no token (the admin port is an
operator's port: bind it privately). Every action is a POST that needs
``Content-Type: application/json`` (a cross-site form cannot send it without a
CORS preflight, which this port never grants) and, with --auth, an
``Authorization: Bearer <token>`` header whose token has the RPC's role in the
queue's namespace (the same rules as gRPC, auth/rules.py). No cookies are used,
so there is nothing for another site to ride on (CSRF).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message

from delayq.v1 import admin_pb2, job_pb2
from delayq_server import convert, errors, lateness, validation
from delayq_server.admin.common import existing_shards, queue_name
from delayq_server.admin.jobs import JobOps
from delayq_server.admin.queues import QueueOps
from delayq_server.auth import principal as pr
from delayq_server.auth.interceptor import AuthInterceptor, Denied
from delayq_server.auth.rules import rule_for
from delayq_server.auth.tokens import TokenAuthenticator
from delayq_server.store import ShardKeys, UnknownJob

HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
}
DETAIL_PREVIEW = 4096  # bytes of payload the job detail shows
HISTOGRAM_BINS = 12

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(msg: Message | dict[str, Any]) -> web.Response:
    body = msg if isinstance(msg, dict) else _dict(msg)
    return web.json_response(body, headers={"Cache-Control": "no-store"})


def _dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _error(code: grpc.StatusCode, message: str) -> web.Response:
    return web.json_response(
        {"code": code.name, "message": message}, status=HTTP_STATUS.get(code, 500)
    )


class DashboardApi:
    """Routes of /api/; ``auth`` is None when the server runs without --auth."""

    def __init__(self, queues: QueueOps, jobs: JobOps, auth: TokenAuthenticator | None) -> None:
        self.q, self.j, self.auth = queues, jobs, auth

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        base = "/api/queues/{namespace}/{queue}"
        r.add_get("/api/session", self._guard(self.session))
        r.add_get("/api/queues", self._guard(self.list_queues))
        r.add_get(base, self._guard(self.get_queue))
        r.add_get(base + "/jobs", self._guard(self.list_jobs))
        r.add_get(base + "/jobs/{job_id}", self._guard(self.get_job))
        r.add_post(base + "/pause", self._action("PauseQueue", self.pause))
        r.add_post(base + "/resume", self._action("ResumeQueue", self.resume))
        r.add_post(base + "/purge", self._action("PurgeQueue", self.purge))
        r.add_post(base + "/redrive", self._action("RedriveDeadLetters", self.redrive))
        r.add_post(
            base + "/jobs/{job_id}/reschedule", self._action("RescheduleJob", self.reschedule)
        )

    # -- plumbing -----------------------------------------------------------------

    @staticmethod
    def _guard(fn: Handler) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                return await fn(request)
            except Denied as exc:
                return _error(exc.code, exc.message)
            except Exception as exc:
                code, message = errors.to_status(exc)
                return _error(code, message)

        return handler

    def _action(
        self, rpc: str, fn: Callable[[web.Request, dict[str, Any]], Awaitable[Message]]
    ) -> Handler:
        method = f"/delayq.v1.AdminService/{rpc}"

        async def handler(request: web.Request) -> web.StreamResponse:
            if request.content_type != "application/json":
                return _error(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "Content-Type: actions take application/json (guards against cross-site forms)",
                )
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                return _error(grpc.StatusCode.INVALID_ARGUMENT, "body: not JSON")
            if not isinstance(body, dict):
                return _error(grpc.StatusCode.INVALID_ARGUMENT, "body: want a JSON object")
            principal = await self._principal(request)
            ns = request.match_info["namespace"]
            rule = rule_for(method)
            if principal is not None and rule is not None:
                # The interceptor's own check: role, then namespace.
                AuthInterceptor._authorize(
                    principal, rule, rpc, admin_pb2.GetQueueRequest(namespace=ns)
                )
                pr.set_current(principal)
            try:
                return _json(await fn(request, body))
            except json_format.ParseError as exc:
                return _error(grpc.StatusCode.INVALID_ARGUMENT, f"body: {exc}")

        return self._guard(handler)

    async def _principal(self, request: web.Request) -> pr.Principal | None:
        """The bearer's principal; None when auth is off. Refuses a missing or bad token."""
        header = request.headers.get("Authorization", "")
        if self.auth is None:
            return None
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Denied(
                grpc.StatusCode.UNAUTHENTICATED,
                "authorization: actions need an admin token (Authorization: Bearer <token>)",
            )
        p = await self.auth.authenticate(token.strip())
        if p is None:
            raise Denied(grpc.StatusCode.UNAUTHENTICATED, "unknown, expired or revoked token")
        return p

    # -- reads ----------------------------------------------------------------------

    async def session(self, request: web.Request) -> web.StreamResponse:
        """What the page may offer: whether actions need a token and whether this one may act."""
        out: dict[str, Any] = {"auth": self.auth is not None, "admin": self.auth is None}
        if self.auth is not None and request.headers.get("Authorization"):
            p = await self._principal(request)
            assert p is not None
            out.update(admin=p.has(pr.ADMIN), namespace=p.namespace, name=p.name)
        return _json(out)

    async def list_queues(self, request: web.Request) -> web.StreamResponse:
        req = admin_pb2.ListQueuesRequest(
            namespace=request.query.get("namespace", ""),
            page_size=500,
            page_token=request.query.get("page_token", ""),
        )
        out = _dict(await self.q.list_queues(req))
        for q in out.get("queues", []):
            # This server's deliveries of the last minute (lateness.py); None: none.
            q["lateness_p99_ms"] = lateness.WINDOW.p99(q["namespace"], q["queue"])
        return _json(out)

    async def get_queue(self, request: web.Request) -> web.StreamResponse:
        ns, q = queue_name(request.match_info["namespace"], request.match_info["queue"])
        await existing_shards(self.q.d, ns, q)
        queue = await self.q.queue(ns, q)
        out = _dict(queue)
        out["lateness_p99_ms"] = lateness.WINDOW.p99(ns, q)
        out["histogram"] = await self._histogram(
            ns, q, queue.settings.shards, queue.stats.scheduled
        )
        return _json(out)

    async def _histogram(self, ns: str, q: str, shards: int, backlog: int) -> dict[str, Any]:
        """Backlog by due time: HISTOGRAM_BINS equal bins from now to the latest
        bucket read (the first 500 buckets of each shard); the rest is "later"."""
        store = self.q.d.store
        buckets: list[tuple[int, int]] = []
        for s in range(shards):
            buckets += await self.j.d.jobs.backlog_buckets(ShardKeys(ns, q, s))
        now = await store.time_ms()
        if not buckets:
            return {"start_ms": now, "bin_ms": 0, "bins": [], "later": 0}
        end = max(t for t, _ in buckets) + 1
        span = max(1000, end - now)
        bin_ms = -(-span // HISTOGRAM_BINS)
        bins = [0] * HISTOGRAM_BINS
        for t, n in buckets:
            bins[min(HISTOGRAM_BINS - 1, max(0, (t - now) // bin_ms))] += n
        later = max(0, backlog - sum(bins))
        return {"start_ms": now, "bin_ms": bin_ms, "bins": bins, "later": later}

    async def list_jobs(self, request: web.Request) -> web.StreamResponse:
        state = request.query.get("state", "")
        try:
            state_value = job_pb2.JobState.Value("JOB_STATE_" + state.upper())
        except ValueError:
            state_value = job_pb2.JOB_STATE_UNSPECIFIED  # refused by ListJobs, naming `state`
        size = request.query.get("page_size", "20")
        req = admin_pb2.ListJobsRequest(
            namespace=request.match_info["namespace"],
            queue=request.match_info["queue"],
            state=state_value,
            page_size=int(size) if size.isdigit() else 20,
            page_token=request.query.get("page_token", ""),
            payload_preview_bytes=120,
        )
        return _json(await self.j.list_jobs(req))

    async def get_job(self, request: web.Request) -> web.StreamResponse:
        ns, q = queue_name(request.match_info["namespace"], request.match_info["queue"])
        job_id = request.match_info["job_id"]
        shard = validation.job_id(job_id)
        shards = await existing_shards(self.q.d, ns, q)
        keys = ShardKeys(ns, q, shard)
        try:
            if shard >= shards:
                raise UnknownJob(job_id)
            rec, now = await self.q.d.store.get(keys, job_id)
        except UnknownJob:
            raise errors.NotFound(f"job_id: no job {job_id!r} in queue {ns}/{q}") from None
        job = convert.job(keys, job_id, rec, now)
        size = len(job.payload)
        job.payload = job.payload[:DETAIL_PREVIEW]
        timeline = [
            (name, ms)
            for name, ms in (
                ("created", rec.created_ms),
                ("last delivered", rec.last_delivery_ms),
                ("due", rec.due_ms),
                ("finished", rec.finish_ms),
                ("expires", rec.expire_ms),
            )
            if ms
        ]
        out = _dict(job)
        out["payload_size"] = size
        out["timeline"] = [
            {"event": n, "time_ms": t} for n, t in sorted(timeline, key=lambda x: x[1])
        ]
        return _json(out)

    # -- actions --------------------------------------------------------------------

    async def pause(self, request: web.Request, body: dict[str, Any]) -> Message:
        m = request.match_info
        return await self.q.pause_queue(
            admin_pb2.PauseQueueRequest(namespace=m["namespace"], queue=m["queue"])
        )

    async def resume(self, request: web.Request, body: dict[str, Any]) -> Message:
        m = request.match_info
        return await self.q.resume_queue(
            admin_pb2.ResumeQueueRequest(namespace=m["namespace"], queue=m["queue"])
        )

    async def purge(self, request: web.Request, body: dict[str, Any]) -> Message:
        m = request.match_info
        req = admin_pb2.PurgeQueueRequest(namespace=m["namespace"], queue=m["queue"])
        json_format.ParseDict(body, req, ignore_unknown_fields=False)
        return await self.q.purge_queue(req)

    async def redrive(self, request: web.Request, body: dict[str, Any]) -> Message:
        m = request.match_info
        req = admin_pb2.RedriveDeadLettersRequest(namespace=m["namespace"], queue=m["queue"])
        json_format.ParseDict(body, req, ignore_unknown_fields=False)
        return await self.j.redrive(req)

    async def reschedule(self, request: web.Request, body: dict[str, Any]) -> Message:
        m = request.match_info
        req = admin_pb2.RescheduleJobRequest(
            namespace=m["namespace"], queue=m["queue"], job_id=m["job_id"]
        )
        json_format.ParseDict(body, req, ignore_unknown_fields=False)
        return await self.j.reschedule_job(req)
