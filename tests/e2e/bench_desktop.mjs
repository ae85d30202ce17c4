#!/usr/bin/env node
// The desktop's actions end to end through MCP, as an agent sees them: `ns-hpc run` on stdio with
// the official SDK client, a living instance on the host's root with its desktop on ([desktop]
// host_root, the host's Xfce), and p50/p99 of
//   - `click` (the seed's tool: move, press, release; no screenshot),
//   - `computer` `key` with text "shift" (its screenshot once the screen has settled: at least 200 ms),
//   - `computer` `screenshot` (JPEG q75, 1280x800),
// beside what the reference implementations spend on one action in the same run: one `xdotool
// click 1` process in the instance's sandbox (through terminal_execute, as a shell tool runs it)
// and `xdotool` alone (timed inside the sandbox by `date`).
// Usage: tests/e2e/bench_desktop.mjs [RUNS]. Skipped when the host has no Xvfb/Xfce.
import { execFileSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';

import { connectNshpc, makeHome, removeHome, textOf } from './lib.mjs';

const runs = Number(process.argv[2] || 100);
try {
  execFileSync('sh', ['-c', 'command -v Xvfb && command -v xfwm4 && command -v xdotool'], { stdio: 'ignore' });
} catch {
  console.log('bench desktop (MCP): skipped: the host has no Xvfb, xfwm4 or xdotool (make deps installs them)');
  process.exit(0);
}

const home = makeHome('bench-desktop', '[desktop]\nhost_root = true\n');
const conn = await connectNshpc(home, { name: 'bench-desktop' });
const c = conn.client;
const call = async (name, args) => {
  const r = await c.callTool({ name, arguments: { instance_id: 'bench', ...args } });
  if (r.isError) throw new Error(`${name}: ${textOf(r)}`);
  return r;
};

function stats(times) {
  const s = [...times].sort((a, b) => a - b);
  return { p50: s[Math.floor(s.length * 0.5)], p99: s[Math.min(s.length - 1, Math.floor(s.length * 0.99))] };
}
async function time(n, fn) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn();
    out.push(performance.now() - t);
  }
  return stats(out);
}

try {
  await c.callTool({ name: 'create_instance', arguments: { instance_id: 'bench', persistent: true, network: 'off' } });
  await call('set_desktop_environment', { enabled: true });
  await call('computer', { action: 'screenshot' });  // the agent connected, the desktop painted
  const click = await time(runs, () => call('click', { x: 640, y: 500 }));
  const key = await time(runs, () => call('computer', { action: 'key', text: 'shift' }).catch(() => {}));
  const shot = await time(runs, () => call('computer', { action: 'screenshot' }));
  const few = Math.max(5, Math.floor(runs / 10));
  const viaShell = await time(few, () => call('terminal_execute', { command: 'xdotool click 1' }));
  const inner = [];
  for (let i = 0; i < few; i++) {
    const r = await call('terminal_execute', {
      command: 's=$(date +%s%N); xdotool click 1; e=$(date +%s%N); echo $(( (e - s) / 1000 ))',
    });
    inner.push(Number(r.structuredContent.stdout.trim()) / 1000);
  }
  const alone = stats(inner);
  const row = (what, s) => console.log(`  ${what.padEnd(58)} ${s.p50.toFixed(2).padStart(8)} ${s.p99.toFixed(2).padStart(9)}`);
  console.log(`\nns-hpc bench: desktop actions end to end through MCP (stdio, SDK client; ${runs} runs, xdotool ${few})`);
  console.log(`  ${''.padEnd(58)} ${'p50 ms'.padStart(8)} ${'p99 ms'.padStart(9)}`);
  row('click (the seed tool) through MCP', click);
  row('computer key "shift" through MCP (screenshot after it)', key);
  row('computer screenshot (JPEG q75) through MCP', shot);
  row('xdotool click 1 through terminal_execute', viaShell);
  row('xdotool click 1 alone (one process, in the sandbox)', alone);
  console.log(`\n  click through MCP / one xdotool process: p50 ${(click.p50 / alone.p50).toFixed(3)}x`);
  console.log(`  click through MCP / xdotool through terminal_execute: p50 ${(click.p50 / viaShell.p50).toFixed(3)}x`);
} finally {
  await c.callTool({ name: 'stop_instance', arguments: { instance_id: 'bench' } }).catch(() => {});
  await conn.close();
  removeHome(home);
}
