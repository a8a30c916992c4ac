#!/usr/bin/env node
/*
 * Fill graphile-worker's queue for the anchor benchmark, before any worker starts.
 *
 *     DATABASE_URL=postgres://…/omnipost_anchor node enqueue.js --count 60000 [--batch 5000] [--keep]
 *
 * 1. creates the database named in DATABASE_URL if it does not exist (via the server's
 *    `postgres` database);
 * 2. drops the `graphile_worker` schema (unless --keep) and lets graphile-worker install it
 *    afresh, so every round starts from the same empty tables;
 * 3. adds --count `deliver` jobs with graphile-worker's own bulk API (`addJobs`, i.e. SQL
 *    `graphile_worker.add_jobs(...)`), --batch jobs per call, several calls in parallel;
 * 4. runs ANALYZE on the jobs table (this server runs with autovacuum off; OmniPost's bench
 *    analyses its tables too), so the planner knows the table's size when the workers start.
 *
 * Each payload is ≈ 300 bytes of JSON in the shape of OmniPost's webhook body, with a unique
 * `id` (a UUID, like OmniPost's notification ids) the worker sends as `webhook-id`.
 * Prints one JSON line: {"event":"enqueued",…}.
 */
"use strict";

const { failInOneLine, arg, databaseUrl, quietLogger } = require("./common");

const fail = failInOneLine("enqueue.js");

const { randomUUID } = require("node:crypto");
const { Client } = require("pg");
const { makeWorkerUtils } = require("graphile-worker");

const connectionString = databaseUrl();
const count = Number.parseInt(arg("--count", "10000"), 10);
const batch = Number.parseInt(arg("--batch", "5000"), 10);
const parallel = Number.parseInt(arg("--parallel", "2"), 10);
const keep = process.argv.includes("--keep");
const schema = "graphile_worker";

async function ensureDatabase() {
  const target = new URL(connectionString);
  const name = decodeURIComponent(target.pathname.replace(/^\//, ""));
  if (!/^[A-Za-z0-9_]+$/.test(name)) throw new Error(`unexpected database name ${JSON.stringify(name)}`);
  const admin = new URL(connectionString);
  admin.pathname = "/postgres";
  const client = new Client({ connectionString: admin.toString() });
  await client.connect();
  try {
    const { rowCount } = await client.query("select 1 from pg_database where datname = $1", [name]);
    if (rowCount === 0) await client.query(`create database "${name}"`);
  } finally {
    await client.end();
  }
}

const BODY = "Your order #12345 has shipped and will arrive on Thursday. Track it in the app any time.";

function payload(i, createdAt) {
  return {
    id: randomUUID(),
    channel: "webhook",
    recipient: `https://hooks.example.test/u/${i}`,
    subject: "Order shipped",
    body: BODY,
    metadata: { order: i },
    created_at: createdAt,
  };
}

async function main() {
  await ensureDatabase();
  if (!keep) {
    const client = new Client({ connectionString });
    await client.connect();
    try {
      await client.query(`drop schema if exists ${schema} cascade`);
    } finally {
      await client.end();
    }
  }
  const utils = await makeWorkerUtils({ connectionString, schema, logger: quietLogger, maxPoolSize: parallel + 1 });
  try {
    await utils.migrate();
    const started = process.hrtime.bigint();
    const createdAt = new Date().toISOString();
    let next = 0;
    const sample = JSON.stringify(payload(count - 1, createdAt)).length;
    async function lane() {
      while (next < count) {
        const start = next;
        const n = Math.min(batch, count - start);
        next += n;
        const specs = new Array(n);
        for (let k = 0; k < n; k++) specs[k] = { identifier: "deliver", payload: payload(start + k, createdAt) };
        await utils.addJobs(specs);
      }
    }
    await Promise.all(Array.from({ length: Math.max(1, parallel) }, lane));
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    await utils.withPgClient((client) => client.query(`analyze ${schema}._private_jobs`));
    process.stdout.write(
      `${JSON.stringify({ event: "enqueued", count, seconds, per_second: count / seconds, payload_bytes: sample })}\n`,
    );
  } finally {
    await utils.release();
  }
}

main().catch(fail);
