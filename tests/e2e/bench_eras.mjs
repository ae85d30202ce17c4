#!/usr/bin/env node
// The two protocol eras side by side over streamable HTTP (issue 36): `ns-hpc run --transport
// streamable-http` on loopback, a living instance, and 50 concurrent clients calling
// terminal_execute `true` in it —
//   - 2025-11-25: 50 sessions (initialize, notifications/initialized, then calls on Mcp-Session-Id);
//   - 2026-07-28: 50 concurrent stateless callers (each request carries its _meta envelope and the
//     Mcp-Method/Mcp-Name headers; no session);
// requests per second and p50/p99 latency printed in one table; then the server's RSS (VmRSS) before
// and after MODERN_REQUESTS modern tools/list requests (cheap: nothing spawned), 50 at a time —
// the goal is flat: nothing per request is kept.
// Usage: tests/e2e/bench_eras.mjs [CALLS_PER_CLIENT (default 20)] [MODERN_REQUESTS (default 100000)]
import { execFileSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';

import { RawSession, makeHttpHome, startServer } from './http_lib.mjs';
import { childEnv, NSHPC_BINARY, removeHome } from './lib.mjs';
import { LEGACY, MODERN, modernPost, modernRequest, rssKiB } from './eras_lib.mjs';

const CLIENTS = 50;
const calls = Number(process.argv[2] || 20);
const modernRequests = Number(process.argv[3] || 100_000);
const INSTANCE = 'bench';
const call = { name: 'terminal_execute', arguments: { instance_id: INSTANCE, command: 'true' } };

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];

// Runs `perClient(i)` for CLIENTS clients at once; each returns its latencies (ms) and errors.
async function run(perClient) {
  const started = performance.now();
  const results = await Promise.all([...Array(CLIENTS).keys()].map(perClient));
  const seconds = (performance.now() - started) / 1000;
  const latencies = results.flatMap((r) => r.latencies).sort((a, b) => a - b);
  const errors = results.reduce((n, r) => n + r.errors, 0);
  return { n: latencies.length, errors, rps: latencies.length / seconds, p50: quantile(latencies, 0.5), p99: quantile(latencies, 0.99), seconds };
}

async function legacyClient(server) {
  const s = new RawSession(server.url, server.token);
  await s.initialize();
  const latencies = [];
  let errors = 0;
  for (let i = 0; i < calls; i++) {
    const t = performance.now();
    try {
      const r = await s.callTool(call.name, call.arguments);
      if (r.isError) errors++;
      else latencies.push(performance.now() - t);
    } catch {
      errors++;
    }
  }
  try {
    await fetch(server.url, { method: 'DELETE', headers: s.headers() });
  } catch {
    // the session ends with the server anyway
  }
  return { latencies, errors };
}

async function modernClient(server, n, message) {
  const latencies = [];
  let errors = 0;
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    try {
      const r = await modernPost(server.url, server.token, message());
      if (r.status !== 200 || !r.json?.result || r.json.result.isError) errors++;
      else latencies.push(performance.now() - t);
    } catch {
      errors++;
    }
  }
  return { latencies, errors };
}

// 50 legacy sessions from one uid: above the default per-peer cap of 32, as in load.mjs.
const home = makeHttpHome('bench-eras', '[server]\nmax_sessions_per_peer = 256\n');
let server;
try {
  execFileSync(NSHPC_BINARY, ['--config', home.config, 'instance', 'create', INSTANCE, '--persistent'], { env: childEnv(home) });
  server = await startServer(home);
  // Warm up both paths (the first sandbox start, the JSON schemas).
  await modernClient(server, 3, () => modernRequest('tools/call', call));

  // Each era twice, in the order legacy, modern, modern, legacy, so neither gains from going
  // second (a warmer sandbox, page cache); the better run of each is printed.
  const best = (a, b) => (a.rps >= b.rps ? a : b);
  const legacyRun = () => run(() => legacyClient(server));
  const modernRun = () => run(() => modernClient(server, calls, () => modernRequest('tools/call', call)));
  const legacy1 = await legacyRun();
  const modern1 = await modernRun();
  const modern = best(modern1, await modernRun());
  const legacy = best(legacy1, await legacyRun());

  const row = (era, how, r) =>
    `${era.padEnd(11)} ${how.padEnd(22)} ${String(r.n).padStart(6)} ${String(r.errors).padStart(6)} ` +
    `${r.rps.toFixed(1).padStart(8)} ${r.p50.toFixed(1).padStart(8)} ${r.p99.toFixed(1).padStart(8)}`;
  console.log(`bench eras: tools/call terminal_execute 'true' in a living instance over streamable HTTP, ${CLIENTS} concurrent clients x ${calls} calls`);
  console.log(`${'era'.padEnd(11)} ${'clients'.padEnd(22)} ${'calls'.padStart(6)} ${'errors'.padStart(6)} ${'req/s'.padStart(8)} ${'p50 ms'.padStart(8)} ${'p99 ms'.padStart(8)}`);
  console.log(row(LEGACY, `${CLIENTS} sessions`, legacy));
  console.log(row(MODERN, `${CLIENTS} stateless callers`, modern));

  // Memory: modern tools/list (no sandbox spawned), CLIENTS at a time.
  const before = rssKiB(server.proc.pid);
  const per = Math.ceil(modernRequests / CLIENTS);
  const flood = await run(() => modernClient(server, per, () => modernRequest('tools/list')));
  await new Promise((resolve) => setTimeout(resolve, 500));
  const afterRss = rssKiB(server.proc.pid);
  console.log(
    `bench eras: server RSS before ${(before / 1024).toFixed(1)} MiB, after ${flood.n + flood.errors} modern tools/list requests ` +
      `(${flood.rps.toFixed(0)} req/s, p50 ${flood.p50.toFixed(1)} ms, p99 ${flood.p99.toFixed(1)} ms, ${flood.errors} errors) ` +
      `${(afterRss / 1024).toFixed(1)} MiB (${afterRss - before >= 0 ? '+' : ''}${((afterRss - before) / 1024).toFixed(1)} MiB)`,
  );
  if (legacy1.errors || legacy.errors || modern1.errors || modern.errors || flood.errors) process.exitCode = 1;
} finally {
  await server?.stop();
  // A living instance's sandbox outlives the server: delete it before the folder goes.
  try {
    execFileSync(NSHPC_BINARY, ['--config', home.config, 'instance', 'delete', '--force', INSTANCE], { env: childEnv(home), stdio: 'ignore' });
  } catch {
    // never created
  }
  removeHome(home);
}

