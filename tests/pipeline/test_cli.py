"""`delayq-pipeline` argument handling (no Spark started)."""

from __future__ import annotations

import argparse

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
