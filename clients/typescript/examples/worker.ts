// The TypeScript example of the README (which imports "@delayq/client").
import { DelayQClient, retryAfter } from "../src/index.js";

const client = new DelayQClient({ address: process.env["DELAYQ_ADDR"] ?? "127.0.0.1:50051" });

const { jobId } = await client.enqueue("emails", JSON.stringify({ to: "a@example.com" }), {
  delayMs: 2_000,
  headers: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
});
console.log(`enqueued ${jobId}`);

// Runs until Ctrl-C; running handlers then finish and are acked before it resolves.
const stop = new AbortController();
process.once("SIGINT", () => stop.abort());
await client.work(
  { queues: ["emails"], concurrency: 8, leaseMs: 30_000, signal: stop.signal, onError: (e) => console.error(e) },
  async (delivery, { signal }) => {
    const job = delivery.job!;
    console.log(`job ${job.id} attempt ${delivery.attempt} traceparent ${job.headers["traceparent"]}`);
    const body = JSON.parse(new TextDecoder().decode(job.payload)) as { to: string };
    if (signal.aborted) throw retryAfter(new Error(`lease lost sending to ${body.to}`), 5_000);
    // resolve to ack; throw to nack (retryAfter(err, ms) or deadLetter(err) choose where it goes)
  },
);
