/** Integration tests against a real delayq server (make test-ts starts one). */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";

import { ConnectError, Code } from "@connectrpc/connect";
import { connectNodeAdapter, createGrpcTransport } from "@connectrpc/connect-node";
import { isMessage } from "@bufbuild/protobuf";
import { timestampMs } from "@bufbuild/protobuf/wkt";

import {
  AckRequestSchema,
  DelayQClient,
  DelayQueueService,
  JobState,
  ReleaseResult,
  retryAfter,
  type BatchOptions,
  type Delivery,
  type WorkOptions,
} from "../src/index.js";

const address = process.env["DELAYQ_ADDR"];
if (address === undefined || address === "") {
  throw new Error("DELAYQ_ADDR is not set: run these tests through scripts/with_server.py (make test-ts)");
}
const client = new DelayQClient({ address });
after(() => client.close()); // its EnqueueStream would keep the process up for a second

function queueName(): string {
  return `ts-${randomUUID().slice(0, 8)}`;
}

/** Runs a worker until `until` resolves, then stops it and waits for it. */
async function runWorker(
  options: Omit<WorkOptions, "signal">,
  handler: (d: Delivery, signal: AbortSignal) => Promise<void>,
  until: Promise<unknown>,
  using: DelayQClient = client,
): Promise<unknown[]> {
  const stop = new AbortController();
  const errors: unknown[] = [];
  const loop = using.work({ ...options, signal: stop.signal, onError: (e) => errors.push(e) }, (d, ctx) =>
    handler(d, ctx.signal),
  );
  try {
    await withDeadline(Promise.race([until, loop]), 20_000, "worker condition");
  } finally {
    stop.abort();
    await loop;
  }
  return errors;
}

async function withDeadline<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([p, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Polls fn until it returns true, failing after ms. */
async function eventually(fn: () => Promise<boolean>, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`${what}: not true within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A client that records how many tokens each of its Ack calls carries. */
function ackCountingClient(): { counted: DelayQClient; ackCalls: number[] } {
  const ackCalls: number[] = [];
  const transport = createGrpcTransport({
    baseUrl: `http://${address}`,
    interceptors: [
      (next) => (req) => {
        if (!req.stream && isMessage(req.message, AckRequestSchema)) ackCalls.push(req.message.leaseTokens.length);
        return next(req);
      },
    ],
  });
  return { counted: new DelayQClient({ address: address!, transport }), ackCalls };
}

async function ackedTotal(queue: string): Promise<bigint | undefined> {
  return (await client.service.getQueueStats({ queue })).stats?.ackedTotal;
}

async function enqueueMany(queue: string, n: number): Promise<void> {
  await Promise.all(Array.from({ length: n }, (_, i) => client.enqueue(queue, `job ${i}`)));
}

async function isSettled(queue: string, jobId: string): Promise<boolean> {
  try {
    const res = await client.service.query({ queue, jobId });
    return res.job?.state === JobState.COMPLETED;
  } catch (err) {
    if (err instanceof ConnectError && err.code === Code.NotFound) return true; // no retention
    throw err;
  }
}

test("a delayed job arrives with its headers, not early, and is acked", async () => {
  const queue = queueName();
  const headers = { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tenant: "acme" };
  const sent = Date.now();
  const res = await client.enqueue(queue, JSON.stringify({ to: "a@example.com" }), { delayMs: 300, headers });
  assert.notEqual(res.jobId, "");
  let resolveGot: (d: Delivery) => void = () => {};
  const got = new Promise<Delivery>((r) => (resolveGot = r));
  let receivedAt = 0;
  const errors = await runWorker(
    { queues: [queue] },
    async (d) => {
      receivedAt = Date.now();
      resolveGot(d);
    },
    got.then(() => eventually(() => isSettled(queue, res.jobId), 5_000, "job completed")),
  );
  const d = await got;
  assert.equal(d.job?.id, res.jobId);
  assert.deepEqual(d.job?.headers, headers);
  assert.equal(new TextDecoder().decode(d.job?.payload), '{"to":"a@example.com"}');
  assert.equal(d.attempt, 1);
  assert.ok(receivedAt - sent >= 300 - 2, `delivered ${receivedAt - sent} ms after enqueue, delay 300 ms`);
  assert.ok(res.dueTime !== undefined && timestampMs(res.dueTime) > 0);
  assert.deepEqual(errors, []);
});

test("a failing handler nacks and the job comes back as attempt 2", async () => {
  const queue = queueName();
  const { jobId } = await client.enqueue(queue, "x");
  const attempts: number[] = [];
  let done: () => void = () => {};
  const second = new Promise<void>((r) => (done = r));
  const errors = await runWorker(
    { queues: [queue] },
    async (d) => {
      attempts.push(d.attempt);
      if (d.attempt === 1) throw retryAfter(new Error("transient"), 50);
      done();
    },
    second.then(() => eventually(() => isSettled(queue, jobId), 5_000, "job completed")),
  );
  assert.deepEqual(attempts, [1, 2]);
  assert.deepEqual(errors, []);
});

test("the lease is renewed while a slow handler runs", async () => {
  const queue = queueName();
  const { jobId } = await client.enqueue(queue, "slow");
  const attempts: number[] = [];
  let done: () => void = () => {};
  const finished = new Promise<void>((r) => (done = r));
  const errors = await runWorker(
    { queues: [queue], leaseMs: 1_000, renewEveryMs: 250 },
    async (d) => {
      attempts.push(d.attempt);
      // Simulated work that outlives the first lease by half a second.
      const deadline = d.leaseDeadline === undefined ? Date.now() + 1_000 : timestampMs(d.leaseDeadline);
      await new Promise((r) => setTimeout(r, deadline - Date.now() + 500));
      done();
    },
    finished.then(() => eventually(() => isSettled(queue, jobId), 5_000, "job completed")),
  );
  assert.deepEqual(attempts, [1]);
  assert.deepEqual(errors, []);
});

test("an invalid queue name is refused with INVALID_ARGUMENT", async () => {
  await assert.rejects(client.enqueue("bad{name}", "x"), (err: unknown) => {
    return err instanceof ConnectError && err.code === Code.InvalidArgument;
  });
  await assert.rejects(
    client.work({ queues: ["bad{name}"] }, async () => {}),
    (err: unknown) => err instanceof ConnectError && err.code === Code.InvalidArgument,
  );
});

test("release gives a delivery back uncounted; a handler running at shutdown still acks", async () => {
  const queue = queueName();
  const { jobId } = await client.enqueue(queue, "x", { maxAttempts: 1 });
  // Release, as the worker uses it for deliveries it did not start: after closing
  // a stream that has a grace, the job is ready again with no attempt counted.
  const peek = new AbortController();
  const stream = client.service
    .consume({ queues: [queue], maxOutstanding: 1, releaseGrace: { seconds: 5n, nanos: 0 } }, { signal: peek.signal })
    [Symbol.asyncIterator]();
  const first = await withDeadline(stream.next(), 20_000, "first delivery");
  assert.equal(first.done, false);
  const token = first.done === false ? (first.value.deliveries[0]?.leaseToken ?? "") : "";
  peek.abort();
  await stream.return?.().catch(() => {});
  const rel = await client.service.release({ leaseTokens: [token, token] });
  assert.deepEqual(rel.results, [ReleaseResult.RELEASED, ReleaseResult.STALE]);
  const job = (await client.service.query({ queue, jobId })).job;
  assert.equal(job?.state, JobState.READY);
  assert.equal(job?.attempts, 0);

  // The worker's shutdown (default grace): the stream closes first, the running
  // handler still acks over a unary call, and the job is not redelivered.
  let started = (): void => {};
  const startedP = new Promise<void>((r) => (started = r));
  let finish = (): void => {};
  const finishP = new Promise<void>((r) => (finish = r));
  const stop = new AbortController();
  const errors: unknown[] = [];
  const loop = client.work({ queues: [queue], signal: stop.signal, onError: (e) => errors.push(e) }, async () => {
    started();
    await finishP;
  });
  await withDeadline(startedP, 20_000, "delivery to the worker");
  stop.abort();
  finish();
  await withDeadline(loop, 20_000, "shutdown");
  assert.deepEqual(errors, []);
  await eventually(() => isSettled(queue, jobId), 5_000, "job acked");
});

/** A client whose transport counts unary calls, streams opened and stream messages sent. */
function rpcCountingClient(batching: BatchOptions = {}, to: string = address!) {
  const counts = { unary: 0, streams: 0, messages: 0 };
  const transport = createGrpcTransport({
    baseUrl: `http://${to}`,
    interceptors: [
      (next) => (req) => {
        if (!req.stream) {
          counts.unary++;
          return next(req);
        }
        counts.streams++;
        const messages = req.message;
        return next({
          ...req,
          message: (async function* () {
            for await (const m of messages) {
              counts.messages++;
              yield m;
            }
          })(),
        });
      },
    ],
  });
  return { counted: new DelayQClient({ address: to, transport, batching }), counts };
}

/** 200 concurrent enqueues, 4 of them to a bad queue name; checks each caller's answer. */
async function enqueue200(counted: DelayQClient, queue: string): Promise<void> {
  const outcomes = await Promise.allSettled(
    Array.from({ length: 200 }, (_, i) => counted.enqueue(i % 50 === 7 ? "bad:name" : queue, `job ${i}`)),
  );
  await counted.close();
  const refused = outcomes.flatMap((o, i) => (o.status === "rejected" ? [i] : []));
  assert.deepEqual(refused, [7, 57, 107, 157]);
  for (const i of refused) {
    const o = outcomes[i]!;
    assert.ok(o.status === "rejected" && o.reason instanceof ConnectError && o.reason.code === Code.InvalidArgument);
  }
  const ids = new Set(outcomes.flatMap((o) => (o.status === "fulfilled" ? [o.value.jobId] : [])));
  assert.equal(ids.size, 196);
  assert.ok(!ids.has(""));
  const stats = await client.service.getQueueStats({ queue });
  assert.equal(stats.stats?.enqueuedTotal, 196n);
}

test("concurrent enqueues travel as few messages on one EnqueueStream, no unary call", async () => {
  const { counted, counts } = rpcCountingClient();
  await enqueue200(counted, queueName());
  assert.equal(counts.streams, 1);
  assert.equal(counts.unary, 0);
  assert.ok(counts.messages >= 1 && counts.messages <= 50, `200 concurrent enqueues made ${counts.messages} messages`);
});

test("with unaryCalls, concurrent enqueues travel in few EnqueueBatch calls and no stream", async () => {
  const { counted, counts } = rpcCountingClient({ unaryCalls: true });
  await enqueue200(counted, queueName());
  assert.equal(counts.streams, 0);
  assert.ok(counts.unary >= 1 && counts.unary <= 2, `200 concurrent enqueues made ${counts.unary} RPCs`);
});

test("against a server without EnqueueStream the batcher stores every job once through calls", async () => {
  // A Connect server forwarding Enqueue and EnqueueBatch to the real one: any other method
  // is UNIMPLEMENTED, as on a server from before EnqueueStream.
  const forwarded = { enqueue: 0, enqueueBatch: 0 };
  const server = http2.createServer(
    connectNodeAdapter({
      routes: (router) =>
        router.service(DelayQueueService, {
          enqueue: (req) => {
            forwarded.enqueue++;
            return client.service.enqueue(req);
          },
          enqueueBatch: (req) => {
            forwarded.enqueueBatch++;
            return client.service.enqueueBatch(req);
          },
        }),
    }),
  );
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => sessions.add(s));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  try {
    const { port } = server.address() as AddressInfo;
    const { counted, counts } = rpcCountingClient({}, `127.0.0.1:${port}`);
    const queue = queueName();
    const first = await Promise.all(Array.from({ length: 30 }, (_, i) => counted.enqueue(queue, `a${i}`)));
    const second = await Promise.all(Array.from({ length: 30 }, (_, i) => counted.enqueue(queue, `b${i}`)));
    await counted.close();
    assert.equal(new Set([...first, ...second].map((r) => r.jobId)).size, 60);
    assert.equal(counts.streams, 1); // tried once, then calls for good
    assert.ok(forwarded.enqueueBatch >= 2, `${forwarded.enqueueBatch} EnqueueBatch calls forwarded`);
    const stats = await client.service.getQueueStats({ queue });
    assert.equal(stats.stats?.enqueuedTotal, 60n);
  } finally {
    const closed = new Promise<void>((r) => server.close(() => r()));
    for (const s of sessions) s.close(); // the client's idle connection would hold close()
    await closed;
  }
});

test("acks of deliveries finished together go in one Ack call", async () => {
  const queue = queueName();
  await enqueueMany(queue, 20);
  const { counted, ackCalls } = ackCountingClient();
  let handled = 0;
  let finish = (): void => {};
  const finishP = new Promise<void>((r) => (finish = r));
  const errors = await runWorker(
    { queues: [queue], concurrency: 50, ackLingerMs: 1_000 },
    async () => {
      handled++;
      await finishP; // all 20 finish at once, after all were received
    },
    eventually(async () => handled === 20, 10_000, "20 handlers running").then(() => {
      finish();
      return eventually(async () => (await ackedTotal(queue)) === 20n, 10_000, "20 acked");
    }),
    counted,
  );
  assert.deepEqual(ackCalls, [20]);
  assert.deepEqual(errors, []);
});

test("a worker without stream credit acks at once: concurrency 1 and an hour's linger still run 5 jobs", async () => {
  const queue = queueName();
  await enqueueMany(queue, 5);
  const { counted, ackCalls } = ackCountingClient();
  const errors = await runWorker(
    { queues: [queue], concurrency: 1, ackLingerMs: 3_600_000 },
    async () => {},
    eventually(async () => (await ackedTotal(queue)) === 5n, 10_000, "5 acked"),
    counted,
  );
  assert.deepEqual(ackCalls, [1, 1, 1, 1, 1]);
  assert.deepEqual(errors, []);
});

test("a stop sends the lingering acks before work() resolves", async () => {
  const queue = queueName();
  await enqueueMany(queue, 3);
  const { counted, ackCalls } = ackCountingClient();
  let handled = 0;
  const stop = new AbortController();
  const errors: unknown[] = [];
  const loop = counted.work(
    { queues: [queue], concurrency: 10, ackLingerMs: 3_600_000, signal: stop.signal, onError: (e) => errors.push(e) },
    async () => {
      handled++;
    },
  );
  try {
    await eventually(async () => handled === 3, 10_000, "3 jobs handled");
    assert.deepEqual(ackCalls, []); // lingering
    assert.equal(await ackedTotal(queue), 0n);
  } finally {
    stop.abort();
    await withDeadline(loop, 20_000, "shutdown");
  }
  assert.deepEqual(ackCalls, [3]);
  assert.equal(await ackedTotal(queue), 3n);
  assert.deepEqual(errors, []);
});
