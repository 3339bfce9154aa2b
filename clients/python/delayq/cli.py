"""The `delayq` command line: enqueue, get, delete, stats, tail, dead-letter admin, tokens,
queue and job administration (cli_queues.py)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO

import grpc

from delayq import __version__, cli_queues, cli_tokens
from delayq._channel import ADDR_ENV, DEFAULT_TARGET, resolve_target
from delayq._convert import delivery_from_proto, parse_duration_text
from delayq._progress import Progress
from delayq.aio import AsyncClient
from delayq.client import Client
from delayq.errors import DelayqError, EnqueueBatchError, from_rpc_error
from delayq.models import Job, Message, QueueStats, RetryPolicy
from delayq.serializers import CONTENT_TYPE_HEADER

__all__ = ["main"]

#: Exit status for malformed local input (a bad JSON line, a bad --at); matches the
#: number of INVALID_ARGUMENT, as every server refusal exits with its status number.
EXIT_BAD_INPUT = 3
_FILE_CHUNK = 5000
#: How long the server keeps `tail`'s leases after its stream closes: time enough
#: for the Release that follows (capped at --lease, as the server requires).
TAIL_RELEASE_GRACE = timedelta(seconds=10)


class InputError(Exception):
    """Malformed input given on the command line or in a file."""


def _duration(text: str) -> timedelta:
    try:
        return parse_duration_text(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _instant(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r} (use ISO 8601, e.g. 2030-01-02T03:04:05+00:00)"
        ) from None


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"invalid header {text!r} (use key=value)")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    p = argparse.ArgumentParser(
        prog="delayq",
        description="Command line for the delayq delayed job queue.",
        epilog="Exit status: 0 on success, else the gRPC status number of the failure "
        "(3 invalid argument, 5 not found, 14 unavailable, ...); 2 for usage errors.",
    )
    p.add_argument(
        "-t",
        "--target",
        default=resolve_target(None),
        help=f"server host:port (env {ADDR_ENV}, default {DEFAULT_TARGET})",
    )
    p.add_argument(
        "-n",
        "--namespace",
        default=os.environ.get("DELAYQ_NAMESPACE", "default"),
        help="namespace (env DELAYQ_NAMESPACE, default %(default)s)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="API token when the server runs with auth (env DELAYQ_TOKEN)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per call (default 10)")
    p.add_argument("--version", action="version", version=f"delayq {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser("enqueue", help="enqueue jobs from arguments or a JSON-lines file")
    e.add_argument("queue")
    e.add_argument("payloads", nargs="*", metavar="PAYLOAD", help="one job per argument")
    e.add_argument("-f", "--file", help="JSON-lines file, one payload per line ('-' for stdin)")
    e.add_argument(
        "--envelope",
        action="store_true",
        help="file lines are objects {payload, delay, at, ttl, max_attempts, headers, "
        "idempotency_key, queue}",
    )
    e.add_argument("--json", action="store_true", help="parse PAYLOAD arguments as JSON")
    when = e.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_duration, help="e.g. 250ms, 10s, 5m, 1h30m")
    when.add_argument("--at", type=_instant, help="ISO 8601 due time")
    e.add_argument("--ttl", type=_duration)
    e.add_argument("--max-attempts", type=int)
    e.add_argument("--initial-backoff", type=_duration)
    e.add_argument("--max-backoff", type=_duration)
    e.add_argument("-H", "--header", type=_header, action="append", default=[], metavar="K=V")
    e.add_argument("--idempotency-key", help="only with a single PAYLOAD")
    e.add_argument("--ids", action="store_true", help="print job ids for file input too")
    e.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )

    g = sub.add_parser("get", help="show one job as JSON")
    g.add_argument("queue")
    g.add_argument("job_id")

    d = sub.add_parser("delete", help="delete one job")
    d.add_argument("queue")
    d.add_argument("job_id")

    s = sub.add_parser("stats", help="counts per state, as a table")
    s.add_argument("queues", nargs="+", metavar="QUEUE")
    s.add_argument("--json", action="store_true", help="one JSON object per queue")

    t = sub.add_parser("tail", help="consume jobs and print them as JSON lines")
    t.add_argument("queues", nargs="+", metavar="QUEUE")
    t.add_argument(
        "--ack",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ack what is printed (default); --no-ack peeks: what is printed is given "
        "back on exit without counting an attempt",
    )
    t.add_argument("-c", "--count", type=int, help="exit after this many jobs")
    t.add_argument("--idle-timeout", type=_duration, help="exit after this long without jobs")
    t.add_argument("--lease", type=_duration, default=timedelta(seconds=30))
    t.add_argument("--max-outstanding", type=int, default=1000)

    dead = sub.add_parser("dead", help="dead-letter set: list, redrive, purge")
    dsub = dead.add_subparsers(dest="dead_command", required=True, metavar="ACTION")
    dl = dsub.add_parser("list", help="list dead jobs, oldest death first")
    dl.add_argument("queue")
    dl.add_argument("--limit", type=int, default=100, help="most jobs to show (default 100)")
    dl.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    for name, verb in (("redrive", "move back to ready"), ("purge", "delete for good")):
        dp = dsub.add_parser(name, help=f"{verb}: the given jobs, or --all")
        dp.add_argument("queue")
        dp.add_argument("job_ids", nargs="*", metavar="JOB_ID")
        dp.add_argument("--all", action="store_true", help="every dead job up to --limit")
        dp.add_argument("--limit", type=int, default=1000)
        if name == "redrive":
            dp.add_argument("--to", metavar="QUEUE", help="redrive into another queue")
            dp.add_argument("--rate", type=int, default=0, help="most jobs per second")
            dp.add_argument(
                "--progress",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="progress bar on stderr (default: when stderr is a terminal)",
            )
    cli_tokens.add_parser(sub)
    cli_queues.add_parsers(sub)
    return p


# -- rendering ----------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _payload_json(job: Job) -> dict[str, Any]:
    try:
        payload = job.payload
    except ValueError:
        payload = job.data
    if isinstance(payload, bytes):
        return {"payload_base64": base64.b64encode(payload).decode()}
    return {"payload": payload}


def job_json(job: Job) -> dict[str, Any]:
    """A job as a JSON-able dict."""
    return {
        "id": job.id,
        "namespace": job.namespace,
        "queue": job.queue,
        "state": job.state.name,
        **_payload_json(job),
        "headers": dict(job.headers),
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "create_time": _iso(job.create_time),
        "due_time": _iso(job.due_time),
        "expire_time": _iso(job.expire_time),
        "last_delivery_time": _iso(job.last_delivery_time),
        "finish_time": _iso(job.finish_time),
        "last_error": job.last_error,
    }


def _fmt_age(td: timedelta) -> str:
    secs = td.total_seconds()
    if secs <= 0:
        return "-"
    if secs < 1:
        return f"{secs * 1000:.0f}ms"
    if secs < 120:
        return f"{secs:.1f}s"
    if secs < 7200:
        return f"{secs / 60:.1f}m"
    return f"{secs / 3600:.1f}h"


def stats_table(rows: Sequence[QueueStats]) -> str:
    """Render stats as an aligned text table."""
    head = [
        "QUEUE",
        "SCHEDULED",
        "READY",
        "LEASED",
        "DEAD",
        "COMPLETED",
        "OLDEST READY",
        "NEXT DUE",
        "ENQUEUED",
        "ACKED",
        "RETRIED",
        "DEAD-LETTERED",
        "EXPIRED",
    ]
    body = [
        [
            s.queue,
            str(s.scheduled),
            str(s.ready),
            str(s.leased),
            str(s.dead),
            str(s.completed),
            _fmt_age(s.oldest_ready_age),
            s.next_due_time.strftime("%Y-%m-%d %H:%M:%S") if s.next_due_time else "-",
            str(s.enqueued_total),
            str(s.acked_total),
            str(s.retried_total),
            str(s.dead_lettered_total),
            str(s.expired_total),
        ]
        for s in rows
    ]
    return _table(head, body, left=1)


def _table(head: list[str], body: list[list[str]], *, left: int) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = []
    for row in [head, *body]:
        cells = [
            c.ljust(w) if i < left or (i == len(row) - 1 and left < 0) else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _client(args: argparse.Namespace) -> Client:
    # Interactive use: retry an unreachable server only within one call's timeout.
    return Client(
        args.target,
        namespace=args.namespace,
        timeout=args.timeout,
        retry_deadline=args.timeout,
        token=args.token,
    )


# -- commands -----------------------------------------------------------------------------


def _read_lines(stream: TextIO, name: str, envelope: bool) -> Iterator[Any]:
    for lineno, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}:{lineno}: invalid JSON: {exc.msg}") from None
        yield _envelope(value, f"{name}:{lineno}") if envelope else value


def _envelope(value: Any, where: str) -> Message:
    if not isinstance(value, dict) or "payload" not in value:
        raise InputError(f"{where}: an envelope line must be an object with a 'payload'")
    allowed = {"payload", "delay", "at", "ttl", "max_attempts", "headers", "idempotency_key"}
    unknown = set(value) - allowed - {"queue"}
    if unknown:
        raise InputError(f"{where}: unknown envelope fields {sorted(unknown)}")
    try:
        return Message(
            payload=value["payload"],
            delay=_env_duration(value.get("delay")),
            at=datetime.fromisoformat(value["at"]) if value.get("at") else None,
            ttl=_env_duration(value.get("ttl")),
            max_attempts=value.get("max_attempts"),
            headers=value.get("headers"),
            idempotency_key=value.get("idempotency_key"),
            queue=value.get("queue"),
        )
    except (ValueError, TypeError) as exc:
        raise InputError(f"{where}: {exc}") from None


def _env_duration(value: Any) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return timedelta(seconds=value)
    return parse_duration_text(str(value))


def _count_lines(path: str) -> int | None:
    try:
        with open(path, "rb") as fh:
            return sum(1 for line in fh if line.strip())
    except OSError:
        return None


def cmd_enqueue(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`delayq enqueue`."""
    if bool(args.payloads) == bool(args.file):
        raise InputError("give PAYLOAD arguments or --file, not both and not neither")
    if args.idempotency_key and len(args.payloads) != 1:
        raise InputError("--idempotency-key needs exactly one PAYLOAD")
    retry = None
    if args.initial_backoff is not None or args.max_backoff is not None:
        retry = RetryPolicy(initial_backoff=args.initial_backoff, max_backoff=args.max_backoff)
    opts: dict[str, Any] = {
        "delay": args.delay,
        "at": args.at,
        "ttl": args.ttl,
        "max_attempts": args.max_attempts,
        "retry": retry,
        "headers": dict(args.header) or None,
    }
    with _client(args) as client:
        if args.payloads:
            payloads: list[Any] = []
            for text in args.payloads:
                try:
                    payloads.append(json.loads(text) if args.json else text)
                except json.JSONDecodeError as exc:
                    raise InputError(f"PAYLOAD {text!r} is not JSON: {exc.msg}") from None
            if len(payloads) == 1:
                res = client.enqueue(
                    args.queue, payloads[0], idempotency_key=args.idempotency_key, **opts
                )
                out.write(res.job_id + ("  (duplicate)" if res.duplicate else "") + "\n")
                return 0
            for r in client.enqueue_many(args.queue, payloads, **opts):
                out.write(r.job_id + "\n")
            return 0
        return _enqueue_file(client, args, opts, out, err)


def _enqueue_file(
    client: Client, args: argparse.Namespace, opts: dict[str, Any], out: TextIO, err: TextIO
) -> int:
    name = "<stdin>" if args.file == "-" else args.file
    total = None if args.file == "-" else _count_lines(args.file)
    show = args.progress if args.progress is not None else err.isatty()
    bar = Progress(total, err, enabled=show)
    started = time.monotonic()
    stored = duplicates = 0
    failures: dict[int, DelayqError] = {}
    try:
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise InputError(f"{name}: {exc.strerror}") from None
    with stream:
        lines = _read_lines(stream, name, args.envelope)
        offset = 0
        while chunk := list(itertools.islice(lines, _FILE_CHUNK)):
            try:
                results: Sequence[Any] = client.enqueue_many(
                    args.queue, chunk, on_progress=bar.update, **opts
                )
            except EnqueueBatchError as exc:
                results = exc.results
                failures.update({offset + i: e for i, e in exc.errors.items()})
            for r in results:
                if r is None:
                    continue
                stored += 1
                duplicates += r.duplicate
                if args.ids:
                    out.write(r.job_id + "\n")
            offset += len(chunk)
    bar.close()
    elapsed = time.monotonic() - started
    err.write(
        f"enqueued {stored:,} jobs to {args.queue} ({duplicates:,} duplicates, "
        f"{len(failures):,} refused) in {elapsed:.2f} s\n"
    )
    if failures:
        for i, e in sorted(failures.items())[:5]:
            err.write(f"delayq: {name}: job {i + 1}: {e}\n")
        first = failures[min(failures)]
        return int(first.code.value[0])
    return 0


def cmd_get(args: argparse.Namespace, out: TextIO) -> int:
    """`delayq get`."""
    with _client(args) as client:
        job = client.get(args.queue, args.job_id)
    out.write(json.dumps(job_json(job), indent=2, ensure_ascii=False) + "\n")
    return 0


def cmd_delete(args: argparse.Namespace, out: TextIO) -> int:
    """`delayq delete`."""
    with _client(args) as client:
        state = client.delete(args.queue, args.job_id)
    out.write(f"deleted {args.job_id} (was {state.name.lower()})\n")
    return 0


def cmd_stats(args: argparse.Namespace, out: TextIO) -> int:
    """`delayq stats`."""
    with _client(args) as client:
        rows = [client.stats(q) for q in args.queues]
    if args.json:
        for s in rows:
            row = {k: v for k, v in vars(s).items()}
            row["oldest_ready_age"] = s.oldest_ready_age.total_seconds()
            row["next_due_time"] = _iso(s.next_due_time)
            out.write(json.dumps(row) + "\n")
    else:
        out.write(stats_table(rows) + "\n")
    return 0


async def _tail(args: argparse.Namespace, out: TextIO) -> int:
    limit: int | None = args.count
    idle = args.idle_timeout.total_seconds() if args.idle_timeout else None
    max_outstanding = max(1, min(args.max_outstanding, limit or 10000, 10000))
    seen = 0
    # Deliveries not acked (not printed, or all with --no-ack) are given back with
    # Release after the stream closes, so peeking never uses an attempt. The
    # grace keeps their tokens valid until then (it is at most the lease).
    grace = min(TAIL_RELEASE_GRACE, args.lease)
    give_back: list[str] = []
    # With a count the stream's credit covers it, so the server sends no more than
    # that while nothing is acked: acks wait for the close. An ack on the open stream
    # would free credit for deliveries nobody reads (back later, an attempt used).
    ack_after_close = limit is not None and max_outstanding >= limit
    to_ack: list[str] = []
    async with AsyncClient(
        args.target,
        namespace=args.namespace,
        timeout=args.timeout,
        retry_deadline=args.timeout,
        token=args.token,
    ) as client:
        call = client.consume_call(
            args.queues, max_outstanding=max_outstanding, lease=args.lease, release_grace=grace
        )
        try:
            stream = call.__aiter__()
            while limit is None or seen < limit:
                try:
                    msg = await asyncio.wait_for(stream.__anext__(), idle)
                except (TimeoutError, StopAsyncIteration):
                    break
                tokens = []
                for d in msg.deliveries:
                    if limit is not None and seen >= limit:
                        give_back.append(d.lease_token)  # not printed
                        continue
                    delivery = delivery_from_proto(d, client.serializer)
                    line = {
                        "queue": delivery.queue,
                        "id": delivery.id,
                        "attempt": delivery.attempt,
                        **_payload_json(delivery.job),
                    }
                    headers = {
                        k: v for k, v in delivery.headers.items() if k != CONTENT_TYPE_HEADER
                    }
                    if headers:
                        line["headers"] = headers
                    out.write(json.dumps(line, ensure_ascii=False) + "\n")
                    tokens.append(delivery.lease_token)
                    seen += 1
                out.flush()
                if not args.ack:
                    give_back += tokens
                elif ack_after_close:
                    to_ack += tokens
                elif tokens:
                    for i in range(0, len(tokens), 1000):
                        await client.ack(tokens[i : i + 1000])
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        finally:
            call.cancel()
            # After the close (the grace keeps the tokens valid): an open stream would
            # get released jobs straight back, and acks would free its credit.
            for i in range(0, len(to_ack), 1000):
                await client.ack(to_ack[i : i + 1000])
            for i in range(0, len(give_back), 1000):
                await client.release(give_back[i : i + 1000])
    return 0


def cmd_tail(args: argparse.Namespace, out: TextIO) -> int:
    """`delayq tail`."""
    return asyncio.run(_tail(args, out))


def cmd_dead(args: argparse.Namespace, out: TextIO) -> int:
    """`delayq dead list|redrive|purge`."""
    with _client(args) as client:
        if args.dead_command == "list":
            jobs = list(
                itertools.islice(
                    client.iter_dead(args.queue, page_size=min(max(args.limit, 1), 1000)),
                    args.limit,
                )
            )
            if args.json:
                for job in jobs:
                    out.write(json.dumps(job_json(job), ensure_ascii=False) + "\n")
            else:
                body = [
                    [
                        j.id,
                        str(j.attempts),
                        j.finish_time.strftime("%Y-%m-%d %H:%M:%S") if j.finish_time else "-",
                        j.last_error.replace("\n", " ")[:80],
                    ]
                    for j in jobs
                ]
                out.write(_table(["ID", "ATTEMPTS", "DIED", "LAST ERROR"], body, left=-1) + "\n")
            return 0
        if not args.job_ids and not args.all:
            raise InputError(f"dead {args.dead_command}: give JOB_ID arguments or --all")
        if args.job_ids and args.all:
            raise InputError(f"dead {args.dead_command}: JOB_ID arguments and --all exclude")
        if args.dead_command == "redrive":
            n = client.redrive_dead(args.queue, args.job_ids, limit=args.limit if args.all else 0)
            out.write(f"redrove {n} jobs\n")
        else:
            n = client.purge_dead(args.queue, args.job_ids, limit=args.limit if args.all else 0)
            out.write(f"purged {n} jobs\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `delayq` console script; returns the exit status."""
    parser = build_parser()
    # PAYLOAD arguments may follow options (`enqueue q --delay 5s a b`), which plain
    # parse_args refuses for a nargs="*" positional; hand the leftovers back to it.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "enqueue" or any(x.startswith("-") and x != "-" for x in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.payloads = [*args.payloads, *extra]
    out, err = sys.stdout, sys.stderr
    try:
        if args.command == "enqueue":
            return cmd_enqueue(args, out, err)
        if args.command == "get":
            return cmd_get(args, out)
        if args.command == "delete":
            return cmd_delete(args, out)
        if args.command == "stats":
            return cmd_stats(args, out)
        if args.command == "tail":
            return cmd_tail(args, out)
        if args.command == "tokens":
            return cli_tokens.run(args, out)
        if args.command in ("queues", "jobs"):
            return cli_queues.run(args, out, err)
        if args.dead_command == "redrive" and (args.all or args.to or args.rate):
            if args.job_ids and args.all:
                raise InputError("dead redrive: JOB_ID arguments and --all exclude")
            if not args.job_ids and not args.all:
                raise InputError("dead redrive: give JOB_ID arguments or --all")
            return cli_queues.redrive_all(args, out, err)
        return cmd_dead(args, out)
    except DelayqError as exc:
        err.write(f"delayq: error: {' '.join(str(exc).split())}\n")
        return int(exc.code.value[0])
    except InputError as exc:
        err.write(f"delayq: error: {exc}\n")
        return EXIT_BAD_INPUT
    except cli_queues.Refused as exc:
        err.write(f"delayq: {exc}\n")
        return 1
    except KeyboardInterrupt:
        err.write("delayq: interrupted\n")
        return 130
    except BrokenPipeError:
        # Output piped into `head`: stop quietly, as other tools do.
        sys.stderr.close()
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
