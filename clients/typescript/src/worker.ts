/** The worker loop: consume, run a handler with lease renewal, ack or nack. */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Client } from "@connectrpc/connect";

import type { Delivery } from "./gen/delayq/v1/job_pb.js";
import { AckResult, type DelayQueueService, type NackRequest } from "./gen/delayq/v1/service_pb.js";

/** What a handler gets besides the delivery. */
export interface HandlerContext {
  /** Aborted when the lease is lost or a shutdown's drain timeout runs out. */
  signal: AbortSignal;
}

/**
 * Processes one delivery. Resolving acks it; throwing (or rejecting) nacks it
 * with the error's message as reason. Throw {@link retryAfter} or
 * {@link deadLetter} to choose where the job goes.
 */
export type Handler = (delivery: Delivery, context: HandlerContext) => Promise<void>;

/** Options of {@link work}; only `queues` is required. */
export interface WorkOptions {
  /** Queues in priority order (queues[0] is always preferred). */
  queues: string[];
  /** Handlers running at once, sent as the stream's max_outstanding. Default 1. */
  concurrency?: number;
  /** Lease asked per delivery and per renewal. Default 30 000 ms (server range 1 s to 12 h). */
  leaseMs?: number;
  /** Renewal period while a handler runs. Default leaseMs / 3. */
  renewEveryMs?: number;
  /** How long a shutdown waits for running handlers before aborting them. Default 30 000 ms. */
  drainTimeoutMs?: number;
  /** Cap on the wait between attempts to reopen a broken stream. Default 5 000 ms. */
  maxReconnectBackoffMs?: number;
  /**
   * How long the server keeps the stream's leases after the stream ends (the
   * request's release_grace). Within it, deliveries not started are given back
   * with Release (attempts not counted) and running handlers keep their leases
   * and still settle, so a transport blip never runs a job twice; after a real
   * crash the jobs are redelivered after the grace. Default 5 000 ms, capped at
   * leaseMs; 0: none (leases released, attempts counted, when the stream ends).
   */
  releaseGraceMs?: number;
  /**
   * How long a finished delivery's ack waits for others to share its Ack call
   * (at most 1 000 tokens, 2 calls at once): each unary call costs the server
   * about 1 ms of CPU, so one call per job is most of its work at 1 000 jobs/s.
   * Acks go at once when the stream's credit (concurrency) is used up, when a
   * call is full and on shutdown. Default 10 ms; 0 sends each ack at once.
   */
  ackLingerMs?: number;
  /** Stops the loop: running handlers finish and settle, then work() resolves. */
  signal?: AbortSignal;
  /**
   * Hears problems that do not stop the loop: failed ack/nack/renewal, a stale
   * ack, a lost lease ({@link LeaseLostError}), a broken stream about to be
   * reopened (no delivery then). Default: ignored.
   */
  onError?: (error: unknown, delivery?: Delivery) => void;
}

/** A handler error that says how to nack. */
export class NackError extends Error {
  constructor(
    message: string,
    readonly delayMs: number | undefined,
    readonly deadLetter: boolean,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "NackError";
  }
}

/** Wraps an error so that the job is retried after `delayMs` instead of its retry policy's backoff. */
export function retryAfter(error: unknown, delayMs: number): NackError {
  return new NackError(messageOf(error), delayMs, false, { cause: error });
}

/** Wraps an error so that the job is dead-lettered at once. */
export function deadLetter(error: unknown): NackError {
  return new NackError(messageOf(error), undefined, true, { cause: error });
}

/** Reported through onError when the server refuses to extend a stale lease. */
export class LeaseLostError extends Error {
  constructor(options?: { cause?: unknown }) {
    super("delayq: lease lost", options);
    this.name = "LeaseLostError";
  }
}

const SETTLE_TIMEOUT_MS = 10_000;
/** The server's cap on tokens in one Ack or Release. */
const MAX_TOKENS_PER_CALL = 1000;
const MAX_ACK_CALLS = 2;
const MAX_REASON_BYTES = 4096;
const PERMANENT = new Set([Code.InvalidArgument, Code.Unauthenticated, Code.PermissionDenied, Code.Unimplemented]);

type Service = Client<typeof DelayQueueService>;

interface Settings {
  queues: string[];
  concurrency: number;
  leaseMs: number;
  renewEveryMs: number;
  drainTimeoutMs: number;
  maxReconnectBackoffMs: number;
  releaseGraceMs: number;
  ackLingerMs: number;
  signal: AbortSignal;
  onError: (error: unknown, delivery?: Delivery) => void;
}

/**
 * Runs `handler` for every delivery until `options.signal` aborts, reopening
 * the stream with backoff when it breaks. Rejects at once on refusals a retry
 * cannot fix (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED).
 */
export async function work(service: Service, namespace: string, options: WorkOptions, handler: Handler): Promise<void> {
  if (options.queues.length === 0) {
    throw new Error("delayq: WorkOptions.queues is empty");
  }
  const leaseMs = options.leaseMs ?? 30_000;
  const s: Settings = {
    queues: options.queues,
    concurrency: Math.max(1, options.concurrency ?? 1),
    leaseMs,
    renewEveryMs: options.renewEveryMs ?? leaseMs / 3,
    drainTimeoutMs: options.drainTimeoutMs ?? 30_000,
    maxReconnectBackoffMs: options.maxReconnectBackoffMs ?? 5_000,
    releaseGraceMs: Math.max(0, Math.min(options.releaseGraceMs ?? 5_000, leaseMs)),
    ackLingerMs: Math.max(0, options.ackLingerMs ?? 10),
    signal: options.signal ?? new AbortController().signal,
    onError: options.onError ?? (() => {}),
  };
  let backoffMs = 50;
  while (!s.signal.aborted) {
    const started = Date.now();
    try {
      await consumeStream(service, namespace, s, handler);
    } catch (err) {
      if (s.signal.aborted) break;
      if (err instanceof ConnectError && PERMANENT.has(err.code)) throw err;
      s.onError(new Error("delayq: consume stream broke, reopening", { cause: err }));
    }
    if (s.signal.aborted) break;
    if (Date.now() - started > s.maxReconnectBackoffMs) backoffMs = 50;
    await abortableDelay(backoffMs, s.signal);
    backoffMs = Math.min(2 * backoffMs, s.maxReconnectBackoffMs);
  }
}

const STOP = Symbol("stop");

/** Runs one Consume stream until it breaks or the loop is stopped. */
async function consumeStream(service: Service, namespace: string, s: Settings, handler: Handler): Promise<void> {
  // Without a release grace the stream outlives the stop signal: acks must
  // reach the server while it is open, because closing it releases every lease.
  const stream = new AbortController();
  const handlers = new AbortController();
  // Aborted when the stream ends within its grace: running handlers extend
  // their leases at once, so the grace does not release them.
  const keep = new AbortController();
  const graceOn = s.releaseGraceMs > 0;
  const running = new Set<Promise<void>>();
  const pending: Delivery[] = []; // received, not started
  // The server counts a delivery as outstanding until its ack arrives, and a
  // handler's promise stays in `running` until its ack is answered: when they
  // fill the credit, the next delivery waits for these acks, so no linger.
  const acks = new AckBatcher(service, s.ackLingerMs, () => running.size + pending.length >= s.concurrency);
  const stopped = new Promise<typeof STOP>((resolve) => {
    if (s.signal.aborted) resolve(STOP);
    s.signal.addEventListener("abort", () => resolve(STOP), { once: true });
  });
  const responses = service
    .consume(
      {
        namespace,
        queues: s.queues,
        maxOutstanding: s.concurrency,
        leaseDuration: durationFromMs(s.leaseMs),
        ...(graceOn ? { releaseGrace: durationFromMs(s.releaseGraceMs) } : {}),
      },
      { signal: stream.signal },
    )
    [Symbol.asyncIterator]();
  /** Closes the stream; keeps what runs; gives back what never started. */
  const endWithGrace = async (): Promise<void> => {
    stream.abort();
    keep.abort();
    await giveBack(service, s, pending.splice(0));
  };
  try {
    for (;;) {
      const next = responses.next();
      next.catch(() => {}); // may reject after a stop, when nobody awaits it
      const got = await Promise.race([next, stopped]);
      if (got === STOP) {
        acks.stop();
        if (graceOn) await endWithGrace();
        await drain(running, handlers, s.drainTimeoutMs);
        return;
      }
      if (got.done === true) {
        throw new Error("delayq: server ended the Consume stream");
      }
      pending.push(...got.value.deliveries);
      while (pending.length > 0) {
        while (running.size >= s.concurrency) {
          if ((await Promise.race([Promise.race(running), stopped])) === STOP) break;
        }
        if (s.signal.aborted) break;
        const delivery = pending.shift() as Delivery;
        const p = processDelivery(service, s, acks, handler, delivery, handlers.signal, keep.signal).finally(() =>
          running.delete(p),
        );
        running.add(p);
      }
    }
  } catch (err) {
    acks.stop();
    if (graceOn) {
      // The server keeps the leases for the grace: running handlers keep
      // theirs and settle over unary calls; then the loop reconnects.
      await endWithGrace();
      await Promise.allSettled(running);
      throw err;
    }
    // The server released this stream's leases: running handlers can no
    // longer settle, so stop them.
    handlers.abort();
    await Promise.allSettled(running);
    throw err;
  } finally {
    stream.abort();
  }
}

/** Gives back deliveries that were never started: ready again, attempts not counted. */
async function giveBack(service: Service, s: Settings, deliveries: Delivery[]): Promise<void> {
  for (let i = 0; i < deliveries.length; i += MAX_TOKENS_PER_CALL) {
    const leaseTokens = deliveries.slice(i, i + MAX_TOKENS_PER_CALL).map((d) => d.leaseToken);
    try {
      await service.release({ leaseTokens }, { timeoutMs: Math.min(SETTLE_TIMEOUT_MS, s.releaseGraceMs) });
    } catch (err) {
      s.onError(new Error(`delayq: release of ${leaseTokens.length} unstarted deliveries failed`, { cause: err }));
    }
  }
}

async function drain(running: Set<Promise<void>>, handlers: AbortController, timeoutMs: number): Promise<void> {
  const all = Promise.allSettled(running);
  const timer = setTimeout(() => handlers.abort(), timeoutMs);
  try {
    await all;
  } finally {
    clearTimeout(timer);
  }
}

/** Runs the handler with lease renewal, then acks or nacks. */
async function processDelivery(
  service: Service,
  s: Settings,
  acks: AckBatcher,
  handler: Handler,
  delivery: Delivery,
  parent: AbortSignal,
  keep: AbortSignal,
): Promise<void> {
  const local = new AbortController();
  const signal = AbortSignal.any([parent, local.signal]);
  const token = delivery.leaseToken;
  let lost = false;
  let renewing: Promise<void> = Promise.resolve();
  const renew = (): void => {
    renewing = renewing.then(async () => {
      if (lost || local.signal.aborted) return;
      try {
        await service.extendLease(
          { leaseToken: token, extension: durationFromMs(s.leaseMs) },
          { timeoutMs: SETTLE_TIMEOUT_MS },
        );
      } catch (err) {
        const code = err instanceof ConnectError ? err.code : undefined;
        if (code === Code.FailedPrecondition || code === Code.NotFound) {
          lost = true;
          s.onError(new LeaseLostError({ cause: err }), delivery);
          local.abort();
        } else {
          s.onError(err, delivery);
        }
      }
    });
  };
  const timer = setInterval(renew, s.renewEveryMs);
  keep.addEventListener("abort", renew, { once: true });

  let failure: unknown = undefined;
  let failed = false;
  try {
    await handler(delivery, { signal });
  } catch (err) {
    failed = true;
    failure = err;
  } finally {
    clearInterval(timer);
    keep.removeEventListener("abort", renew);
  }
  await renewing;
  if (lost) return;
  try {
    if (!failed) {
      const result = await acks.ack(token);
      if (result !== AckResult.ACKED) {
        s.onError(new Error(`delayq: ack not applied: ${AckResult[result]}`), delivery);
      }
    } else {
      await service.nack(nackRequest(token, failure), { timeoutMs: SETTLE_TIMEOUT_MS });
    }
  } catch (err) {
    s.onError(err, delivery);
  }
}

interface PendingAck {
  token: string;
  resolve: (result: AckResult) => void;
  reject: (error: unknown) => void;
}

/**
 * Gathers the acks of one stream's deliveries into few Ack calls. The first
 * pending ack starts the linger; when it ends the pending acks are due and go
 * out as call slots free up, with those that join them meanwhile.
 */
class AckBatcher {
  private pending: PendingAck[] = [];
  private due = false;
  private calls = 0;
  private timer: ReturnType<typeof setTimeout> | undefined;
  private stopping = false;

  constructor(
    private readonly service: Service,
    private readonly lingerMs: number,
    private readonly outOfCredit: () => boolean,
  ) {}

  /** Resolves to this token's result, or rejects with its call's error. */
  ack(token: string): Promise<AckResult> {
    return new Promise((resolve, reject) => {
      this.pending.push({ token, resolve, reject });
      if (this.lingerMs === 0 || this.stopping || this.pending.length >= MAX_TOKENS_PER_CALL || this.outOfCredit()) {
        this.flush();
      } else if (this.timer === undefined && !this.due) {
        this.timer = setTimeout(() => this.flush(), this.lingerMs);
      }
    });
  }

  /** No more lingering: the stream is ending and its handlers wait for their acks. */
  stop(): void {
    this.stopping = true;
    this.flush();
  }

  private flush(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    this.due = true;
    this.kick();
  }

  private kick(): void {
    while (this.due && this.pending.length > 0 && this.calls < MAX_ACK_CALLS) {
      this.calls++;
      void this.send(this.pending.splice(0, MAX_TOKENS_PER_CALL));
    }
    if (this.pending.length === 0) this.due = false; // the next ack starts a new linger
  }

  private async send(batch: PendingAck[]): Promise<void> {
    try {
      const res = await this.service.ack({ leaseTokens: batch.map((a) => a.token) }, { timeoutMs: SETTLE_TIMEOUT_MS });
      batch.forEach((a, i) => a.resolve(res.results[i] ?? AckResult.UNSPECIFIED));
    } catch (err) {
      for (const a of batch) a.reject(err);
    } finally {
      this.calls--;
      this.kick();
    }
  }
}

/** Maps a handler error to the Nack that gives the job back. */
export function nackRequest(
  leaseToken: string,
  error: unknown,
): Pick<NackRequest, "leaseToken" | "reason" | "deadLetter"> & Partial<Pick<NackRequest, "delay">> {
  const req = { leaseToken, reason: truncateUtf8(messageOf(error), MAX_REASON_BYTES), deadLetter: false };
  if (error instanceof NackError) {
    return {
      ...req,
      deadLetter: error.deadLetter,
      ...(error.delayMs !== undefined ? { delay: durationFromMs(error.delayMs) } : {}),
    };
  }
  return req;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** Cuts s to at most max UTF-8 bytes without splitting a character. */
export function truncateUtf8(s: string, max: number): string {
  const bytes = new TextEncoder().encode(s);
  if (bytes.length <= max) return s;
  let n = max;
  while (n > 0 && ((bytes[n] ?? 0) & 0xc0) === 0x80) n--;
  return new TextDecoder().decode(bytes.subarray(0, n));
}

function abortableDelay(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
