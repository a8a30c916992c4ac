#!/usr/bin/env node
/*
 * One graphile-worker process for the anchor benchmark (bench/versus.py starts two of them).
 *
 *     DATABASE_URL=postgres://…/omnipost_anchor node worker.js --url http://127.0.0.1:PORT/hook [--wait-for-go]
 *
 * It drains the jobs that enqueue.js added beforehand and exits when the queue is empty, as
 * OmniPost's dispatchers are stopped once their queue is empty in the e2e bench. That is
 * graphile-worker's `runOnce()`: the same worker pool as `run()` (same local queue, same
 * batchers, same concurrency); the only difference is what happens when a fetch finds nothing
 * left — `run()` waits pollInterval and polls again, `runOnce()` lets the pool finish its jobs,
 * flush its batches and resolve. While there is work the two run identical code.
 *
 * The one task, `deliver`, POSTs the job payload (≈ 300 bytes of JSON, the shape of OmniPost's
 * webhook body) to the receiver with a `webhook-id` header over keep-alive connections, and
 * throws on anything but 2xx (graphile-worker then retries the job with backoff).
 *
 * Configuration (environment; the defaults are the fastest set measured here, see README.md):
 *
 *   GW_CONCURRENCY          200   jobs in flight in this process (the anchor: 200)
 *   GW_LOCAL_QUEUE_SIZE     500   preset.worker.localQueue.size: jobs fetched and locked by one
 *                                 "get jobs" query (batched fetching; the LocalQueue's
 *                                 getJobBatchSize). graphile-worker warns below the concurrency;
 *                                 -1 turns it off
 *   GW_COMPLETE_BATCH_DELAY 10    preset.worker.completeJobBatchDelay (ms): completions within
 *                                 this window are deleted by one statement (one commit); -1 off
 *   GW_FAIL_BATCH_DELAY     10    preset.worker.failJobBatchDelay (ms), the same for failures
 *   GW_MAX_POOL_SIZE        10    preset.worker.maxPoolSize (PostgreSQL connections; batched,
 *                                 the pool is far from busy)
 *   GW_HTTP                 undici  undici Pool (≈ 40 % faster here than node:http's Agent) or http
 *   GW_HTTP_MAX_SOCKETS     = GW_CONCURRENCY   keep-alive connections to the receiver
 *   GW_WARMUP               3000  requests sent to a throwaway in-process server before the
 *                                 first job (see warmUp below); 0 turns it off
 */
"use strict";

const { failInOneLine, arg, databaseUrl, quietLogger } = require("./common");

const fail = failInOneLine("worker.js");

const http = require("node:http");
const { runOnce } = require("graphile-worker");
const { Pool } = require("undici");

function intEnv(name, fallback) {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return fallback;
  const value = Number.parseInt(raw, 10);
  if (Number.isNaN(value)) throw new Error(`${name} must be an integer, got ${JSON.stringify(raw)}`);
  return value;
}

const receiverUrl = new URL(arg("--url", process.env.RECEIVER_URL || ""));
const connectionString = databaseUrl();

const concurrency = intEnv("GW_CONCURRENCY", 200);
const localQueueSize = intEnv("GW_LOCAL_QUEUE_SIZE", 500);
const completeJobBatchDelay = intEnv("GW_COMPLETE_BATCH_DELAY", 10);
const failJobBatchDelay = intEnv("GW_FAIL_BATCH_DELAY", 10);
const maxPoolSize = intEnv("GW_MAX_POOL_SIZE", 10);
const maxSockets = intEnv("GW_HTTP_MAX_SOCKETS", concurrency);
const warmupRequests = intEnv("GW_WARMUP", 3000);

const httpClient = process.env.GW_HTTP || "undici";

// undici: a Pool of keep-alive connections (no pipelining: one request per connection at a time,
// as node:http and OmniPost's client do).
if (httpClient !== "undici" && httpClient !== "http") throw new Error("GW_HTTP must be undici or http");
const pool =
  httpClient === "undici"
    ? new Pool(receiverUrl.origin, { connections: maxSockets, pipelining: 1, keepAliveTimeout: 60_000 })
    : null;

async function deliverUndici(payload, target) {
  const body = JSON.stringify(payload);
  const res = await (target ? target.pool : pool).request({
    path: receiverUrl.pathname,
    method: "POST",
    headers: { "content-type": "application/json", "webhook-id": String(payload.id) },
    body,
    headersTimeout: 30_000,
    bodyTimeout: 30_000,
  });
  await res.body.dump();
  if (res.statusCode < 200 || res.statusCode >= 300) throw new Error(`HTTP ${res.statusCode} from the receiver`);
}

// node:http with a keep-alive Agent.
const agent = new http.Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
const requestOptions = {
  agent,
  host: receiverUrl.hostname,
  port: receiverUrl.port,
  path: receiverUrl.pathname,
  method: "POST",
};

function deliverHttp(payload, target) {
  const body = JSON.stringify(payload);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        ...requestOptions,
        ...(target ? { agent: target.agent, port: target.port } : {}),
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
          "webhook-id": String(payload.id),
        },
      },
      (res) => {
        res.resume(); // drain the (2-byte) body so the socket goes back to the agent
        res.on("end", () => {
          if (res.statusCode >= 200 && res.statusCode < 300) resolve();
          else reject(new Error(`HTTP ${res.statusCode} from the receiver`));
        });
        res.on("error", reject);
      },
    );
    req.setTimeout(30_000, () => req.destroy(new Error("receiver timed out after 30 s")));
    req.on("error", reject);
    req.end(body);
  });
}

const preset = {
  worker: {
    connectionString,
    concurrentJobs: concurrency,
    maxPoolSize,
    pollInterval: 2000,
    preparedStatements: true,
    completeJobBatchDelay,
    failJobBatchDelay,
    ...(localQueueSize > 0 ? { localQueue: { size: localQueueSize } } : {}),
  },
};

const deliver = httpClient === "undici" ? deliverUndici : deliverHttp;

/*
 * Warm the HTTP client up before taking jobs: GW_WARMUP POSTs of the same shape, `concurrency` at
 * a time, to a throwaway server inside this process (never to the bench receiver, which counts
 * every request it gets). A cold Node process spends its first seconds compiling undici's code and
 * tiering up its WebAssembly HTTP parser; this takes part of that out of the measured window
 * (first half second ≈ 1,400 deliveries instead of ≈ 900 in runs here). OmniPost's dispatchers
 * are CPython and get no such head start; the anchor is favoured, not the other way round.
 */
async function warmUp() {
  if (warmupRequests <= 0) return;
  const server = http.createServer((req, res) => {
    req.resume();
    req.on("end", () => res.end("ok"));
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const origin = `http://127.0.0.1:${server.address().port}`;
  const warmPool = new Pool(origin, { connections: maxSockets, pipelining: 1 });
  const warmAgent = new http.Agent({ keepAlive: true, maxSockets });
  const target = { pool: warmPool, agent: warmAgent, port: server.address().port };
  let next = 0;
  async function lane() {
    while (next < warmupRequests) {
      const i = next++;
      await deliver({ id: `warmup-${i}`, channel: "webhook", body: "x".repeat(200), metadata: { order: i } }, target);
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, warmupRequests) }, lane));
  await warmPool.close();
  warmAgent.destroy();
  await new Promise((resolve) => server.close(resolve));
}

// With --wait-for-go the worker says {"event":"ready"} once warm and waits for a line on stdin
// before it takes the first job, so the orchestrator can start both processes at one moment.
function waitForGo() {
  if (!process.argv.includes("--wait-for-go")) return Promise.resolve();
  process.stdout.write(`${JSON.stringify({ event: "ready", pid: process.pid })}\n`);
  return new Promise((resolve) => {
    process.stdin.once("data", () => {
      process.stdin.pause();
      resolve();
    });
    process.stdin.once("end", resolve);
  });
}

async function main() {
  await warmUp();
  await waitForGo();
  const started = Date.now();
  let completed = 0;
  let failed = 0;
  const taskList = {
    deliver: async (payload) => {
      try {
        await deliver(payload);
        completed++;
      } catch (e) {
        failed++;
        throw e;
      }
    },
  };
  await runOnce({ preset, logger: quietLogger, taskList, noHandleSignals: false });
  agent.destroy();
  if (pool) await pool.close();
  process.stdout.write(
    `${JSON.stringify({ event: "done", pid: process.pid, completed, failed, seconds: (Date.now() - started) / 1000 })}\n`,
  );
  process.exit(0); // nothing is left to wait for; don't linger on idle handles
}

main().catch(fail);
