"""The dashboard in a real headless Chromium (Debian's /usr/bin/chromium via Playwright).

Never `playwright install`: it downloads browsers; `make system-deps` installs
Debian's chromium instead. Every wait is on the page's DOM or on Redis state,
never a fixed sleep. Screenshots go to .run/dashboard/ (test output).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from delayq.v1 import admin_pb2, admin_pb2_grpc, job_pb2, service_pb2, service_pb2_grpc
from tests.support.auth import AuthServer, auth_server
from tests.support.rpc import ms
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, wait_until

CHROMIUM = "/usr/bin/chromium"
# These flags matter on a closed network: no sandbox (root in a container), no
# GPU, and none of the background calls home that would hang or fail.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = ROOT / ".run" / "dashboard"
A = admin_pb2
S = service_pb2
TIMEOUT_MS = 20_000  # generous: the machine is shared


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "chromium missing: run `make deps` (Debian package)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DelayqProcess]:
    """A server without auth on a Redis of its own, with the admin HTTP port."""
    with (
        ManagedRedis(tmp_path_factory.mktemp("dash-redis"), appendonly=False) as r,
        DelayqProcess(r.url, ["--http-listen", "127.0.0.1:0"]) as proc,
    ):
        yield proc


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    with auth_server(tmp_path_factory.mktemp("dash-auth"), ["--http-listen", "127.0.0.1:0"]) as srv:
        yield srv


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = ctx.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    yield pg
    ctx.close()


def url(proc: DelayqProcess, fragment: str = "") -> str:
    return f"http://127.0.0.1:{proc.http_port}/dashboard/?interval=300#{fragment}"


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def stubs(
    proc: DelayqProcess,
) -> tuple[service_pb2_grpc.DelayQueueServiceStub, admin_pb2_grpc.AdminServiceStub]:
    ch = grpc.insecure_channel(proc.address)
    return service_pb2_grpc.DelayQueueServiceStub(ch), admin_pb2_grpc.AdminServiceStub(ch)


def test_overview_counts_follow_enqueues(plain: DelayqProcess, page: Page) -> None:
    stub, _ = stubs(plain)
    stub.Enqueue(S.EnqueueRequest(queue="mail", payload=b"first"))
    page.goto(url(plain))
    row = page.locator('#queues tr[data-key="default/mail"]')
    expect(row.locator("td.ready")).to_have_text("1")
    stub.EnqueueBatch(
        S.EnqueueBatchRequest(requests=[S.EnqueueRequest(queue="mail", payload=b"x")] * 4)
    )
    stub.Enqueue(S.EnqueueRequest(queue="mail", payload=b"later", delay=ms(3_600_000)))
    # Live: the same page updates without a reload.
    expect(row.locator("td.ready")).to_have_text("5")
    expect(row.locator("td.scheduled")).to_have_text("1")
    shot(page, "overview")


def test_pause_and_resume_from_the_page(plain: DelayqProcess, page: Page) -> None:
    stub, admin = stubs(plain)
    stub.Enqueue(S.EnqueueRequest(queue="paused-q", payload=b"x"))
    page.goto(url(plain))
    page.get_by_role("button", name="Pause default/paused-q").click()
    row = page.locator('#queues tr[data-key="default/paused-q"]')
    expect(row.locator("td.state")).to_have_text("paused")
    assert admin.GetQueue(A.GetQueueRequest(queue="paused-q")).queue.paused
    page.get_by_role("button", name="Resume default/paused-q").click()
    expect(row.locator("td.state")).to_have_text("active")
    assert not admin.GetQueue(A.GetQueueRequest(queue="paused-q")).queue.paused


def test_reschedule_a_job_from_its_detail(plain: DelayqProcess, page: Page) -> None:
    stub, _ = stubs(plain)
    job_id = stub.Enqueue(
        S.EnqueueRequest(queue="later-q", payload=b'{"to": "ann"}', delay=ms(3_600_000))
    ).job_id
    page.goto(url(plain, "/q/default/later-q/scheduled"))
    page.get_by_role("button", name=f"Details of job {job_id}").click()
    expect(page.locator("#payload")).to_have_text('{"to": "ann"}')
    expect(page.locator("#timeline li")).to_have_count(2)  # created, due
    shot(page, "queue")
    page.get_by_label("Due in (seconds)").fill("0")
    page.get_by_role("button", name="Reschedule").click()
    expect(page.locator("#detail p").first).to_contain_text("State ready")
    job = stub.Query(S.QueryRequest(queue="later-q", job_id=job_id)).job
    assert job.state == job_pb2.JOB_STATE_READY


def test_keyboard_reaches_the_actions(plain: DelayqProcess, page: Page) -> None:
    stub, admin = stubs(plain)
    stub.Enqueue(S.EnqueueRequest(queue="kbd", payload=b"x"))
    page.goto(url(plain))
    expect(page.locator('#queues tr[data-key="default/kbd"] td.ready')).to_have_text("1")
    target = "Pause default/kbd"
    for _ in range(60):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('aria-label')") == target:
            break
    else:
        raise AssertionError(f"Tab never reached the {target!r} button")
    page.keyboard.press("Enter")
    wait_until(lambda: admin.GetQueue(A.GetQueueRequest(queue="kbd")).queue.paused, timeout=20)
    # The live refresh keeps focus on the (relabelled) button.
    expect(page.get_by_role("button", name="Resume default/kbd")).to_be_focused()


def _dead_jobs(srv: AuthServer, token: str, ns: str, queue: str, n: int) -> list[str]:
    stub = srv.stub(token)
    ids = [
        stub.Enqueue(S.EnqueueRequest(namespace=ns, queue=queue, payload=f"d{i}".encode())).job_id
        for i in range(n)
    ]
    call = stub.Consume(S.ConsumeRequest(namespace=ns, queues=[queue], max_outstanding=n))
    got = 0
    for resp in call:
        for d in resp.deliveries:
            stub.Nack(S.NackRequest(lease_token=d.lease_token, dead_letter=True, reason="boom"))
            got += 1
        if got == n:
            break
    call.cancel()  # type: ignore[no-untyped-call]
    # The cancelled stream may still be open on the server for a moment and would
    # claim a redriven job (counting an attempt): paused, the queue keeps it READY.
    srv.admin(token).PauseQueue(admin_pb2.PauseQueueRequest(namespace=ns, queue=queue), timeout=10)
    return ids


def test_read_only_without_a_token_then_redrive_with_one(secured: AuthServer, page: Page) -> None:
    assert secured.proc is not None
    ns = "dash"
    token = secured.token(ns, "admin", "produce", "consume", "read")
    ids = _dead_jobs(secured, token, ns, "jobs", 2)
    page.goto(url(secured.proc, f"/dead/{ns}/jobs"))
    button = page.get_by_role("button", name=f"Redrive job {ids[0]}")
    expect(button).to_be_disabled()
    expect(page.locator("#mode")).to_have_text("read-only")
    # The server refuses too, whatever the page shows.
    status = page.evaluate(
        """async (path) => (await fetch(path, {method: 'POST',
             headers: {'Content-Type': 'application/json'}, body: '{}'})).status""",
        f"/api/queues/{ns}/jobs/pause",
    )
    assert status == 401
    wrong = secured.token(ns, "read")
    status = page.evaluate(
        """async ([path, t]) => (await fetch(path, {method: 'POST', headers: {
             'Content-Type': 'application/json', 'Authorization': 'Bearer ' + t}, body: '{}'})).status""",
        [f"/api/queues/{ns}/jobs/pause", wrong],
    )
    assert status == 403
    shot(page, "dead-read-only")

    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Use token").click()
    expect(page.locator("#mode")).to_have_text("admin")
    expect(button).to_be_enabled()
    button.click()
    expect(page.locator(f'#dead tr[data-id="{ids[0]}"]')).to_have_count(0)
    expect(page.locator("#dead-count")).to_have_text("1 dead jobs")
    job = secured.stub(token).Query(S.QueryRequest(namespace=ns, queue="jobs", job_id=ids[0])).job
    assert (job.state, job.attempts) == (job_pb2.JOB_STATE_READY, 0)
    shot(page, "dead")
    # The token lives in sessionStorage only: no cookie carries it.
    assert page.context.cookies() == []
