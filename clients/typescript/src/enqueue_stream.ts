/**
 * The batcher's batches as messages on one long-lived EnqueueStream (issue 12; docs/decisions.md,
 * "EnqueueStream"). A message on an open stream costs the server about half of a unary call,
 * whatever the client's language. The stream opens on the first batch, stays open, and opens
 * again on the next batch after it ended; each batch waits for the answer with its batch_id. A
 * server without the method (UNIMPLEMENTED) turns the batcher back to Enqueue and EnqueueBatch
 * calls, for good.
 *
 * Node keeps a process alive while an HTTP/2 stream is open, so unlike the Go and Python clients
 * this one half-closes a stream that has had no batch for {@link IDLE_CLOSE_MS}: a program that
 * never calls close() still exits (that much later), and a producer that goes quiet holds no
 * stream. The next batch opens a new one.
 *
 * Connect-node reports a stream refused at open (UNIMPLEMENTED, UNAUTHENTICATED) with its own
 * status even when the first batch was written before the refusal came back, so unlike grpc.aio
 * (grpc#36066) the first batch does not wait for the server's `delayq-enqueue-stream` header.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { createWritableIterable, type WritableIterable } from "@connectrpc/connect/protocol";

import {
  EnqueueStreamRequestSchema,
  type EnqueueRequest,
  type EnqueueStreamRequest,
  type EnqueueStreamResponse,
} from "./gen/delayq/v1/service_pb.js";
import type { DelayQueueServiceClient } from "./client.js";

/** How long close() waits for the server to end the stream before aborting it. */
export const CLOSE_WAIT_MS = 5_000;
/** A stream with no batch waiting for this long is half-closed (see the module doc). */
export const IDLE_CLOSE_MS = 1_000;

/** The server answered UNIMPLEMENTED: it predates EnqueueStream, and no batch was stored. */
export class StreamUnsupportedError extends Error {
  constructor() {
    super("the server has no EnqueueStream");
    this.name = "StreamUnsupportedError";
  }
}

interface Waiter {
  resolve: (r: EnqueueStreamResponse) => void;
  reject: (e: unknown) => void;
}

/** One EnqueueStream call and the batches waiting for its answers. */
interface OpenStream {
  /** The request side: batches written here are sent in order; close() half-closes. */
  readonly outbox: WritableIterable<EnqueueStreamRequest>;
  readonly abort: AbortController;
  /** Batches sent and not answered; undefined once the stream ended (the reader failed them). */
  waiting: Map<bigint, Waiter> | undefined;
  idleTimer: NodeJS.Timeout | undefined;
  reader: Promise<void>;
}

/** Sends batches on one long-lived EnqueueStream; see the module doc. */
export class EnqueueStream {
  /** Set once the server answered UNIMPLEMENTED: it predates EnqueueStream. */
  unsupported = false;
  private ids = 0n;
  private current: OpenStream | undefined;
  /** Streams whose reader has not finished (the current one, and half-closed idle ones). */
  private readonly live = new Set<OpenStream>();

  private readonly idleCloseMs: number;
  private readonly closeWaitMs: number;

  /** `timing` is for tests; the defaults are IDLE_CLOSE_MS and CLOSE_WAIT_MS. */
  constructor(
    private readonly service: DelayQueueServiceClient,
    timing: { idleCloseMs?: number; closeWaitMs?: number } = {},
  ) {
    this.idleCloseMs = timing.idleCloseMs ?? IDLE_CLOSE_MS;
    this.closeWaitMs = timing.closeWaitMs ?? CLOSE_WAIT_MS;
  }

  /**
   * One batch's answer. Rejects with the stream's ConnectError when it ended before answering
   * (one object per stream: copy it per caller), or a StreamUnsupportedError.
   */
  send(requests: EnqueueRequest[]): Promise<EnqueueStreamResponse> {
    // Never reopen a stream the server refused as UNIMPLEMENTED (nothing was stored).
    if (this.unsupported) return Promise.reject(new StreamUnsupportedError());
    const st = this.open();
    const batchId = ++this.ids;
    return new Promise<EnqueueStreamResponse>((resolve, reject) => {
      // open() returned a stream whose reader has not ended: `waiting` is set.
      st.waiting!.set(batchId, { resolve, reject });
      // Settles when the transport takes the message; a stream that ends first rejects it,
      // and the reader then fails this batch with the stream's error.
      st.outbox.write(create(EnqueueStreamRequestSchema, { batchId, requests })).catch(() => {});
    });
  }

  private open(): OpenStream {
    const cur = this.current;
    if (cur !== undefined && cur.waiting !== undefined) {
      if (cur.idleTimer !== undefined) {
        clearTimeout(cur.idleTimer);
        cur.idleTimer = undefined;
      }
      return cur;
    }
    const st: OpenStream = {
      outbox: createWritableIterable<EnqueueStreamRequest>(),
      abort: new AbortController(),
      waiting: new Map(),
      idleTimer: undefined,
      reader: Promise.resolve(),
    };
    // No deadline (timeoutMs 0 overrides a transport's default): the stream lives as long as
    // it has batches; each caller has its own signal.
    const responses = this.service.enqueueStream(st.outbox, { signal: st.abort.signal, timeoutMs: 0 });
    st.reader = this.read(st, responses);
    this.current = st;
    this.live.add(st);
    return st;
  }

  /** Answers batches by id until the stream ends, then fails the rest with its error. */
  private async read(st: OpenStream, responses: AsyncIterable<EnqueueStreamResponse>): Promise<void> {
    let err: ConnectError;
    try {
      for await (const resp of responses) {
        const w = st.waiting?.get(resp.batchId);
        if (w === undefined) continue; // not ours (a server bug): nobody waits for it
        st.waiting!.delete(resp.batchId);
        w.resolve(resp);
        if (st.waiting!.size === 0 && st === this.current) this.idle(st);
      }
      err = new ConnectError("the server ended the EnqueueStream", Code.Unavailable);
    } catch (e) {
      err = ConnectError.from(e);
    }
    // UNIMPLEMENTED comes at open: no batch was read, so the batcher sends them as calls.
    const unsupported = err.code === Code.Unimplemented;
    if (unsupported) this.unsupported = true;
    const waiting = st.waiting!;
    st.waiting = undefined;
    if (st.idleTimer !== undefined) clearTimeout(st.idleTimer);
    st.outbox.close(); // the transport stops waiting for a next batch
    this.live.delete(st);
    for (const w of waiting.values()) w.reject(unsupported ? new StreamUnsupportedError() : err);
  }

  /** No batch waits on `st`: half-close it unless one comes within idleCloseMs. */
  private idle(st: OpenStream): void {
    if (st.idleTimer !== undefined) clearTimeout(st.idleTimer);
    st.idleTimer = setTimeout(() => {
      st.idleTimer = undefined;
      if (st.waiting?.size !== 0) return; // a batch came meanwhile, or the stream ended
      if (this.current === st) this.current = undefined;
      st.outbox.close(); // the server answers nothing more and ends the stream
    }, this.idleCloseMs);
    // An open stream keeps the process alive anyway; the timer itself should not.
    st.idleTimer.unref();
  }

  /**
   * Half-closes the stream (call once no batch is in flight) and waits for the server to end
   * it, at most closeWaitMs; then aborts the call.
   */
  async close(): Promise<void> {
    const cur = this.current;
    this.current = undefined;
    if (cur !== undefined) {
      if (cur.idleTimer !== undefined) clearTimeout(cur.idleTimer);
      cur.idleTimer = undefined;
      cur.outbox.close();
    }
    const streams = [...this.live];
    if (streams.length === 0) return;
    const readers = Promise.allSettled(streams.map((s) => s.reader));
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((r) => (timer = setTimeout(() => r(true), this.closeWaitMs)));
    try {
      if (await Promise.race([readers.then(() => false), late])) {
        // A server that does not end the stream: stop waiting for it.
        for (const s of streams) s.abort.abort();
        await readers;
      }
    } finally {
      clearTimeout(timer);
    }
  }
}
