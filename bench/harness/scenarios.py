"""What is measured: scenario parameters per system and the figures taken from each run."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from bench.harness.stats import percentile

# Enqueue rates assumed before one is measured, to schedule lateness jobs far enough ahead.
DEFAULT_ENQUEUE_RATE = {"delayq": 15_000.0, "bullmq": 15_000.0, "arq": 3_000.0}


@dataclass(frozen=True)
class Metric:
    """One row of the results table."""

    key: str
    label: str
    unit: str
    better: str  # "lower" or "higher"
    target: str = ""


def metrics(rates: list[int]) -> list[Metric]:
    rows: list[Metric] = []
    for rate in rates:
        target = "<= 5 ms" if rate == 1000 else ""
        rows += [
            Metric(f"lateness_p50@{rate}", f"lateness p50 @ {rate:,}/s due", "ms", "lower"),
            Metric(f"lateness_p99@{rate}", f"lateness p99 @ {rate:,}/s due", "ms", "lower", target),
            Metric(f"lateness_max@{rate}", f"lateness max @ {rate:,}/s due", "ms", "lower"),
            Metric(
                f"early@{rate}", f"early deliveries @ {rate:,}/s (all runs)", "jobs", "lower", "0"
            ),
        ]
    rows += [
        Metric("enqueue_single", "enqueue, single calls (concurrent)", "jobs/s", "higher"),
        Metric("enqueue_batch", "enqueue, batched (best API)", "jobs/s", "higher", ">= 50,000"),
        Metric("drain", "drain: consume + ack, all due", "jobs/s", "higher", ">= 20,000"),
        Metric("bytes_per_job", "Redis bytes per delayed job", "B", "lower", "<= 300"),
        Metric("redelivery", "redelivery after worker SIGKILL", "s", "lower", "<= 1"),
    ]
    return rows


@dataclass(frozen=True)
class Step:
    """One scenario to run for one system, with the figures it yields."""

    scenario: str  # runner scenario name
    name: str  # display name
    params: dict[str, Any]

    def figures(self, result: dict[str, Any]) -> dict[str, float]:
        """Figures of one run, keyed like Metric.key."""
        if self.scenario == "lateness":
            rate = int(self.params["rate"])
            late: list[float] = result["lateness_ms"]
            return {
                f"lateness_p50@{rate}": percentile(late, 50),
                f"lateness_p99@{rate}": percentile(late, 99),
                f"lateness_max@{rate}": max(late) if late else math.nan,
                f"early@{rate}": float(sum(1 for v in late if v < 0)),
            }
        if self.name == "memory":
            return {"bytes_per_job": result["redis_used_memory_delta"] / self.params["jobs"]}
        if self.scenario == "enqueue":
            return {f"enqueue_{self.params['mode']}": float(result["rate"])}
        if self.scenario == "drain":
            return {"drain": float(result["rate"])}
        seconds = result["seconds"]
        return {"redelivery": math.inf if seconds is None else float(seconds)}

    def sanity(self, system: str, result: dict[str, Any]) -> list[str]:
        """Problems with one run that make its figures meaningless (never timing thresholds)."""
        problems: list[str] = []
        where = f"{system} {self.name}"
        if self.scenario == "lateness":
            if result["received"] != result["jobs"]:
                problems.append(f"{where}: {result['received']} of {result['jobs']} delivered")
            if result["duplicates"]:
                problems.append(f"{where}: {result['duplicates']} duplicate deliveries")
            early = sum(1 for v in result["lateness_ms"] if v < 0)
            if system == "delayq" and early:
                problems.append(f"{where}: {early} early deliveries")
        elif self.scenario == "drain" and result["acked"] != result["jobs"]:
            problems.append(f"{where}: {result['acked']} of {result['jobs']} acked")
        elif self.scenario == "enqueue" and not result["rate"] > 0:
            problems.append(f"{where}: no enqueue rate")
        elif self.scenario == "redelivery" and system == "delayq" and result["seconds"] is None:
            problems.append(f"{where}: job never redelivered")
        if self.name == "memory" and result["redis_used_memory_delta"] <= 0:
            problems.append(f"{where}: Redis memory did not grow")
        return problems


def best_enqueue_mode(system: str) -> str:
    """arq has no batch API; its best is concurrent single calls."""
    return "single" if system == "arq" else "batch"


def lead_s(system: str, jobs: int, enqueue_rate: float) -> float:
    """How far ahead the first lateness job is due: all jobs are stored before any falls due."""
    rate = enqueue_rate if enqueue_rate > 0 else DEFAULT_ENQUEUE_RATE[system]
    return round(1.5 + 1.3 * jobs / rate, 2)


def plan(system: str, args: argparse.Namespace) -> list[Step]:
    """The steps for one system, in order (enqueue first: lateness leads use its rate)."""
    common = {
        "batch_size": args.batch_size,
        "batch_concurrency": args.batch_concurrency,
        "concurrency": args.worker_concurrency,
        "enqueue_concurrency": args.enqueue_concurrency,
        "max_outstanding": args.max_outstanding,
        "max_batch": args.max_batch,
    }
    steps: list[Step] = []
    wanted = set(args.scenarios)
    if "enqueue" in wanted:
        steps.append(
            Step(
                "enqueue",
                "enqueue single",
                {
                    **common,
                    "mode": "single",
                    "jobs": args.enqueue_single_jobs,
                    "concurrency": args.enqueue_concurrency,
                },
            )
        )
        if system != "arq":
            steps.append(
                Step(
                    "enqueue",
                    "enqueue batched",
                    {**common, "mode": "batch", "jobs": args.enqueue_batch_jobs},
                )
            )
    if "memory" in wanted:
        steps.append(
            Step(
                "enqueue",
                "memory",
                {
                    **common,
                    "mode": best_enqueue_mode(system),
                    "jobs": args.memory_jobs,
                    "concurrency": args.enqueue_concurrency,
                },
            )
        )
    if "lateness" in wanted:
        for rate in args.lateness_rates:
            jobs = int(rate * args.lateness_duration)
            steps.append(
                Step(
                    "lateness",
                    f"lateness @{rate:,}/s",
                    {
                        **common,
                        "rate": rate,
                        "jobs": jobs,
                        "lead_s": lead_s(system, jobs, 0),
                        "grace_s": args.lateness_grace,
                    },
                )
            )
    if "drain" in wanted:
        steps.append(Step("drain", "drain", {**common, "jobs": args.drain_jobs}))
    if "redelivery" in wanted:
        steps.append(Step("redelivery", "redelivery", {"timeout_s": args.redelivery_timeout}))
    return steps
