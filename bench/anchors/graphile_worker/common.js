/*
 * What enqueue.js and worker.js share: failures as one line on stderr (bench/versus.py reports the
 * last line of a failed process), reading arguments and DATABASE_URL, and a graphile-worker logger
 * that keeps only warnings and errors (it logs every completed job at "info": 60,000 lines to a pipe
 * would measure the logger).
 */
"use strict";

const { Logger } = require("graphile-worker");

// Exit 1 with one line for an uncaught exception now, and for whatever is passed to the returned
// function (main().catch(fail)).
function failInOneLine(script) {
  const fail = (e) => {
    process.stderr.write(`${script}: ${e && e.message ? e.message : e}\n`);
    process.exit(1);
  };
  process.on("uncaughtException", fail);
  return fail;
}

function arg(name, fallback) {
  const i = process.argv.indexOf(name);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1] : fallback;
}

function databaseUrl() {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error("DATABASE_URL is not set");
  return url;
}

const quietLogger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") process.stderr.write(`[graphile-worker ${level}] ${message}\n`);
});

module.exports = { failInOneLine, arg, databaseUrl, quietLogger };
