/** DelayQClient: a typed wrapper over the generated DelayQueueService client. */
import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromDate } from "@bufbuild/protobuf/wkt";
import { createClient, type Client, type Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  DelayQueueService,
  EnqueueRequestSchema,
  type EnqueueRequest,
  type EnqueueResponse,
} from "./gen/delayq/v1/service_pb.js";
import { Batcher, type BatchOptions } from "./batcher.js";
import { work, type Handler, type WorkOptions } from "./worker.js";

/** How to reach the server. */
export interface ClientOptions {
  /** "host:port" (plaintext) or a full URL ("https://delayq.example:443"). */
  address: string;
  /** Namespace for every request; empty or unset means the server's "default". */
  namespace?: string;
  /** A transport of your own (TLS, interceptors); `address` is then ignored. */
  transport?: Transport;
  /**
   * Batching of concurrent enqueue() calls: on by default (a call made while no batch is in
   * flight still goes out at once). Batches travel as messages on one EnqueueStream, or as
   * EnqueueBatch calls with `{ unaryCalls: true }` (see {@link BatchOptions}); `false` sends
   * one Enqueue per call.
   */
  batching?: BatchOptions | boolean;
}

/** Optional fields of one job. */
export interface EnqueueOptions {
  /** Due this many milliseconds after the server receives the job. */
  delayMs?: number;
  /** Due at this instant (server clock); wins over delayMs when both are set. */
  dueTime?: Date;
  /** Headers kept with the job: trace context (traceparent, tracestate) and user metadata. */
  headers?: Record<string, string>;
  /** Drop the job if it is not acked this long after enqueue. */
  ttlMs?: number;
  /** Deliveries allowed before dead-lettering (1 to 1000; unset: server default). */
  maxAttempts?: number;
  /** A repeat with the same key within the server's window stores nothing. */
  idempotencyKey?: string;
  /** Abort the call. */
  signal?: AbortSignal;
}

/** The generated client type, for the RPCs the helpers do not wrap. */
export type DelayQueueServiceClient = Client<typeof DelayQueueService>;

/** Builds a gRPC (HTTP/2) transport for "host:port" or a URL. */
export function grpcTransport(address: string): Transport {
  const baseUrl = /^https?:\/\//.test(address) ? address : `http://${address}`;
  return createGrpcTransport({ baseUrl });
}

/** Client for one delayq server; safe to share across the process. */
export class DelayQClient {
  /** The generated client: every RPC of delayq.v1.DelayQueueService. */
  readonly service: DelayQueueServiceClient;
  readonly namespace: string;
  private readonly batcher: Batcher | undefined;

  constructor(options: ClientOptions) {
    this.service = createClient(DelayQueueService, options.transport ?? grpcTransport(options.address));
    this.namespace = options.namespace ?? "";
    const batching = options.batching ?? true;
    this.batcher = batching === false ? undefined : new Batcher(this.service, batching === true ? {} : batching);
  }

  /**
   * Sends the enqueues still gathering, waits for their answers and closes the EnqueueStream.
   * Without it an open stream keeps the process alive until it has been idle for a second.
   */
  close(): Promise<void> {
    return this.batcher?.close() ?? Promise.resolve();
  }

  /** Builds the EnqueueRequest that enqueue() sends; useful for enqueueBatch. */
  enqueueRequest(queue: string, payload: Uint8Array | string, options: EnqueueOptions = {}): EnqueueRequest {
    const req = create(EnqueueRequestSchema, {
      namespace: this.namespace,
      queue,
      payload: typeof payload === "string" ? new TextEncoder().encode(payload) : payload,
      headers: { ...options.headers },
      maxAttempts: options.maxAttempts ?? 0,
      idempotencyKey: options.idempotencyKey ?? "",
    });
    if (options.dueTime !== undefined) {
      req.schedule = { case: "dueTime", value: timestampFromDate(options.dueTime) };
    } else if (options.delayMs !== undefined) {
      req.schedule = { case: "delay", value: durationFromMs(options.delayMs) };
    }
    if (options.ttlMs !== undefined) {
      req.ttl = durationFromMs(options.ttlMs);
    }
    return req;
  }

  /**
   * Stores one job; resolves to the server's answer (jobId, dueTime, duplicate). With batching
   * (the default) it may travel in one batch with concurrent calls (an EnqueueStream message or
   * an EnqueueBatch call); a refusal of this job still rejects this call alone, with its own
   * ConnectError.
   */
  enqueue(queue: string, payload: Uint8Array | string, options: EnqueueOptions = {}): Promise<EnqueueResponse> {
    const req = this.enqueueRequest(queue, payload, options);
    if (this.batcher !== undefined) return this.batcher.enqueue(req, options.signal);
    const call = options.signal === undefined ? {} : { signal: options.signal };
    return this.service.enqueue(req, call);
  }

  /**
   * Runs `handler` for every delivery of `options.queues` until
   * `options.signal` aborts; see {@link work}.
   */
  work(options: WorkOptions, handler: Handler): Promise<void> {
    return work(this.service, this.namespace, options, handler);
  }
}
