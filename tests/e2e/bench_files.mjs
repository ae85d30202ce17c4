#!/usr/bin/env node
// `make bench`: 1,000 read_file calls of a small file through ns-hpc, side by side with the same
// number of read_text_file calls through @modelcontextprotocol/server-filesystem, both over the
// same transport (stdio, the official SDK client), one after the other in the same run.
//
// Usage: tests/e2e/bench_files.mjs [--calls N] [--json]
// Environment: NSHPC_BINARY (default <repo>/build/ns-hpc).
import fs from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';

import { NSHPC_BINARY, childEnv, makeHome, nshpcArgs, removeHome } from './home.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const calls = argv.includes('--calls') ? Number(argv[argv.indexOf('--calls') + 1]) : 1000;
const asJson = argv.includes('--json');
const CONTENT = Array.from({ length: 40 }, (_, i) => `line ${i + 1} of a small text file`).join('\n') + '\n';

async function connect(command, args, env) {
  const transport = new StdioClientTransport({ command, args, env, stderr: 'ignore' });
  const client = new Client({ name: 'nshpc-bench-files', version: '1.0.0' }, { capabilities: {} });
  await client.connect(transport);
  return client;
}

// Runs `calls` sequential calls; returns {total_ms, per_call_ms, p50_ms, p99_ms}.
async function measure(client, name, args, check) {
  for (let i = 0; i < 20; i++) check(await client.callTool({ name, arguments: args })); // warm up
  const times = [];
  const start = performance.now();
  for (let i = 0; i < calls; i++) {
    const t = performance.now();
    const r = await client.callTool({ name, arguments: args });
    times.push(performance.now() - t);
    if (i % 100 === 0) check(r);
  }
  const total = performance.now() - start;
  times.sort((a, b) => a - b);
  return {
    total_ms: +total.toFixed(1),
    per_call_ms: +(total / calls).toFixed(3),
    p50_ms: +times[Math.floor(times.length / 2)].toFixed(3),
    p99_ms: +times[Math.floor(times.length * 0.99)].toFixed(3),
  };
}

const home = makeHome('bench-files');
let status = 0;
try {
  // ns-hpc: an instance with the file in its workspace.
  const nshpc = await connect(NSHPC_BINARY, nshpcArgs(home), childEnv(home));
  const created = await nshpc.callTool({ name: 'create_instance', arguments: { instance_id: 'files-bench', network: 'off' } });
  if (created.isError) throw new Error(`create_instance failed: ${JSON.stringify(created.content)}`);
  const w = await nshpc.callTool({
    name: 'write_file',
    arguments: { instance_id: 'files-bench', path: 'small.txt', content: CONTENT },
  });
  if (w.isError) throw new Error(`write_file failed: ${JSON.stringify(w.content)}`);
  const ours = await measure(nshpc, 'read_file', { instance_id: 'files-bench', path: 'small.txt' }, (r) => {
    if (r.isError || r.structuredContent?.content !== CONTENT) throw new Error('ns-hpc read_file returned something else');
  });
  await nshpc.close();

  // server-filesystem over the same folder (the instance's workspace on the host).
  const workspace = path.join(home.instancesDir, 'files-bench', 'workspace');
  const entry = path.join(here, 'node_modules', '@modelcontextprotocol', 'server-filesystem', 'dist', 'index.js');
  const fsClient = await connect(process.execPath, [entry, workspace], { PATH: process.env.PATH || '/usr/bin:/bin' });
  const theirs = await measure(fsClient, 'read_text_file', { path: path.join(workspace, 'small.txt') }, (r) => {
    if (r.isError || !JSON.stringify(r.content).includes('line 40 of a small')) throw new Error('server-filesystem read failed');
  });
  await fsClient.close();

  const ratio = +(ours.per_call_ms / theirs.per_call_ms).toFixed(2);
  if (asJson) {
    process.stdout.write(JSON.stringify({ calls, nshpc: ours, server_filesystem: theirs, ratio }) + '\n');
  } else {
    process.stdout.write(
      `\nns-hpc bench: ${calls} sequential file reads of a ${CONTENT.length}-byte file, stdio, SDK client\n\n` +
        `  server                                     total ms   per call ms   p50 ms   p99 ms\n` +
        `  ns-hpc read_file                           ${String(ours.total_ms).padStart(8)}   ${String(ours.per_call_ms).padStart(11)}   ${String(ours.p50_ms).padStart(6)}   ${String(ours.p99_ms).padStart(6)}\n` +
        `  server-filesystem read_text_file           ${String(theirs.total_ms).padStart(8)}   ${String(theirs.per_call_ms).padStart(11)}   ${String(theirs.p50_ms).padStart(6)}   ${String(theirs.p99_ms).padStart(6)}\n` +
        `  ns-hpc / server-filesystem (per call): ${ratio}x\n`,
    );
  }
} catch (err) {
  process.stderr.write(`bench_files.mjs: ${err.stack || err}\n`);
  status = 1;
} finally {
  removeHome(home);
}
process.exit(status);
