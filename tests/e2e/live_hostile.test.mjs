// End-to-end tests of the live desktop's relay against a hostile sandbox and a hostile browser
// (issue 35), over `ns-hpc run --transport streamable-http` on a host-root desktop:
//   - the "VNC server" of one instance floods: a python3 program in its sandbox stops the real
//     x11vnc (SIGSTOP: the supervisor still sees it alive and starts no other), takes the socket
//     path and, to every connection, answers the RFB handshake and then writes FramebufferUpdate
//     headers and garbage as fast as it can, forever. Viewers that read slowly or not at all are
//     cut, the server's memory stays within what the transport's budget allows, MCP, the
//     dashboard's API and /healthz keep answering promptly, and a well-behaved viewer of another
//     instance keeps getting its frames;
//   - garbage from the browser's side (not RFB) closes only that connection.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { WebSocket } from 'undici';

import { connectHttp, makeHttpHome, startServer } from './http_lib.mjs';
import { hostHas, removeHome, sleep, textOf, until } from './lib.mjs';

const skip = ['Xvfb', 'xfwm4', 'x11vnc', 'python3'].every(hostHas)
  ? false
  : 'the host has no Xvfb/Xfce/x11vnc/python3 (make deps installs the desktop group)';

// The transport's budget of unsent bytes per WebSocket (WebSocketRoute::buffer_bytes, the
// default the desktop route keeps): a viewer that does not read is cut once this much waits.
const BUFFER_BYTES = 8 * 1024 * 1024;
// What the server may grow by while the hostile viewers are open: each of them holds at most
// BUFFER_BYTES queued, plus one read chunk (64 KiB) in its relay; the rest is slack for the
// allocator (per-thread arenas of the relay threads and the workers), the MCP and API answers.
const HOSTILE_VIEWERS = 3;
const SLACK = 24 * 1024 * 1024;
const RSS_BOUND = HOSTILE_VIEWERS * (BUFFER_BYTES + 64 * 1024) + SLACK;

// The hostile "VNC server": it runs in the instance's sandbox as the instance's user.
const FLOOD_PY = String.raw`
import os, signal, socket, struct, threading, time
path = '/tmp/.ns-hpc-desktop/vnc'
stopped = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            if open('/proc/%s/comm' % pid).read().strip() == 'x11vnc':
                os.kill(int(pid), signal.SIGSTOP)
                stopped.append(pid)
        except OSError:
            pass
try:
    os.unlink(path)
except FileNotFoundError:
    pass
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(64)
junk = os.urandom(1 << 20)
update = struct.pack('>BxHHHHHi', 0, 1, 0, 0, 1280, 800, 0)  # one Raw rectangle of 1280x800x4
served = [0]
lock = threading.Lock()
def log(line):
    with lock:
        with open('/workspace/flood.log', 'a') as f:
            f.write(line + '\n')
def serve(c, n):
    sent = 0
    try:
        c.sendall(b'RFB 003.008\n')
        c.settimeout(2)
        try:
            c.recv(12)
            c.sendall(b'\x01\x01')
            c.recv(1)
            c.sendall(b'\x00\x00\x00\x00')
            c.recv(1)
            c.sendall(struct.pack('>HHBBBBHHHBBBxxxI', 1280, 800, 32, 24, 0, 1, 255, 255, 255, 16, 8, 0, 5) + b'flood')
        except socket.timeout:
            pass
        c.settimeout(None)
        while True:
            c.sendall(update)
            for _ in range(4):
                c.sendall(junk)
                sent += len(junk)
    except OSError as e:
        log('connection %d ended after %d bytes: %s' % (n, sent, e))
    finally:
        c.close()
with open('/workspace/flood.pid', 'w') as f:
    f.write('%d %s\n' % (os.getpid(), ' '.join(stopped)))
while True:
    c, _ = srv.accept()
    served[0] += 1
    threading.Thread(target=serve, args=(c, served[0]), daemon=True).start()
`;

function rssBytes(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+) kB/m);
  return Number(m[1]) * 1024;
}

// A WebSocket viewer over a plain TCP socket, so that it can stop reading (a browser's
// WebSocket always reads): the upgrade, then nothing is read unless `read()` is called.
async function rawViewer(server, wsPath) {
  const sock = net.connect(server.port, '127.0.0.1');
  await new Promise((resolve, reject) => {
    sock.once('connect', resolve);
    sock.once('error', reject);
  });
  sock.write([
    `GET ${wsPath} HTTP/1.1`, `Host: 127.0.0.1:${server.port}`, 'Connection: Upgrade', 'Upgrade: websocket',
    'Sec-WebSocket-Version: 13', 'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==', 'Sec-WebSocket-Protocol: binary',
    `Authorization: Bearer ${server.token}`, '', ''].join('\r\n'));
  let head = Buffer.alloc(0);
  const state = { sock, ended: false, error: null, rest: Buffer.alloc(0), frames: frameWalker() };
  await new Promise((resolve, reject) => {
    const onData = (chunk) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      sock.off('data', onData);
      sock.pause();
      const status = head.subarray(0, head.indexOf('\r\n')).toString();
      if (!status.includes(' 101 ')) reject(new Error(`upgrade refused: ${status}`));
      state.rest = head.subarray(end + 4);
      resolve();
    };
    sock.on('data', onData);
    sock.once('error', reject);
  });
  sock.on('error', (e) => {
    state.error = e.code || e.message;
  });
  sock.on('close', () => {
    state.ended = true;
  });
  // The browser's half of the handshake, sent at once (masked client frames).
  const frame = (payload) => {
    const mask = Buffer.from([1, 2, 3, 4]);
    const out = Buffer.alloc(2 + 4 + payload.length);
    out[0] = 0x82;
    out[1] = 0x80 | payload.length;
    mask.copy(out, 2);
    for (let i = 0; i < payload.length; i++) out[6 + i] = payload[i] ^ mask[i % 4];
    return out;
  };
  sock.write(frame(Buffer.from('RFB 003.008\n')));
  sock.write(frame(Buffer.from([1])));
  sock.write(frame(Buffer.from([1])));
  // Reads what the stream holds now (at most one stream buffer's worth).
  state.read = () => {
    const chunk = sock.read();
    if (chunk) state.frames.feed(chunk);
  };
  state.frames.feed(state.rest);
  return state;
}

// The server's WebSocket frames, walked as they come without keeping their payloads: the close
// frame's code when one came.
function frameWalker() {
  let head = Buffer.alloc(0);
  let skip = 0;
  let closing = false;
  let closeBytes = Buffer.alloc(0);
  const w = { code: null };
  w.feed = (chunk) => {
    let buf = chunk;
    while (buf.length) {
      if (skip > 0) {
        const n = Math.min(skip, buf.length);
        if (closing) closeBytes = Buffer.concat([closeBytes, buf.subarray(0, n)]);
        skip -= n;
        buf = buf.subarray(n);
        if (skip === 0 && closing) w.code = closeBytes.length >= 2 ? closeBytes.readUInt16BE(0) : 1005;
        continue;
      }
      head = Buffer.concat([head, buf]);
      buf = Buffer.alloc(0);
      if (head.length < 2) break;
      let len = head[1] & 0x7f;
      let off = 2;
      if (len === 126) {
        if (head.length < 4) break;
        len = head.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (head.length < 10) break;
        len = Number(head.readBigUInt64BE(2));
        off = 10;
      }
      closing = (head[0] & 0x0f) === 8;
      if (closing && len === 0) w.code = 1005;
      skip = len;
      buf = head.subarray(off);
      head = Buffer.alloc(0);
    }
  };
  return w;
}

// Reads everything that is left: whether the connection ended and the close frame's code.
async function drainForClose(state, timeout = 15_000) {
  const sock = state.sock;
  sock.on('data', (chunk) => state.frames.feed(chunk));
  sock.resume();
  await until(() => state.ended, timeout);
  return { ended: state.ended, code: state.frames.code, error: state.error };
}

// A browser-like viewer (undici's WebSocket) that collects binary into one Buffer.
function openWs(server, wsPath) {
  const ws = new WebSocket(`ws://127.0.0.1:${server.port}${wsPath}`, {
    headers: { Authorization: `Bearer ${server.token}` }, protocols: ['binary'] });
  ws.binaryType = 'arraybuffer';
  const state = { ws, bytes: Buffer.alloc(0), closed: null };
  ws.addEventListener('message', (e) => {
    if (typeof e.data !== 'string') state.bytes = Buffer.concat([state.bytes, Buffer.from(e.data)]);
  });
  ws.addEventListener('close', (e) => {
    state.closed = { code: e.code, reason: e.reason };
  });
  state.opened = new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve);
    ws.addEventListener('close', () => reject(new Error('closed before open')));
  });
  return state;
}

async function take(state, n, timeout = 10_000) {
  assert.ok(await until(() => state.bytes.length >= n || state.closed, timeout), `waited for ${n} bytes`);
  assert.ok(state.bytes.length >= n, `the connection closed first: ${JSON.stringify(state.closed)}`);
  const out = state.bytes.subarray(0, n);
  state.bytes = state.bytes.subarray(n);
  return out;
}

// The RFB handshake of a well-behaved viewer: returns the ServerInit's size and bytes per pixel.
async function handshake(s) {
  assert.equal((await take(s, 12)).toString(), 'RFB 003.008\n');
  s.ws.send(Buffer.from('RFB 003.008\n'));
  const count = (await take(s, 1))[0];
  assert.ok([...(await take(s, count))].includes(1));
  s.ws.send(Buffer.from([1]));
  assert.equal((await take(s, 4)).readUInt32BE(0), 0);
  s.ws.send(Buffer.from([1]));
  const init = await take(s, 24);
  await take(s, init.readUInt32BE(20));
  return { width: init.readUInt16BE(0), height: init.readUInt16BE(2), bpp: init[4] / 8 };
}

// Asks for a whole (non-incremental) 64x64 update and waits for it (Raw, the default encoding):
// the milliseconds it took.
async function frameTime(s, bpp, timeout = 10_000) {
  const t0 = performance.now();
  s.ws.send(Buffer.from([3, 0, 0, 0, 0, 0, 0, 64, 0, 64]));
  for (;;) {
    const type = (await take(s, 1, timeout))[0];
    if (type === 0) break;
    if (type === 2) continue;  // Bell
    if (type === 3) {
      await take(s, 3 + 4);
      continue;
    }
    throw new Error(`unexpected server message ${type}`);
  }
  const head = await take(s, 3, timeout);
  for (let i = 0; i < head.readUInt16BE(1); i++) {
    const rect = await take(s, 12, timeout);
    assert.equal(rect.readInt32BE(8), 0, 'a Raw rectangle');
    await take(s, rect.readUInt16BE(4) * rect.readUInt16BE(6) * bpp, timeout);
  }
  return performance.now() - t0;
}

async function timed(fn) {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

function auditLines(home, id) {
  const file = path.join(home.instancesDir, id, 'audit.log');
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

describe('the live desktop against a hostile sandbox and a hostile browser', { skip }, () => {
  let home;
  let server;
  let mcp;
  const call = async (name, args) => {
    const r = await mcp.client.callTool({ name, arguments: args });
    assert.ok(!r.isError, `${name}: ${textOf(r)}`);
    return r;
  };

  before(async () => {
    home = makeHttpHome('live-hostile', '[desktop]\nhost_root = true\n');
    server = await startServer(home);
    mcp = await connectHttp(server.url, { token: server.token });
    for (const id of ['flood', 'calm']) {
      await call('create_instance', { instance_id: id, persistent: true, network: 'off' });
      await call('set_desktop_environment', { instance_id: id, enabled: true });
    }
  });
  after(async () => {
    if (mcp) {
      // The flood ends and the stopped x11vnc goes on, so that the desktop stops at once.
      await mcp.client.callTool({ name: 'terminal_execute', arguments: { instance_id: 'flood',
        command: 'read p s < /workspace/flood.pid && kill -KILL $p; kill -CONT $s; true' } }).catch(() => {});
      for (const id of ['flood', 'calm']) await mcp.client.callTool({ name: 'stop_instance', arguments: { instance_id: id } }).catch(() => {});
      await mcp.close();
    }
    if (server) await server.stop();
    removeHome(home);
  });

  test('a flooding VNC server and viewers that do not read leave the server responsive and bounded', async () => {
    // A well-behaved viewer of the other instance, before anything floods.
    const calm = openWs(server, '/desktop/calm/vnc');
    await calm.opened;
    const { bpp } = await handshake(calm);
    const calmBefore = await frameTime(calm, bpp);

    // The flood starts in the first instance's sandbox.
    await call('terminal_execute', { instance_id: 'flood', command:
      `cat > /workspace/flood.py <<'EOF'\n${FLOOD_PY}\nEOF\n` +
      'setsid python3 /workspace/flood.py </dev/null >/workspace/flood.out 2>&1 & ' +
      'for i in $(seq 100); do [ -s /workspace/flood.pid ] && break; sleep 0.1; done; cat /workspace/flood.pid /workspace/flood.out' });

    await sleep(500);
    const pid = server.proc.pid;
    const baseline = rssBytes(pid);
    let peak = baseline;
    const sampler = setInterval(() => {
      peak = Math.max(peak, rssBytes(pid));
    }, 50);

    try {
      // Viewers of the flooding desktop: one never reads, two read slowly (a stream buffer
      // every 100 ms: far less than the flood).
      const still = await rawViewer(server, '/desktop/flood/vnc');
      const slow = [await rawViewer(server, '/desktop/flood/vnc'), await rawViewer(server, '/desktop/flood/vnc')];
      const reader = setInterval(() => {
        for (const s of slow) s.read();
      }, 100);

      // While they are open: everything else answers promptly, the calm viewer gets its frames.
      const times = { mcp: [], api: [], healthz: [], calm: [] };
      const started = performance.now();
      let closedAll = false;
      while (performance.now() - started < 8000) {
        times.mcp.push(await timed(() => call('list_instances', {})));
        times.api.push(await timed(async () => {
          const r = await fetch(`http://127.0.0.1:${server.port}/api/instances`, { headers: { Authorization: `Bearer ${server.token}` } });
          assert.equal(r.status, 200);
          assert.ok((await r.json()).instances.some((i) => i.id === 'flood'));
        }));
        times.healthz.push(await timed(async () => {
          const r = await fetch(`http://127.0.0.1:${server.port}/healthz`);
          assert.equal(r.status, 200);
          await r.text();
        }));
        times.calm.push(await frameTime(calm, bpp));
        closedAll = auditLines(home, 'flood').filter((l) => l.event === 'desktop.view_closed').length >= 3;
        await sleep(100);
      }
      clearInterval(reader);
      const worst = Object.fromEntries(Object.entries(times).map(([k, v]) => [k, Math.round(Math.max(...v))]));
      console.log(`# worst answers during the flood (ms): ${JSON.stringify(worst)}; calm frame before: ${Math.round(calmBefore)} ms`);
      console.log(`# server RSS: baseline ${(baseline / 2 ** 20).toFixed(1)} MiB, peak ${(peak / 2 ** 20).toFixed(1)} MiB, ` +
        `bound +${(RSS_BOUND / 2 ** 20).toFixed(1)} MiB`);
      for (const [k, v] of Object.entries(worst)) assert.ok(v < 2000, `${k} answered in ${v} ms during the flood`);

      // The viewers that did not keep up were cut by the server (their relays ended and audited
      // it), while they still were not reading.
      assert.ok(closedAll || await until(() => auditLines(home, 'flood').filter((l) => l.event === 'desktop.view_closed').length >= 3, 10_000),
        'the three flooded views closed');
      const codes = [];
      for (const s of [still, ...slow]) {
        const end = await drainForClose(s);
        assert.ok(end.ended, 'the slow connection ends');
        assert.ok(end.code === null || end.code === 1008, `close code ${end.code}`);
        codes.push(end.code ?? end.error ?? 'end');
      }
      console.log(`# the flooded viewers' ends: ${JSON.stringify(codes)}`);
      // The flooding program saw its connections end (the relay closed the socket).
      const log = await call('terminal_execute', { instance_id: 'flood', command: 'cat /workspace/flood.log' });
      assert.ok((textOf(log).match(/connection \d+ ended after/g) || []).length >= 3, textOf(log));
      console.log(`# ${textOf(log).trim().split('\n').join('\n# ')}`);

      // The calm viewer was never disturbed.
      assert.equal(calm.closed, null);
      console.log(`# calm viewer's frames during the flood: ${times.calm.length}, worst ${worst.calm} ms`);
    } finally {
      clearInterval(sampler);
    }
    assert.ok(peak - baseline <= RSS_BOUND,
      `the server grew by ${((peak - baseline) / 2 ** 20).toFixed(1)} MiB (bound ${(RSS_BOUND / 2 ** 20).toFixed(1)} MiB)`);

    // Round after round of abandoned viewers does not ratchet the memory up.
    for (let round = 0; round < 4; round++) {
      const viewers = [];
      for (let i = 0; i < HOSTILE_VIEWERS; i++) viewers.push(await rawViewer(server, '/desktop/flood/vnc'));
      const closedBefore = auditLines(home, 'flood').filter((l) => l.event === 'desktop.view_closed').length;
      assert.ok(await until(() => auditLines(home, 'flood').filter((l) => l.event === 'desktop.view_closed').length >= closedBefore + HOSTILE_VIEWERS, 15_000),
        `round ${round}: the viewers were cut`);
      for (const v of viewers) v.sock.destroy();
      peak = Math.max(peak, rssBytes(pid));
    }
    const last = rssBytes(pid);
    console.log(`# server RSS after 4 more rounds: ${(last / 2 ** 20).toFixed(1)} MiB, peak ${(peak / 2 ** 20).toFixed(1)} MiB`);
    assert.ok(peak - baseline <= RSS_BOUND, `peak over all rounds +${((peak - baseline) / 2 ** 20).toFixed(1)} MiB`);
    assert.ok((await frameTime(calm, bpp)) < 2000, 'the calm viewer still answers');
    calm.ws.close();
  });

  test('garbage from the browser closes only its own connection', async () => {
    const good = openWs(server, '/desktop/calm/vnc');
    await good.opened;
    const { bpp } = await handshake(good);

    // Not RFB at all: an HTTP request where the version should be.
    const bad = openWs(server, '/desktop/calm/vnc');
    await bad.opened;
    await take(bad, 12);
    bad.ws.send(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    assert.ok(await until(() => bad.closed, 10_000), 'the connection that sent garbage is closed');

    // After a good handshake, a message type that does not exist.
    const bad2 = openWs(server, '/desktop/calm/vnc');
    await bad2.opened;
    await handshake(bad2);
    bad2.ws.send(Buffer.from([0xc8, 1, 2, 3, 4, 5, 6, 7, 8, 9]));
    assert.ok(await until(() => bad2.closed, 10_000), 'the connection that sent an unknown message is closed');
    assert.match(bad2.closed.reason, /VNC client/);

    // The other viewer goes on, and the server answers.
    assert.equal(good.closed, null);
    assert.ok((await frameTime(good, bpp)) < 2000);
    const h = await fetch(`http://127.0.0.1:${server.port}/healthz`);
    assert.equal(h.status, 200);
    good.ws.close();
  });
});
