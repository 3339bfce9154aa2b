"""`delayq queues ...` and `delayq jobs ...`: queue administration (issue 14)."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from datetime import datetime
from typing import Any, TextIO

from delayq._convert import parse_duration_text
from delayq._progress import Progress
from delayq.admin import AdminClient
from delayq.admin_queues import SETTING_NAMES, QueueInfo, QueueSettings, state_of
from delayq.models import JobState, RetryPolicy

__all__ = ["add_parsers", "confirm", "redrive_all", "run"]


class Refused(Exception):
    """The operator did not confirm a destructive operation (or could not be asked)."""


def _state(text: str) -> JobState:
    try:
        return state_of(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _when(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid time {text!r} (ISO 8601)") from None


def _settings_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lease", type=parse_duration_text, help="default lease, e.g. 30s")
    p.add_argument("--max-attempts", type=int, help="deliveries before dead-lettering")
    p.add_argument("--initial-backoff", type=parse_duration_text)
    p.add_argument("--max-backoff", type=parse_duration_text)
    p.add_argument("--multiplier", type=float)
    p.add_argument("--jitter", type=float)
    p.add_argument("--completed-retention", type=parse_duration_text, help="e.g. 1h")
    p.add_argument("--dead-retention", type=parse_duration_text, help="e.g. 7d")
    p.add_argument("--dead-max", type=int, help="most dead jobs kept")


def _confirm_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def _progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )


def add_parsers(sub: Any) -> None:
    """Adds `queues` and `jobs` to the CLI's subparsers."""
    q = sub.add_parser("queues", help="queues: list, show, create, update, pause, purge, delete")
    qs = q.add_subparsers(dest="queues_command", required=True, metavar="ACTION")
    ls = qs.add_parser("list", help="queues with counts, as a table")
    ls.add_argument("--all-namespaces", action="store_true", help="every namespace readable")
    ls.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    show = qs.add_parser("show", help="one queue's settings and counts as JSON")
    show.add_argument("queue")
    c = qs.add_parser("create", help="create a queue with its own settings")
    c.add_argument("queue")
    c.add_argument("--shards", type=int, default=0, help="fixed at creation (default: server's)")
    _settings_flags(c)
    u = qs.add_parser("update", help="change settings (only the flags given)")
    u.add_argument("queue")
    _settings_flags(u)
    u.add_argument(
        "--reset", action="append", default=[], choices=SETTING_NAMES, help="back to default"
    )
    for name, text in (("pause", "stop deliveries"), ("resume", "resume deliveries")):
        qs.add_parser(name, help=text).add_argument("queue")
    pg = qs.add_parser("purge", help="delete jobs of a queue (every state, or --state)")
    pg.add_argument("queue")
    pg.add_argument("--state", type=_state, help="only this state (e.g. dead)")
    _confirm_flags(pg)
    _progress_flag(pg)
    d = qs.add_parser("delete", help="delete an empty queue")
    d.add_argument("queue")
    _confirm_flags(d)

    j = sub.add_parser("jobs", help="jobs: list by state, reschedule, update")
    js = j.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    jl = js.add_parser("list", help="jobs of one state, in order, as a table")
    jl.add_argument("queue")
    jl.add_argument("--state", type=_state, required=True)
    jl.add_argument("--from", dest="start", type=_when, help="ISO 8601 start of the range")
    jl.add_argument("--to", dest="end", type=_when, help="ISO 8601 end of the range")
    jl.add_argument("--limit", type=int, default=50)
    jl.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    r = js.add_parser("reschedule", help="move a job to a new due time, keeping its id")
    r.add_argument("queue")
    r.add_argument("job_id")
    when = r.add_mutually_exclusive_group(required=True)
    when.add_argument("--delay", type=parse_duration_text, help="due after this long")
    when.add_argument("--at", type=_when, help="ISO 8601 due time")
    r.add_argument("--force", action="store_true", help="also take back a leased job")
    up = js.add_parser("update", help="replace a waiting job's payload and/or headers")
    up.add_argument("queue")
    up.add_argument("job_id")
    up.add_argument("--payload", help="new payload (text)")
    up.add_argument("-H", "--header", action="append", metavar="K=V", help="replaces all headers")


def _settings(args: argparse.Namespace) -> tuple[QueueSettings, list[str]]:
    """Settings from flags, and the UpdateQueue field names the flags set."""
    fields: list[str] = []
    retry = None
    backoff = (args.initial_backoff, args.max_backoff, args.multiplier, args.jitter)
    if any(v is not None for v in backoff):
        retry = RetryPolicy(
            initial_backoff=args.initial_backoff,
            max_backoff=args.max_backoff,
            multiplier=args.multiplier or 0.0,
            jitter=args.jitter or 0.0,
        )
        fields.append("retry")
    named = {
        "default_lease": args.lease,
        "max_attempts": args.max_attempts,
        "completed_retention": args.completed_retention,
        "dead_retention": args.dead_retention,
        "dead_max_jobs": args.dead_max,
    }
    fields += [k for k, v in named.items() if v is not None]
    settings = QueueSettings(
        shards=getattr(args, "shards", 0),
        default_lease=args.lease,
        max_attempts=args.max_attempts or 0,
        retry=retry,
        completed_retention=args.completed_retention,
        dead_retention=args.dead_retention,
        dead_max_jobs=args.dead_max or 0,
    )
    return settings, fields


def confirm(args: argparse.Namespace, err: TextIO, question: str) -> None:
    """Asks before a destructive operation unless --yes; refuses when nobody can answer."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise Refused(f"{question}: refusing without --yes (no terminal to ask)")
    err.write(f"{question} [y/N] ")
    err.flush()
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise Refused("not confirmed; nothing done")


def _queue_json(q: QueueInfo) -> dict[str, Any]:
    s = q.settings
    return {
        "namespace": q.namespace,
        "queue": q.queue,
        "paused": q.paused,
        "settings": {
            "shards": s.shards,
            "default_lease_s": s.default_lease.total_seconds() if s.default_lease else None,
            "max_attempts": s.max_attempts or None,
            "retry": None
            if s.retry is None
            else {
                "initial_backoff_s": s.retry.initial_backoff.total_seconds()
                if s.retry.initial_backoff
                else None,
                "max_backoff_s": s.retry.max_backoff.total_seconds()
                if s.retry.max_backoff
                else None,
                "multiplier": s.retry.multiplier,
                "jitter": s.retry.jitter,
            },
            "completed_retention_s": s.completed_retention.total_seconds()
            if s.completed_retention is not None
            else None,
            "dead_retention_s": s.dead_retention.total_seconds() if s.dead_retention else None,
            "dead_max_jobs": s.dead_max_jobs or None,
        },
        "counts": {
            "scheduled": q.stats.scheduled,
            "ready": q.stats.ready,
            "leased": q.stats.leased,
            "dead": q.stats.dead,
            "completed": q.stats.completed,
        },
        "totals": {
            "enqueued": q.stats.enqueued_total,
            "acked": q.stats.acked_total,
            "dead_lettered": q.stats.dead_lettered_total,
        },
    }


def _table(head: list[str], body: list[list[str]], left: int) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in [head, *body]
    )


def queues_table(rows: list[QueueInfo]) -> str:
    head = [
        "NAMESPACE",
        "QUEUE",
        "STATE",
        "SCHEDULED",
        "READY",
        "LEASED",
        "DEAD",
        "COMPLETED",
        "SHARDS",
    ]
    body = [
        [
            q.namespace,
            q.queue,
            "paused" if q.paused else "active",
            *(str(x) for x in (q.stats.scheduled, q.stats.ready, q.stats.leased, q.stats.dead)),
            str(q.stats.completed),
            str(q.settings.shards),
        ]
        for q in rows
    ]
    return _table(head, body, left=3)


def _admin(args: argparse.Namespace) -> AdminClient:
    return AdminClient(
        args.target, token=args.token, namespace=args.namespace, timeout=args.timeout
    )


def _progress(args: argparse.Namespace, err: TextIO, total: int, label: str) -> Progress:
    enabled = err.isatty() if args.progress is None else args.progress
    return Progress(total, err, enabled=enabled, label=label)


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`delayq queues ...` and `delayq jobs ...`."""
    with _admin(args) as admin:
        if args.command == "jobs":
            return _jobs(args, admin, out)
        cmd = args.queues_command
        if cmd == "list":
            rows = admin.list_queues("" if args.all_namespaces else args.namespace)
            if args.json:
                for q in rows:
                    out.write(json.dumps(_queue_json(q)) + "\n")
            else:
                out.write(queues_table(rows) + "\n")
            return 0
        if cmd == "show":
            out.write(json.dumps(_queue_json(admin.get_queue(args.queue)), indent=2) + "\n")
            return 0
        if cmd == "create":
            settings, _ = _settings(args)
            q = admin.create_queue(args.queue, settings)
            out.write(f"created {q.namespace}/{q.queue} ({q.settings.shards} shards)\n")
            return 0
        if cmd == "update":
            settings, fields = _settings(args)
            fields += [f for f in args.reset if f not in fields]
            if not fields:
                raise Refused("update: give a setting flag or --reset NAME")
            admin.update_queue(args.queue, settings, fields)
            out.write(f"updated {args.queue}: {', '.join(fields)}\n")
            return 0
        if cmd in ("pause", "resume"):
            q = admin.pause_queue(args.queue) if cmd == "pause" else admin.resume_queue(args.queue)
            out.write(f"{q.queue}: {'paused' if q.paused else 'resumed'}\n")
            return 0
        if cmd == "purge":
            return _purge(args, admin, out, err)
        q = admin.get_queue(args.queue)
        confirm(args, err, f"delete queue {q.namespace}/{q.queue}?")
        admin.delete_queue(args.queue)
        out.write(f"deleted queue {q.namespace}/{q.queue}\n")
        return 0


def _purge(args: argparse.Namespace, admin: AdminClient, out: TextIO, err: TextIO) -> int:
    q = admin.get_queue(args.queue)
    s = q.stats
    counts = {
        JobState.SCHEDULED: s.scheduled,
        JobState.READY: s.ready,
        JobState.LEASED: s.leased,
        JobState.DEAD: s.dead,
        JobState.COMPLETED: s.completed,
    }
    total = counts[args.state] if args.state else sum(counts.values())
    what = args.state.name.lower() + " jobs" if args.state else "jobs (every state)"
    confirm(args, err, f"purge about {total:,} {what} of {q.namespace}/{q.queue}?")
    bar = _progress(args, err, total, "purged")
    purged = 0
    while True:
        step = admin.purge_step(args.queue, args.state, limit=5000)
        purged += step.purged
        bar.total = max(bar.total or 0, purged + step.remaining)
        bar.update(step.purged)
        if step.remaining == 0 or step.purged == 0:
            break
    bar.close()
    out.write(f"purged {purged} jobs\n")
    return 0


def redrive_all(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`delayq dead redrive QUEUE --all [--to T] [--rate N]`: in steps, with progress."""
    with _admin(args) as admin:
        dead = admin.get_queue(args.queue).stats.dead
        total = min(dead, args.limit) if not args.job_ids else len(args.job_ids)
        bar = _progress(args, err, total, "redriven")
        moved = 0
        step_limit = 1000 if not args.rate else max(1, min(1000, args.rate * 5))
        while moved < total:
            step = admin.redrive_step(
                args.queue,
                target=args.to or "",
                job_ids=args.job_ids,
                limit=min(step_limit, total - moved),
                rate=args.rate,
            )
            moved += step.redriven
            bar.update(step.redriven)
            if step.redriven == 0 or args.job_ids or step.remaining == 0:
                break
        bar.close()
    out.write(f"redrove {moved} jobs\n")
    return 0


def _jobs(args: argparse.Namespace, admin: AdminClient, out: TextIO) -> int:
    cmd = args.jobs_command
    if cmd == "list":
        jobs = list(
            itertools.islice(
                admin.iter_jobs(
                    args.queue, args.state, start=args.start, end=args.end,
                    page_size=max(1, min(args.limit, 500)),
                ),
                args.limit,
            )
        )  # fmt: skip
        if args.json:
            from delayq.cli import job_json  # the same JSON as `delayq get`

            for job in jobs:
                out.write(json.dumps(job_json(job), ensure_ascii=False) + "\n")
            return 0
        body = [
            [
                j.id,
                j.state.name.lower(),
                j.due_time.strftime("%Y-%m-%d %H:%M:%S") if j.due_time else "-",
                f"{j.attempts}/{j.max_attempts}",
                j.data[:40].decode("utf-8", "replace").replace("\n", " "),
            ]
            for j in jobs
        ]
        out.write(_table(["ID", "STATE", "DUE", "ATTEMPTS", "PAYLOAD"], body, left=2) + "\n")
        return 0
    if cmd == "reschedule":
        job = admin.reschedule_job(
            args.queue, args.job_id, delay=args.delay, at=args.at, force=args.force
        )
        due = job.due_time.isoformat() if job.due_time else "-"
        out.write(f"{job.id}: {job.state.name.lower()}, due {due}\n")
        return 0
    headers = None
    if args.header is not None:
        headers = {}
        for h in args.header:
            k, sep, v = h.partition("=")
            if not sep or not k:
                raise Refused(f"invalid header {h!r} (use key=value)")
            headers[k] = v
    if args.payload is None and headers is None:
        raise Refused("update: give --payload and/or --header")
    payload = None if args.payload is None else args.payload.encode()
    job = admin.update_job(args.queue, args.job_id, payload=payload, headers=headers)
    out.write(f"updated {job.id}\n")
    return 0
