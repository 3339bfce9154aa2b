/**
 * Client-side batching of concurrent enqueue() calls (issue 12; rules in docs/decisions.md).
 *
 * A call made while no batch is in flight goes out after the current turn of the event loop
 * (so calls started together travel together, and a lone caller is not delayed); calls made
 * while one is in flight gather until it returns, `maxDelayMs` passes, or `maxItems` jobs or
 * `maxBytes` bytes wait, and then travel together: as one message on the client's long-lived
 * EnqueueStream (enqueue_stream.ts), or, with `unaryCalls` or against a server without the
 * stream (UNIMPLEMENTED), as one EnqueueBatch call (a lone job as one Enqueue).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";

import {
  EnqueueBatchRequestSchema,
  EnqueueRequestSchema,
  type EnqueueBatchResult,
  type EnqueueRequest,
  type EnqueueResponse,
} from "./gen/delayq/v1/service_pb.js";
import type { DelayQueueServiceClient } from "./client.js";
import { EnqueueStream, StreamUnsupportedError } from "./enqueue_stream.js";

/**
 * How concurrent enqueue() calls are gathered; unset fields take the defaults.
 *
 * Batches travel as messages on one long-lived EnqueueStream per client (opened on the first
 * batch, half-closed by close() or after a second without batches, opened again when needed):
 * a message costs the server about half of a call. Against a server without EnqueueStream
 * (UNIMPLEMENTED) the client goes back to calls for good; `unaryCalls: true` chooses calls.
 */
export interface BatchOptions {
  /** Longest a call waits for company while another batch is in flight (default 5). */
  maxDelayMs?: number;
  /** Most jobs per batch (default 500, at most 1000). */
  maxItems?: number;
  /** Most encoded request bytes per batch (default 1 MiB, at most 3 MiB). */
  maxBytes?: number;
  /**
   * Send each batch as its own EnqueueBatch call (a lone job as one Enqueue) instead of a
   * message on the EnqueueStream (default false): for load balancers that spread calls one
   * by one over replicas, as a stream stays on one.
   */
  unaryCalls?: boolean;
}

interface Item {
  req: EnqueueRequest;
  size: number;
  resolve: (r: EnqueueResponse) => void;
  reject: (e: unknown) => void;
}

/** Gathers enqueue() calls of one client into batches: EnqueueStream messages or EnqueueBatch calls. */
export class Batcher {
  private readonly maxDelayMs: number;
  private readonly maxItems: number;
  private readonly maxBytes: number;
  private pending: Item[] = [];
  private bytes = 0;
  private inFlight = 0;
  private timer: NodeJS.Timeout | undefined;
  private scheduled = false;
  private closed = false;
  private readonly calls = new Set<Promise<void>>();
  /** The EnqueueStream, unless `unaryCalls`. */
  private readonly stream: EnqueueStream | undefined;

  constructor(
    private readonly service: DelayQueueServiceClient,
    options: BatchOptions = {},
  ) {
    this.maxDelayMs = options.maxDelayMs ?? 5;
    this.maxItems = Math.min(Math.max(options.maxItems ?? 500, 1), 1000);
    this.maxBytes = Math.min(Math.max(options.maxBytes ?? 1 << 20, 1024), 3 << 20);
    this.stream = options.unaryCalls === true ? undefined : new EnqueueStream(service);
  }

  /** Queues one request; resolves with its answer or rejects with its own ConnectError. */
  enqueue(req: EnqueueRequest, signal?: AbortSignal): Promise<EnqueueResponse> {
    if (this.closed) return Promise.reject(new ConnectError("client is closed", Code.FailedPrecondition));
    if (signal?.aborted) return Promise.reject(ConnectError.from(signal.reason, Code.Canceled));
    return new Promise<EnqueueResponse>((resolve, reject) => {
      const size = toBinary(EnqueueRequestSchema, req).length + 8;
      if (this.pending.length > 0 && this.bytes + size > this.maxBytes) this.flush();
      let settled = false;
      const item: Item = {
        req,
        size,
        resolve: (r) => {
          settled = true;
          resolve(r);
        },
        reject: (e) => {
          settled = true;
          reject(e);
        },
      };
      // An aborted caller stops waiting; its job may still be stored, as with a unary call.
      signal?.addEventListener(
        "abort",
        () => {
          if (!settled) item.reject(ConnectError.from(signal.reason, Code.Canceled));
        },
        { once: true },
      );
      this.pending.push(item);
      this.bytes += size;
      if (this.pending.length >= this.maxItems || this.bytes >= this.maxBytes) {
        this.flush();
      } else if (this.inFlight === 0) {
        if (!this.scheduled) {
          this.scheduled = true;
          setImmediate(() => {
            this.scheduled = false;
            this.flush();
          });
        }
      } else if (this.timer === undefined) {
        this.timer = setTimeout(() => this.flush(), this.maxDelayMs);
      }
    });
  }

  private flush(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    const items = this.pending;
    this.pending = [];
    this.bytes = 0;
    if (items.length === 0) return;
    this.inFlight++;
    const call = this.run(items).finally(() => {
      this.calls.delete(call);
      this.inFlight--;
      // Group commit: whatever gathered while this call was out goes now.
      if (this.inFlight === 0 && this.pending.length > 0) this.flush();
    });
    this.calls.add(call);
  }

  /**
   * Stores the batch as one message on the EnqueueStream, or (unaryCalls, or a server without
   * the stream) as one Enqueue for a lone job, else one EnqueueBatch, and answers per job: a
   * per-item error rejects that caller alone; an error of the call, of the stream or of the
   * whole batch rejects every caller of the batch, each with its own ConnectError.
   */
  private async run(items: Item[]): Promise<void> {
    try {
      const reqs = items.map((i) => i.req);
      if (this.stream !== undefined && !this.stream.unsupported) {
        try {
          const resp = await this.stream.send(reqs);
          if (resp.error !== undefined) throw new ConnectError(resp.error.message, resp.error.code as Code);
          answer(items, resp.results, "EnqueueStream");
          return;
        } catch (e) {
          // UNIMPLEMENTED: nothing was stored, so the batch goes again as calls.
          if (!(e instanceof StreamUnsupportedError)) throw e;
        }
      }
      if (items.length === 1) {
        const only = items[0]!;
        only.resolve(await this.service.enqueue(only.req));
        return;
      }
      const resp = await this.service.enqueueBatch(create(EnqueueBatchRequestSchema, { requests: reqs }));
      answer(items, resp.results, "EnqueueBatch");
    } catch (e) {
      // An error of the call, the stream or the whole batch fails every job, each with its own error.
      const err = ConnectError.from(e);
      for (const item of items) item.reject(new ConnectError(err.rawMessage, err.code));
    }
  }

  /**
   * Sends what is gathering, waits for every batch in flight, then half-closes the EnqueueStream
   * and waits (at most 5 s) for the server to end it.
   */
  async close(): Promise<void> {
    this.closed = true;
    this.flush();
    while (this.calls.size > 0) await Promise.allSettled([...this.calls]);
    await this.stream?.close();
  }
}

/** Settles each job with its own result; throws (failing every job) on a count mismatch. */
function answer(items: Item[], results: EnqueueBatchResult[], method: string): void {
  if (results.length !== items.length) {
    throw new ConnectError(`${method} answered ${results.length} results for ${items.length} jobs`, Code.Internal);
  }
  items.forEach((item, i) => {
    const r = results[i]!;
    if (r.error !== undefined) {
      item.reject(new ConnectError(r.error.message, r.error.code as Code));
    } else {
      item.resolve(r.response!);
    }
  });
}
