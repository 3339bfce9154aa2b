/** The worker loop against an in-memory fake of the service: what it sends on shutdown. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { durationMs, timestampNow } from "@bufbuild/protobuf/wkt";
import { createClient, createRouterTransport } from "@connectrpc/connect";

import { DeliverySchema, JobSchema } from "../src/gen/delayq/v1/job_pb.js";
import {
  AckResult,
  DelayQueueService,
  ReleaseResult,
  type ConsumeRequest,
} from "../src/gen/delayq/v1/service_pb.js";
import { work } from "../src/worker.js";

function delivery(token: string) {
  return create(DeliverySchema, { leaseToken: token, attempt: 1, job: create(JobSchema, { id: `job-${token}` }) });
}

test("shutdown closes the stream, keeps the running lease and gives back what never started", async () => {
  const events: string[] = [];
  let request: ConsumeRequest | undefined;
  let startedResolve = (): void => {};
  const started = new Promise<void>((r) => (startedResolve = r));
  let finishResolve = (): void => {};
  const finish = new Promise<void>((r) => (finishResolve = r));
  const transport = createRouterTransport(({ service }) => {
    service(DelayQueueService, {
      async *consume(req, ctx) {
        request = req;
        // One message, two deliveries, concurrency 1: the second waits for a slot.
        yield { deliveries: [delivery("running"), delivery("waiting")] };
        await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
        events.push("stream-closed");
      },
      ack(req) {
        events.push(...req.leaseTokens.map((t) => `ack:${t}`));
        return { results: req.leaseTokens.map(() => AckResult.ACKED) };
      },
      release(req) {
        events.push(...req.leaseTokens.map((t) => `release:${t}`));
        return { results: req.leaseTokens.map(() => ReleaseResult.RELEASED) };
      },
      extendLease(req) {
        events.push(`extend:${req.leaseToken}`);
        return { leaseDeadline: timestampNow() };
      },
    });
  });
  const stop = new AbortController();
  const loop = work(createClient(DelayQueueService, transport), "", { queues: ["q"], signal: stop.signal }, async () => {
    startedResolve();
    await finish;
  });
  await started;
  stop.abort();
  // Let the stop take effect before the handler finishes.
  const deadline = Date.now() + 10_000;
  while (!events.includes("release:waiting")) {
    assert.ok(Date.now() < deadline, `no release within 10 s: ${String(events)}`);
    await new Promise((r) => setTimeout(r, 5));
  }
  finishResolve();
  await loop;
  assert.ok(request?.releaseGrace !== undefined && durationMs(request.releaseGrace) === 5_000);
  assert.ok(events.includes("extend:running"), String(events));
  assert.ok(!events.includes("release:running") && !events.includes("ack:waiting"), String(events));
  assert.ok(events.indexOf("release:waiting") < events.indexOf("ack:running"), String(events));
});
