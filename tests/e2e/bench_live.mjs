#!/usr/bin/env node
// The live views' numbers (issue 35), through the server's relays as a browser reaches them:
// `ns-hpc run --transport streamable-http`, a living instance on the host's root with its desktop
// on (1280x800) and undici's WebSocket with the bearer token.
//   - frames per second while the screen changes: an xmessage window moved back and forth by
//     xdotool in the sandbox; the client asks for the encodings noVNC asks for (Tight, ZRLE,
//     Hextile's place taken by CopyRect, Raw) and sends the next incremental request as each
//     FramebufferUpdate ends, as noVNC does; FramebufferUpdate messages are counted, not pixels;
//   - input-to-screen latency: in control mode a PointerEvent moves the pointer (x11vnc draws it
//     into the framebuffer for a client that takes no cursor shape), timed until an update
//     covering the new position arrives;
//   - connect to first full frame: a new WebSocket, the RFB handshake and a whole-screen request,
//     until its update has arrived whole;
//   - the live terminal's keystroke echo: one byte sent, timed until it comes back (200 times).
// Usage: tests/e2e/bench_live.mjs [ECHOES]. Skipped when the host has no Xvfb/Xfce/x11vnc/xdotool.
import { execFileSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';

import { WebSocket } from 'undici';

import { connectHttp, makeHttpHome, startServer } from './http_lib.mjs';
import { removeHome, sleep, textOf } from './lib.mjs';

const echoes = Number(process.argv[2] || 200);
try {
  execFileSync('sh', ['-c', 'command -v Xvfb && command -v xfwm4 && command -v x11vnc && command -v xdotool && command -v xmessage'],
    { stdio: 'ignore' });
} catch {
  console.log('bench live views: skipped: the host has no Xvfb, xfwm4, x11vnc, xdotool or xmessage (make deps installs them)');
  process.exit(0);
}

// Encodings (RFB numbers): Tight 7, ZRLE 16, CopyRect 1, Raw 0; DesktopSize -223, LastRect -224.
const ENCODINGS = [7, 16, 1, 0, -223, -224];

// Bytes of a WebSocket as a queue that the RFB parser takes from, waiting when short.
class Stream {
  constructor(ws) {
    this.chunks = [];
    this.length = 0;
    this.waiter = null;
    this.closed = null;
    this.texts = [];
    ws.addEventListener('message', (e) => {
      if (typeof e.data === 'string') {
        this.texts.push(e.data);
      } else {
        const b = Buffer.from(e.data);
        this.chunks.push(b);
        this.length += b.length;
      }
      this.wake();
    });
    ws.addEventListener('close', (e) => {
      this.closed = `${e.code} ${e.reason}`;
      this.wake();
    });
  }

  wake() {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w();
    }
  }

  async take(n) {
    while (this.length < n) {
      if (this.closed) throw new Error(`the relay closed: ${this.closed}`);
      await new Promise((resolve) => {
        this.waiter = resolve;
      });
    }
    const out = Buffer.allocUnsafe(n);
    let at = 0;
    while (at < n) {
      const c = this.chunks[0];
      const k = Math.min(c.length, n - at);
      c.copy(out, at, 0, k);
      at += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    this.length -= n;
    return out;
  }

  async u8() { return (await this.take(1))[0]; }
  async u16() { return (await this.take(2)).readUInt16BE(0); }
  async u32() { return (await this.take(4)).readUInt32BE(0); }

  // Tight's compact length: 1 to 3 bytes of 7 bits.
  async compact() {
    let b = await this.u8();
    let len = b & 0x7f;
    if (b & 0x80) {
      b = await this.u8();
      len |= (b & 0x7f) << 7;
      if (b & 0x80) len |= (await this.u8()) << 14;
    }
    return len;
  }
}

// One rectangle's data skipped by its encoding (pixel format: x11vnc's 32 bpp, depth 24).
async function skipRect(s, r, bpp) {
  const tpixel = bpp === 4 ? 3 : bpp;
  switch (r.enc) {
    case 0: await s.take(r.w * r.h * bpp); return;
    case 1: await s.take(4); return;
    case 16: await s.take(await s.u32()); return;
    case -223: return;
    case 7: {
      const control = await s.u8();
      const kind = control >> 4;
      if (kind === 8) { await s.take(tpixel); return; }
      if (kind === 9) { await s.take(await s.compact()); return; }
      if (kind > 9) throw new Error(`Tight: compression control ${control}`);
      let size = r.w * r.h * tpixel;
      if (control & 0x40) {
        const filter = await s.u8();
        if (filter === 1) {
          const colours = (await s.u8()) + 1;
          await s.take(colours * tpixel);
          size = colours === 2 ? ((r.w + 7) >> 3) * r.h : r.w * r.h;
        } else if (filter !== 0 && filter !== 2) {
          throw new Error(`Tight: filter ${filter}`);
        }
      }
      await s.take(size < 12 ? size : await s.compact());
      return;
    }
    default: throw new Error(`an encoding not asked for: ${r.enc}`);
  }
}

// Reads server messages until one FramebufferUpdate has arrived whole: its rectangles.
async function nextUpdate(s, bpp) {
  for (;;) {
    const type = await s.u8();
    if (type === 0) break;
    if (type === 2) continue;  // Bell
    if (type === 1) {  // SetColourMapEntries
      await s.take(3);
      await s.take((await s.u16()) * 6);
      continue;
    }
    if (type === 3) {  // ServerCutText
      await s.take(3);
      await s.take(await s.u32());
      continue;
    }
    throw new Error(`unknown server message ${type}`);
  }
  await s.take(1);
  const count = await s.u16();
  const rects = [];
  for (let i = 0; i < count; i++) {
    const h = await s.take(12);
    const r = { x: h.readUInt16BE(0), y: h.readUInt16BE(2), w: h.readUInt16BE(4), h: h.readUInt16BE(6), enc: h.readInt32BE(8) };
    if (r.enc === -224) break;  // LastRect
    await skipRect(s, r, bpp);
    rects.push(r);
  }
  return rects;
}

const request = (incremental, x, y, w, h) => {
  const b = Buffer.alloc(10);
  b[0] = 3;
  b[1] = incremental ? 1 : 0;
  b.writeUInt16BE(x, 2);
  b.writeUInt16BE(y, 4);
  b.writeUInt16BE(w, 6);
  b.writeUInt16BE(h, 8);
  return b;
};

// A viewer through the relay, after the handshake and SetEncodings: {ws, s, width, height, bpp}.
async function viewer(server, id) {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}/desktop/${id}/vnc`,
    { headers: { Authorization: `Bearer ${server.token}` }, protocols: ['binary'] });
  ws.binaryType = 'arraybuffer';
  const s = new Stream(ws);
  await new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve);
    ws.addEventListener('close', (e) => reject(new Error(`not opened: ${e.code} ${e.reason}`)));
  });
  await s.take(12);
  ws.send(Buffer.from('RFB 003.008\n'));
  await s.take(await s.u8());
  ws.send(Buffer.from([1]));
  if ((await s.u32()) !== 0) throw new Error('security failed');
  ws.send(Buffer.from([1]));
  const init = await s.take(24);
  await s.take(init.readUInt32BE(20));
  const enc = Buffer.alloc(4 + 4 * ENCODINGS.length);
  enc[0] = 2;
  enc.writeUInt16BE(ENCODINGS.length, 2);
  ENCODINGS.forEach((e, i) => enc.writeInt32BE(e, 4 + 4 * i));
  ws.send(enc);
  return { ws, s, width: init.readUInt16BE(0), height: init.readUInt16BE(2), bpp: init[4] / 8 };
}

const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.floor(s.length / 2)];
};
const pct = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((s.length * p) / 100))];
};

const home = makeHttpHome('bench-live', '[desktop]\nhost_root = true\n');
const server = await startServer(home);
const mcp = await connectHttp(server.url, { token: server.token });
const call = async (name, args) => {
  const r = await mcp.client.callTool({ name, arguments: { instance_id: 'bench', ...args } });
  if (r.isError) throw new Error(`${name}: ${textOf(r)}`);
  return r;
};
let failed = false;
try {
  await mcp.client.callTool({ name: 'create_instance', arguments: { instance_id: 'bench', persistent: true, network: 'off' } });
  await call('set_desktop_environment', { enabled: true });

  // Connect to first full frame (the first connection also waits for x11vnc to be up: not counted).
  await (async () => {
    const v = await viewer(server, 'bench');
    v.ws.send(request(false, 0, 0, v.width, v.height));
    await nextUpdate(v.s, v.bpp);
    v.ws.close();
  })();
  const firstFrame = [];
  let size = '';
  for (let i = 0; i < 10; i++) {
    const t0 = performance.now();
    const v = await viewer(server, 'bench');
    size = `${v.width}x${v.height}`;
    v.ws.send(request(false, 0, 0, v.width, v.height));
    let covered = 0;
    while (covered < v.width * v.height) {
      for (const r of await nextUpdate(v.s, v.bpp)) covered += r.w * r.h;
    }
    firstFrame.push(performance.now() - t0);
    v.ws.close();
  }

  // Frames per second while a window moves back and forth.
  const mover = await call('terminal_execute', { command:
    "setsid xmessage -geometry 360x160+100+200 -name benchmove 'moving' </dev/null >/dev/null 2>&1 & " +
    "for i in $(seq 50); do w=$(xdotool search --name '^benchmove$' | head -n 1); [ -n \"$w\" ] && break; sleep 0.1; done; " +
    'echo "$w" > /tmp/bench-window; ' +
    'setsid sh -c \'w=$(cat /tmp/bench-window); while :; do for x in 100 260 420 580 740 580 420 260; do ' +
    'xdotool windowmove "$w" "$x" 200; sleep 0.02; done; done\' </dev/null >/dev/null 2>&1 & echo $! > /tmp/bench-mover; cat /tmp/bench-window' });
  if (!/^\d+\s*$/.test(textOf(mover).trim().split('\n').at(-1))) throw new Error(`the moving window did not start: ${textOf(mover)}`);
  const v = await viewer(server, 'bench');
  v.ws.send(request(false, 0, 0, v.width, v.height));
  await nextUpdate(v.s, v.bpp);
  const seconds = 10;
  let frames = 0;
  const used = {};
  const t0 = performance.now();
  while (performance.now() - t0 < seconds * 1000) {
    v.ws.send(request(true, 0, 0, v.width, v.height));
    const rects = await nextUpdate(v.s, v.bpp);
    if (rects.length) frames++;
    for (const r of rects) used[r.enc] = (used[r.enc] || 0) + 1;
  }
  const fps = frames / ((performance.now() - t0) / 1000);
  await call('terminal_execute', { command: 'kill $(cat /tmp/bench-mover); pkill -x xmessage; true' });
  await sleep(500);

  // Input to screen: the pointer moved in control mode, until an update covers where it went.
  // First, view-only: the same move is dropped by the relay, and nothing covers that spot (else
  // the figure below would time something other than the input).
  {
    await sleep(300);
    const quiet = [];
    v.ws.send(Buffer.from([5, 0, 300 >> 8, 300 & 255, 500 >> 8, 500 & 255]));
    const end = performance.now() + 1000;
    while (performance.now() < end) {
      v.ws.send(request(true, 0, 0, v.width, v.height));
      const rects = await Promise.race([nextUpdate(v.s, v.bpp), sleep(end - performance.now()).then(() => null)]);
      if (!rects) break;
      quiet.push(...rects.filter((r) => 300 >= r.x && 300 < r.x + r.w && 500 >= r.y && 500 < r.y + r.h));
    }
    if (quiet.length) throw new Error(`view-only, the spot still changed: ${JSON.stringify(quiet)}`);
  }
  v.ws.send(JSON.stringify({ control: true }));
  const until = Date.now() + 5000;
  while (!v.s.texts.includes('{"control":true}') && Date.now() < until) await sleep(10);
  if (!v.s.texts.includes('{"control":true}')) throw new Error('control was not granted');
  // Drain what the window's last moves left: updates until one comes back empty-handed in time.
  const settle = async () => {
    for (;;) {
      v.ws.send(request(true, 0, 0, v.width, v.height));
      const got = await Promise.race([nextUpdate(v.s, v.bpp).then(() => true), sleep(300).then(() => false)]);
      if (!got) return;  // the request stays pending: the next update answers it
    }
  };
  await settle();
  const inputLatency = [];
  const spots = [[300, 500], [900, 450]];
  for (let i = 0; i < 40; i++) {
    const [x, y] = spots[i % 2];
    const ev = Buffer.from([5, 0, x >> 8, x & 255, y >> 8, y & 255]);
    const start = performance.now();
    v.ws.send(ev);
    let hit = false;
    while (!hit) {
      const rects = await nextUpdate(v.s, v.bpp);
      hit = rects.some((r) => x >= r.x && x < r.x + r.w && y >= r.y && y < r.y + r.h);
      v.ws.send(request(true, 0, 0, v.width, v.height));
      if (performance.now() - start > 5000) throw new Error(`no update covered the pointer at ${x},${y} within 5 s`);
    }
    inputLatency.push(performance.now() - start);
    await sleep(100);
  }
  v.ws.close();

  // The terminal's echo: one byte at a time.
  const tws = new WebSocket(`ws://127.0.0.1:${server.port}/terminal/bench?rows=40&cols=200`,
    { headers: { Authorization: `Bearer ${server.token}` } });
  tws.binaryType = 'arraybuffer';
  let out = '';
  let wake = null;
  tws.addEventListener('message', (e) => {
    if (typeof e.data !== 'string') out += Buffer.from(e.data).toString('latin1');
    if (wake) wake();
  });
  await new Promise((resolve, reject) => {
    tws.addEventListener('open', resolve);
    tws.addEventListener('close', () => reject(new Error('the terminal closed')));
  });
  const waitFor = async (pred, ms = 5000) => {
    const end = performance.now() + ms;
    while (!pred()) {
      if (performance.now() > end) throw new Error(`the terminal did not answer: ${JSON.stringify(out.slice(-200))}`);
      await new Promise((resolve) => {
        wake = resolve;
        setTimeout(resolve, 50);
      });
    }
  };
  tws.send(Buffer.from('echo ready-$((6*7))\r'));
  await waitFor(() => out.includes('ready-42'));
  await sleep(200);
  const echo = [];
  for (let i = 0; i < echoes; i++) {
    if (i % 100 === 0) {
      tws.send(Buffer.from([0x15]));  // ^U: the line starts empty again
      await sleep(100);
    }
    out = '';
    const start = performance.now();
    tws.send(Buffer.from('x'));
    await waitFor(() => out.includes('x'));
    echo.push(performance.now() - start);
  }
  tws.send(Buffer.from([0x15]));
  tws.send(Buffer.from('exit\r'));
  tws.close();

  const rows = [
    ['frames per second while a window moves (FramebufferUpdates)', fps.toFixed(1), '>= 15', fps >= 15],
    ['input to screen: pointer move until an update covers it, p50 ms', median(inputLatency).toFixed(1), '<= 100', median(inputLatency) <= 100],
    ['  (p90 ms)', pct(inputLatency, 90).toFixed(1), '', true],
    ['connect to first full frame, p50 ms', median(firstFrame).toFixed(1), '<= 1000', median(firstFrame) <= 1000],
    ['  (max ms)', Math.max(...firstFrame).toFixed(1), '', true],
    [`terminal keystroke echo, p50 ms (${echoes} bytes)`, median(echo).toFixed(2), '<= 20', median(echo) <= 20],
    ['  (p99 ms)', pct(echo, 99).toFixed(2), '', true],
  ];
  console.log(`\nns-hpc bench: live views through the relays (streamable HTTP, WebSocket, ${size}, encodings Tight/ZRLE/CopyRect/Raw)`);
  console.log(`  rectangles by encoding while moving: ${JSON.stringify(used)}`);
  console.log(`  ${''.padEnd(64)} ${'measured'.padStart(9)} ${'goal'.padStart(8)}`);
  for (const [what, value, goal, ok] of rows) {
    console.log(`  ${what.padEnd(64)} ${value.padStart(9)} ${goal.padStart(8)} ${goal ? (ok ? 'ok' : 'MISSED') : ''}`);
  }
} catch (e) {
  failed = true;
  console.error(`bench live views: ${e.stack || e}`);
} finally {
  await mcp.client.callTool({ name: 'stop_instance', arguments: { instance_id: 'bench' } }).catch(() => {});
  await mcp.close();
  await server.stop();
  removeHome(home);
}
process.exit(failed ? 1 : 0);
