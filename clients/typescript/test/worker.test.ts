/** The worker loop against an in-memory fake of the service: what it sends on shutdown, how it acks. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { durationMs, timestampNow } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";

import { DeliverySchema, JobSchema } from "../src/gen/delayq/v1/job_pb.js";
import {
  AckResult,
  DelayQueueService,
  ReleaseResult,
  type AckRequest,
  type ConsumeRequest,
} from "../src/gen/delayq/v1/service_pb.js";
import { work, type WorkOptions } from "../src/worker.js";

function delivery(token: string) {
  return create(DeliverySchema, { leaseToken: token, attempt: 1, job: create(JobSchema, { id: `job-${token}` }) });
}

/** Polls cond until it is true, failing after 10 s. */
async function until(cond: () => boolean, what: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!cond()) {
    assert.ok(Date.now() < deadline, `${what}: not true within 10 s`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/**
 * Runs a worker with handlers that resolve at once against a fake whose streams
 * play `script` in order: a list of tokens is one message (sent once the
 * previous ones' tokens were all in Ack calls), an error breaks the stream
 * (once every delivery sent was handled). Ack answers with `ack`; the tokens
 * of each Ack call are recorded.
 */
function ackingWorker(
  script: (string[] | Error)[],
  options: Omit<WorkOptions, "queues" | "signal">,
  ack: (req: AckRequest) => Promise<AckResult[]> = async (req) => req.leaseTokens.map(() => AckResult.ACKED),
) {
  const ackCalls: string[][] = [];
  const steps = script[Symbol.iterator](); // a reopened stream goes on where the broken one stopped
  let streams = 0;
  let sent = 0;
  let handled = 0;
  const transport = createRouterTransport(({ service }) => {
    service(DelayQueueService, {
      async *consume(_req, ctx) {
        streams++;
        for (let step = steps.next(); step.done !== true; step = steps.next()) {
          if (step.value instanceof Error) {
            await until(() => handled >= sent, "handlers of the stream");
            throw step.value;
          }
          await until(() => ackCalls.flat().length >= sent, "acks of the previous message");
          yield { deliveries: step.value.map(delivery) };
          sent += step.value.length;
        }
        await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve(), { once: true }));
      },
      async ack(req) {
        ackCalls.push([...req.leaseTokens]);
        return { results: await ack(req) };
      },
      release(req) {
        return { results: req.leaseTokens.map(() => ReleaseResult.RELEASED) };
      },
      extendLease() {
        return { leaseDeadline: timestampNow() };
      },
    });
  });
  const stop = new AbortController();
  const loop = work(
    createClient(DelayQueueService, transport),
    "",
    { ...options, queues: ["q"], signal: stop.signal },
    async () => {
      handled++;
    },
  );
  return {
    ackCalls,
    streams: () => streams,
    /** Stops the worker; fails if it has not resolved within 10 s. */
    async stop(): Promise<void> {
      stop.abort();
      let settled = false;
      void Promise.allSettled([loop]).then(() => (settled = true));
      await until(() => settled, "work() settled after the stop");
      await loop;
    },
  };
}

function tokens(prefix: string, n: number): string[] {
  return Array.from({ length: n }, (_, i) => `${prefix}${i}`);
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

test("each delivery in a batched Ack hears its own outcome", async () => {
  const errors = new Map<string, string>();
  const w = ackingWorker(
    [["a", "b", "c"], ["d", "e"]],
    { concurrency: 10, ackLingerMs: 50, onError: (e, d) => errors.set(d?.leaseToken ?? "?", String(e)) },
    async (req) => {
      if (req.leaseTokens.includes("d")) throw new ConnectError("boom", Code.Unavailable);
      const results = { b: AckResult.STALE, c: AckResult.UNKNOWN } as Record<string, AckResult>;
      return req.leaseTokens.map((t) => results[t] ?? AckResult.ACKED);
    },
  );
  await until(() => errors.size === 4, "four errors");
  await w.stop();
  assert.deepEqual(w.ackCalls, [["a", "b", "c"], ["d", "e"]]);
  assert.deepEqual(
    [...errors].sort(),
    [
      ["b", "Error: delayq: ack not applied: STALE"],
      ["c", "Error: delayq: ack not applied: UNKNOWN"],
      ["d", "ConnectError: [unavailable] boom"],
      ["e", "ConnectError: [unavailable] boom"],
    ],
  );
});

test("a broken stream sends its lingering acks before the worker reopens it", async () => {
  const w = ackingWorker([["a", "b"], new ConnectError("blip", Code.Unavailable)], {
    concurrency: 10,
    ackLingerMs: 3_600_000,
  });
  await until(() => w.streams() === 2, "a second stream");
  assert.deepEqual(w.ackCalls, [["a", "b"]]);
  await w.stop();
});

test("a full Ack call of 1,000 tokens goes without lingering", async () => {
  const w = ackingWorker([tokens("t", 1001)], { concurrency: 2000, ackLingerMs: 3_600_000 });
  await until(() => w.ackCalls.length === 1, "the full call");
  await w.stop(); // sends the one lingering
  assert.deepEqual(
    w.ackCalls.map((c) => c.length),
    [1000, 1],
  );
});

test("at most 2 Ack calls in flight; acks finished meanwhile follow in calls of at most 1,000", async () => {
  let inFlight = 0;
  let maxInFlight = 0;
  let release = (): void => {};
  const released = new Promise<void>((r) => (release = r));
  const w = ackingWorker([tokens("t", 2003)], { concurrency: 3000, ackLingerMs: 0 }, async (req) => {
    maxInFlight = Math.max(maxInFlight, ++inFlight);
    await released;
    inFlight--;
    return req.leaseTokens.map(() => AckResult.ACKED);
  });
  // With no linger the first two acks go at once, each alone; the rest wait for a call slot.
  await until(() => w.ackCalls.length >= 2, "two calls");
  release();
  await until(() => w.ackCalls.flat().length === 2003, "every token in a call");
  await w.stop();
  assert.deepEqual(
    w.ackCalls.map((c) => c.length),
    [1, 1, 1000, 1000, 1],
  );
  assert.equal(maxInFlight, 2);
});
