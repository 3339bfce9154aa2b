"""`python -m bench.harness`: delayq, BullMQ and arq side by side; prints and writes one table.

Every run gets a fresh redis-server (and, for delayq, a fresh server); systems run one at a
time, taking turns run by run within each step (`schedule`), so each ratio compares figures
of the same minutes. Results go to bench/results/ (Markdown, JSON, PNG); --quick writes to
.run/bench-quick.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import plots, report
from bench.harness.procs import REPO
from bench.harness.runs import LABELS, SYSTEMS, Tools, run_once
from bench.harness.scenarios import Step, best_enqueue_mode, lead_s, metrics, plan, schedule
from bench.harness.stats import Figure

SCENARIOS = ("enqueue", "memory", "lateness", "drain", "redelivery")
FULL = {
    "runs": 3,
    "lateness_rates": [1000, 10000],
    "lateness_duration": 30.0,
    "enqueue_single_jobs": 20_000,
    "enqueue_latency_jobs": 2_000,
    "enqueue_batch_jobs": 100_000,
    "memory_jobs": 100_000,
    "drain_jobs": 50_000,
    "redelivery_timeout": 90.0,
    "lateness_grace": 300.0,
    "out": str(REPO / "bench" / "results"),
}
QUICK = {
    "runs": 1,
    "lateness_rates": [1000],
    "lateness_duration": 1.0,
    "enqueue_single_jobs": 3_000,
    "enqueue_latency_jobs": 200,
    "enqueue_batch_jobs": 20_000,
    "memory_jobs": 4_000,
    "drain_jobs": 2_000,
    "redelivery_timeout": 3.0,
    "lateness_grace": 60.0,
    "out": str(REPO / ".run" / "bench-quick"),
}


def csv(kind: type) -> Any:
    return lambda text: [kind(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.harness",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke: small counts, 1 run, peers' redelivery capped; < 2 min",
    )
    p.add_argument("--systems", type=csv(str), default=list(SYSTEMS))
    p.add_argument("--scenarios", type=csv(str), default=list(SCENARIOS))
    p.add_argument("--runs", type=int, help="runs per figure (median, min, max)")
    p.add_argument(
        "--lateness-rates",
        type=csv(int),
        help="jobs/s falling due, one scenario each (default 1000,10000; --quick 1000)",
    )
    p.add_argument("--lateness-duration", type=float, help="seconds of jobs falling due per rate")
    p.add_argument("--lateness-grace", type=float, help="seconds allowed after the last due time")
    p.add_argument("--enqueue-single-jobs", type=int)
    p.add_argument("--enqueue-latency-jobs", type=int, help="sequential calls for the p50")
    p.add_argument("--enqueue-batch-jobs", type=int)
    p.add_argument("--memory-jobs", type=int, help="delayed jobs stored for bytes/job")
    p.add_argument("--drain-jobs", type=int)
    p.add_argument("--redelivery-timeout", type=float, help="seconds to wait for a redelivery")
    p.add_argument("--batch-size", type=int, default=1000, help="jobs per batch call")
    p.add_argument("--batch-concurrency", type=int, default=2, help="batch calls in flight")
    p.add_argument(
        "--enqueue-concurrency", type=int, default=50, help="concurrent single-call producers"
    )
    p.add_argument(
        "--worker-concurrency",
        type=int,
        default=100,
        help="peers' worker concurrency (BullMQ concurrency, arq max_jobs)",
    )
    p.add_argument("--max-outstanding", type=int, default=2000, help="delayq stream credit")
    p.add_argument("--max-batch", type=int, default=0, help="delayq deliveries per message")
    p.add_argument("--out", help="directory for results.md, results.json and the plots")
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the delayq server and client per scenario (1 run, own dir)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 on sanity problems (counts, early deliveries); implied by --quick",
    )
    args = p.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.profile:
        args.runs = 1
        args.systems = ["delayq"]
        args.out = str(Path(args.out) / "profile")
    args.check = args.check or args.quick
    unknown = set(args.systems) - set(SYSTEMS) | set(args.scenarios) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown systems or scenarios: {sorted(unknown)}")
    return args


def measured_enqueue_rate(figures: dict[str, dict[str, Figure]], system: str) -> float:
    fig = figures.get(f"enqueue_{best_enqueue_mode(system)}", {}).get(system)
    return fig.median if fig is not None and not math.isnan(fig.median) else 0.0


def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like Ctrl-C, so every redis-server, server and runner is stopped.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    args = parse_args(argv)
    tools = Tools.find(args.systems, args.profile)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict[str, dict[str, Figure]] = {}
    samples: dict[int, dict[str, list[float]]] = {}
    problems: list[str] = []
    cpu: dict[str, dict[str, list[dict[str, float]]]] = {}
    plans = {system: plan(system, args) for system in args.systems}
    turns = schedule(plans, args.runs)
    step_params: dict[tuple[str, str], dict[str, Any]] = {}
    started = time.monotonic()
    for done, (system, step, run) in enumerate(turns, 1):
        params = step_params.get((system, step.name))
        if params is None:
            params = step_params[system, step.name] = dict(step.params)
            if step.scenario == "lateness":
                # The system's own enqueue figures exist by now: enqueue steps come first.
                rate = measured_enqueue_rate(figures, system)
                params["lead_s"] = lead_s(system, int(params["jobs"]), rate)
                samples.setdefault(int(params["rate"]), {})[system] = []
        print(
            f"[{done}/{len(turns)} {time.monotonic() - started:5.0f}s] {LABELS[system]}: "
            f"{step.name} (run {run + 1}/{args.runs})",
            file=sys.stderr,
            flush=True,
        )
        timeout = 600 + float(params.get("lead_s", 0)) + args.redelivery_timeout
        slug = re.sub(r"[^a-z0-9]+", "-", step.name.replace(",", ""))
        try:
            result = run_once(
                tools,
                system,
                step.scenario,
                params,
                timeout=timeout,
                profile=out / f"profile-{slug}" if args.profile else None,
            )
        except RuntimeError as err:
            problems.append(f"{system} {step.name}: {err}")
            print(f"    FAILED: {err}", file=sys.stderr, flush=True)
            continue
        problems += Step(step.scenario, step.name, params).sanity(system, result)
        cpu.setdefault(system, {}).setdefault(step.name, []).append(result["cpu"])
        print(f"    cpu: {result['cpu']}", file=sys.stderr, flush=True)
        for key, value in Step(step.scenario, step.name, params).figures(result, system).items():
            figures.setdefault(key, {}).setdefault(system, Figure()).runs.append(value)
            print(f"    {key} = {value:,.3f}", file=sys.stderr, flush=True)
        if step.scenario == "lateness":
            samples[int(params["rate"])][system] += result["lateness_ms"]
    write(args, out, figures, samples, problems, cpu)
    return 1 if problems and args.check else 0


def write(
    args: argparse.Namespace,
    out: Path,
    figures: dict[str, dict[str, Figure]],
    samples: dict[int, dict[str, list[float]]],
    problems: list[str],
    cpu: dict[str, dict[str, list[dict[str, float]]]],
) -> None:
    rows = metrics(args.lateness_rates)
    params = {k: v for k, v in vars(args).items() if k not in ("out", "check")}
    meta = report.machine()
    pngs: list[str] = []
    if samples:
        pngs.append(str(plots.lateness_cdf(samples, out / "lateness.png")))
    panels = [
        (m.label, m.unit, figures[m.key])
        for m in rows
        if m.key
        in (
            "enqueue_single",
            "enqueue_batch",
            "drain",
            "bytes_per_job_dense",
            "bytes_per_job_sparse",
            "redelivery",
            "redelivery_stop",
        )
        and m.key in figures
    ]
    if panels:
        bars = plots.bars(
            panels, args.systems, out / "throughput.png", timeout=args.redelivery_timeout
        )
        pngs.append(str(bars))
    md = report.markdown(rows, figures, args.systems, meta, params, pngs, problems)
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(
        json.dumps(report.record(figures, meta, params, problems, cpu), indent=2) + "\n"
    )
    print()
    print(report.table(rows, figures, args.systems, float(args.redelivery_timeout)))
    print()
    for problem in problems:
        print(f"SANITY: {problem}")
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {len(pngs)} plots")


if __name__ == "__main__":
    sys.exit(main())
