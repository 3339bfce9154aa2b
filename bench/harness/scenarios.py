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


# Steps whose CPU cost per job gets a row (display names, as in plan()).
CPU_STEPS = ("enqueue single", "enqueue batched", "drain")
SPREADS = {"dense": 3600.0, "sparse": 30 * 86400.0}


def cpu_key(step_name: str) -> str:
    return f"cpu_per_1k@{step_name}"


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
        Metric(
            "enqueue_single",
            "enqueue, single calls, 50 callers (delayq: Python AsyncClient, batching)",
            "jobs/s",
            "higher",
            ">= BullMQ",
        ),
        Metric("enqueue_unary", "enqueue, unary RPC, 50 in flight (raw stub)", "jobs/s", "higher"),
        Metric("enqueue_p50_c1", "enqueue, one call at a time: p50", "ms", "lower", "< 0.5"),
        Metric(
            "enqueue_client_p50_c1",
            "enqueue, one at a time through the Python AsyncClient (EnqueueStream): p50",
            "ms",
            "lower",
        ),
        Metric("enqueue_batch", "enqueue, batched (best API)", "jobs/s", "higher", ">= 2x BullMQ"),
        Metric("drain", "drain: consume + ack, all due", "jobs/s", "higher", ">= 20,000"),
        Metric(
            "bytes_per_job_dense",
            "Redis bytes per delayed job, due over 1 h",
            "B",
            "lower",
            "<= 300",
        ),
        Metric(
            "bytes_per_job_sparse",
            "Redis bytes per delayed job, due over 30 d",
            "B",
            "lower",
            "<= 300",
        ),
        Metric("redelivery", "redelivery after worker SIGKILL", "s", "lower", "<= 1"),
        Metric(
            "redelivery_stop",
            "redelivery after worker SIGSTOP (waits for the 30 s lease / lock)",
            "s",
            "lower",
        ),
    ]
    names = [f"lateness @{rate:,}/s" for rate in rates] + list(CPU_STEPS)
    cpu_targets = {"lateness @1,000/s": "< 0.15"}
    rows += [
        Metric(
            cpu_key(n),
            f"CPU s per 1,000 jobs, {n} (delayq server; peers: their worker process)",
            "s/1k",
            "lower",
            cpu_targets.get(n, ""),
        )
        for n in names
    ]
    return rows


@dataclass(frozen=True)
class Step:
    """One scenario to run for one system, with the figures it yields."""

    scenario: str  # runner scenario name
    name: str  # display name
    params: dict[str, Any]

    def figures(self, result: dict[str, Any], system: str = "delayq") -> dict[str, float]:
        """Figures of one run, keyed like Metric.key."""
        out = self._figures(result)
        if self.name in CPU_STEPS or self.scenario == "lateness":
            # delayq's work is in its server; a peer's in its runner (worker, and producer).
            proc = "server" if system == "delayq" else "runner"
            cpu = result.get("cpu", {}).get(f"{proc}_cpu_s")
            jobs = result.get("jobs") or self.params.get("jobs")
            if cpu is not None and jobs:
                out[cpu_key(self.name)] = float(cpu) / float(jobs) * 1000
        return out

    def _figures(self, result: dict[str, Any]) -> dict[str, float]:
        if self.scenario == "lateness":
            rate = int(self.params["rate"])
            late: list[float] = result["lateness_ms"]
            return {
                f"lateness_p50@{rate}": percentile(late, 50),
                f"lateness_p99@{rate}": percentile(late, 99),
                f"lateness_max@{rate}": max(late) if late else math.nan,
                f"early@{rate}": float(sum(1 for v in late if v < 0)),
            }
        if self.name.startswith("memory"):
            spread = self.name.split()[-1]
            return {
                f"bytes_per_job_{spread}": result["redis_used_memory_delta"] / self.params["jobs"]
            }
        if self.scenario == "enqueue":
            if self.params["mode"] == "latency":
                return {"enqueue_p50_c1": float(result["p50_ms"])}
            if self.params["mode"] == "client_latency":
                return {"enqueue_client_p50_c1": float(result["p50_ms"])}
            return {f"enqueue_{self.params['mode']}": float(result["rate"])}
        if self.scenario == "drain":
            return {"drain": float(result["rate"])}
        seconds = result["seconds"]
        key = "redelivery_stop" if self.params.get("signal") == "STOP" else "redelivery"
        return {key: math.inf if seconds is None else float(seconds)}

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
        if self.name.startswith("memory") and result["redis_used_memory_delta"] <= 0:
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
        if system == "delayq":
            steps.append(
                Step(
                    "enqueue",
                    "enqueue unary",
                    {
                        **common,
                        "mode": "unary",
                        "jobs": args.enqueue_single_jobs,
                        "concurrency": args.enqueue_concurrency,
                    },
                )
            )
        steps.append(
            Step(
                "enqueue",
                "enqueue one at a time",
                {**common, "mode": "latency", "jobs": args.enqueue_latency_jobs},
            )
        )
        if system == "delayq":
            steps.append(
                Step(
                    "enqueue",
                    "enqueue one at a time (client)",
                    {**common, "mode": "client_latency", "jobs": args.enqueue_latency_jobs},
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
        for spread, spread_s in SPREADS.items():
            steps.append(
                Step(
                    "enqueue",
                    f"memory {spread}",
                    {
                        **common,
                        "mode": best_enqueue_mode(system),
                        "jobs": args.memory_jobs,
                        "concurrency": args.enqueue_concurrency,
                        "spread_s": spread_s,
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
        # A frozen worker's job waits for its 30 s lease: only a timeout beyond that shows it.
        for sig in ("KILL", "STOP") if args.redelivery_timeout > 30 else ("KILL",):
            steps.append(
                Step(
                    "redelivery",
                    f"redelivery SIG{sig}",
                    {"timeout_s": args.redelivery_timeout, "signal": sig},
                )
            )
    return steps


def schedule(plans: dict[str, list[Step]], runs: int) -> list[tuple[str, Step, int]]:
    """The order of the turns (system, step, run index): step by step, in each system's
    step order, and within a step the systems take turns run by run, the one that goes
    first rotating. Measured one system after the other, each ratio compared figures
    taken minutes apart, and this machine's speed moves with the hour (README)."""
    order: list[str] = []
    for steps in plans.values():
        at = -1  # where this system's previous step stands in the merged order
        for step in steps:
            if step.name in order:
                at = order.index(step.name)
            else:
                at += 1
                order.insert(at, step.name)
    by_name = {system: {s.name: s for s in steps} for system, steps in plans.items()}
    systems = list(plans)
    turns: list[tuple[str, Step, int]] = []
    for name in order:
        for run in range(runs):
            first = run % len(systems) if systems else 0
            for system in systems[first:] + systems[:first]:
                found = by_name[system].get(name)
                if found is not None:
                    turns.append((system, found, run))
    return turns
