// End-to-end tests of the live views' WebSockets over `ns-hpc run --transport streamable-http`:
//   - /desktop/<id>/vnc: a raw RFB handshake through the authenticated relay to the x11vnc inside
//     the instance's sandbox (host root, [desktop] host_root); refused without the token, with a
//     foreign Origin, and for an instance whose desktop is off; view-only until the page asks for
//     control, which is audited, and input then audited in batches (counts, never content);
//   - /terminal/<id>: a shell in the sandbox as `instance enter` gives one: `echo hi` is echoed,
//     `stty size` follows a resize, the exit code comes back and the shell is gone afterwards.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { WebSocket } from 'undici';

import { connectHttp, makeHttpHome, rawRequest, startServer } from './http_lib.mjs';
import { hostHas, removeHome, textOf, until } from './lib.mjs';

const desktopSkip = ['Xvfb', 'xfwm4', 'x11vnc'].every(hostHas)
  ? false
  : 'the host has no Xvfb/Xfce/x11vnc (make deps installs the desktop group)';

// A WebSocket that collects what it receives: binary as one growing Buffer, text as messages.
function open(server, wsPath, { headers = {}, protocols } = {}) {
  const url = `ws://127.0.0.1:${server.port}${wsPath}`;
  const ws = new WebSocket(url, { headers: { Authorization: `Bearer ${server.token}`, ...headers }, protocols });
  ws.binaryType = 'arraybuffer';
  const state = { ws, bytes: Buffer.alloc(0), texts: [], closed: null, error: null };
  ws.addEventListener('message', (e) => {
    if (typeof e.data === 'string') state.texts.push(e.data);
    else state.bytes = Buffer.concat([state.bytes, Buffer.from(e.data)]);
  });
  ws.addEventListener('close', (e) => {
    state.closed = { code: e.code, reason: e.reason };
  });
  ws.addEventListener('error', (e) => {
    state.error = e.message || 'error';
  });
  state.opened = new Promise((resolve, reject) => {
    ws.addEventListener('open', resolve);
    ws.addEventListener('close', () => reject(new Error(`closed before open: ${state.error}`)));
  });
  return state;
}

// Takes `n` bytes once they are there.
async function take(state, n, timeout = 10_000) {
  assert.ok(await until(() => state.bytes.length >= n || state.closed, timeout), `waited for ${n} bytes`);
  assert.ok(state.bytes.length >= n, `the connection closed first: ${JSON.stringify(state.closed)}`);
  const out = state.bytes.subarray(0, n);
  state.bytes = state.bytes.subarray(n);
  return out;
}

// The upgrade request as a plain HTTP request: its status when refused.
function upgrade(server, wsPath, headers) {
  return rawRequest({
    port: server.port,
    path: wsPath,
    headers: {
      Connection: 'Upgrade', Upgrade: 'websocket', 'Sec-WebSocket-Version': '13',
      'Sec-WebSocket-Key': 'dGhlIHNhbXBsZSBub25jZQ==', ...headers,
    },
  });
}

function auditLines(home, id) {
  const file = path.join(home.instancesDir, id, 'audit.log');
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
}

describe('live views over WebSockets', () => {
  let home;
  let server;
  let mcp;
  const call = async (name, args) => {
    const r = await mcp.client.callTool({ name, arguments: args });
    assert.ok(!r.isError, `${name}: ${textOf(r)}`);
    return r;
  };

  before(async () => {
    home = makeHttpHome('live', '[desktop]\nhost_root = true\n');
    server = await startServer(home);
    mcp = await connectHttp(server.url, { token: server.token });
    await call('create_instance', { instance_id: 'live', persistent: true, network: 'off' });
    await call('create_instance', { instance_id: 'dark', persistent: true, network: 'off' });
  });
  after(async () => {
    if (mcp) {
      for (const id of ['live', 'dark']) await mcp.client.callTool({ name: 'stop_instance', arguments: { instance_id: id } }).catch(() => {});
      await mcp.close();
    }
    if (server) await server.stop();
    removeHome(home);
  });

  test('the desktop: an RFB handshake through the relay, view-only until control is asked for', { skip: desktopSkip }, async () => {
    await call('set_desktop_environment', { instance_id: 'live', enabled: true });
    const s = open(server, '/desktop/live/vnc', { protocols: ['binary'] });
    await s.opened;
    assert.equal(s.ws.protocol, 'binary');
    assert.equal((await take(s, 12)).toString(), 'RFB 003.008\n');
    s.ws.send(Buffer.from('RFB 003.008\n'));
    const count = (await take(s, 1))[0];
    const types = [...(await take(s, count))];
    assert.ok(types.includes(1), `security types offered: ${types}`);
    s.ws.send(Buffer.from([1]));
    assert.equal((await take(s, 4)).readUInt32BE(0), 0, 'SecurityResult OK');
    s.ws.send(Buffer.from([1]));  // ClientInit, shared
    const init = await take(s, 24);
    assert.deepEqual([init.readUInt16BE(0), init.readUInt16BE(2)], [1280, 800]);
    await take(s, init.readUInt32BE(20));  // the desktop's name

    // View-only: a click is dropped, and nothing is audited as input.
    const click = Buffer.from([5, 1, 0, 100, 0, 100, 5, 0, 0, 100, 0, 100]);
    s.ws.send(click);
    // A frame request is passed: the relay answers with pixels.
    s.ws.send(Buffer.from([3, 0, 0, 0, 0, 0, 5, 0, 3, 32]));
    assert.ok(await until(() => s.bytes.length > 4, 10_000), 'a framebuffer update');
    // Control asked for: audited; a click then passes and is counted.
    s.ws.send(JSON.stringify({ control: true }));
    assert.ok(await until(() => s.texts.includes('{"control":true}'), 5000), `texts: ${s.texts}`);
    s.ws.send(click);
    s.ws.close();
    assert.ok(await until(() => s.closed, 5000));
    let lines = [];
    assert.ok(await until(() => {
      lines = auditLines(home, 'live');
      return lines.some((l) => l.event === 'desktop.view_closed');
    }, 10_000), 'desktop.view_closed in the audit');
    const control = lines.filter((l) => l.event === 'desktop.control');
    assert.equal(control.length, 1);
    assert.equal(control[0].enabled, true);
    assert.match(control[0].actor, /^dashboard \(uid \d+\)$/);
    const input = lines.filter((l) => l.event === 'desktop.input');
    assert.equal(input.reduce((n, l) => n + l.pointer, 0), 2, JSON.stringify(input));  // the second click only
    assert.equal(input.reduce((n, l) => n + l.keys, 0), 0);
  });

  test('the desktop refuses: no token, a foreign Origin, a desktop that is off, a path that is no instance', async () => {
    const ok = { 'Sec-WebSocket-Protocol': 'binary' };
    assert.equal((await upgrade(server, '/desktop/live/vnc', ok)).status, 401);
    const foreign = await upgrade(server, '/desktop/live/vnc', { ...ok, Authorization: `Bearer ${server.token}`, Origin: 'https://evil.example' });
    assert.equal(foreign.status, 403);
    const off = await upgrade(server, '/desktop/dark/vnc', { ...ok, Authorization: `Bearer ${server.token}` });
    assert.equal(off.status, 409, off.body);
    assert.match(off.json.error, /desktop/i);
    const none = await upgrade(server, '/desktop/no-such/vnc', { Authorization: `Bearer ${server.token}` });
    assert.equal(none.status, 404);
    const plain = await rawRequest({ port: server.port, path: '/desktop/live/vnc', headers: { Authorization: `Bearer ${server.token}` } });
    assert.equal(plain.status, 426);
  });

  test('the terminal: echo, resize, exit code, and nothing left running', async () => {
    const t = open(server, '/terminal/live?rows=30&cols=100');
    await t.opened;
    const seen = () => t.bytes.toString('utf8');
    t.ws.send(Buffer.from('echo h""i; stty size\r'));
    assert.ok(await until(() => /\rhi\r\n30 100\r\n/.test(seen()), 10_000), `output: ${JSON.stringify(seen())}`);
    t.ws.send(JSON.stringify({ resize: [40, 120] }));
    t.ws.send(Buffer.from('stty size; echo marker-$((6*7)) > /workspace/term.txt; exit 3\r'));
    assert.ok(await until(() => t.closed, 10_000), `output: ${JSON.stringify(seen())}`);
    assert.match(seen(), /[\r\n]40 120\r\n/);
    assert.deepEqual(t.texts.map((m) => JSON.parse(m)), [{ exit: 3 }]);
    const file = await call('read_file', { instance_id: 'live', path: '/workspace/term.txt' });
    assert.match(textOf(file), /marker-42/);
    const enter = auditLines(home, 'live').filter((l) => l.event === 'sandbox.enter');
    assert.ok(enter.length >= 1, 'sandbox.enter in the audit');
    assert.match(enter.at(-1).actor, /^dashboard \(uid \d+\)$/);
  });

  test('a terminal of an instance that is not persistent leaves nothing running when it ends', async () => {
    await call('create_instance', { instance_id: 'brief', network: 'off' });
    const t = open(server, '/terminal/brief');
    await t.opened;
    t.ws.send(Buffer.from('sleep 3131 & echo started-$((2*3))\r'));
    assert.ok(await until(() => t.bytes.toString().includes('started-6'), 10_000), t.bytes.toString());
    const running = () => {
      try {
        return execFileSync('pgrep', ['-f', 'sleep 313[1]'], { encoding: 'utf8' }).trim();
      } catch {
        return '';  // pgrep exits 1 when nothing matches
      }
    };
    assert.notEqual(running(), '', 'the background sleep runs while the terminal is open');
    t.ws.close();  // the browser went: its sandbox ends, background processes included
    assert.ok(await until(() => running() === '', 10_000), `left running: ${running()}`);
  });

  test('the terminal refuses without the token and for an unknown instance', async () => {
    assert.equal((await upgrade(server, '/terminal/live', {})).status, 401);
    assert.equal((await upgrade(server, '/terminal/no-such', { Authorization: `Bearer ${server.token}` })).status, 404);
  });
});
