"""`delayq queues ...`, `delayq jobs ...` and stepped redrive against a real server (issue 14)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from delayq import Client
from delayq.admin import AdminClient
from delayq.admin_queues import QueueSettings
from delayq.models import JobState


def run(cli: Path, target: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cli), "--target", target, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        input=stdin,
    )


def test_queue_lifecycle_from_the_command_line(cli: Path, target: str) -> None:
    made = run(cli, target, "queues", "create", "mail", "--shards", "2", "--max-attempts", "3",
               "--lease", "45s", "--dead-max", "100")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout == "created default/mail (2 shards)\n"
    with Client(target) as client:
        for i in range(30):
            client.enqueue("mail", f"m{i}")
    table = run(cli, target, "queues", "list")
    assert table.returncode == 0, table.stderr
    head, *rows = table.stdout.splitlines()
    assert head.split()[:4] == ["NAMESPACE", "QUEUE", "STATE", "SCHEDULED"]
    row = next(r.split() for r in rows if r.split()[1] == "mail")
    assert row[:5] == ["default", "mail", "active", "0", "30"]

    shown = json.loads(run(cli, target, "queues", "show", "mail").stdout)
    assert shown["settings"]["max_attempts"] == 3 and shown["settings"]["default_lease_s"] == 45
    upd = run(
        cli, target, "queues", "update", "mail", "--max-attempts", "9", "--reset", "dead_max_jobs"
    )
    assert upd.returncode == 0, upd.stderr
    shown = json.loads(run(cli, target, "queues", "show", "mail").stdout)
    assert shown["settings"]["max_attempts"] == 9 and shown["settings"]["dead_max_jobs"] is None

    assert run(cli, target, "queues", "pause", "mail").stdout == "mail: paused\n"
    assert "paused" in run(cli, target, "queues", "list").stdout
    assert run(cli, target, "queues", "resume", "mail").stdout == "mail: resumed\n"

    # Destructive: refused without --yes when nobody can answer, asked otherwise.
    refused = run(cli, target, "queues", "purge", "mail")
    assert refused.returncode == 1 and "--yes" in refused.stderr
    purged = run(cli, target, "queues", "purge", "mail", "--yes", "--progress")
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout == "purged 30 jobs\n"
    assert "30/30 100%" in purged.stderr  # the progress bar reached the end
    deleted = run(cli, target, "queues", "delete", "mail", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    gone = run(cli, target, "queues", "show", "mail")
    assert gone.returncode == 5 and "no queue default/mail" in gone.stderr


def test_jobs_list_and_reschedule(cli: Path, target: str) -> None:
    with Client(target) as client:
        ids = [client.enqueue("later", f"p{i}", delay=60 * (i + 1)).job_id for i in range(3)]
    listed = run(cli, target, "jobs", "list", "later", "--state", "scheduled")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ids
    moved = run(cli, target, "jobs", "reschedule", "later", ids[2], "--delay", "0s")
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.startswith(f"{ids[2]}: ready, due ")
    as_json = run(cli, target, "jobs", "list", "later", "--state", "ready", "--json")
    assert [json.loads(x)["id"] for x in as_json.stdout.splitlines()] == [ids[2]]
    upd = run(cli, target, "jobs", "update", "later", ids[0], "--payload", "changed")
    assert upd.returncode == 0, upd.stderr
    with Client(target) as client:
        assert client.get("later", ids[0]).data == b"changed"


def test_redrive_all_to_another_queue_with_progress(cli: Path, target: str) -> None:
    with Client(target) as client:
        for i in range(5):
            client.enqueue("src", f"d{i}")
        for d in client.consume(["src"], max_outstanding=5):
            client.nack(d.lease_token, dead_letter=True)
            if client.stats("src").dead == 5:
                break
    with AdminClient(target) as admin:
        admin.create_queue("dst", QueueSettings())
    out = run(cli, target, "dead", "redrive", "src", "--all", "--to", "dst", "--rate", "1000",
              "--progress")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout == "redrove 5 jobs\n" and "5/5 100%" in out.stderr
    with AdminClient(target) as admin:
        assert admin.get_queue("src").stats.dead == 0
        moved = list(admin.iter_jobs("dst", JobState.READY))
    assert sorted(j.data for j in moved) == [f"d{i}".encode() for i in range(5)]
