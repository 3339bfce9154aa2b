"""PNG plots: lateness distributions (CDF) and throughput bars with min/max whiskers."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from bench.harness.runs import LABELS
from bench.harness.stats import Figure

COLORS = {"delayq": "#1b9e77", "bullmq": "#d95f02", "arq": "#7570b3"}
FLOOR_MS = 0.1  # log axis: on-time deliveries (lateness <= 0.1 ms) sit at the left edge


def lateness_cdf(samples: dict[int, dict[str, list[float]]], path: Path) -> Path:
    """One panel per rate: fraction of jobs delivered within x ms of their due time."""
    rates = sorted(samples)
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates, strict=True):
        for system, values in samples[rate].items():
            if not values:
                continue
            ordered = sorted(max(v, FLOOR_MS) for v in values)
            n = len(ordered)
            ax.step(
                ordered,
                [(i + 1) / n for i in range(n)],
                where="post",
                color=COLORS[system],
                label=f"{LABELS[system]} (n={n:,})",
            )
        ax.set_xscale("log")
        ax.set_xlabel("lateness: delivery time - due time (ms, log)")
        ax.set_ylabel("fraction of jobs delivered")
        ax.set_title(f"due-time lateness, ~{rate:,} jobs/s falling due")
        ax.axhline(0.99, color="grey", lw=0.6, ls=":")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bars(
    panels: list[tuple[str, str, dict[str, Figure]]],
    systems: list[str],
    path: Path,
    *,
    timeout: float,
    log_units: tuple[str, ...] = ("s",),
) -> Path:
    """One bar panel per measure: median with min/max whiskers, value printed on the bar.

    A run that timed out is drawn at the timeout, hatched and labelled "> timeout".
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 4.2), squeeze=False)
    for ax, (title, unit, figs) in zip(axes[0], panels, strict=True):
        shown = [s for s in systems if s in figs and not math.isnan(figs[s].median)]
        for i, system in enumerate(shown):
            f = figs[system]
            runs = [timeout if math.isinf(v) else v for v in f.measured]
            med = timeout if math.isinf(f.median) else f.median
            ax.bar(
                i,
                med,
                color=COLORS[system],
                hatch="//" if math.isinf(f.median) else None,
                yerr=[[med - min(runs)], [max(runs) - med]],
                capsize=4,
            )
            if math.isinf(f.median):
                label = f"> {timeout:.0f} (timeout)"
            else:
                label = f"{med:,.0f}" if med >= 10 else f"{med:.3g}"
            ax.annotate(label, (i, med), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(shown)), [LABELS[s] for s in shown])
        if unit in log_units:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(unit + (" (log)" if unit in log_units else ""))
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
