// BullMQ side of the delayq benchmark: one scenario per process, BullMQ's own Node API.
// Usage: node bullmq_runner.mjs SCENARIO --redis-url URL [--params JSON] [--out FILE]
// Options left at BullMQ's defaults except worker concurrency (a flag of the harness).
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { Queue, Worker } from "bullmq";

const PAYLOAD = "delayq-bench-payload-".repeat(5).slice(0, 100);
const QUEUE = "bench";

function parseArgs(argv) {
  const args = { scenario: argv[0], params: {}, out: "", redisUrl: "" };
  for (let i = 1; i < argv.length; i += 2) {
    if (argv[i] === "--redis-url") args.redisUrl = argv[i + 1];
    else if (argv[i] === "--params") args.params = JSON.parse(argv[i + 1]);
    else if (argv[i] === "--out") args.out = argv[i + 1];
  }
  return args;
}

function connectionOf(url) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port), maxRetriesPerRequest: null };
}

class Progress {
  constructor(label, total) {
    this.label = label;
    this.total = total;
    this.last = Date.now();
  }
  update(done) {
    const now = Date.now();
    if (now - this.last >= 2000) {
      this.last = now;
      process.stderr.write(`    ${this.label}: ${done.toLocaleString("en-US")}/${this.total.toLocaleString("en-US")}\n`);
    }
  }
}

// A seeded PRNG (mulberry32): the same random spreads every run.
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Whole-ms due times at random over jobs/rate seconds, sorted (cf. common.due_times_ms).
function dueTimesMs(leadS, jobs, rate) {
  const r = rng(7);
  const t0 = Date.now() + leadS * 1000;
  const span = (jobs / rate) * 1000;
  return Array.from({ length: jobs }, () => Math.floor(t0 + r() * span)).sort((a, b) => a - b);
}

// Per-job delays in ms: 1 h, or at random over spread_s after one minute (memory scenarios).
function delaysMs(p) {
  if (!p.spread_s) return Array.from({ length: p.jobs }, () => Math.round((p.delay_s ?? 3600) * 1000));
  const r = rng(12);
  return Array.from({ length: p.jobs }, () => Math.round((60 + r() * p.spread_s) * 1000));
}

const nowMs = () => performance.timeOrigin + performance.now();

// jobs: an array, or anything with length and slice(start, end) (built on send).
async function addBatched(queue, jobs, batchSize, concurrency, onBatch) {
  let next = 0;
  async function loop() {
    while (next < jobs.length) {
      const start = next;
      next += batchSize;
      const chunk = jobs.slice(start, start + batchSize);
      await queue.addBulk(chunk);
      if (onBatch) onBatch(start, start + chunk.length, Date.now());
    }
  }
  await Promise.all(Array.from({ length: concurrency }, loop));
}

async function scenarioEnqueue(conn, p) {
  const queue = new Queue(QUEUE, { connection: conn });
  await queue.waitUntilReady();
  const jobs = p.jobs;
  const delay = Math.round((p.delay_s ?? 3600) * 1000);
  const start = performance.now();
  if (p.mode === "latency") {
    const lat = [];
    for (let i = 0; i < jobs; i++) {
      const t = performance.now();
      await queue.add("job", { p: PAYLOAD }, { delay });
      lat.push(performance.now() - t);
    }
    const seconds = (performance.now() - start) / 1000;
    await queue.close();
    lat.sort((a, b) => a - b);
    return { jobs, seconds, rate: jobs / seconds, p50_ms: lat[Math.floor(lat.length / 2)] };
  }
  if (p.mode === "single") {
    const progress = new Progress("bullmq enqueue (single)", jobs);
    let next = 0;
    async function loop() {
      while (next < jobs) {
        next += 1;
        await queue.add("job", { p: PAYLOAD }, { delay });
        progress.update(next);
      }
    }
    await Promise.all(Array.from({ length: p.concurrency }, loop));
  } else {
    const progress = new Progress("bullmq enqueue (addBulk)", jobs);
    // Each chunk's jobs are built when it is sent, as delayq's runner builds its requests
    // (BuiltOnSend): the producer's work overlaps the store's.
    const delays = delaysMs(p);
    const all = {
      length: delays.length,
      slice: (s, e) => delays.slice(s, e).map((d) => ({ name: "job", data: { p: PAYLOAD }, opts: { delay: d } })),
    };
    await addBatched(queue, all, p.batch_size, p.batch_concurrency, (_s, end) => progress.update(end));
  }
  const seconds = (performance.now() - start) / 1000;
  await queue.close();
  return { jobs, seconds, rate: jobs / seconds };
}

function runWorker(conn, concurrency, onJob) {
  return new Worker(QUEUE, async (job) => onJob(job), { connection: conn, concurrency });
}

async function scenarioLateness(conn, p) {
  const queue = new Queue(QUEUE, { connection: conn });
  await queue.waitUntilReady();
  const { jobs, rate } = p;
  const due = dueTimesMs(p.lead_s, jobs, rate);
  const lateness = [];
  const seen = new Set();
  let duplicates = 0;
  const progress = new Progress(`bullmq lateness @${rate}/s`, jobs);
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const worker = runWorker(conn, p.concurrency, async (job) => {
    // Receipt on the consumer's clock (sub-ms) minus the requested due time,
    // timestamp + opts.delay (job.delay itself is reset to 0 when the job is promoted).
    lateness.push(nowMs() - (job.timestamp + job.opts.delay));
    if (seen.has(job.id)) duplicates += 1;
    seen.add(job.id);
    progress.update(lateness.length);
    if (lateness.length >= jobs) finish();
  });
  await worker.waitUntilReady();
  let lateEnqueues = 0;
  const now = Date.now();
  const all = due.map((d) => ({ name: "job", data: { p: PAYLOAD }, opts: { timestamp: now, delay: d - now } }));
  await addBatched(queue, all, p.batch_size, p.batch_concurrency, (start, end, at) => {
    if (at > due[start]) lateEnqueues += end - start;
  });
  const timeout = (p.lead_s + jobs / rate + (p.grace_s ?? 60)) * 1000;
  const timer = setTimeout(() => finish(), timeout);
  await finished;
  clearTimeout(timer);
  await worker.close();
  await queue.close();
  return {
    jobs,
    received: lateness.length,
    duplicates,
    late_enqueues: lateEnqueues,
    lateness_ms: lateness,
    clock: "consumer: performance.timeOrigin + performance.now() in the handler - (job.timestamp + job.opts.delay)",
  };
}

async function scenarioDrain(conn, p) {
  const queue = new Queue(QUEUE, { connection: conn });
  await queue.waitUntilReady();
  const jobs = p.jobs;
  // removeOnComplete: delayq deletes a job on ack, so BullMQ does not keep it either.
  const all = Array.from({ length: jobs }, () => ({ name: "job", data: { p: PAYLOAD }, opts: { removeOnComplete: true } }));
  await addBatched(queue, all, p.batch_size, p.batch_concurrency);
  const progress = new Progress("bullmq drain", jobs);
  let completed = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const start = performance.now();
  const worker = runWorker(conn, p.concurrency, async () => {});
  worker.on("completed", () => {
    completed += 1;
    progress.update(completed);
    if (completed >= jobs) finish();
  });
  await finished;
  const seconds = (performance.now() - start) / 1000;
  await worker.close();
  await queue.close();
  return { jobs, acked: completed, seconds, rate: completed / seconds };
}

async function scenarioHold(conn) {
  const worker = runWorker(conn, 1, async (job) => {
    process.stdout.write(`held ${job.id}\n`);
    await new Promise(() => {});
  });
  await worker.waitUntilReady();
  await new Promise(() => {});
}

async function scenarioRedelivery(conn, p, args) {
  const queue = new Queue(QUEUE, { connection: conn });
  await queue.waitUntilReady();
  const self = fileURLToPath(import.meta.url);
  const holder = spawn(process.execPath, [self, "hold", "--redis-url", args.redisUrl], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  try {
    const added = await queue.add("job", { p: PAYLOAD });
    const lines = createInterface({ input: holder.stdout });
    const held = await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("worker A did not take the job")), 30000);
      lines.once("line", (line) => {
        clearTimeout(timer);
        resolve(line);
      });
    });
    if (held !== `held ${added.id}`) throw new Error(`worker A reported ${held}`);
    let got;
    const received = new Promise((resolve) => (got = resolve));
    // Worker B, with BullMQ's default lock and stall-check settings, idle before A dies.
    const worker = runWorker(conn, 1, async (job) => got({ at: performance.now(), job }));
    await worker.waitUntilReady();
    await new Promise((resolve) => setTimeout(resolve, 500));
    holder.kill(p.signal === "STOP" ? "SIGSTOP" : "SIGKILL");
    const killed = performance.now();
    const timeout = new Promise((resolve) => setTimeout(() => resolve(null), p.timeout_s * 1000));
    const result = await Promise.race([received, timeout]);
    await worker.close(true);
    await queue.close();
    if (result === null) return { seconds: null, timeout_s: p.timeout_s };
    if (result.job.id !== added.id) throw new Error(`worker B got ${result.job.id}`);
    return { seconds: (result.at - killed) / 1000, timeout_s: p.timeout_s };
  } finally {
    holder.kill("SIGKILL");
  }
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const conn = connectionOf(args.redisUrl);
  let result;
  switch (args.scenario) {
    case "enqueue":
      result = await scenarioEnqueue(conn, args.params);
      break;
    case "lateness":
      result = await scenarioLateness(conn, args.params);
      break;
    case "drain":
      result = await scenarioDrain(conn, args.params);
      break;
    case "redelivery":
      result = await scenarioRedelivery(conn, args.params, args);
      break;
    case "hold":
      await scenarioHold(conn);
      return;
    default:
      throw new Error(`unknown scenario ${args.scenario}`);
  }
  if (args.out) writeFileSync(args.out, JSON.stringify(result));
  process.exit(0);
}

main().catch((err) => {
  process.stderr.write(`${err.stack ?? err}\n`);
  process.exit(1);
});
