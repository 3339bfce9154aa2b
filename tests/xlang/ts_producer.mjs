// Cross-language test producer: enqueues one job with the TypeScript client
// (built into clients/typescript/dist by `make`) and prints {"jobId": ...}.
// Usage: node ts_producer.mjs ADDR QUEUE PAYLOAD HEADERS_JSON
import { DelayQClient } from "../../clients/typescript/dist/src/index.js";

const [address, queue, payload, headersJson] = process.argv.slice(2);
if (!address || !queue || payload === undefined || !headersJson) {
  console.error("usage: node ts_producer.mjs ADDR QUEUE PAYLOAD HEADERS_JSON");
  process.exit(2);
}
const client = new DelayQClient({ address });
const res = await client.enqueue(queue, payload, { delayMs: 100, headers: JSON.parse(headersJson) });
console.log(JSON.stringify({ jobId: res.jobId }));
await client.close(); // sends what is gathering and closes the EnqueueStream: the process exits at once
