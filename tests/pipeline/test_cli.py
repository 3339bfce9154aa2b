"""`delayq-pipeline` argument handling and refusals (Spark only where a test says so)."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from delayq_pipeline import cli


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000), ("1.5", 1500)],
)
def test_durations(text: str, ms: int) -> None:
    assert cli.parse_ms(text) == ms


def test_a_bad_duration_is_refused() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a duration"):
        cli.parse_ms("soon")


def test_schedule_needs_one_queue_source_and_one_due_source(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli.main(
            [
                "schedule",
                "x.parquet",
                "--queue",
                "q",
                "--queue-col",
                "c",
                "--payload-col",
                "p",
                "--delay",
                "1s",
            ]
        )
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_token_from_the_environment_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DELAYQ_TOKEN", "t0k")
    args = cli._parser().parse_args(
        ["schedule", "x", "--queue", "q", "--payload-col", "p", "--delay", "1s"]
    )
    assert args.token == "t0k"


def test_export_names_an_unreachable_redis_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # `make run` starts its managed Redis on a free port; a user who guesses 6379
    # gets the URL back, where to find the right one, and no traceback.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    assert cli.main(["export", "--redis-url", url, "--out", "unused"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"redis://***@127.0.0.1:{port}/0" in err and "s3cret" not in err
    assert "started managed redis-server at" in err


def test_schedule_names_an_unreachable_server_in_one_line(tmp_path: Path) -> None:
    # It used to retry for its 120 s deadline in silence, then print a traceback.
    data = tmp_path / "jobs.jsonl"
    data.write_text('{"k": "a", "body": "x"}\n')
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    out = subprocess.run(
        [str(Path(sys.executable).parent / "delayq-pipeline"), "schedule", str(data),
         "--queue", "q", "--payload-col", "body", "--delay", "1m", "--key-col", "k",
         "--target", f"127.0.0.1:{port}", "--master", "local[1]"],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"delayq-pipeline schedule: cannot reach the server at 127.0.0.1:{port}")
    assert "Traceback" not in out.stderr
