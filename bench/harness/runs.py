"""One measurement: a fresh Redis (and delayq server), one runner process, its result."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import procs
from bench.harness.profiles import CpuSampler, summarize
from tests.support.servers import DelayqProcess, ManagedRedis

SYSTEMS = ("delayq", "bullmq", "arq")
# Redis' own listpack limits (the managed redis-server raises them for delayq's record
# groups): every system is measured on the Redis a user would run by default.
# `make bench-memory` shows delayq on both (docs/decisions.md, memory layout v2).
STOCK_REDIS = ["--hash-max-listpack-value", "64", "--hash-max-listpack-entries", "512"]
LABELS = {"delayq": "delayq", "bullmq": "BullMQ", "arq": "arq"}
PEERS = procs.REPO / "bench" / "peers"
ARQ_PYTHON = PEERS / ".venv" / "bin" / "python"


@dataclass
class Tools:
    """Where each system's runner lives; checked once before the first run."""

    python: str
    node: str
    arq_python: str
    py_spy: str | None

    @classmethod
    def find(cls, systems: list[str], profile: bool) -> Tools:
        python = sys.executable  # .venv's: it has the delayq server, client and stubs
        node = shutil.which("node") or ""
        if "bullmq" in systems and (not node or not (PEERS / "node_modules" / "bullmq").exists()):
            raise SystemExit("BullMQ is not installed: run `make bench-deps`")
        if "arq" in systems and not ARQ_PYTHON.exists():
            raise SystemExit("arq's venv is missing: run `make bench-deps`")
        py_spy = shutil.which("py-spy", path=str(Path(python).parent)) if profile else None
        if profile and py_spy is None:
            raise SystemExit("--profile needs py-spy: run `make bench-deps`")
        return cls(python, node, str(ARQ_PYTHON), py_spy)


def runner_command(tools: Tools, system: str) -> list[str]:
    if system == "delayq":
        return [tools.python, "-m", "bench.harness.delayq_runner"]
    if system == "bullmq":
        return [tools.node, str(PEERS / "bullmq_runner.mjs")]
    return [tools.arq_python, "-m", "bench.peers.arq_runner"]


class Profiler:
    """py-spy recording of one process, written as collapsed stacks and an SVG flame graph."""

    def __init__(self, py_spy: str, pid: int, out: Path) -> None:
        self.out = out
        self.procs = [
            subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    "250",
                    "--nonblocking",
                    "--format",
                    fmt,
                    "--output",
                    str(out.with_suffix(ext)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for fmt, ext in (("raw", ".txt"), ("flamegraph", ".svg"))
        ]
        time.sleep(0.3)  # let py-spy attach before the measured work starts

    def finish(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        raw = self.out.with_suffix(".txt")
        if raw.exists():
            self.out.with_name(self.out.name + "-top.txt").write_text(summarize(raw))


def run_once(
    tools: Tools,
    system: str,
    scenario: str,
    params: dict[str, Any],
    *,
    timeout: float,
    profile: Path | None = None,
) -> dict[str, Any]:
    """Run one scenario on fresh processes: the runner's result, plus Redis memory growth
    and the CPU seconds of each process (runner, redis, delayq server)."""
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="delayq-bench-")))
        redis = stack.enter_context(
            ManagedRedis(workdir / "redis", appendonly=False, extra=STOCK_REDIS)
        )
        url = redis.url
        command = [*runner_command(tools, system), scenario, "--redis-url", url]
        assert redis.proc is not None
        pids = {"redis": redis.proc.pid}
        server: DelayqProcess | None = None
        if system == "delayq":
            server = stack.enter_context(DelayqProcess(url))
            assert server.proc is not None
            pids["server"] = server.proc.pid
            command += ["--target", server.address]
        out = workdir / "result.json"
        command += ["--params", json.dumps(params), "--out", str(out)]
        memory_before = procs.used_memory(url)
        profilers: list[Profiler] = []
        runner = subprocess.Popen(command, cwd=procs.REPO)
        stack.callback(procs.stop, runner)  # a no-op once it has exited
        pids["runner"] = runner.pid
        if profile is not None and tools.py_spy is not None and system == "delayq":
            profile.parent.mkdir(parents=True, exist_ok=True)
            profilers = [
                Profiler(tools.py_spy, pids["server"], profile.with_name(profile.name + "-server")),
                Profiler(tools.py_spy, runner.pid, profile.with_name(profile.name + "-client")),
            ]
        cpu = CpuSampler(pids)
        try:
            code = runner.wait(timeout)
        except subprocess.TimeoutExpired:
            runner.kill()
            runner.wait()
            raise RuntimeError(f"{system} {scenario} runner took over {timeout:.0f}s") from None
        finally:
            usage = cpu.stop()
            for profiler in profilers:
                profiler.finish()
        if code != 0:
            tail = "".join(server.output)[-2000:] if server is not None else ""
            raise RuntimeError(f"{system} {scenario} runner exited with {code}\n{tail}")
        result: dict[str, Any] = json.loads(out.read_text())
        result["redis_used_memory_delta"] = procs.used_memory(url) - memory_before
        result["cpu"] = usage
        return result
