// Shared helpers of the ns-hpc MCP end-to-end tests: binaries, temporary homes and configs,
// SDK clients over stdio, a raw line-oriented JSON-RPC child, JSON Schema checks.
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');

import { NSHPC_BINARY, childEnv, nshpcArgs } from './home.mjs';

export { NSHPC_BINARY, childEnv, makeHome, nshpcArgs, removeHome } from './home.mjs';
export const NSHPC_FIXTURE =
  process.env.NSHPC_FIXTURE || path.join(repo, 'build', 'tests', 'nshpc_mcp_fixture');

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Collects a child's stderr (kept small) so failures can show it.
function collectStderr(stream) {
  const box = { text: '' };
  if (stream) {
    stream.on('data', (chunk) => {
      box.text += chunk.toString();
      if (box.text.length > 200_000) box.text = box.text.slice(-100_000);
    });
  }
  return box;
}

// An SDK client connected over stdio to `command args`. Returns {client, transport, stderr,
// negotiated(), close()}.
export async function connectClient({ command, args, env, name = 'nshpc-e2e' }) {
  const transport = new StdioClientTransport({ command, args, env, stderr: 'pipe' });
  const stderr = collectStderr(transport.stderr);
  let negotiated;
  // StdioClientTransport has no setProtocolVersion; the client calls it when present.
  transport.setProtocolVersion = (v) => {
    negotiated = v;
  };
  const client = new Client({ name, version: '1.0.0' }, { capabilities: {} });
  try {
    await client.connect(transport);
  } catch (err) {
    await sleep(100); // let the child's last words arrive
    throw new Error(`could not connect to ${command}: ${err.message}\nserver stderr:\n${stderr.text.slice(-4000)}`);
  }
  return {
    client,
    transport,
    stderr,
    negotiated: () => negotiated,
    async close() {
      try {
        await client.close();
      } catch {
        // already closed
      }
    },
  };
}

// An SDK client connected over stdio to `ns-hpc run` in `home` (see connectClient).
export function connectNshpc(home, { name } = {}) {
  return connectClient({ command: NSHPC_BINARY, args: nshpcArgs(home), env: childEnv(home), name });
}

// Creates the instance with create_instance (`args`: its arguments) and throws with the tool's
// text when the call is an error.
export async function createInstance(client, args) {
  const created = await client.callTool({ name: 'create_instance', arguments: args });
  if (created.isError) throw new Error(`create_instance ${JSON.stringify(args)} failed: ${textOf(created)}`);
  return created;
}

export function ajv() {
  const a = new Ajv({ strict: false, allErrors: true });
  addFormats(a);
  return a;
}

// Compiles `schema` (throws when it is not valid JSON Schema) and returns a validator that
// returns the error text or null.
export function compileSchema(a, schema) {
  const validate = a.compile(schema);
  return (data) => (validate(data) ? null : a.errorsText(validate.errors));
}

export function textOf(result) {
  return (result.content || [])
    .filter((c) => c.type === 'text')
    .map((c) => c.text)
    .join('\n');
}

// A server child spoken to in raw newline-delimited JSON-RPC.
export class RawChild {
  constructor(command, args, env) {
    this.proc = spawn(command, args, { env, stdio: ['pipe', 'pipe', 'pipe'] });
    this.lines = []; // every stdout line, raw
    this.messages = []; // parsed stdout lines (null where a line did not parse)
    this.waiters = [];
    this.buffer = '';
    this.stderr = collectStderr(this.proc.stderr);
    this.exited = new Promise((resolve) => {
      this.proc.on('exit', (code, signal) => resolve({ code, signal }));
      this.proc.on('error', (err) => {
        this.spawnError = err;
        resolve({ code: null, signal: null, error: err.message });
      });
    });
    this.proc.stdin.on('error', () => {}); // EPIPE after the server exits
    this.proc.stdout.on('data', (chunk) => {
      this.buffer += chunk.toString('utf8');
      let nl;
      while ((nl = this.buffer.indexOf('\n')) >= 0) {
        const line = this.buffer.slice(0, nl);
        this.buffer = this.buffer.slice(nl + 1);
        this.lines.push(line);
        let msg = null;
        try {
          msg = JSON.parse(line);
        } catch {
          msg = null;
        }
        this.messages.push(msg);
        this.wake();
      }
    });
    this.nextId = 1000;
  }

  wake() {
    for (const w of [...this.waiters]) {
      const found = this.messages.slice(w.from).find((m) => m && w.pred(m));
      if (found) {
        this.waiters.splice(this.waiters.indexOf(w), 1);
        clearTimeout(w.timer);
        w.resolve(found);
      }
    }
  }

  // Waits for a message (after the `from`-th) that satisfies `pred`.
  waitFor(pred, { timeout = 10_000, from = 0, what = 'a message' } = {}) {
    const found = this.messages.slice(from).find((m) => m && pred(m));
    if (found) return Promise.resolve(found);
    return new Promise((resolve, reject) => {
      const w = {
        pred,
        from,
        resolve,
        timer: setTimeout(() => {
          this.waiters.splice(this.waiters.indexOf(w), 1);
          reject(
            new Error(
              `timed out after ${timeout} ms waiting for ${what}; stdout so far:\n` +
                this.lines.slice(-20).join('\n') +
                `\nstderr tail:\n${this.stderr.text.slice(-2000)}`,
            ),
          );
        }, timeout),
      };
      this.waiters.push(w);
    });
  }

  writeRaw(data) {
    this.proc.stdin.write(data);
  }

  send(message) {
    this.writeRaw(JSON.stringify(message) + '\n');
  }

  // Sends a request and waits for the response with its id.
  async request(method, params, { id, timeout } = {}) {
    const rid = id ?? this.nextId++;
    const msg = { jsonrpc: '2.0', id: rid, method };
    if (params !== undefined) msg.params = params;
    const from = this.messages.length;
    this.send(msg);
    return this.waitFor((m) => m.id === rid && ('result' in m || 'error' in m), {
      timeout,
      from,
      what: `the response to ${method} (id ${JSON.stringify(rid)})`,
    });
  }

  // Sends raw text (a line) and waits for the next error response with id null.
  async rawExpectError(text, { timeout } = {}) {
    const from = this.messages.length;
    this.writeRaw(text);
    return this.waitFor((m) => 'error' in m && m.id === null, {
      timeout,
      from,
      what: 'an error response with id null',
    });
  }

  async initialize(protocolVersion = '2025-11-25') {
    const res = await this.request('initialize', {
      protocolVersion,
      capabilities: {},
      clientInfo: { name: 'nshpc-e2e-raw', version: '1.0.0' },
    });
    this.send({ jsonrpc: '2.0', method: 'notifications/initialized' });
    return res;
  }

  // Waits for the process to exit, up to `timeout` ms; returns {code, signal} or null.
  async waitExit(timeout = 5000) {
    let timer;
    const t = new Promise((resolve) => {
      timer = setTimeout(() => resolve(null), timeout);
    });
    const r = await Promise.race([this.exited, t]);
    clearTimeout(timer);
    return r;
  }

  async kill() {
    if (this.proc.exitCode === null && this.proc.signalCode === null) {
      this.proc.kill('SIGKILL');
      await this.waitExit(5000);
    }
  }
}

// Host processes whose command line contains `needle` (sandboxed processes are ordinary host
// processes in a private pid namespace).
export function hostProcessesWith(needle) {
  const found = [];
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    let cmdline;
    try {
      cmdline = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8');
    } catch {
      continue; // gone meanwhile
    }
    if (cmdline.includes(needle)) found.push(`${entry}: ${cmdline.split('\0').join(' ')}`);
  }
  return found;
}

// Polls until `cond()` (sync or async) is true or `timeout` ms pass; returns whether it became true.
// Whether `program` is on the PATH (a test that needs it skips, saying so, when it is not).
export function hostHas(program) {
  try {
    execFileSync('sh', ['-c', `command -v ${program}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

export async function until(cond, timeout = 5000) {
  const end = Date.now() + timeout;
  while (Date.now() < end) {
    if (await cond()) return true;
    await sleep(50);
  }
  return Boolean(await cond());
}

// A PNG of w x h pixels (RGB, or RGBA with `alpha`), made with zlib as a script would.
export function makePng(w, h, { alpha = false } = {}) {
  const crcTable = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc = (buf) => {
    let c = 0xffffffff;
    for (const b of buf) c = crcTable[(c ^ b) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const body = Buffer.concat([Buffer.from(type), data]);
    const c = Buffer.alloc(4);
    c.writeUInt32BE(crc(body));
    return Buffer.concat([len, body, c]);
  };
  const channels = alpha ? 4 : 3;
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0);
  ihdr.writeUInt32BE(h, 4);
  ihdr[8] = 8;
  ihdr[9] = alpha ? 6 : 2;
  const raw = Buffer.alloc((w * channels + 1) * h);
  for (let y = 0; y < h; y++)
    for (let x = 0; x < w; x++) {
      const o = y * (w * channels + 1) + 1 + x * channels;
      raw[o] = x % 256;
      raw[o + 1] = y % 256;
      raw[o + 2] = (x * y) % 256;
      if (alpha) raw[o + 3] = 128;
    }
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk('IHDR', ihdr),
    chunk('IDAT', zlib.deflateSync(raw)),
    chunk('IEND', Buffer.alloc(0)),
  ]);
}
