"""`make chaos`: every fault, several rounds, the same-second burst at full size; prints
the checker's table per fault and for the whole run (docs/chaos.md)."""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.chaos import faults
from tests.chaos.checker import Report, format_table


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=faults.SOAK.rounds, help="faults per run")
    p.add_argument("--acks", type=int, default=faults.SOAK.after_acks, help="acks between faults")
    p.add_argument("--burst", type=int, default=faults.SOAK.burst, help="jobs due in one second")
    p.add_argument(
        "--burst-rate",
        type=float,
        default=faults.SOAK.burst_rate,
        help="enqueue rate (jobs/s) assumed when placing the burst's due second",
    )
    p.add_argument("--only", action="append", default=[], help="fault name (repeatable)")
    p.add_argument("--out", type=Path, default=None, help="keep histories here")
    args = p.parse_args(argv)
    # SIGTERM (and SIGINT, which a background shell ignores) unwind through the
    # clusters' clean-up instead of orphaning servers, workers and redis-servers.
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    scale = dataclasses.replace(
        faults.SOAK,
        rounds=args.rounds,
        warmup_acks=args.acks,
        after_acks=args.acks,
        burst=args.burst,
        burst_rate=args.burst_rate,
    )
    chosen = [f for f in faults.FAULTS if not args.only or f.name in args.only]
    out = args.out or Path(tempfile.mkdtemp(prefix="delayq-chaos-"))
    reports: list[Report] = []
    for i, fault in enumerate(chosen):
        started = time.monotonic()
        workdir = out / f"{i:02d}-{fault.name.replace(' ', '_').replace('/', '_')}"
        try:
            rep = faults.run(fault, workdir, seed=args.seed + i, scale=scale)
        except (AssertionError, TimeoutError) as exc:  # the fault did not happen as planned
            rep = Report(name=fault.name)
            rep.add("lost", "-", f"run aborted: {exc}")
        print(rep.summary(), flush=True)
        print(
            f"  ({time.monotonic() - started:.0f}s, {rep.info}, history in {workdir})\n", flush=True
        )
        reports.append(rep)
    table = format_table(reports)
    print(table)
    (out / "table.txt").write_text(table + "\n")
    return 1 if any(r.failed for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
