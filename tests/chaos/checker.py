"""The history checker: a pure function from a run's operations to a report.

Invariants (docs/chaos.md explains each and how to read the table):

* lost: every acknowledged enqueue ends acked, dead-lettered or deleted;
* early: no delivery before its due time (server's or the producer's);
* after_ack: no delivery claimed after a successful ack or delete returned;
* stale_accepted: no ack answered ACKED after its lease was given to another
  delivery, nacked or released;
* unexplained: every redelivery follows a lease expiry, a nack or release, or the end of
  the holder's stream or process; one enqueue stores one job;
* attempts: observed attempts rise by one (a gap only across a stream or
  process end that can hide a delivery; the same number after a Release, which
  does not count) and never exceed max_attempts;
* payload: every delivered payload is intact and belongs to its job;
* unexpected: an enqueue that failed definitely is never delivered.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tests.chaos.history import FAIL, INFO, INVOKE, OK, Op

INVARIANTS = (
    "lost",
    "early",
    "after_ack",
    "stale_accepted",
    "unexplained",
    "attempts",
    "payload",
    "unexpected",
)
# A stream end is written by the worker once it notices; the server may have
# released the lease (and another worker received the job) a moment earlier.
STREAM_END_SLACK_MS = 1_000
_SETTLED_STATES = frozenset({"COMPLETED", "DEAD"})


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    job: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: job {self.job}: {self.detail}"


@dataclass
class Report:
    """Counts per invariant and the evidence; ``failed`` names what breaks a run."""

    name: str = ""
    operations: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    info: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    tolerated: frozenset[str] = frozenset()  # measured, not failed (e.g. everysec loss)
    known: Mapping[str, str] = field(default_factory=dict)  # invariant -> issue reference
    unmet: list[str] = field(default_factory=list)  # the fault did not happen as planned

    def add(self, invariant: str, job: str, detail: str) -> None:
        self.counts[invariant] += 1
        self.violations.append(Violation(invariant, job, detail))

    @property
    def failed(self) -> list[str]:
        broken = [
            k
            for k in INVARIANTS
            if self.counts[k] and k not in self.tolerated and k not in self.known
        ]
        return broken + (["fault not as planned"] if self.unmet else [])

    def summary(self, limit: int = 10) -> str:
        lines = [format_table([self])]
        for name in INVARIANTS:
            shown = [v for v in self.violations if v.invariant == name][:limit]
            lines += [f"  {v}" for v in shown]
        lines += [f"  fault not as planned: {text}" for text in self.unmet]
        for name, ref in self.known.items():
            if self.counts[name]:
                lines.append(f"  known failure {name}: {ref}")
        return "\n".join(lines)


@dataclass
class _Enqueue:
    invoke: Op
    outcome: str
    job: str
    done: Op | None


def _paired(history: Iterable[Op]) -> tuple[list[Op], dict[str, Op]]:
    ops = list(history)
    completions = {o.op: o for o in ops if o.type != INVOKE and o.op}
    return ops, completions


def _outcome(inv: Op, completions: dict[str, Op]) -> tuple[str, Op | None]:
    done = completions.get(inv.op)
    return (done.type, done) if done else (INFO, None)


def _at(d: Op) -> float:
    """When a delivery was granted: the server's claim time, else its receipt."""
    return float(d.claim) if d.claim is not None else d.t


def check(
    history: Iterable[Op],
    *,
    name: str = "",
    tolerate: Iterable[str] = (),
    known: Mapping[str, str] | None = None,
) -> Report:
    """Checks every invariant over ``history`` (pure: no I/O, no clock)."""
    ops, completions = _paired(history)
    rep = Report(name=name, tolerated=frozenset(tolerate), known=dict(known or {}))

    enqueues: dict[str, _Enqueue] = {}
    deliveries: dict[str, list[Op]] = defaultdict(list)
    acks: dict[str, list[tuple[Op, str, Op | None]]] = defaultdict(list)
    # Nacks and Releases: both end a lease on purpose. A released attempt is not
    # counted, so the next delivery may carry the same attempt number.
    gave_back: dict[str, list[tuple[Op, str, Op | None]]] = defaultdict(list)
    uncounted: set[str] = set()
    deletes: dict[str, list[tuple[Op, str, Op | None]]] = defaultdict(list)
    ends: dict[str, list[float]] = defaultdict(list)  # process -> stream/process end times
    any_end: list[float] = []
    finals: dict[str, str] = {}
    for o in ops:
        if o.f == "deliver" and o.type == OK:
            deliveries[o.job].append(o)
        elif o.f == "stream" and o.type in (FAIL, INFO):
            ends[o.process].append(o.t)
            any_end.append(o.t)
        elif o.f == "nemesis":
            ends[o.target].append(o.t)
            if o.target.startswith(("worker", "server")):
                # Only a worker or server fault ends streams. A skipped attempt
                # across a Redis fault is a script re-run after a lost reply
                # (issue 8, defect 5), not a delivery lost on a closing stream.
                any_end.append(o.t)
        elif o.f == "final" and o.type == OK:
            finals[o.job] = o.result
        elif o.type == INVOKE:
            outcome, done = _outcome(o, completions)
            if o.f == "enqueue":
                job = done.job if done and outcome == OK else ""
                enqueues[o.key] = _Enqueue(o, outcome, job, done)
            elif o.f == "ack":
                acks[o.token].append((o, outcome, done))
            elif o.f in ("nack", "release"):
                gave_back[o.token].append((o, outcome, done))
                if o.f == "release" and (outcome == INFO or (done and done.result == "RELEASED")):
                    uncounted.add(o.token)
            elif o.f == "delete":
                deletes[o.job].append((o, outcome, done))
    rep.operations = sum(1 for o in ops if o.type == INVOKE) + sum(map(len, deliveries.values()))

    key_jobs: dict[str, set[str]] = defaultdict(set)
    job_key: dict[str, str] = {}
    for key, enq in enqueues.items():
        if enq.job:
            key_jobs[key].add(enq.job)
            job_key[enq.job] = key
    token_delivery: dict[str, Op] = {}
    for job, ds in deliveries.items():
        ds.sort(key=lambda d: (_at(d), d.t))
        for d in ds:
            token_delivery[d.token] = d
            if d.key:
                key_jobs[d.key].add(job)

    _check_payload_and_early(rep, deliveries, enqueues, job_key)
    acked_at = _check_acks(rep, deliveries, acks, gave_back, token_delivery)
    deleted_at = {
        job: done.t
        for job, tries in deletes.items()
        for _inv, outcome, done in tries
        if outcome == OK and done is not None and done.result not in ("", "NOT_FOUND")
    }
    for job, ds in deliveries.items():
        for d in ds:
            for what, when in (("ack", acked_at.get(job)), ("delete", deleted_at.get(job))):
                if when is not None and _at(d) > when:
                    rep.add(
                        "after_ack",
                        job,
                        f"delivered (attempt {d.attempt}, token {d.token}) at {_at(d):.0f}, "
                        f"after a successful {what} returned at {when:.0f}",
                    )
        _check_redeliveries(
            rep,
            job,
            ds,
            gave_back,
            uncounted,
            ends,
            sorted(any_end),
            enqueues.get(job_key.get(job, "")),
        )

    for key, jobs in key_jobs.items():
        if len(jobs) > 1:
            rep.add(
                "unexplained",
                ",".join(sorted(jobs)),
                f"one enqueue ({key}) stored {len(jobs)} jobs",
            )
    _check_lost(rep, enqueues, deliveries, acks, deletes, acked_at, deleted_at, finals)
    rep.info["enqueued_ok"] = sum(1 for e in enqueues.values() if e.outcome == OK)
    rep.info["enqueue_unknown"] = sum(1 for e in enqueues.values() if e.outcome == INFO)
    rep.info["enqueue_failed"] = sum(1 for e in enqueues.values() if e.outcome == FAIL)
    rep.info["deliveries"] = sum(map(len, deliveries.values()))
    rep.info["redeliveries"] = sum(max(0, len(ds) - 1) for ds in deliveries.values())
    rep.info["acked"] = len(acked_at)
    rep.info["dead"] = sum(1 for s in finals.values() if s == "DEAD")
    rep.info["stale_refused"] = sum(
        1
        for tries in acks.values()
        for _inv, outcome, done in tries
        if outcome == OK and done is not None and done.result == "STALE"
    )
    return rep


def _check_payload_and_early(
    rep: Report,
    deliveries: dict[str, list[Op]],
    enqueues: dict[str, _Enqueue],
    job_key: dict[str, str],
) -> None:
    for job, ds in deliveries.items():
        for d in ds:
            if not d.payload_ok:
                rep.add("payload", job, f"payload of attempt {d.attempt} failed its checksum")
            elif job in job_key and d.key != job_key[job]:
                rep.add("payload", job, f"payload names {d.key!r}, enqueued as {job_key[job]!r}")
            enq = enqueues.get(d.key)
            if d.claim is not None and d.due is not None and d.claim < d.due:
                rep.add(
                    "early", job, f"server claimed it at {d.claim}, before its due time {d.due}"
                )
            elif d.due is not None and d.t < d.due:
                rep.add("early", job, f"received at {d.t:.0f}, before its due time {d.due}")
            elif enq and enq.invoke.want_due is not None and d.t < enq.invoke.want_due:
                rep.add(
                    "early",
                    job,
                    f"received at {d.t:.0f}, before the producer's due time {enq.invoke.want_due:.0f}",
                )
            elif enq and enq.outcome == FAIL:
                result = enq.done.result if enq.done else ""
                rep.add("unexpected", job, f"delivered although its enqueue failed ({result})")


def _check_acks(
    rep: Report,
    deliveries: dict[str, list[Op]],
    acks: dict[str, list[tuple[Op, str, Op | None]]],
    gave_back: dict[str, list[tuple[Op, str, Op | None]]],
    token_delivery: dict[str, Op],
) -> dict[str, float]:
    """Stale tokens accepted; returns job -> time its first successful ack returned."""
    acked_at: dict[str, float] = {}
    for token, tries in acks.items():
        d = token_delivery.get(token)
        for inv, outcome, done in tries:
            if outcome != OK or done is None or done.result != "ACKED":
                continue
            job = d.job if d else inv.job
            acked_at[job] = min(acked_at.get(job, done.t), done.t)
            if d is None:
                continue
            later = [
                o
                for o in deliveries[job]
                if o.token != token and _at(o) > _at(d) and _at(o) < inv.t
            ]
            if later:
                rep.add(
                    "stale_accepted",
                    job,
                    f"ack of attempt {d.attempt} sent at {inv.t:.0f} answered ACKED, but attempt "
                    f"{later[0].attempt} was delivered at {_at(later[0]):.0f}",
                )
                continue
            for n_inv, n_out, n_done in gave_back.get(token, []):
                took = n_out == OK and n_done is not None and n_done.result != "STALE"
                if took and n_done is not None and n_done.t < inv.t:
                    rep.add(
                        "stale_accepted",
                        job,
                        f"ack sent at {inv.t:.0f} answered ACKED after its {n_inv.f} returned "
                        f"at {n_done.t:.0f} (sent {n_inv.t:.0f})",
                    )
                    break
    return acked_at


def _ended_between(times: Iterable[float], lo: float, hi: float) -> bool:
    return any(lo <= t <= hi for t in times)


def _check_redeliveries(
    rep: Report,
    job: str,
    ds: list[Op],
    gave_back: dict[str, list[tuple[Op, str, Op | None]]],
    uncounted: set[str],
    ends: dict[str, list[float]],
    any_end: list[float],
    enq: _Enqueue | None,
) -> None:
    prev: Op | None = None
    for d in ds:
        if d.max_attempts and d.attempt is not None and d.attempt > d.max_attempts:
            rep.add("attempts", job, f"attempt {d.attempt} exceeds max_attempts {d.max_attempts}")
        expected = 1 if prev is None else (prev.attempt or 0) + 1
        if prev is not None and prev.token in uncounted:
            expected -= 1  # released: the attempt went back down
        attempt = d.attempt or 0
        if attempt < expected:
            rep.add(
                "attempts",
                job,
                f"attempt {attempt} (token {d.token}) after attempt {expected - 1}: not rising",
            )
        elif attempt > expected:
            since = prev.t if prev else (enq.invoke.t if enq else float("-inf"))
            if not _ended_between(any_end, since, d.t):
                rep.add(
                    "attempts",
                    job,
                    f"attempt {attempt} follows attempt {expected - 1} with no stream or process "
                    "end in between to hide a delivery",
                )
        if prev is not None and not _explained(prev, d, gave_back, ends):
            rep.add(
                "unexplained",
                job,
                f"attempt {d.attempt} (by {d.process}, claimed {_at(d):.0f}) while attempt "
                f"{prev.attempt} (by {prev.process}, token {prev.token}) had its lease until "
                f"{prev.deadline}, no nack and no end of {prev.process}",
            )
        prev = d


def _explained(
    prev: Op,
    d: Op,
    gave_back: dict[str, list[tuple[Op, str, Op | None]]],
    ends: dict[str, list[float]],
) -> bool:
    if prev.deadline is not None and _at(d) >= prev.deadline:
        return True  # the lease ran out
    if any(inv.t <= d.t for inv, _out, _done in gave_back.get(prev.token, [])):
        return True
    return _ended_between(ends.get(prev.process, []), prev.t, d.t + STREAM_END_SLACK_MS)


def _check_lost(
    rep: Report,
    enqueues: dict[str, _Enqueue],
    deliveries: dict[str, list[Op]],
    acks: dict[str, list[tuple[Op, str, Op | None]]],
    deletes: dict[str, list[tuple[Op, str, Op | None]]],
    acked_at: dict[str, float],
    deleted_at: dict[str, float],
    finals: dict[str, str],
) -> None:
    for key, enq in enqueues.items():
        if enq.outcome != OK:
            continue
        job = enq.job
        if job in acked_at or job in deleted_at:
            continue
        final = finals.get(job, "")
        if final in _SETTLED_STATES:
            continue
        ds = deliveries.get(job, [])
        tokens = {d.token for d in ds}
        ack_unsure = any(
            outcome != OK for tok in tokens for _i, outcome, _d in acks.get(tok, [])
        ) or bool(deletes.get(job))
        if final == "NOT_FOUND" and ack_unsure:
            continue  # an ack or delete whose reply was lost did take effect
        seen = f"delivered {len(ds)} time(s)" if ds else "never delivered"
        rep.add(
            "lost", job, f"enqueue {key} acknowledged; {seen}; final state {final or 'unknown'}"
        )


_COLUMNS = (
    ("operations", "ops"),
    ("lost", "lost"),
    ("early", "early"),
    ("after_ack", "after-ack"),
    ("stale_accepted", "stale accepted"),
    ("unexplained", "unexplained dups"),
    ("attempts", "attempts"),
    ("payload", "payload"),
    ("unexpected", "unexpected"),
)
_INFO = (
    ("enqueued_ok", "enq ok"),
    ("enqueue_unknown", "enq ?"),
    ("redeliveries", "redelivered"),
    ("acked", "acked"),
    ("dead", "dead"),
    ("stale_refused", "stale refused"),
    ("stats_drift", "stats drift"),
)


def format_table(reports: Iterable[Report]) -> str:
    """One row per run: violation counts (must be 0), then what happened (info).

    A count marked ``~`` is measured, not failed (tolerated for that fault);
    ``!`` marks a known failure whose issue reference the summary prints.
    """
    reports = list(reports)
    heads = ["fault"] + [h for _k, h in _COLUMNS] + [h for _k, h in _INFO] + ["verdict"]
    rows = [heads]
    for r in reports:
        cells = [r.name, str(r.operations)]
        for k, _h in _COLUMNS[1:]:
            mark = "~" if k in r.tolerated else "!" if k in r.known else ""
            cells.append(mark + str(r.counts[k]))
        cells += [str(r.info.get(k, 0)) for k, _h in _INFO]
        cells.append("FAIL " + ",".join(r.failed) if r.failed else "ok")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
    out = []
    for row in rows:
        first, *middle, last = row
        cols = [first.ljust(widths[0])]
        cols += [c.rjust(w) for c, w in zip(middle, widths[1:-1], strict=True)]
        out.append("  ".join([*cols, last]))
    return "\n".join(out)
