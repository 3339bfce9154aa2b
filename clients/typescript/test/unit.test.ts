/** Unit tests of request building (no server). */
import assert from "node:assert/strict";
import { test } from "node:test";

import { durationMs, timestampDate } from "@bufbuild/protobuf/wkt";

import { DelayQClient, deadLetter, retryAfter } from "../src/index.js";
import { nackRequest, truncateUtf8 } from "../src/worker.js";

const client = new DelayQClient({ address: "127.0.0.1:1", namespace: "ns" });

test("enqueueRequest maps every option", () => {
  const due = new Date("2030-01-02T03:04:05Z");
  const req = client.enqueueRequest("emails", "hi", {
    dueTime: due,
    headers: { traceparent: "00-a-b-01" },
    ttlMs: 3_600_000,
    maxAttempts: 5,
    idempotencyKey: "idem",
  });
  assert.equal(req.namespace, "ns");
  assert.equal(req.queue, "emails");
  assert.deepEqual(req.payload, new TextEncoder().encode("hi"));
  assert.deepEqual(req.headers, { traceparent: "00-a-b-01" });
  assert.equal(req.schedule.case, "dueTime");
  assert.equal(req.schedule.case === "dueTime" && timestampDate(req.schedule.value).getTime(), due.getTime());
  assert.equal(req.ttl !== undefined && durationMs(req.ttl), 3_600_000);
  assert.equal(req.maxAttempts, 5);
  assert.equal(req.idempotencyKey, "idem");
});

test("enqueueRequest with a delay and no options", () => {
  const req = client.enqueueRequest("q", new Uint8Array([1, 2]), { delayMs: 1500 });
  assert.equal(req.schedule.case, "delay");
  assert.equal(req.schedule.case === "delay" && durationMs(req.schedule.value), 1500);
  assert.equal(client.enqueueRequest("q", "x").schedule.case, undefined);
});

test("nackRequest follows retryAfter and deadLetter", () => {
  const retry = nackRequest("t1", retryAfter(new Error("busy"), 2500));
  assert.equal(retry.reason, "busy");
  assert.equal(retry.deadLetter, false);
  assert.equal(retry.delay !== undefined && durationMs(retry.delay), 2500);
  const dead = nackRequest("t2", deadLetter(new Error("bad payload")));
  assert.equal(dead.deadLetter, true);
  assert.equal(dead.delay, undefined);
  const plain = nackRequest("t3", "a string was thrown");
  assert.deepEqual(plain, { leaseToken: "t3", reason: "a string was thrown", deadLetter: false });
});

test("truncateUtf8 never splits a character", () => {
  const s = "é".repeat(3000); // 6000 bytes
  const cut = truncateUtf8(s, 4095);
  assert.equal(new TextEncoder().encode(cut).length, 4094);
  assert.ok(s.startsWith(cut));
  assert.equal(truncateUtf8("short", 4096), "short");
});
