"""The `delayq` command line against a real server: JSON-lines round trip, stats, errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from delayq import Client

N = 10_000


def run(
    cli: Path, target: str, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cli), "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_jsonl_round_trip_of_10000_jobs_with_stats(cli: Path, target: str, tmp_path: Path) -> None:
    src = tmp_path / "jobs.jsonl"
    jobs = [{"n": i, "to": f"user{i}@example.com", "tags": ["a", i % 7]} for i in range(N)]
    src.write_text("".join(json.dumps(j) + "\n" for j in jobs))

    enq = run(cli, target, "enqueue", "emails", "--file", str(src), "--progress")
    assert enq.returncode == 0, enq.stderr
    assert "enqueued 10,000 jobs to emails (0 duplicates, 0 refused)" in enq.stderr
    assert f"{N:,}/{N:,} 100%" in enq.stderr  # the progress bar reached the end

    table = run(cli, target, "stats", "emails")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    cols = dict(
        zip(
            header.replace("OLDEST READY", "OLDEST_READY").replace("NEXT DUE", "NEXT_DUE").split(),
            row.split(),
            strict=False,
        )
    )
    assert (cols["QUEUE"], cols["READY"], cols["ENQUEUED"]) == ("emails", str(N), str(N))

    tail = run(cli, target, "tail", "emails", "--count", str(N), "--idle-timeout", "20s")
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(x) for x in tail.stdout.splitlines()]
    assert len(lines) == N
    assert sorted((x["payload"] for x in lines), key=lambda p: p["n"]) == jobs
    assert {x["queue"] for x in lines} == {"emails"}

    after = run(cli, target, "stats", "emails", "--json")
    stats = json.loads(after.stdout)
    assert (stats["acked_total"], stats["ready"], stats["leased"]) == (N, 0, 0)


def test_tail_without_ack_leaves_jobs_for_others(cli: Path, target: str) -> None:
    assert run(cli, target, "enqueue", "q", "a", "b", "c").returncode == 0
    peek = run(cli, target, "tail", "q", "--no-ack", "--count", "3")
    assert [json.loads(x)["payload"] for x in peek.stdout.splitlines()] == ["a", "b", "c"]
    with Client(target) as client:
        s = client.stats("q")
        assert s.acked_total == 0 and s.ready + s.leased == 3


def test_peeking_twice_uses_no_attempt(cli: Path, target: str) -> None:
    with Client(target) as client:
        job_id = client.enqueue("peek", "p", max_attempts=2).job_id
        for _ in range(2):
            peek = run(cli, target, "tail", "peek", "--no-ack", "--count", "1")
            assert peek.returncode == 0, peek.stderr
            assert json.loads(peek.stdout)["attempt"] == 1  # never an earlier peek's count
            job = client.get("peek", job_id)
            assert (job.state.name, job.attempts) == ("READY", 0)
        s = client.stats("peek")
        assert (s.ready, s.leased, s.dead) == (1, 0, 0)


def test_tail_with_a_count_takes_no_more_than_it_prints(cli: Path, target: str) -> None:
    # Its last ack used to free credit on the open stream: the server sent more
    # deliveries that were never read, and they came back later as attempt 2.
    assert run(cli, target, "enqueue", "more", *[f"j{i}" for i in range(10)]).returncode == 0
    for _ in range(3):
        tail = run(cli, target, "tail", "more", "--count", "2")
        assert tail.returncode == 0, tail.stderr
        assert [json.loads(x)["attempt"] for x in tail.stdout.splitlines()] == [1, 1]
    with Client(target) as client:
        s = client.stats("more")
        assert (s.acked_total, s.leased, s.ready) == (6, 0, 4)


def test_get_delete_and_errors_are_one_line_with_the_status_as_exit_code(
    cli: Path, target: str
) -> None:
    enq = run(cli, target, "enqueue", "q", "--json", '{"x": 1}', "--delay", "1h", "-H", "k=v")
    assert enq.returncode == 0, enq.stderr
    job_id = enq.stdout.strip()
    got = json.loads(run(cli, target, "get", "q", job_id).stdout)
    assert (got["state"], got["payload"], got["headers"]["k"]) == ("SCHEDULED", {"x": 1}, "v")
    assert run(cli, target, "delete", "q", job_id).stdout.startswith(f"deleted {job_id}")

    missing = run(cli, target, "get", "q", job_id)
    assert missing.returncode == 5  # NOT_FOUND
    assert missing.stderr.startswith("delayq: error: NOT_FOUND: ")
    assert missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr

    bad = run(cli, target, "enqueue", "bad:name", "x")
    assert bad.returncode == 3 and bad.stderr.startswith("delayq: error: INVALID_ARGUMENT: ")

    down = run(cli, "127.0.0.1:1", "--timeout", "1", "stats", "q")
    assert down.returncode == 14 and down.stderr.startswith("delayq: error: UNAVAILABLE: ")
    assert down.stderr.count("\n") == 1


def test_dead_list_redrive_purge(cli: Path, target: str) -> None:
    with Client(target) as client:
        ids = [client.enqueue("q", f"p{i}").job_id for i in range(3)]
        for d in client.consume(["q"], max_outstanding=3):
            client.nack(d.lease_token, dead_letter=True, reason=f"bad {d.payload}")
            if client.stats("q").dead == 3:
                break
    listed = run(cli, target, "dead", "list", "q")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["ID", "ATTEMPTS", "DIED", "LAST", "ERROR"]
    assert {line.split()[0] for line in listed.stdout.splitlines()[1:]} == set(ids)
    as_json = [
        json.loads(x) for x in run(cli, target, "dead", "list", "q", "--json").stdout.splitlines()
    ]
    assert sorted(j["last_error"] for j in as_json) == ["bad p0", "bad p1", "bad p2"]

    assert run(cli, target, "dead", "redrive", "q", ids[0]).stdout == "redrove 1 jobs\n"
    assert run(cli, target, "dead", "purge", "q", "--all").stdout == "purged 2 jobs\n"
    refuse = run(cli, target, "dead", "purge", "q")
    assert refuse.returncode == 3 and "--all" in refuse.stderr
    with Client(target) as client:
        s = client.stats("q")
        assert (s.dead, s.ready) == (0, 1)
