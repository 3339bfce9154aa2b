"""The checker over hand-made histories: each invariant can fail, and clean runs pass."""

from __future__ import annotations

import pytest

from tests.chaos.checker import INVARIANTS, check, format_table
from tests.chaos.history import Op


class H:
    """A tiny language for histories (times in ms, server and client clocks equal)."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.n = 0

    def _pair(
        self, process: str, f: str, t: float, t_done: float | None, outcome: str, **kw: object
    ) -> None:
        self.n += 1
        op = f"{process}:{self.n}"
        inv_kw = {k: v for k, v in kw.items() if k not in ("job", "result") or f != "enqueue"}
        if f == "enqueue":
            inv_kw = {k: v for k, v in kw.items() if k in ("key", "want_due")}
        self.ops.append(Op(process, "invoke", f, t, op=op, **inv_kw))  # type: ignore[arg-type]
        if t_done is not None:
            self.ops.append(Op(process, outcome, f, t_done, op=op, **kw))  # type: ignore[arg-type]

    def enqueue(
        self,
        key: str,
        job: str,
        t: float = 0,
        *,
        outcome: str = "ok",
        want_due: float | None = None,
        done: bool = True,
    ) -> H:
        self._pair(
            "p",
            "enqueue",
            t,
            t + 1 if done else None,
            outcome,
            key=key,
            job=job if outcome == "ok" else "",
            want_due=want_due,
        )
        return self

    def deliver(
        self,
        job: str,
        attempt: int,
        t: float,
        *,
        key: str = "",
        token: str = "",
        due: int = 0,
        claim: int | None = None,
        lease: int = 1000,
        process: str = "w1",
        payload_ok: bool = True,
        max_attempts: int = 5,
    ) -> H:
        claim = int(t) if claim is None else claim
        self.ops.append(
            Op(process, "ok", "deliver", t, key=key or f"k{job}", job=job, due=due, claim=claim, deadline=claim + lease,
               token=token or f"{job}.{attempt}", attempt=attempt, max_attempts=max_attempts, payload_ok=payload_ok)
        )  # fmt: skip
        return self

    def ack(
        self,
        token: str,
        t: float,
        *,
        result: str = "ACKED",
        outcome: str = "ok",
        took: float = 1,
        process: str = "w1",
    ) -> H:
        self._pair(
            process,
            "ack",
            t,
            t + took,
            outcome,
            token=token,
            result=result if outcome == "ok" else "",
        )
        return self

    def nack(self, token: str, t: float, process: str = "w1") -> H:
        self._pair(process, "nack", t, t + 1, "ok", token=token, result="SCHEDULED")
        return self

    def release(self, token: str, t: float, result: str = "RELEASED", process: str = "w1") -> H:
        self._pair(process, "release", t, t + 1, "ok", token=token, result=result)
        return self

    def delete(self, job: str, t: float) -> H:
        self._pair("p", "delete", t, t + 1, "ok", job=job, result="SCHEDULED")
        return self

    def stream_end(self, process: str, t: float) -> H:
        self.ops.append(Op(process, "info", "stream", t, result="UNAVAILABLE"))
        return self

    def nemesis(self, target: str, t: float, action: str = "kill") -> H:
        self.ops.append(Op("nemesis", "info", "nemesis", t, target=target, result=action))
        return self

    def final(self, job: str, state: str) -> H:
        self.ops.append(Op("final", "ok", "final", 1e9, job=job, result=state))
        return self


def clean() -> H:
    """Two jobs: one acked first time, one nacked then acked; a third expired lease."""
    h = H().enqueue("ka", "a", 0, want_due=50).enqueue("kb", "b", 0).enqueue("kc", "c", 0)
    h.deliver("a", 1, 100, due=50).ack("a.1", 110)
    h.deliver("b", 1, 100).nack("b.1", 105).deliver("b", 2, 300).ack("b.2", 310)
    h.deliver("c", 1, 100, lease=1000).deliver("c", 2, 1100, process="w2").ack(
        "c.1", 1200, result="STALE"
    ).ack("c.2", 1201, process="w2")
    return h


def zero_except(counts: dict[str, int], name: str, n: int = 1) -> None:
    assert counts[name] == n, counts
    assert all(v == 0 for k, v in counts.items() if k != name), counts


def test_a_clean_history_passes() -> None:
    rep = check(clean().ops, name="clean")
    assert rep.failed == [], rep.summary()
    assert all(v == 0 for v in rep.counts.values())
    assert (
        rep.info["acked"] == 3 and rep.info["stale_refused"] == 1 and rep.info["redeliveries"] == 2
    )


def test_lost_acknowledged_enqueue() -> None:
    rep = check(clean().enqueue("kd", "d", 5).final("d", "READY").ops)
    zero_except(rep.counts, "lost")
    assert rep.failed == ["lost"] and "final state READY" in str(rep.violations[0])


def test_lost_after_delivery_without_ack() -> None:
    rep = check(H().enqueue("kd", "d").deliver("d", 1, 10).final("d", "NOT_FOUND").ops)
    assert rep.counts["lost"] == 1


@pytest.mark.parametrize("state", ["DEAD", "COMPLETED"])
def test_settled_jobs_are_not_lost(state: str) -> None:
    assert check(H().enqueue("kd", "d").deliver("d", 1, 10).final("d", state).ops).failed == []


def test_gone_job_with_an_unsure_ack_is_not_lost() -> None:
    h = (
        H()
        .enqueue("kd", "d")
        .deliver("d", 1, 10)
        .ack("d.1", 20, outcome="info")
        .final("d", "NOT_FOUND")
    )
    assert check(h.ops).failed == []


def test_unknown_or_failed_enqueues_need_not_arrive() -> None:
    h = (
        H()
        .enqueue("kx", "", outcome="info")
        .enqueue("ky", "", outcome="fail")
        .enqueue("kz", "", done=False)
    )
    rep = check(h.ops)
    assert rep.failed == [] and rep.info["enqueue_unknown"] == 2


@pytest.mark.parametrize(
    ("kw", "want_due", "text"),
    [
        ({"due": 200, "claim": 150}, None, "server claimed it at 150"),
        (
            {"due": 200, "claim": 200},
            None,
            "received at 100",
        ),  # the server lies about its claim time
        ({"due": 0}, 500, "producer's due time 500"),
    ],
)
def test_early(kw: dict[str, int], want_due: float | None, text: str) -> None:
    h = H().enqueue("kd", "d", want_due=want_due)
    h.deliver("d", 1, 100, key="kd", due=kw["due"], claim=kw.get("claim")).ack("d.1", 600)
    rep = check(h.ops)
    zero_except(rep.counts, "early")
    assert text in str(rep.violations[0])


def test_delivery_after_ack() -> None:
    h = clean().deliver("a", 2, 500, process="w2")  # acked at 111
    rep = check(h.ops)
    assert rep.counts["after_ack"] == 1
    assert "after a successful ack" in str(rep.violations[0])


def test_delivery_after_delete() -> None:
    h = H().enqueue("kd", "d").delete("d", 10).deliver("d", 1, 50)
    assert check(h.ops).counts["after_ack"] == 1


def test_stale_ack_accepted_after_redelivery() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100, lease=100).deliver("d", 2, 300, process="w2")
    h.ack("d.1", 400).ack("d.2", 401, process="w2")
    rep = check(h.ops)
    assert rep.counts["stale_accepted"] == 1 and rep.failed == ["stale_accepted"]


def test_ack_accepted_after_nack() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100).nack("d.1", 110).ack("d.1", 120)
    assert check(h.ops).counts["stale_accepted"] == 1


def test_unexplained_redelivery() -> None:
    h = (
        H()
        .enqueue("kd", "d")
        .deliver("d", 1, 100, lease=1000)
        .deliver("d", 2, 300, process="w2")
        .ack("d.2", 310, process="w2")
    )
    rep = check(h.ops)
    zero_except(rep.counts, "unexplained")
    assert "had its lease until 1100" in str(rep.violations[0])


@pytest.mark.parametrize(
    "explain",
    [
        lambda h: h.nack("d.1", 150),
        lambda h: h.stream_end("w1", 250),
        lambda h: h.nemesis("w1", 200, "kill"),
        lambda h: h.stream_end("w1", 800),  # written a moment after w2 got the job
    ],
)
def test_explained_redelivery(explain: object) -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100, lease=1000)
    assert callable(explain)
    explain(h)
    h.deliver("d", 2, 300, process="w2").ack("d.2", 310, process="w2")
    assert check(h.ops).failed == []


def test_stream_end_of_another_worker_does_not_explain() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100, lease=1000).stream_end("w3", 200)
    h.deliver("d", 2, 300, process="w2").ack("d.2", 310, process="w2")
    assert check(h.ops).counts["unexplained"] == 1


def test_one_enqueue_storing_two_jobs() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 10, key="kd").ack("d.1", 20)
    h.deliver("e", 1, 30, key="kd").ack("e.1", 40)
    rep = check(h.ops)
    zero_except(rep.counts, "unexplained")
    assert "stored 2 jobs" in str(rep.violations[0])


def test_attempt_repeated() -> None:
    h = (
        H()
        .enqueue("kd", "d")
        .deliver("d", 1, 100, lease=10)
        .deliver("d", 1, 300, token="d.1b", process="w2")
        .ack("d.1b", 310)
    )
    rep = check(h.ops)
    zero_except(rep.counts, "attempts")


def test_attempt_skipped_without_a_stream_end() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100, lease=10).deliver("d", 3, 300).ack("d.3", 310)
    rep = check(h.ops)
    zero_except(rep.counts, "attempts")
    assert check(h.stream_end("w9", 200).ops).failed == []  # a hidden delivery is possible


def test_attempt_beyond_max() -> None:
    h = (
        H()
        .enqueue("kd", "d")
        .deliver("d", 1, 100, lease=10, max_attempts=1)
        .deliver("d", 2, 300, max_attempts=1)
        .ack("d.2", 310)
    )
    assert check(h.ops).counts["attempts"] == 1


def test_payload_corrupt_or_swapped() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 10, payload_ok=False).ack("d.1", 20)
    h.enqueue("ke", "e").deliver("e", 1, 10, key="kd", token="e.1").ack("e.1", 20)
    rep = check(h.ops)
    assert rep.counts["payload"] == 2


def test_failed_enqueue_delivered() -> None:
    h = H().enqueue("kd", "", outcome="fail").deliver("d", 1, 10, key="kd").ack("d.1", 20)
    rep = check(h.ops)
    zero_except(rep.counts, "unexpected")


def test_tolerated_and_known_counts_do_not_fail() -> None:
    h = clean().enqueue("kd", "d").final("d", "READY")
    assert check(h.ops, tolerate=["lost"]).failed == []
    rep = check(h.ops, known={"lost": "issue 8 defect 5"})
    assert rep.failed == [] and "issue 8 defect 5" in rep.summary()


def test_table_has_a_column_per_invariant() -> None:
    rep = check(clean().enqueue("kd", "d").final("d", "READY").ops, name="demo", tolerate=["lost"])
    table = format_table([rep])
    for head in ("ops", "lost", "early", "after-ack", "stale accepted", "unexplained dups"):
        assert head in table
    assert "~1" in table and table.splitlines()[1].startswith("demo")
    assert set(rep.counts) == set(INVARIANTS)


def test_release_explains_a_redelivery_with_the_same_attempt() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100, lease=1000).release("d.1", 110)
    h.deliver("d", 1, 200, token="d.1b", process="w2").ack("d.1b", 210, process="w2")
    assert check(h.ops).failed == []


def test_same_attempt_after_a_stale_release_is_not_explained() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100, lease=1000).release("d.1", 110, "STALE")
    h.deliver("d", 1, 200, token="d.1b", process="w2").ack("d.1b", 210, process="w2")
    assert check(h.ops).counts["attempts"] == 1


def test_ack_accepted_after_release() -> None:
    h = H().enqueue("kd", "d").deliver("d", 1, 100).release("d.1", 110).ack("d.1", 120)
    assert check(h.ops).counts["stale_accepted"] == 1


def test_a_fault_that_did_not_happen_fails_the_run() -> None:
    rep = check(clean().ops, name="demo")
    rep.unmet.append("no late ack reached the server")
    assert rep.failed == ["fault not as planned"]
    assert "no late ack" in rep.summary()
