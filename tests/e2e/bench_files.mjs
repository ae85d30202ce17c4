#!/usr/bin/env node
// `make bench`: 1,000 read_file calls of a 200-line file through ns-hpc (`ns-hpc run`'s read_file
// of an instance's file, and `ns-hpc computer`'s read_file of a computer's file), side by side with
// the same number of read_text_file calls through @modelcontextprotocol/server-filesystem, all over
// the same transport (stdio, the official SDK client), one after the other in the same run. The
// computer's needs make test's image 'test' (scripts/test-image.sh); without it that row is left
// out, saying why.
//
// Usage: tests/e2e/bench_files.mjs [--calls N] [--json]
// Environment: NSHPC_BINARY (default <repo>/build/ns-hpc).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
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
const CONTENT = Array.from({ length: 200 }, (_, i) => `line ${i + 1} of a small text file`).join('\n') + '\n';

// make test's image cache (as tests/e2e/computer.test.mjs finds it).
const imageCache =
  process.getuid() === 0
    ? '/var/cache/ns-hpc-test'
    : path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'ns-hpc-test');

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

  // ns-hpc computer: the same file in a computer's /workspace (network off, as the instance's).
  let computer = null;
  let computerSkipped = '';
  if (!fs.existsSync(path.join(imageCache, 'images', 'test'))) {
    computerSkipped = `no image 'test' in ${imageCache} (scripts/test-image.sh, run by make test, builds it)`;
  } else {
    const text = fs.readFileSync(home.config, 'utf8').replace('default_image = ""', 'default_image = "test"');
    const config = path.join(home.root, 'computer.toml');
    fs.writeFileSync(
      config,
      text.replace('[namespace]\n', `[namespace]\nimages_dir = ${JSON.stringify(path.join(imageCache, 'images'))}\n`),
    );
    const env = { ...childEnv(home), COMPUTER_ID: 'bench-computer' };
    const client = await connect(NSHPC_BINARY, ['--config', config, 'computer', '--no-network'], env);
    try {
      const cw = await client.callTool({ name: 'write_file', arguments: { path: 'small.txt', content: CONTENT } });
      if (cw.isError) throw new Error(`computer write_file failed: ${JSON.stringify(cw.content)}`);
      computer = await measure(client, 'read_file', { path: 'small.txt' }, (r) => {
        if (r.isError || r.structuredContent?.content !== CONTENT)
          throw new Error('ns-hpc computer read_file returned something else');
      });
    } finally {
      await client.close();
      // A computer never stops for idleness: its sandbox ends with the bench.
      execFileSync(NSHPC_BINARY, ['--config', config, 'instance', 'stop', 'bench-computer'], { env, stdio: 'ignore' });
    }
  }

  // server-filesystem over the same folder (the instance's workspace on the host).
  const workspace = path.join(home.instancesDir, 'files-bench', 'workspace');
  const entry = path.join(here, 'node_modules', '@modelcontextprotocol', 'server-filesystem', 'dist', 'index.js');
  const fsClient = await connect(process.execPath, [entry, workspace], { PATH: process.env.PATH || '/usr/bin:/bin' });
  const theirs = await measure(fsClient, 'read_text_file', { path: path.join(workspace, 'small.txt') }, (r) => {
    if (r.isError || !JSON.stringify(r.content).includes('line 40 of a small')) throw new Error('server-filesystem read failed');
  });
  await fsClient.close();

  const ratio = +(ours.per_call_ms / theirs.per_call_ms).toFixed(2);
  const computerRatio = computer ? +(computer.per_call_ms / theirs.per_call_ms).toFixed(2) : null;
  if (asJson) {
    process.stdout.write(
      JSON.stringify({
        calls,
        lines: 200,
        nshpc: ours,
        computer: computer ?? { skipped: computerSkipped },
        server_filesystem: theirs,
        ratio,
        computer_ratio: computerRatio,
      }) + '\n',
    );
  } else {
    const row = (name, m) =>
      `  ${name.padEnd(41)}${String(m.total_ms).padStart(8)}   ${String(m.per_call_ms).padStart(11)}   ${String(m.p50_ms).padStart(6)}   ${String(m.p99_ms).padStart(6)}\n`;
    process.stdout.write(
      `\nns-hpc bench: ${calls} sequential file reads of a 200-line (${CONTENT.length}-byte) file, stdio, SDK client\n\n` +
        `  server                                     total ms   per call ms   p50 ms   p99 ms\n` +
        row('ns-hpc run read_file', ours) +
        (computer ? row('ns-hpc computer read_file', computer) : `  ns-hpc computer read_file: left out: ${computerSkipped}\n`) +
        row('server-filesystem read_text_file', theirs) +
        `  ns-hpc run / server-filesystem (per call): ${ratio}x\n` +
        (computer ? `  ns-hpc computer / server-filesystem (per call): ${computerRatio}x\n` : ''),
    );
  }
} catch (err) {
  process.stderr.write(`bench_files.mjs: ${err.stack || err}\n`);
  status = 1;
} finally {
  removeHome(home);
}
process.exit(status);
