"""One push request: the signed JSON body, the capped response, and what it means."""

from __future__ import annotations

import base64
import email.utils
import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from delayq_server.push import signing, ssrf
from delayq_server.push.config import Target
from delayq_server.store import Claimed, ShardKeys

EXCERPT_BYTES = 200  # of the response body, in a dead-lettered job's reason
USER_AGENT = "delayq-pusher/1"


@dataclass(frozen=True, slots=True)
class Outcome:
    """Success (ack) or a failure (nack) with its reason and the receiver's Retry-After."""

    ok: bool
    reason: str = ""
    retry_after_ms: int | None = None


def rfc3339_ms(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    )


def body(keys: ShardKeys, c: Claimed) -> bytes:
    """The request body: the job as JSON, its payload as UTF-8 text when it is valid UTF-8."""
    rec = c.record
    try:
        payload, encoding = rec.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(rec.payload).decode(), "base64"
    doc = {
        "id": c.job_id,
        "namespace": keys.namespace,
        "queue": keys.queue,
        "attempt": rec.attempts,
        "max_attempts": rec.max_attempts,
        "due_time": rfc3339_ms(rec.due_ms),
        "headers": rec.headers,
        "payload": payload,
        "payload_encoding": encoding,
    }
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def excerpt(raw: bytes) -> str:
    """At most EXCERPT_BYTES of UTF-8, one line."""
    text = raw[:EXCERPT_BYTES].decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    while len(text.encode()) > EXCERPT_BYTES:
        text = text[:-1]
    return text


def retry_after_ms(value: str | None, cap_ms: int, now_s: float | None = None) -> int | None:
    """Retry-After as delta-seconds or an HTTP date, capped; None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        ms = int(value) * 1000
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        now = time.time() if now_s is None else now_s
        ms = int((when.timestamp() - now) * 1000)
    return max(0, min(ms, cap_ms))


def _seconds(ms: int) -> str:
    return f"{ms / 1000:g}s"


def connect_failure(exc: aiohttp.ClientConnectorError) -> str:
    """The reason for a connect that failed, naming an SSRF refusal plainly."""
    inner = exc.os_error
    text = str(inner) if inner is not None else str(exc)
    text = text.removeprefix("Multiple exceptions: ")  # every address of the name failed
    if isinstance(inner, ssrf.RefusedAddress) or "refused (" in text:
        return f"push: {text}"[:300]
    return f"push: cannot connect to {exc.host}:{exc.port}: {text}"[:300]


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    """Up to ``cap`` bytes of the body; a longer body's connection is dropped, not read."""
    chunks: list[bytes] = []
    size = 0
    while size < cap:
        chunk = await resp.content.read(cap - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    if not resp.content.at_eof():
        resp.close()
    return b"".join(chunks)


def _later_ok(raw: bytes) -> bool:
    """later's convention: the receiver answers {"code": 100} when it handled the job."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(doc, dict) and doc.get("code") == 100


async def send(
    session: aiohttp.ClientSession,
    target: Target,
    keys: ShardKeys,
    c: Claimed,
    retry_after_cap_ms: int,
) -> Outcome:
    """Sends one job to its target; never raises for an HTTP or network failure."""
    data = body(keys, c)
    headers = {
        **target.headers,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Delayq-Job-Id": c.job_id,
        "Delayq-Attempt": str(c.record.attempts),
        signing.HEADER: signing.sign(target.secret, data),
    }
    for name in ("traceparent", "tracestate"):  # the producer's trace (telemetry.py)
        if name in c.record.headers:
            headers[name] = c.record.headers[name]
    timeout = aiohttp.ClientTimeout(total=target.timeout_ms / 1000)
    try:
        async with session.request(
            target.method,
            target.url,
            data=data,
            headers=headers,
            timeout=timeout,
            allow_redirects=False,  # a redirect could point anywhere: never followed
        ) as resp:
            raw = await _read_capped(resp, target.max_response_bytes)
            status = resp.status
            if 200 <= status < 300 and (target.success == "2xx" or _later_ok(raw)):
                return Outcome(True)
            wait = retry_after_ms(resp.headers.get("Retry-After"), retry_after_cap_ms)
            if 200 <= status < 300:
                return Outcome(
                    False, f'push: HTTP {status} without {{"code":100}}: {excerpt(raw)}', wait
                )
            if 300 <= status < 400:
                where = excerpt(resp.headers.get("Location", "").encode())
                return Outcome(False, f"push: HTTP {status} redirect to {where} not followed", wait)
            text = excerpt(raw)
            return Outcome(False, f"push: HTTP {status}" + (f": {text}" if text else ""), wait)
    except TimeoutError:
        return Outcome(False, f"push: timeout after {_seconds(target.timeout_ms)}")
    except aiohttp.ClientConnectorError as exc:
        return Outcome(False, connect_failure(exc))
    except (aiohttp.ClientError, OSError) as exc:
        return Outcome(False, f"push: {type(exc).__name__}: {exc}"[:300])
