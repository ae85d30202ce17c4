#!/usr/bin/env node
// Load test of ns-hpc's streamable HTTP transport: starts `ns-hpc run --transport streamable-http
// --port 0` on loopback with a temporary home and config, opens many concurrent MCP sessions
// (raw JSON-RPC over fetch: initialize, notifications/initialized, then tools/call of a cheap
// tool, sequential within a session, sessions concurrent) and prints p50/p99 latency, requests
// per second, the error count and the server's peak RSS. Node built-ins only (no node_modules).
//
// Usage: tests/e2e/load.mjs [--sessions N] [--calls M] [--tool NAME] [--bench] [--json]
//   --bench   print the figures as a table like the other `make bench` output
//   --json    print one JSON line with the figures (for tests)
// Environment: NSHPC_BINARY (default <repo>/build/ns-hpc).
// Exit status: 0 when every call succeeded and the server stopped cleanly on SIGTERM (exit 0),
// 1 otherwise, 2 on bad usage.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import { performance } from 'node:perf_hooks';

import { NSHPC_BINARY, childEnv, makeHttpHome, removeHome } from './home.mjs';
const PROTOCOL_VERSION = '2025-11-25';

function usage(message) {
  if (message) process.stderr.write(`load.mjs: ${message}\n`);
  process.stderr.write('usage: load.mjs [--sessions N] [--calls M] [--tool NAME] [--bench] [--json]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { sessions: 50, calls: 200, tool: 'list_instances', bench: false, json: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      return argv[++i];
    };
    const count = (name) => {
      const n = Number(value());
      if (!Number.isInteger(n) || n < 1) usage(`${name} must be a positive integer`);
      return n;
    };
    if (a === '--sessions') opts.sessions = count('--sessions');
    else if (a === '--calls') opts.calls = count('--calls');
    else if (a === '--tool') opts.tool = value();
    else if (a === '--bench') opts.bench = true;
    else if (a === '--json') opts.json = true;
    else if (a === '-h' || a === '--help') usage();
    else usage(`unknown argument ${a}`);
  }
  return opts;
}

// Starts the server and resolves with {proc, url, token, stderr()} once it printed its URL and
// token; rejects when it exits first or takes too long.
function startServer(home) {
  const proc = spawn(
    NSHPC_BINARY,
    ['--config', home.config, 'run', '--transport', 'streamable-http', '--host', '127.0.0.1', '--port', '0'],
    {
      env: childEnv(home),
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let text = '';
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => resolve({ code, signal }));
    proc.on('error', (err) => resolve({ code: null, signal: null, error: err.message }));
  });
  const ready = new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`the server did not report its URL within 20 s; stderr:\n${text}`)), 20000);
    proc.stderr.on('data', (chunk) => {
      text += chunk.toString();
      if (text.length > 200000) text = text.slice(-100000);
      const url = /listening on (\S+)/.exec(text);
      const token = /bearer token \(kept in [^)]*\): (\S+)/.exec(text);
      if (url && token) {
        clearTimeout(timer);
        resolve({ url: url[1], token: token[1] });
      }
    });
    exited.then((status) => {
      clearTimeout(timer);
      reject(new Error(`the server exited early (${JSON.stringify(status)}); stderr:\n${text}`));
    });
  });
  return { proc, exited, ready, stderr: () => text };
}

// The JSON-RPC response with `id` in a response body: plain JSON or an SSE stream.
async function responseOf(res, id) {
  const type = (res.headers.get('content-type') || '').toLowerCase();
  const body = await res.text();
  if (type.startsWith('application/json')) return JSON.parse(body);
  if (type.startsWith('text/event-stream')) {
    let found;
    for (const event of body.split(/\r?\n\r?\n/)) {
      const data = event
        .split(/\r?\n/)
        .filter((line) => line.startsWith('data:'))
        .map((line) => line.slice(5).replace(/^ /, ''))
        .join('\n');
      if (!data) continue;
      let message;
      try {
        message = JSON.parse(data);
      } catch {
        continue;
      }
      if (message && message.id === id && ('result' in message || 'error' in message)) found = message;
    }
    if (found) return found;
    throw new Error(`no response for id ${id} in the SSE stream: ${body.slice(0, 300)}`);
  }
  throw new Error(`HTTP ${res.status} with content-type '${type}': ${body.slice(0, 300)}`);
}

// One MCP session: initialize, notifications/initialized, `calls` tools/call, DELETE. Latencies
// of the tools/call round trips go to `latencies`; failures to `errors`.
async function runSession(n, { url, token, calls, tool, latencies, errors }) {
  const base = {
    authorization: `Bearer ${token}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
  };
  const fail = (what, err) => errors.push(`session ${n}: ${what}: ${err.message || err}`);
  let sid;
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers: base,
      body: JSON.stringify({
        jsonrpc: '2.0',
        id: 0,
        method: 'initialize',
        params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'nshpc-load', version: '1' } },
      }),
    });
    sid = res.headers.get('mcp-session-id');
    const msg = await responseOf(res, 0);
    if (res.status !== 200 || !sid || !msg.result) throw new Error(`HTTP ${res.status}: ${JSON.stringify(msg)}`);
  } catch (err) {
    fail('initialize', err);
    return;
  }
  const headers = { ...base, 'mcp-session-id': sid, 'mcp-protocol-version': PROTOCOL_VERSION };
  try {
    const res = await fetch(url, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
    });
    await res.arrayBuffer();
    if (res.status !== 202) throw new Error(`HTTP ${res.status}, expected 202`);
  } catch (err) {
    fail('notifications/initialized', err);
    return;
  }
  for (let i = 1; i <= calls; i++) {
    const t0 = performance.now();
    try {
      const res = await fetch(url, {
        method: 'POST',
        headers,
        body: JSON.stringify({ jsonrpc: '2.0', id: i, method: 'tools/call', params: { name: tool, arguments: {} } }),
      });
      const msg = await responseOf(res, i);
      latencies.push(performance.now() - t0);
      if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${JSON.stringify(msg)}`);
      if (msg.error) throw new Error(`JSON-RPC error ${JSON.stringify(msg.error)}`);
      if (!msg.result || msg.result.isError) throw new Error(`tool error ${JSON.stringify(msg.result)}`);
    } catch (err) {
      fail(`tools/call #${i}`, err);
    }
  }
  try {
    const res = await fetch(url, { method: 'DELETE', headers });
    await res.arrayBuffer();
    if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
  } catch (err) {
    fail('DELETE', err);
  }
}

function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank];
}

// Peak resident set size of `pid` in KiB (VmHWM), or NaN.
function peakRssKb(pid) {
  try {
    const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
    const m = /^VmHWM:\s+(\d+)\s+kB/m.exec(status);
    return m ? Number(m[1]) : NaN;
  } catch {
    return NaN;
  }
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (!fs.existsSync(NSHPC_BINARY)) {
    process.stderr.write(`load.mjs: ns-hpc binary not found: ${NSHPC_BINARY} (build it, or set NSHPC_BINARY)\n`);
    return 2;
  }
  // Every session comes from this one client (one uid): lift the per-peer session cap.
  const home = makeHttpHome('load', '[server]\nmax_sessions_per_peer = 256\n');
  const server = startServer(home);
  let exitCode = 0;
  try {
    const { url, token } = await server.ready;
    const parsed = new URL(url);
    if (!['127.0.0.1', 'localhost', '[::1]'].includes(parsed.hostname))
      throw new Error(`refusing to load a non-loopback server: ${url}`);

    const latencies = [];
    const errors = [];
    const start = performance.now();
    await Promise.all(
      Array.from({ length: opts.sessions }, (_, n) =>
        runSession(n, { url, token, calls: opts.calls, tool: opts.tool, latencies, errors }),
      ),
    );
    const seconds = (performance.now() - start) / 1000;
    const rssKb = peakRssKb(server.proc.pid);

    server.proc.kill('SIGTERM');
    const killer = setTimeout(() => server.proc.kill('SIGKILL'), 20000);
    const status = await server.exited;
    clearTimeout(killer);
    if (status.code !== 0) {
      errors.push(`the server did not exit 0 after SIGTERM: ${JSON.stringify(status)}; stderr:\n${server.stderr().slice(-2000)}`);
    }

    const sorted = latencies.slice().sort((a, b) => a - b);
    const figures = {
      sessions: opts.sessions,
      calls_per_session: opts.calls,
      tool: opts.tool,
      calls: latencies.length,
      seconds: Number(seconds.toFixed(3)),
      p50_ms: Number(percentile(sorted, 50).toFixed(3)),
      p99_ms: Number(percentile(sorted, 99).toFixed(3)),
      requests_per_second: Math.round(latencies.length / seconds),
      errors: errors.length,
      peak_rss_mb: Number((rssKb / 1024).toFixed(1)),
      server_exit: status.code,
    };

    if (opts.json) {
      process.stdout.write(`${JSON.stringify(figures)}\n`);
    } else if (opts.bench) {
      const row = (label, a, b) => `  ${label.padEnd(52)} ${String(a).padStart(10)} ${String(b).padStart(10)}\n`;
      process.stdout.write(
        `\nns-hpc bench: MCP over streamable HTTP, ${opts.sessions} concurrent sessions x ${opts.calls} calls, loopback\n\n` +
          row('', 'median ms', 'p99 ms') +
          row(`tools/call ${opts.tool} (round trip)`, figures.p50_ms.toFixed(2), figures.p99_ms.toFixed(2)) +
          `\n  requests per second (${opts.sessions} sessions, ${os.cpus().length} cores): ${figures.requests_per_second}\n` +
          `  errors: ${figures.errors} of ${opts.sessions * opts.calls} calls\n` +
          `  server peak RSS (VmHWM): ${figures.peak_rss_mb.toFixed(1)} MB\n\n`,
      );
    } else {
      process.stdout.write(
        `load: ${opts.sessions} sessions x ${opts.calls} tools/call ${opts.tool} = ${latencies.length} calls in ${seconds.toFixed(2)} s\n` +
          `load: latency p50 ${figures.p50_ms.toFixed(2)} ms, p99 ${figures.p99_ms.toFixed(2)} ms; ` +
          `${figures.requests_per_second} requests/s; errors ${figures.errors}; server peak RSS ${figures.peak_rss_mb.toFixed(1)} MB\n`,
      );
    }
    if (errors.length) {
      for (const e of errors.slice(0, 10)) process.stderr.write(`load.mjs: ${e}\n`);
      if (errors.length > 10) process.stderr.write(`load.mjs: … and ${errors.length - 10} more errors\n`);
      exitCode = 1;
    }
  } catch (err) {
    process.stderr.write(`load.mjs: ${err.message}\n`);
    exitCode = 1;
  } finally {
    if (server.proc.exitCode === null && server.proc.signalCode === null) {
      server.proc.kill('SIGKILL');
      await server.exited;
    }
    removeHome(home);
  }
  return exitCode;
}

process.exitCode = await main();
