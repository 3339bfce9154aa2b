"""A chaos cluster: one Redis, N server replicas, worker processes and producer threads."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import redis
from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import job_pb2, service_pb2, service_pb2_grpc
from tests.chaos import payload
from tests.chaos.history import (
    FAIL,
    INDEFINITE_CODES,
    INFO,
    INVOKE,
    OK,
    Recorder,
    load,
    now_ms,
    outcome_of,
)
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis

NAMESPACE, QUEUE = "chaos", "q"
CALL_TIMEOUT_S = 2.0
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def ts(ms: float) -> timestamp_pb2.Timestamp:
    ms_int = int(ms)
    return timestamp_pb2.Timestamp(seconds=ms_int // 1000, nanos=(ms_int % 1000) * 1_000_000)


def ts_ms(t: timestamp_pb2.Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def dur(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


SHIM_SOURCE = ROOT / "tests" / "durability" / "unsynced_writes.c"


def build_crash_shim(directory: Path) -> Path:
    """The LD_PRELOAD shim that makes kill -9 of Redis lose what a power cut would
    (unsynced AOF writes; tests/durability/unsynced_writes.c), built with gcc."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "the chaos suite needs a C compiler for the crash shim (apt-get install gcc)"
    out = directory / "unsynced_writes.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIM_SOURCE), "-ldl", "-lpthread"],
        check=True,
    )
    return out


def wait_for(
    what: str, predicate: Callable[[], bool], timeout: float, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"chaos: {what} not reached within {timeout:.0f}s")


class Producer(threading.Thread):
    """Enqueues paced single jobs, half with a delay and half with a due time."""

    def __init__(self, cluster: Cluster, name: str, rate: float, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.cluster = cluster
        self.rec = Recorder(cluster.history_dir / f"{name}.jsonl", name)
        self.rate = rate
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.ok = 0
        self.codes: dict[str, int] = {}
        self.n = 0
        self.server = seed  # index of the replica in use; the next one after a failure

    def run(self) -> None:
        channels = [grpc.insecure_channel(s.address) for s in self.cluster.servers]
        stubs = [service_pb2_grpc.DelayQueueServiceStub(c) for c in channels]
        try:
            while not self.halt.is_set():
                self.n += 1
                if not self.enqueue(stubs[self.server % len(stubs)]):
                    self.server += 1
                self.halt.wait(1 / self.rate)  # pacing, not synchronisation
        finally:
            for c in channels:
                c.close()
            self.rec.close()

    def enqueue(self, stub: service_pb2_grpc.DelayQueueServiceStub) -> bool:
        key = f"{self.name}-{self.n}"
        delay = self.rng.randint(0, self.cluster.max_delay_ms)
        req = service_pb2.EnqueueRequest(
            namespace=NAMESPACE,
            queue=QUEUE,
            payload=payload.make(key),
            max_attempts=self.cluster.max_attempts,
        )
        op = self.rec.next_op_id()
        start = now_ms()
        if self.rng.random() < 0.5:
            req.delay.CopyFrom(dur(delay))
        else:
            req.due_time.CopyFrom(ts(start + delay))
        self.rec.record(INVOKE, "enqueue", op=op, key=key, want_due=float(int(start + delay)))
        try:
            resp = stub.Enqueue(req, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as err:
            kind, code = outcome_of(err)
            self.codes[code] = self.codes.get(code, 0) + 1
            self.rec.record(kind, "enqueue", op=op, key=key, result=code)
            return False
        self.ok += 1
        self.rec.record(OK, "enqueue", op=op, key=key, job=resp.job_id, due=ts_ms(resp.due_time))
        return True


class Cluster:
    """Everything one chaos run needs; every fault is recorded in the history."""

    def __init__(
        self,
        workdir: Path,
        *,
        seed: int,
        servers: int = 2,
        workers: int = 3,
        producers: int = 2,
        rate: float = 40.0,
        appendfsync: str = "always",
        server_args: Sequence[Sequence[str]] = (),
        lease_ms: int = 2_000,
        hold_ms: int = 50,
        max_delay_ms: int = 1_500,
        max_attempts: int = 25,
        power_cut: bool = False,
    ) -> None:
        self.workdir = workdir
        self.history_dir = workdir / "history"
        self.history_dir.mkdir(parents=True, exist_ok=True)
        self.seed = seed
        # power_cut: kill -9 of Redis also loses its unsynced AOF writes, as a
        # machine crash would (the page cache otherwise keeps them).
        env = {**os.environ, "LD_PRELOAD": str(build_crash_shim(workdir))} if power_cut else None
        self.redis = ManagedRedis(
            workdir / "redis", appendonly=True, appendfsync=appendfsync, env=env
        )
        self.n_servers, self.n_workers, self.n_producers = servers, workers, producers
        self.rate = rate
        self.server_args = [list(a) for a in server_args]
        self.lease_ms, self.hold_ms = lease_ms, hold_ms
        self.max_delay_ms, self.max_attempts = max_delay_ms, max_attempts
        self.servers: list[DelayqProcess] = []
        self.workers: list[subprocess.Popen[bytes] | None] = []
        self.producers: list[Producer] = []
        self.nemesis = Recorder(self.history_dir / "nemesis.jsonl", "nemesis")
        self.stopped: set[int] = set()  # pids under SIGSTOP, resumed before teardown

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> Cluster:
        self.redis.start()
        for i in range(self.n_servers):
            extra = self.server_args[i] if i < len(self.server_args) else []
            args = ["--shards-per-queue", "2", "--completed-retention", "1h", *extra]
            self.servers.append(DelayqProcess(self.redis.url, args).start())
        self.workers = [self._spawn_worker(i) for i in range(self.n_workers)]
        return self

    def start_load(self) -> None:
        per = self.rate / self.n_producers
        self.producers = [
            Producer(self, f"producer-{i}", per, self.seed * 100 + i)
            for i in range(self.n_producers)
        ]
        for p in self.producers:
            p.start()

    def stop_load(self) -> None:
        for p in self.producers:
            p.halt.set()
        for p in self.producers:
            p.join(30)

    def close(self) -> None:
        for pid in list(self.stopped):
            self._signal(pid, signal.SIGCONT)
        self.stop_load()
        for w in self.workers:
            if w and w.poll() is None:
                w.terminate()
        for w in self.workers:
            if w:
                try:
                    w.wait(15)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
        for s in self.servers:
            s.kill()
        self.redis.stop()
        self.nemesis.close()

    def _spawn_worker(self, i: int) -> subprocess.Popen[bytes]:
        targets = ",".join(s.address for s in self.servers)
        cmd = [
            sys.executable, "-m", "tests.chaos.worker",
            "--name", f"worker-{i}",
            "--history", str(self.history_dir / f"worker-{i}.jsonl"),
            "--targets", targets, "--first", str(i),
            "--namespace", NAMESPACE, "--queue", QUEUE,
            "--lease-ms", str(self.lease_ms), "--hold-ms", str(self.hold_ms),
            "--seed", str(self.seed * 1000 + i),
        ]  # fmt: skip
        log = open(self.workdir / f"worker-{i}.log", "ab")  # noqa: SIM115 (the child owns it)
        try:
            return subprocess.Popen(
                cmd,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()

    # -- faults (each one recorded before it happens) ------------------------
    def record(self, action: str, target: str) -> None:
        self.nemesis.record(INFO, "nemesis", target=target, result=action)

    def _signal(self, pid: int, sig: signal.Signals) -> None:
        if sig == signal.SIGSTOP:
            self.stopped.add(pid)
        elif sig == signal.SIGCONT:
            self.stopped.discard(pid)
        os.kill(pid, sig)

    def worker_pid(self, i: int) -> int:
        w = self.workers[i]
        assert w is not None
        return w.pid

    def kill_worker(self, i: int) -> None:
        self.record("kill", f"worker-{i}")
        w = self.workers[i]
        assert w is not None
        w.kill()
        w.wait()

    def restart_worker(self, i: int) -> None:
        self.record("start", f"worker-{i}")
        self.workers[i] = self._spawn_worker(i)

    def pause_worker(self, i: int) -> None:
        self.record("stop", f"worker-{i}")
        self._signal(self.worker_pid(i), signal.SIGSTOP)

    def resume_worker(self, i: int) -> None:
        self.record("cont", f"worker-{i}")
        self._signal(self.worker_pid(i), signal.SIGCONT)

    def server_pid(self, i: int) -> int:
        proc = self.servers[i].proc
        assert proc is not None
        return proc.pid

    def kill_server(self, i: int) -> None:
        self.record("kill", f"server-{i}")
        self.servers[i].kill()

    def restart_server(self, i: int) -> None:
        self.record("start", f"server-{i}")
        self.servers[i].start()  # same port: workers and producers find it again

    def pause_server(self, i: int) -> None:
        self.record("stop", f"server-{i}")
        self._signal(self.server_pid(i), signal.SIGSTOP)

    def resume_server(self, i: int) -> None:
        self.record("cont", f"server-{i}")
        self._signal(self.server_pid(i), signal.SIGCONT)

    def kill_redis(self) -> None:
        self.record("kill", "redis")
        self.redis.stop(sig_kill=True)

    def restart_redis(self) -> None:
        self.record("start", "redis")
        self.redis.start(timeout=60)  # same port and directory: replays the AOF

    def pause_redis(self) -> None:
        self.record("stop", "redis")
        assert self.redis.proc is not None
        self._signal(self.redis.proc.pid, signal.SIGSTOP)

    def resume_redis(self) -> None:
        self.record("cont", "redis")
        assert self.redis.proc is not None
        self._signal(self.redis.proc.pid, signal.SIGCONT)

    def redis_client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis.url, socket_timeout=5)

    # -- observation ---------------------------------------------------------
    def stats(self) -> job_pb2.QueueStats | None:
        """Queue stats from any answering replica (None while none answers)."""
        for s in self.servers:
            try:
                with grpc.insecure_channel(s.address) as ch:
                    return (
                        service_pb2_grpc.DelayQueueServiceStub(ch)
                        .GetQueueStats(
                            service_pb2.GetQueueStatsRequest(namespace=NAMESPACE, queue=QUEUE),
                            timeout=CALL_TIMEOUT_S,
                        )
                        .stats
                    )
            except grpc.RpcError:
                continue
        return None

    def acked_total(self) -> int:
        st = self.stats()
        return st.acked_total if st else -1

    def wait_progress(self, acks: int, timeout: float = 60.0) -> None:
        """Waits until ``acks`` more jobs were acked through any replica."""
        start = -1
        while start < 0:
            start = self.acked_total()
        wait_for(f"{acks} more acks", lambda: self.acked_total() >= start + acks, timeout, 0.1)

    def drain(self, timeout: float) -> bool:
        """Waits until nothing more can be delivered: nothing ready or leased and no
        due time ahead. The ``scheduled`` counter alone is not trusted: a drifted
        counter (see docs/chaos.md, "stats drift") would keep a drain waiting forever.
        False on timeout."""

        def settled() -> bool:
            st = self.stats()
            if st is None:
                return False
            if st.scheduled + st.ready + st.leased == 0:
                return True
            return st.ready + st.leased == 0 and not st.HasField("next_due_time")

        try:
            wait_for("an empty queue", settled, timeout, 0.2)
        except TimeoutError:
            return False
        return True

    def record_finals(self) -> None:
        """Queries every acknowledged job without a successful ack: its final state."""
        ops = load(self.history_dir)
        acked_tokens = set()
        pending = {o.op: o for o in ops if o.f == "ack" and o.type == INVOKE}
        for o in ops:
            if o.f == "ack" and o.type == OK and o.result == "ACKED" and o.op in pending:
                acked_tokens.add(pending[o.op].token)
        acked_jobs = {o.job for o in ops if o.f == "deliver" and o.token in acked_tokens}
        jobs = {o.job for o in ops if o.job and o.f in ("enqueue", "deliver") and o.type == OK}
        rec = Recorder(self.history_dir / "final.jsonl", "final")
        with grpc.insecure_channel(self.servers[0].address) as ch:
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            for job in sorted(jobs - acked_jobs):
                try:
                    resp = stub.Query(
                        service_pb2.QueryRequest(namespace=NAMESPACE, queue=QUEUE, job_id=job),
                        timeout=10,
                    )
                    state = job_pb2.JobState.Name(resp.job.state).removeprefix("JOB_STATE_")
                except grpc.RpcError as err:
                    if err.code() != grpc.StatusCode.NOT_FOUND:
                        raise
                    state = "NOT_FOUND"
                rec.record(OK, "final", job=job, result=state)
        rec.close()

    def batch_enqueue(self, n: int, due_ms: float, name: str = "burst") -> int:
        """Enqueues ``n`` jobs due at one instant in batches of 1,000; returns how many
        the server acknowledged."""
        rec = Recorder(self.history_dir / f"{name}.jsonl", name)
        ok = 0
        with grpc.insecure_channel(self.servers[0].address) as ch:
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            for start in range(0, n, 1000):
                keys = [f"{name}-{i}" for i in range(start, min(n, start + 1000))]
                ops = [rec.next_op_id() for _ in keys]
                reqs = []
                for op, key in zip(ops, keys, strict=True):
                    rec.record(INVOKE, "enqueue", op=op, key=key, want_due=float(int(due_ms)))
                    req = service_pb2.EnqueueRequest(
                        namespace=NAMESPACE, queue=QUEUE, payload=payload.make(key),
                        due_time=ts(due_ms), max_attempts=self.max_attempts,
                    )  # fmt: skip
                    reqs.append(req)
                try:
                    resp = stub.EnqueueBatch(
                        service_pb2.EnqueueBatchRequest(requests=reqs), timeout=60
                    )
                except grpc.RpcError as err:
                    kind, code = outcome_of(err)
                    for op, key in zip(ops, keys, strict=True):
                        rec.record(kind, "enqueue", op=op, key=key, result=code)
                    continue
                for op, key, res in zip(ops, keys, resp.results, strict=True):
                    if res.error.code:
                        status = _CODES.get(res.error.code, grpc.StatusCode.UNKNOWN)
                        kind = INFO if status in INDEFINITE_CODES else FAIL
                        rec.record(kind, "enqueue", op=op, key=key, result=status.name)
                    else:
                        ok += 1
                        r = res.response
                        rec.record(
                            OK, "enqueue", op=op, key=key, job=r.job_id, due=ts_ms(r.due_time)
                        )
        rec.close()
        return ok
