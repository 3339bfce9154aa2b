/** delayq TypeScript client: generated messages and service, plus enqueue and worker helpers. */
export { DelayQClient, grpcTransport } from "./client.js";
export type { BatchOptions } from "./batcher.js";
export type { ClientOptions, DelayQueueServiceClient, EnqueueOptions } from "./client.js";
export { LeaseLostError, NackError, deadLetter, retryAfter, work } from "./worker.js";
export type { Handler, HandlerContext, WorkOptions } from "./worker.js";
export * from "./gen/delayq/v1/job_pb.js";
export * from "./gen/delayq/v1/service_pb.js";
