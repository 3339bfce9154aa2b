/** Unit tests of the enqueue batcher against a fake service (no server). */
import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import { Batcher, type BatchOptions } from "../src/batcher.js";
import type { DelayQueueServiceClient } from "../src/client.js";
import {
  EnqueueBatchResponseSchema,
  EnqueueRequestSchema,
  EnqueueResponseSchema,
  type EnqueueBatchRequest,
  type EnqueueRequest,
} from "../src/gen/delayq/v1/service_pb.js";

/**
 * Answers Enqueue/EnqueueBatch; a call whose first job has queue "hold" waits for release().
 * Its EnqueueStream answers UNIMPLEMENTED, as a server from before the method: the batcher
 * falls back to the calls these tests count (test/enqueue_stream.test.ts tests the stream).
 */
function fakeService(failRpc?: ConnectError) {
  const jobsPerCall: number[] = [];
  const streams = { opened: 0 };
  let release: () => void = () => {};
  const held = new Promise<void>((r) => (release = r));
  const maybeHold = async (first: EnqueueRequest, n: number) => {
    jobsPerCall.push(n);
    if (first.queue === "hold") await held;
    if (failRpc !== undefined) throw failRpc;
  };
  const service = {
    async *enqueueStream() {
      streams.opened++;
      throw new ConnectError("unknown method EnqueueStream", Code.Unimplemented);
    },
    async enqueue(req: EnqueueRequest) {
      await maybeHold(req, 1);
      return create(EnqueueResponseSchema, { jobId: new TextDecoder().decode(req.payload) });
    },
    async enqueueBatch(req: EnqueueBatchRequest) {
      await maybeHold(req.requests[0]!, req.requests.length);
      return create(EnqueueBatchResponseSchema, {
        results: req.requests.map((r) =>
          r.queue === "bad"
            ? { error: { code: Code.InvalidArgument, message: "queue: bad name" } }
            : { response: { jobId: new TextDecoder().decode(r.payload) } },
        ),
      });
    },
  } as unknown as DelayQueueServiceClient;
  return { service, jobsPerCall, streams, release: () => release() };
}

function job(queue: string, id: string): EnqueueRequest {
  return create(EnqueueRequestSchema, { queue, payload: new TextEncoder().encode(id) });
}

const turn = () => new Promise<void>((r) => setImmediate(r));

// The call transport, reached two ways: a server that answers EnqueueStream with UNIMPLEMENTED
// (the stream is tried once, then every batch goes as calls), and unaryCalls (no stream at all).
for (const mode of ["without EnqueueStream", "unaryCalls"] as const) {
  const options = (o: BatchOptions = {}): BatchOptions => (mode === "unaryCalls" ? { ...o, unaryCalls: true } : o);
  const streamsOpened = mode === "unaryCalls" ? 0 : 1;

  test(`${mode}: calls started together travel in one batch; each caller gets its own answer`, async () => {
    const fake = fakeService();
    const batcher = new Batcher(fake.service, options());
    const outcomes = await Promise.allSettled([
      batcher.enqueue(job("q", "a")),
      batcher.enqueue(job("bad", "b")),
      batcher.enqueue(job("q", "c")),
    ]);
    assert.deepEqual(fake.jobsPerCall, [3]);
    assert.equal(outcomes[0]!.status === "fulfilled" && outcomes[0]!.value.jobId, "a");
    assert.equal(outcomes[2]!.status === "fulfilled" && outcomes[2]!.value.jobId, "c");
    const refused = outcomes[1]!;
    assert.ok(refused.status === "rejected" && refused.reason instanceof ConnectError);
    assert.equal(refused.status === "rejected" && (refused.reason as ConnectError).code, Code.InvalidArgument);
    await batcher.close();
    assert.equal(fake.streams.opened, streamsOpened);
  });

  test(`${mode}: a lone call is a plain Enqueue; calls made while it is out gather behind it`, async () => {
    const fake = fakeService();
    const batcher = new Batcher(fake.service, options({ maxDelayMs: 60_000 }));
    const first = batcher.enqueue(job("hold", "first"));
    while (fake.jobsPerCall.length === 0) await turn();
    const rest = [batcher.enqueue(job("q", "x")), batcher.enqueue(job("q", "y"))];
    await turn();
    assert.deepEqual(fake.jobsPerCall, [1]);
    fake.release();
    assert.equal((await first).jobId, "first");
    assert.deepEqual((await Promise.all(rest)).map((r) => r.jobId), ["x", "y"]);
    // Sent as soon as the first call returned (group commit), not after maxDelayMs.
    assert.deepEqual(fake.jobsPerCall, [1, 2]);
    await batcher.close();
    assert.equal(fake.streams.opened, streamsOpened);
  });

  test(`${mode}: close sends what is still gathering`, async () => {
    const fake = fakeService();
    const batcher = new Batcher(fake.service, options({ maxDelayMs: 60_000 }));
    const first = batcher.enqueue(job("hold", "first"));
    while (fake.jobsPerCall.length === 0) await turn();
    const rest = [batcher.enqueue(job("q", "x")), batcher.enqueue(job("q", "y"))];
    const closed = batcher.close();
    await turn();
    assert.deepEqual(fake.jobsPerCall, [1, 2]);
    fake.release();
    await closed;
    assert.equal((await first).jobId, "first");
    assert.deepEqual((await Promise.all(rest)).map((r) => r.jobId), ["x", "y"]);
    await assert.rejects(batcher.enqueue(job("q", "z")), /closed/);
    assert.equal(fake.streams.opened, streamsOpened);
  });

  test(`${mode}: an RPC-level error fails every caller of the batch`, async () => {
    const fake = fakeService(new ConnectError("down", Code.Unavailable));
    const batcher = new Batcher(fake.service, options());
    const outcomes = await Promise.allSettled([1, 2, 3].map((i) => batcher.enqueue(job("q", String(i)))));
    assert.deepEqual(fake.jobsPerCall, [3]);
    for (const o of outcomes) {
      assert.ok(o.status === "rejected" && o.reason instanceof ConnectError && o.reason.code === Code.Unavailable);
    }
    await batcher.close();
    assert.equal(fake.streams.opened, streamsOpened);
  });
}
