"""PNG charts (matplotlib) and the HTML page of a lifecycle report."""

from __future__ import annotations

import html
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt

__all__ = ["render"]

Rows = list[dict[str, Any]]
_INSTANTS = frozenset({"bin_ms", "due_hour_ms"})  # epoch ms columns, shown as UTC times


def _name(row: dict[str, Any]) -> str:
    return f"{row['namespace']}/{row['queue']}"


def _when(ms: float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def _throughput(rows: Rows, path: Path, bin_ms: int) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    series: dict[tuple[str, str], list[tuple[datetime, float]]] = defaultdict(list)
    for r in rows:
        series[(_name(r), r["event"])].append((_when(r["bin_ms"]), r["events"] * 1000 / bin_ms))
    for (queue, event), points in sorted(series.items()):
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker=".", label=f"{queue} {event}")
    ax.set_ylabel("events/s")
    ax.set_title(f"Throughput ({bin_ms / 1000:g} s bins)")
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _lateness(rows: Rows, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    keys = ["lateness_p50_ms", "lateness_p90_ms", "lateness_p99_ms"]
    queues = [r for r in rows if r.get("lateness_p50_ms") is not None]
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        ax.bar(
            [n + i * width for n in range(len(queues))],
            [r[key] for r in queues],
            width,
            label=key.split("_")[1],
        )
    ax.set_xticks([n + width for n in range(len(queues))], [_name(r) for r in queues])
    ax.set_ylabel("ms after due time")
    ax.set_title("Delivery lateness")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _attempts(rows: Rows, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    series: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)
    for r in rows:
        series[(_name(r), r["outcome"])][r["attempt"]] = r["jobs"]
    width = 0.8 / max(1, len(series))
    for i, ((queue, outcome), counts) in enumerate(sorted(series.items())):
        xs = sorted(counts)
        ax.bar(
            [x + i * width for x in xs], [counts[x] for x in xs], width, label=f"{queue} {outcome}"
        )
    ax.set_xlabel("attempts")
    ax.set_ylabel("jobs")
    ax.set_title("Attempts per finished job")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _backlog(rows: Rows, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 3.5))
    series: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
    for r in rows:
        series[_name(r)].append((_when(r["due_hour_ms"]), r["jobs"]))
    for queue, points in sorted(series.items()):
        xs, ys = zip(*points, strict=True)
        ax.bar(xs, ys, width=1 / 24 * 0.9, align="edge", alpha=0.7, label=queue)
    ax.set_ylabel("waiting jobs")
    ax.set_title("Backlog by due hour (UTC)")
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(rows: Rows, columns: list[str] | None = None) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    cols = columns or list(rows[0])

    def cell(column: str, v: Any) -> str:
        if column in _INSTANTS and v is not None:
            return f"{_when(v):%Y-%m-%d %H:%M:%S}"
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
        return html.escape("" if v is None else str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell(c, r.get(c))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render(out: Path, tables: dict[str, Rows], *, bin_ms: int) -> Path:
    """Draws the charts beside the tables and writes ``out/report.html``."""
    out.mkdir(parents=True, exist_ok=True)
    _throughput(tables["throughput"], out / "throughput.png", bin_ms)
    _lateness(tables["summary"], out / "lateness.png")
    _attempts(tables["attempts"], out / "attempts.png")
    _backlog(tables["backlog"], out / "backlog.png")
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>delayq lifecycle report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}}</style></head><body>
<h1>delayq lifecycle report</h1>
<p>Generated {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC from exported lifecycle events.</p>
<h2>Per queue</h2>{_table(tables["summary"])}
<h2>Delivery lateness</h2><img src="lateness.png" alt="lateness">
<h2>Enqueue to ack</h2>{
        _table(
            tables["summary"],
            ["namespace", "queue", "acked"] + [c for c in tables["summary"][0] if "ack_" in c]
            if tables["summary"]
            else None,
        )
    }
<h2>Attempts</h2><img src="attempts.png" alt="attempts">{_table(tables["attempts"])}
<h2>Dead letters, expiries and retries: top reasons</h2>{_table(tables["reasons"])}
<h2>Throughput over time</h2><img src="throughput.png" alt="throughput">
<h2>Backlog by due time</h2><img src="backlog.png" alt="backlog">{_table(tables["backlog"])}
</body></html>
"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
