/** Unit tests of the batcher's EnqueueStream transport against scripted fake streams (no server). */
import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { Batcher } from "../src/batcher.js";
import type { DelayQueueServiceClient } from "../src/client.js";
import { EnqueueStream, StreamUnsupportedError } from "../src/enqueue_stream.js";
import {
  EnqueueBatchResponseSchema,
  EnqueueRequestSchema,
  EnqueueResponseSchema,
  EnqueueStreamResponseSchema,
  type EnqueueBatchRequest,
  type EnqueueRequest,
  type EnqueueStreamRequest,
  type EnqueueStreamResponse,
} from "../src/gen/delayq/v1/service_pb.js";

/** One EnqueueStream call of the fake server: reads the client's batches, yields answers. */
type Script = (
  requests: AsyncIterable<EnqueueStreamRequest>,
  signal: AbortSignal,
) => AsyncIterable<EnqueueStreamResponse>;

/**
 * A fake service whose n-th EnqueueStream call runs scripts[n] (the last one for later calls).
 * Records every batch the streams carry and every unary call (jobs per call).
 */
function streamService(...scripts: Script[]) {
  const fake = {
    opened: 0,
    /** [stream number, batch id, jobs] of each batch sent on a stream. */
    batches: [] as [number, bigint, number][],
    /** Jobs per Enqueue (1) or EnqueueBatch call. */
    unary: [] as number[],
    service: undefined as unknown as DelayQueueServiceClient,
  };
  fake.service = {
    enqueueStream(requests: AsyncIterable<EnqueueStreamRequest>, options: { signal: AbortSignal }) {
      const n = fake.opened++;
      const script = scripts[Math.min(n, scripts.length - 1)]!;
      const recorded = (async function* () {
        for await (const m of requests) {
          fake.batches.push([n, m.batchId, m.requests.length]);
          yield m;
        }
      })();
      return script(recorded, options.signal);
    },
    async enqueue(req: EnqueueRequest) {
      fake.unary.push(1);
      return create(EnqueueResponseSchema, { jobId: idOf(req) });
    },
    async enqueueBatch(req: EnqueueBatchRequest) {
      fake.unary.push(req.requests.length);
      const results = req.requests.map((r) => ({ response: { jobId: idOf(r) } }));
      return create(EnqueueBatchResponseSchema, { results });
    },
  } as unknown as DelayQueueServiceClient;
  return fake;
}

const idOf = (r: EnqueueRequest) => new TextDecoder().decode(r.payload);

/** The answer a server gives a batch it stored: job ids from the payloads. */
function stored(m: EnqueueStreamRequest): EnqueueStreamResponse {
  return create(EnqueueStreamResponseSchema, {
    batchId: m.batchId,
    results: m.requests.map((r) => ({ response: { jobId: idOf(r) } })),
  });
}

/** Answers each batch as it comes; ends (as the server does) once the client half-closes. */
const echo: Script = async function* (requests) {
  for await (const m of requests) yield stored(m);
};

function job(queue: string, id: string): EnqueueRequest {
  return create(EnqueueRequestSchema, { queue, payload: new TextEncoder().encode(id) });
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Asserts every outcome is a rejection with `code`, each caller with its own error object. */
function assertAllRejected(outcomes: PromiseSettledResult<unknown>[], code: Code, message: RegExp): void {
  const reasons = outcomes.map((o) => (o.status === "rejected" ? o.reason : o.value));
  for (const r of reasons) {
    assert.ok(r instanceof ConnectError, `not a ConnectError: ${String(r)}`);
    assert.equal(r.code, code);
    assert.match(r.rawMessage, message);
  }
  assert.equal(new Set(reasons).size, reasons.length, "callers share an error object");
}

test("stream answers are matched to batches by batch_id, even out of order", async () => {
  const fake = streamService(async function* (requests) {
    const it = requests[Symbol.asyncIterator]();
    const got: EnqueueStreamRequest[] = [];
    while (got.length < 3) {
      const r = await it.next();
      if (r.done === true) return;
      got.push(r.value);
    }
    for (const m of got.reverse()) yield stored(m); // the last batch finishes first
    for (let r = await it.next(); r.done !== true; r = await it.next()) yield stored(r.value);
  });
  const batcher = new Batcher(fake.service, { maxItems: 2 });
  const ids = ["a", "b", "c", "d", "e"];
  const answers = await Promise.all(ids.map((id) => batcher.enqueue(job("q", id))));
  assert.deepEqual(answers.map((r) => r.jobId), ids);
  // Three batches on one stream, no unary call.
  assert.deepEqual(fake.batches.map(([n, , size]) => [n, size]), [[0, 2], [0, 2], [0, 1]]);
  assert.equal(new Set(fake.batches.map(([, id]) => id)).size, 3);
  assert.deepEqual(fake.unary, []);
  await batcher.close();
  assert.equal(fake.opened, 1);
});

test("a whole-batch error reaches every caller of that batch; the next batch on the stream succeeds", async () => {
  const fake = streamService(async function* (requests) {
    for await (const m of requests) {
      if (m.requests[0]?.namespace === "theirs") {
        yield create(EnqueueStreamResponseSchema, {
          batchId: m.batchId,
          error: { code: Code.PermissionDenied, message: "namespace 'theirs' is not allowed" },
        });
      } else {
        yield stored(m);
      }
    }
  });
  const batcher = new Batcher(fake.service);
  const theirs = (id: string) => create(EnqueueRequestSchema, { ...job("q", id), namespace: "theirs" });
  const refused = await Promise.allSettled([batcher.enqueue(theirs("a")), batcher.enqueue(theirs("b"))]);
  assertAllRejected(refused, Code.PermissionDenied, /namespace 'theirs' is not allowed/);
  const answers = await Promise.all([batcher.enqueue(job("q", "c")), batcher.enqueue(job("q", "d"))]);
  assert.deepEqual(answers.map((r) => r.jobId), ["c", "d"]);
  assert.deepEqual(fake.batches.map(([n, , size]) => [n, size]), [[0, 2], [0, 2]]);
  assert.deepEqual(fake.unary, []);
  await batcher.close();
  assert.equal(fake.opened, 1);
});

test("a stream that ends under a batch fails it with UNAVAILABLE; the next batch opens a new stream", async () => {
  const fake = streamService(
    async function* (requests) {
      for await (const _ of requests) return; // reads one batch, then ends without answering it
    },
    echo,
  );
  const batcher = new Batcher(fake.service);
  const failed = await Promise.allSettled([batcher.enqueue(job("q", "a")), batcher.enqueue(job("q", "b"))]);
  assertAllRejected(failed, Code.Unavailable, /the server ended the EnqueueStream/);
  assert.equal((await batcher.enqueue(job("q", "c"))).jobId, "c");
  assert.deepEqual(fake.batches.map(([n, , size]) => [n, size]), [[0, 2], [1, 1]]);
  assert.deepEqual(fake.unary, []); // not re-sent: the batch may have been stored
  await batcher.close();
  assert.equal(fake.opened, 2);
});

test("a stream that fails under a batch gives each caller the stream's status", async () => {
  const fake = streamService(
    async function* (requests) {
      for await (const _ of requests) throw new ConnectError("the server is shutting down", Code.Unavailable);
    },
    echo,
  );
  const batcher = new Batcher(fake.service);
  const failed = await Promise.allSettled([batcher.enqueue(job("q", "a")), batcher.enqueue(job("q", "b"))]);
  assertAllRejected(failed, Code.Unavailable, /shutting down/);
  assert.equal((await batcher.enqueue(job("q", "c"))).jobId, "c");
  await batcher.close();
  assert.equal(fake.opened, 2);
});

test("UNIMPLEMENTED turns the batcher to unary calls for good, the refused batch included", async () => {
  const fake = streamService(async function* () {
    throw new ConnectError("unknown method EnqueueStream", Code.Unimplemented);
  });
  const batcher = new Batcher(fake.service);
  const answers = await Promise.all(["a", "b", "c"].map((id) => batcher.enqueue(job("q", id))));
  assert.deepEqual(answers.map((r) => r.jobId), ["a", "b", "c"]);
  assert.equal((await batcher.enqueue(job("q", "d"))).jobId, "d");
  assert.deepEqual(fake.unary, [3, 1]); // EnqueueBatch, then a lone Enqueue
  await batcher.close();
  assert.equal(fake.opened, 1); // never tried again
});

test("a stream the server does not serve is never opened again by a later send", async () => {
  // The batcher checks `unsupported` before it sends; send itself refuses too, as the
  // Python and Go clients must (a sender there could pass the check just before the refusal).
  const fake = streamService(async function* () {
    throw new ConnectError("unknown method EnqueueStream", Code.Unimplemented);
  });
  const stream = new EnqueueStream(fake.service);
  await assert.rejects(stream.send([job("q", "a")]), StreamUnsupportedError);
  assert.equal(stream.unsupported, true);
  await assert.rejects(stream.send([job("q", "b")]), StreamUnsupportedError);
  await stream.close();
  assert.equal(fake.opened, 1);
});

test("an aborted caller stops waiting; the rest of its batch is answered", async () => {
  let answer: () => void = () => {};
  const answered = new Promise<void>((r) => (answer = r));
  const fake = streamService(async function* (requests) {
    for await (const m of requests) {
      await answered;
      yield stored(m);
    }
  });
  const batcher = new Batcher(fake.service);
  const abort = new AbortController();
  const aborted = batcher.enqueue(job("q", "a"), abort.signal);
  const kept = batcher.enqueue(job("q", "b"));
  while (fake.batches.length === 0) await sleep(1);
  abort.abort();
  await assert.rejects(aborted, (e: unknown) => e instanceof ConnectError && e.code === Code.Canceled);
  answer();
  assert.equal((await kept).jobId, "b");
  await batcher.close();
});

test("an idle stream is half-closed and the next batch opens a new one", async () => {
  const ended: number[] = [];
  let n = 0;
  const fake = streamService(async function* (requests) {
    const mine = n++;
    for await (const m of requests) yield stored(m);
    ended.push(mine); // the client half-closed: the server ends the stream
  });
  const stream = new EnqueueStream(fake.service, { idleCloseMs: 200 });
  await stream.send([job("q", "a")]);
  await stream.send([job("q", "b")]); // within the idle time: same stream
  assert.deepEqual(ended, []);
  // The idle close ends the first stream: wait for that event (10 s at most, not a timing).
  for (let i = 0; ended.length === 0; i++) {
    assert.ok(i < 2_000, "the idle stream was never half-closed");
    await sleep(5);
  }
  assert.deepEqual(ended, [0]);
  await stream.send([job("q", "c")]);
  assert.equal(fake.opened, 2);
  await stream.close();
  assert.deepEqual(ended, [0, 1]);
});

test("close waits for the server to end the stream, then aborts a server that does not", async () => {
  let signal: AbortSignal | undefined;
  const fake = streamService(async function* (requests, s) {
    signal = s;
    for await (const m of requests) yield stored(m);
    // Half-closed, but this server never ends the stream: only the client's abort does.
    await new Promise<void>((_, reject) =>
      s.addEventListener("abort", () => reject(new ConnectError("aborted", Code.Canceled)), { once: true }),
    );
  });
  const stream = new EnqueueStream(fake.service, { closeWaitMs: 50 });
  assert.equal((await stream.send([job("q", "a")])).results[0]?.response?.jobId, "a");
  const started = Date.now();
  await stream.close();
  const took = Date.now() - started;
  assert.ok(signal?.aborted === true, "the call was not aborted");
  // At least the wait; the upper bound only says close did not hang on a server that never ends.
  assert.ok(took >= 45 && took < 30_000, `close took ${took} ms`);

  // A server that ends the stream on half-close is waited for, not aborted.
  let politeSignal: AbortSignal | undefined;
  const polite = streamService(async function* (requests, s) {
    politeSignal = s;
    yield* echo(requests, s);
  });
  const second = new EnqueueStream(polite.service, { closeWaitMs: 60_000 });
  await second.send([job("q", "b")]);
  await second.close();
  assert.equal(politeSignal?.aborted, false);
});
