// The HTTP load test (load.mjs) as an end-to-end test: 50 concurrent sessions x 200 tools/call
// must all succeed and the server must stop cleanly on SIGTERM.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));

function run(args) {
  return new Promise((resolve) => {
    const proc = spawn(process.execPath, [path.join(here, 'load.mjs'), ...args], {
      env: process.env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (c) => (stdout += c));
    proc.stderr.on('data', (c) => (stderr += c));
    proc.on('exit', (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
}

test('50 concurrent HTTP sessions x 200 tools/call, no errors', { timeout: 300000 }, async () => {
  const { code, signal, stdout, stderr } = await run(['--json']);
  assert.equal(signal, null, `load.mjs was killed by ${signal}\n${stderr}`);
  assert.equal(code, 0, `load.mjs exited ${code}\nstdout:\n${stdout}\nstderr:\n${stderr}`);
  const figures = JSON.parse(stdout.trim().split('\n').pop());
  assert.equal(figures.errors, 0, stderr);
  assert.equal(figures.sessions, 50);
  assert.equal(figures.calls, 50 * 200);
  assert.equal(figures.server_exit, 0);
  assert.ok(figures.p50_ms > 0 && figures.p99_ms >= figures.p50_ms, JSON.stringify(figures));
  console.log(`# load: ${JSON.stringify(figures)}`);
});
