"""/metrics on the admin HTTP port after a scripted run: counters, gauges, histograms."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator

import pytest
from google.protobuf.duration_pb2 import Duration
from prometheus_client.parser import text_string_to_metric_families

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.rpc import Consumer, ack, enqueue
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until

Labels = frozenset[tuple[str, str]]


def scrape(port: int) -> dict[tuple[str, Labels], float]:
    """Every sample, keyed by name and labels (scope labels dropped)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = frozenset(
                (k, v) for k, v in s.labels.items() if not k.startswith("otel_scope")
            )
            out[(s.name, labels)] = s.value
    return out


def q(queue: str, **extra: str) -> Labels:
    base = {
        "messaging_system": "delayq",
        "messaging_destination_name": queue,
        "delayq_namespace": "default",
    }
    return frozenset({**base, **extra}.items())


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DelayqProcess]:
    """A server with a Redis of its own: counters are per process, and with other
    replicas on the same Redis their reaper could take this one's leases."""
    # Retries back off 2 h without jitter: the lease that runs out stays in the
    # backlog (due within the day) instead of coming back to the stream.
    args = [
        "--http-listen",
        "127.0.0.1:0",
        "--retry-initial",
        "2h",
        "--retry-max",
        "2h",
        "--retry-jitter",
        "0",
    ]
    with (
        ManagedRedis(tmp_path_factory.mktemp("metrics-redis"), appendonly=False) as redis,
        DelayqProcess(redis.url, args) as server,
    ):
        yield server


def test_scripted_run_moves_every_counter(metrics_server: DelayqProcess, queue: str) -> None:
    """Enqueue 10; ack 7, nack 2 (one retried, one dead-lettered), let 1 lease run out."""
    with metrics_server.channel() as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        for _ in range(10):
            enqueue(stub, queue)
        # 3 s leases: the acks and nacks below must land before any runs out, the
        # tenth's is left to run out.
        with Consumer(stub, [queue], max_outstanding=10, lease_ms=3_000) as c:
            ds = c.take(10)
            ack(stub, *(d.lease_token for d in ds[:7]))
            stub.Nack(
                service_pb2.NackRequest(lease_token=ds[7].lease_token, delay=Duration(seconds=1800))
            )
            stub.Nack(
                service_pb2.NackRequest(
                    lease_token=ds[8].lease_token, dead_letter=True, reason="bad input"
                )
            )
            # ds[9] is left alone: its lease runs out and the reaper retries it (2 h).
            port = metrics_server.http_port
            wait_until(
                lambda: scrape(port).get(("delayq_leases_expired_total", q(queue)), 0) == 1,
                timeout=30,
                interval=0.2,
            )
            m = scrape(port)
            assert m[("delayq_consume_streams", frozenset())] >= 1
        want = {
            ("delayq_jobs_enqueued_total", q(queue)): 10,
            ("delayq_jobs_delivered_total", q(queue)): 10,
            ("delayq_jobs_acked_total", q(queue)): 7,
            ("delayq_jobs_nacked_total", q(queue, delayq_nack_outcome="retry")): 1,
            ("delayq_jobs_nacked_total", q(queue, delayq_nack_outcome="dead")): 1,
            ("delayq_leases_expired_total", q(queue)): 1,
            ("delayq_delivery_lateness_seconds_count", q(queue)): 10,
            ("delayq_job_enqueue_to_ack_seconds_count", q(queue)): 7,
        }
        assert {k: m.get(k) for k in want} == want

        # Queue-wide gauges come from Redis, refreshed at most every 2 s.
        def settled() -> bool:
            g = scrape(port)
            return (
                g.get(("delayq_queue_jobs", q(queue, delayq_job_state="scheduled"))) == 2
                and g.get(("delayq_queue_jobs", q(queue, delayq_job_state="dead"))) == 1
                and g.get(("delayq_queue_jobs_dead_lettered_total", q(queue))) == 1
            )

        wait_until(settled, timeout=30, interval=0.3)
        g = scrape(port)
        due = {
            w: g[("delayq_queue_backlog_due", q(queue, delayq_due_within=w))]
            for w in ("minute", "hour", "day", "later")
        }
        assert due == {"minute": 0, "hour": 1, "day": 1, "later": 0}
        assert g[("delayq_queue_jobs", q(queue, delayq_job_state="leased"))] == 0
        assert g[("delayq_queue_jobs_expired_total", q(queue))] == 0


def test_lateness_histogram_resolves_one_millisecond(
    metrics_server: DelayqProcess, queue: str
) -> None:
    with metrics_server.channel() as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        enqueue(stub, queue)
        with Consumer(stub, [queue]) as c:
            c.take(1)
    # The stream closed with its delivery unanswered: the server gave the lease back.
    port = metrics_server.http_port
    wait_until(
        lambda: scrape(port).get(("delayq_jobs_released_total", q(queue))) == 1,
        timeout=30,
        interval=0.1,
    )
    m = scrape(port)
    bounds = sorted(
        float(dict(labels)["le"])
        for name, labels in m
        if name == "delayq_delivery_lateness_seconds_bucket"
        and ("messaging_destination_name", queue) in labels
    )
    assert bounds[:11] == [i / 1000 for i in range(11)]  # 0, 1 ms, 2 ms ... 10 ms
    scripts = {
        dict(labels).get("delayq_script")
        for name, labels in m
        if name == "delayq_redis_script_duration_seconds_count"
    }
    assert {"enqueue", "claim", "promote"} <= scripts


def test_service_name_and_resource_attributes_from_the_environment(
    redis_server: ManagedRedis,
) -> None:
    env = {
        "OTEL_SERVICE_NAME": "jobs-eu",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=staging",
    }
    with DelayqProcess(redis_server.url, ["--http-listen", "127.0.0.1:0"], env=env) as server:
        m = scrape(server.http_port)
    (labels,) = [dict(lb) for name, lb in m if name == "target_info"]
    assert labels["service_name"] == "jobs-eu"
    assert labels["deployment_environment"] == "staging"


def test_default_service_name(metrics_server: DelayqProcess) -> None:
    m = scrape(metrics_server.http_port)
    (labels,) = [dict(lb) for name, lb in m if name == "target_info"]
    assert labels["service_name"] == "delayq-server"
