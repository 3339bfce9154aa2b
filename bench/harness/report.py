"""The results table (Markdown, also printed) and the JSON record, with the machine."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness.procs import REPO
from bench.harness.runs import LABELS
from bench.harness.scenarios import Metric
from bench.harness.stats import Figure, ratio

Figures = dict[str, dict[str, Figure]]  # metric key -> system -> figure


def _run(*cmd: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, cwd=REPO)
        return out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        m = re.search(r"model name\s*:\s*(.+)", cpuinfo.read_text())
        cpu = m.group(1) if m else ""
    mem_gib = 0.0
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        m = re.search(r"MemTotal:\s*(\d+) kB", meminfo.read_text())
        mem_gib = int(m.group(1)) / 2**20 if m else 0.0
    versions = {
        "python": platform.python_version(),
        "redis": _run("redis-server", "--version").split(" v=")[-1].split()[0],
        "node": _run("node", "--version"),
        "bullmq": _package_version(REPO / "bench/peers/node_modules/bullmq/package.json"),
        "arq": _run(
            str(REPO / "bench/peers/.venv/bin/python"),
            "-c",
            "import arq.version; print(arq.version.VERSION)",
        ),
        "grpcio": _run(sys.executable, "-c", "import grpc; print(grpc.__version__)"),
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "commit": _run("git", "rev-parse", "--short", "HEAD"),
        # The delayq server runs from the working tree: say when it differs from the commit.
        "server_uncommitted": _run("git", "status", "--porcelain", "--", "server").splitlines(),
        "versions": versions,
    }


def _package_version(path: Path) -> str:
    try:
        return str(json.loads(path.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return ""


def fmt(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "timeout"
    if unit in ("jobs/s", "B", "jobs") or value >= 1000:
        return f"{value:,.0f}"
    if unit == "s" and value < 0.1:
        return f"{value:.3f}"
    if unit == "s/1k":
        return f"{value:.3f}"
    if unit == "ms" and abs(value) < 10:
        return f"{value:.2f}"
    return f"{value:.1f}"


def cell(fig: Figure | None, metric: Metric, timeout: float) -> str:
    if fig is None or not fig.runs:
        return "—"
    if metric.key.startswith("early@"):
        return fmt(sum(fig.measured), metric.unit)
    med = fig.median
    if math.isinf(med):
        return f"> {timeout:.0f} (timeout)"
    text = fmt(med, metric.unit)
    if len(fig.measured) > 1:
        high = fig.high
        high_text = f"> {timeout:.0f}" if math.isinf(high) else fmt(high, metric.unit)
        text += f" [{fmt(fig.low, metric.unit)}, {high_text}]"
    return text


def ratio_cell(figures: dict[str, Figure], peer: str, metric: Metric, timeout: float) -> str:
    ours, theirs = figures.get("delayq"), figures.get(peer)
    if ours is None or theirs is None or metric.key.startswith("early@"):
        return ""
    if math.isinf(theirs.median) and not math.isinf(ours.median):
        # The peer did not redeliver within the timeout: the ratio is at most this.
        return f"< {ours.median / timeout:.2g}x"
    r = ratio(ours.median, theirs.median)
    return "" if math.isnan(r) else f"{r:.3g}x"


def table(metrics: list[Metric], figures: Figures, systems: list[str], timeout: float) -> str:
    """Markdown table: median [min, max] per system, then delayq/peer ratios."""
    peers = [s for s in systems if s != "delayq"]
    head = ["measure", "unit", *(LABELS[s] for s in systems)]
    if "delayq" in systems:
        head += [f"delayq/{LABELS[p]}" for p in peers] + ["delayq target"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for metric in metrics:
        row_figs = figures.get(metric.key, {})
        if not row_figs:
            continue
        row = [metric.label, metric.unit]
        row += [cell(row_figs.get(s), metric, timeout) for s in systems]
        if "delayq" in systems:
            row += [ratio_cell(row_figs, p, metric, timeout) for p in peers] + [metric.target]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def markdown(
    metrics: list[Metric],
    figures: Figures,
    systems: list[str],
    meta: dict[str, Any],
    params: dict[str, Any],
    plots: list[str],
    problems: list[str],
) -> str:
    v = meta["versions"]
    timeout = float(params["redelivery_timeout"])
    out = [
        "# delayq benchmark results",
        "",
        f"{meta['date']} · {meta['cores']} cores ({meta['cpu']}) · {meta['memory_gib']} GiB · "
        f"Linux {meta['kernel']} · commit {meta['commit']} · "
        f"load average at end {meta['loadavg_at_end']}",
        f"Redis {v['redis']} · Python {v['python']} (grpcio {v['grpcio']}) · Node {v['node']} · "
        f"BullMQ {v['bullmq']} · arq {v['arq']}",
        *(
            [
                f"delayq server from the working tree: {len(meta['server_uncommitted'])} files "
                "under server/ differed from the commit at the end of the run"
            ]
            if meta.get("server_uncommitted")
            else []
        ),
        "",
        f"Each figure: median of {params['runs']} runs [min, max]; every run on a fresh "
        "redis-server (and delayq server), one system at a time, taking turns run by run; "
        "ratios are delayq/peer medians.",
        "",
        table(metrics, figures, systems, timeout),
        "",
    ]
    if problems:
        out += ["**Sanity problems:**", "", *(f"- {p}" for p in problems), ""]
    out += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    out += ["", "Parameters:", "", "```json", json.dumps(params, indent=2), "```", ""]
    return "\n".join(out)


def record(
    figures: Figures,
    meta: dict[str, Any],
    params: dict[str, Any],
    problems: list[str],
    cpu: dict[str, Any],
) -> dict[str, Any]:
    """The JSON written beside the Markdown (with CPU seconds per process and run)."""
    return {
        "cpu_per_run": cpu,
        "machine": meta,
        "params": params,
        "figures": {
            key: {system: fig.as_json() for system, fig in by_system.items()}
            for key, by_system in figures.items()
        },
        "problems": problems,
    }
