"""The faults, and one run of one fault under steady load, judged by the checker."""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos import history
from tests.chaos.checker import Report, check
from tests.chaos.cluster import CALL_TIMEOUT_S, Cluster, wait_for


@dataclass(frozen=True)
class Scale:
    """How long a run is: acks before and after each fault, fault rounds, burst size."""

    warmup_acks: int = 40
    after_acks: int = 40
    rounds: int = 1
    burst: int = 20_000
    drain_s: float = 120.0
    rate: float = 40.0
    burst_rate: float = 1_000  # jobs/s the burst's enqueue reaches at least (~3,000 seen)


SHORT = Scale()
SOAK = Scale(
    warmup_acks=400,
    after_acks=400,
    rounds=3,
    burst=1_000_000,
    drain_s=3_600,
    rate=100,
    burst_rate=2_500,
)


@dataclass(frozen=True)
class Fault:
    name: str
    inject: Callable[[Cluster, Scale], None]
    cluster: Mapping[str, Any] = field(default_factory=dict)
    tolerate: tuple[str, ...] = ()  # measured, not failed
    known: Mapping[str, str] = field(default_factory=dict)  # invariant -> issue reference
    expect: Callable[[Report, Cluster, list[history.Op]], None] | None = None  # fault happened


def _elapsed(start: float, seconds: float) -> Callable[[], bool]:
    return lambda: time.monotonic() - start >= seconds


def _codes(cluster: Cluster, code: str) -> int:
    return sum(p.codes.get(code, 0) for p in cluster.producers)


def kill_server(c: Cluster, s: Scale) -> None:
    c.kill_server(0)
    c.wait_progress(s.after_acks)  # the other replica carries on
    c.restart_server(0)
    c.wait_progress(s.after_acks)


def kill_worker(c: Cluster, s: Scale) -> None:
    c.kill_worker(0)
    c.wait_progress(s.after_acks)
    c.restart_worker(0)
    c.wait_progress(s.after_acks)


def pause_worker(c: Cluster, s: Scale) -> None:
    c.pause_worker(0)
    start = time.monotonic()
    # Past its lease: the others must get its jobs (an expiry), then it wakes up
    # and acks with tokens that lost their lease.
    wait_for("2.5 leases", _elapsed(start, 2.5 * c.lease_ms / 1000), 60, 0.1)
    c.wait_progress(s.after_acks)
    c.resume_worker(0)
    c.wait_progress(s.after_acks)


def _stale_refused(rep: Report, _c: Cluster, _ops: list[history.Op]) -> None:
    assert rep.info["stale_refused"] > 0, "the paused worker's late acks never reached the server"


def kill_redis(c: Cluster, s: Scale) -> None:
    c.kill_redis()
    c.restart_redis()
    c.wait_progress(s.after_acks)


def pause_redis(c: Cluster, s: Scale) -> None:
    before = _codes(c, "DEADLINE_EXCEEDED")
    c.pause_redis()
    start = time.monotonic()
    wait_for(
        "client deadlines passing",
        lambda: _codes(c, "DEADLINE_EXCEEDED") > before and _elapsed(start, 2 * CALL_TIMEOUT_S)(),
        60,
    )
    c.resume_redis()
    c.wait_progress(s.after_acks)


def pause_server(c: Cluster, s: Scale) -> None:
    c.pause_server(0)
    start = time.monotonic()
    wait_for("2.5 leases", _elapsed(start, 2.5 * c.lease_ms / 1000), 60, 0.1)
    c.wait_progress(s.after_acks)
    c.resume_server(0)
    c.wait_progress(s.after_acks)


SKEW_MS = 10 * 60_000


def skewed_clock(c: Cluster, s: Scale) -> None:
    c.wait_progress(3 * s.after_acks)  # the skew is there from the start


def _job_id_ms(job_id: str) -> int:
    raw = base64.b32hexdecode(job_id.split("-")[0].upper() + "=")
    return int.from_bytes(raw[:6], "big")


def _skew_visible(rep: Report, _c: Cluster, ops: list[history.Op]) -> None:
    ahead = [o for o in ops if o.f == "enqueue" and o.job and _job_id_ms(o.job) - o.t > SKEW_MS / 2]
    assert ahead, "no job id carries the skewed replica's clock: the setting had no effect"


def maxmemory(c: Cluster, s: Scale) -> None:
    r = c.redis_client()
    used = int(r.info("memory")["used_memory"])
    before = _codes(c, "RESOURCE_EXHAUSTED")
    c.record("maxmemory", "redis")
    r.config_set("maxmemory", used + 200_000)
    wait_for("RESOURCE_EXHAUSTED", lambda: _codes(c, "RESOURCE_EXHAUSTED") >= before + 5, 120)
    c.record("maxmemory-off", "redis")
    r.config_set("maxmemory", 0)
    r.close()
    c.wait_progress(s.after_acks)


def _exhausted(rep: Report, c: Cluster, _ops: list[history.Op]) -> None:
    assert _codes(c, "RESOURCE_EXHAUSTED") > 0


def same_second(c: Cluster, s: Scale) -> None:
    # A second boundary far enough ahead that the whole burst is stored before it
    # (enqueueing runs at a few thousand jobs/s here): none is clamped to "now".
    due_ms = math.ceil(history.now_ms() / 1000 + 2 + s.burst / s.burst_rate) * 1000.0
    name = f"burst{len(list(c.history_dir.glob('burst*.jsonl')))}"  # one per round
    c.record(f"{name} of {s.burst}", "burst")
    ok = c.batch_enqueue(s.burst, due_ms, name)
    assert ok == s.burst, f"{s.burst - ok} of the burst's enqueues were refused"
    c.wait_progress(s.after_acks)


def _one_due_second(_rep: Report, _c: Cluster, ops: list[history.Op]) -> None:
    dues: dict[str, set[int | None]] = {}
    for o in ops:
        if o.process.startswith("burst") and o.type == history.OK:
            dues.setdefault(o.process, set()).add(o.due)
    assert dues, "no burst was stored"
    for name, seen in dues.items():
        assert len(seen) == 1, f"{name} was stored with {len(seen)} due times, not one"


FAULTS = [
    Fault("kill -9 server", kill_server),
    Fault("kill -9 worker", kill_worker),
    Fault("SIGSTOP worker", pause_worker, {"hold_ms": 400}, expect=_stale_refused),
    Fault("kill -9 redis (always)", kill_redis, {"power_cut": True}),
    Fault(
        "kill -9 redis (everysec)",
        kill_redis,
        {"appendfsync": "everysec", "power_cut": True},
        tolerate=("lost", "after_ack", "stale_accepted", "unexplained", "attempts", "unexpected"),
    ),
    Fault("SIGSTOP redis", pause_redis),
    Fault("SIGSTOP server", pause_server),
    Fault(
        "clock skew +10m",
        skewed_clock,
        {"server_args": [[], [f"--clock-skew={SKEW_MS // 60_000}m"]]},
        expect=_skew_visible,
    ),
    Fault("redis maxmemory", maxmemory, expect=_exhausted),
    Fault("same-second burst", same_second, expect=_one_due_second),
]


def by_name(name: str) -> Fault:
    return next(f for f in FAULTS if f.name == name)


def run(fault: Fault, workdir: Path, *, seed: int, scale: Scale = SHORT) -> Report:
    """Starts a cluster, injects ``fault`` under load, drains, queries and checks."""
    kw = {"rate": scale.rate, **fault.cluster}
    cluster = Cluster(workdir, seed=seed, **kw).start()
    drained = False
    end = None
    try:
        cluster.start_load()
        cluster.wait_progress(scale.warmup_acks)
        for _ in range(scale.rounds):
            fault.inject(cluster, scale)
            cluster.wait_progress(scale.warmup_acks)
        cluster.stop_load()
        drained = cluster.drain(scale.drain_s)
        cluster.record_finals()
        end = cluster.stats()
    finally:
        cluster.close()
    ops = history.load(cluster.history_dir)
    rep = check(ops, name=fault.name, tolerate=fault.tolerate, known=fault.known)
    rep.info["drained"] = int(drained)
    if end is not None:
        # The server's own counters against the history: jobs counted as enqueued
        # that no client saw (e.g. a script re-run after a lost reply counts twice).
        jobs = {o.job for o in ops if o.job and o.f in ("enqueue", "deliver") and o.type == "ok"}
        rep.info["stats_drift"] = end.enqueued_total - len(jobs)
        rep.info["backlog_left"] = end.scheduled + end.ready + end.leased
    if fault.expect:
        try:
            fault.expect(rep, cluster, ops)
        except AssertionError as exc:  # reported with the table, not instead of it
            rep.unmet.append(str(exc))
    return rep
