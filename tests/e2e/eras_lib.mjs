// Helpers of the protocol-era tests (eras.test.mjs) and bench (bench_eras.mjs): MCP 2026-07-28
// ("modern": no initialize, a _meta envelope on every request) beside 2025-11-25 ("legacy") on the
// same endpoints. Clients of @modelcontextprotocol/client 2.4.0 (both eras) over stdio and
// streamable HTTP, and raw modern JSON-RPC over fetch: the envelope and the Mcp-* headers.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

import { NSHPC_BINARY } from './home.mjs';
import { sleep } from './lib.mjs';
import { sseReader } from './http_lib.mjs';

export const MODERN = '2026-07-28';
export const LEGACY = '2025-11-25';
export const META_VERSION = 'io.modelcontextprotocol/protocolVersion';
export const META_CAPABILITIES = 'io.modelcontextprotocol/clientCapabilities';
export const META_CLIENT_INFO = 'io.modelcontextprotocol/clientInfo';

// The v2 client's versionNegotiation for each mode the tests use: 'legacy' is the option left out
// (the 2025 handshake, byte for byte), 'auto' probes with server/discover, 'pin' is 2026-07-28 or
// nothing.
export const MODES = {
  legacy: undefined,
  auto: { mode: 'auto' },
  pin: { mode: { pin: MODERN } },
};
export const expectedEra = (mode) => (mode === 'legacy' ? 'legacy' : 'modern');

function v2Client(mode, name) {
  const negotiation = MODES[mode];
  if (!(mode in MODES)) throw new Error(`unknown mode ${mode}`);
  return new Client({ name, version: '2.4.0' }, negotiation ? { versionNegotiation: negotiation } : {});
}

function handle(client, transport, stderrBox) {
  return {
    client,
    transport,
    stderr: () => stderrBox?.text ?? '',
    async close() {
      try {
        await client.close();
      } catch {
        // already closed
      }
    },
  };
}

// A v2 client in `mode` over stdio to `command args`. Returns {client, transport, stderr(), close()}.
export async function connectV2Stdio({ command, args, env, mode, name = 'nshpc-e2e-v2' }) {
  const transport = new StdioClientTransport({ command, args, env, stderr: 'pipe' });
  const box = { text: '' };
  transport.stderr?.on('data', (c) => {
    box.text += c.toString();
    if (box.text.length > 200_000) box.text = box.text.slice(-100_000);
  });
  const client = v2Client(mode, name);
  try {
    await client.connect(transport);
  } catch (err) {
    await sleep(100);
    throw new Error(`v2 client (${mode}) could not connect over stdio to ${command}: ${err.message}\nstderr:\n${box.text.slice(-3000)}`);
  }
  return handle(client, transport, box);
}

// A v2 client in `mode` over streamable HTTP to `url` with the bearer token.
export async function connectV2Http(url, { token, mode, name = 'nshpc-e2e-v2-http' }) {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: token ? { Authorization: `Bearer ${token}` } : {} },
  });
  const client = v2Client(mode, name);
  try {
    await client.connect(transport);
  } catch (err) {
    throw new Error(`v2 client (${mode}) could not connect over HTTP to ${url}: ${err.message}`);
  }
  return handle(client, transport);
}

// The modern request envelope (_meta), with `extra` keys merged in.
export function envelope(extra = {}, { version = MODERN, capabilities = {} } = {}) {
  const meta = { [META_VERSION]: version, [META_CLIENT_INFO]: { name: 'nshpc-e2e-raw-modern', version: '1.0.0' } };
  if (capabilities !== null) meta[META_CAPABILITIES] = capabilities;
  return { ...meta, ...extra };
}

// The Mcp-Name header's source for a method (params.name or params.uri), per the 2026-07-28
// streamable HTTP transport.
function nameOf(method, params) {
  if (method === 'tools/call' || method === 'prompts/get') return params?.name;
  if (method === 'resources/read') return params?.uri;
  return undefined;
}

// One raw modern POST: the body `message` (an object, or text), the standard headers derived from
// it (MCP-Protocol-Version, Mcp-Method, Mcp-Name) unless `headers` overrides them (a null value
// drops a header). Resolves {status, headers, json (the JSON-RPC answer, from JSON or the SSE
// stream), text}.
export async function modernPost(url, token, message, { headers = {}, fetch = globalThis.fetch, signal } = {}) {
  const method = message.method;
  const version = message.params?._meta?.[META_VERSION] ?? MODERN;
  const h = {
    'Content-Type': 'application/json',
    Accept: 'application/json, text/event-stream',
    Authorization: `Bearer ${token}`,
    'MCP-Protocol-Version': version,
    'Mcp-Method': method,
  };
  const name = nameOf(method, message.params);
  if (name !== undefined) h['Mcp-Name'] = name;
  for (const [k, v] of Object.entries(headers)) {
    const existing = Object.keys(h).find((x) => x.toLowerCase() === k.toLowerCase());
    if (existing) delete h[existing];
    if (v !== null) h[k] = v;
  }
  const res = await fetch(url, { method: 'POST', headers: h, body: JSON.stringify(message), signal });
  const type = res.headers.get('content-type') || '';
  if (type.startsWith('text/event-stream')) {
    const sse = sseReader(res);
    for (let ev = await sse.next(); ev; ev = await sse.next()) {
      if (ev.json && ev.json.id === message.id && ('result' in ev.json || 'error' in ev.json)) {
        await sse.cancel();
        return { status: res.status, headers: res.headers, json: ev.json, text: ev.data };
      }
    }
    return { status: res.status, headers: res.headers, json: undefined, text: '' };
  }
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, json, text };
}

let rawId = 1;
// A modern request (envelope in _meta) as a message object.
export function modernRequest(method, params = {}, meta = {}, opts = {}) {
  return { jsonrpc: '2.0', id: rawId++, method, params: { ...params, _meta: envelope(meta, opts) } };
}

// VmRSS of `pid` in KiB (from /proc/<pid>/status).
export function rssKiB(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/^VmRSS:\s+(\d+)\s+kB/m);
  return m ? Number(m[1]) : NaN;
}

// make test's image cache ('test' built by scripts/test-image.sh): computers run on it.
export const IMAGE_CACHE =
  process.getuid() === 0
    ? '/var/cache/ns-hpc-test'
    : path.join(process.env.XDG_CACHE_HOME || path.join(process.env.HOME || '/root', '.cache'), 'ns-hpc-test');
export const IMAGES_DIR = path.join(IMAGE_CACHE, 'images');
export const haveTestImage = () => fs.existsSync(path.join(IMAGES_DIR, 'test'));

// Points a home made by makeHome/makeHttpHome at the test image cache, computers on image 'test'.
export function useTestImage(home) {
  const text = fs.readFileSync(home.config, 'utf8').replace('default_image = ""', 'default_image = "test"');
  fs.writeFileSync(home.config, text.replace('[namespace]\n', `[namespace]\nimages_dir = ${JSON.stringify(IMAGES_DIR)}\n`));
  return home;
}

// `ns-hpc --config <home> computer --transport http --port 0 ...extra` with COMPUTER_ID=`id`;
// resolves {proc, url, port, stderr(), stop()} once it listens.
export async function startComputerHttp(home, id, env, extra = []) {
  const proc = spawn(NSHPC_BINARY, ['--config', home.config, 'computer', '--transport', 'http', '--port', '0', ...extra], {
    env: { ...env, COMPUTER_ID: id },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let text = '';
  proc.stderr.on('data', (c) => {
    text += c.toString();
    if (text.length > 400_000) text = text.slice(-200_000);
  });
  const started = Date.now();
  while (!/listening on (\S+)/.test(text)) {
    if (proc.exitCode !== null || Date.now() - started > 15_000) {
      proc.kill('SIGKILL');
      throw new Error(`ns-hpc computer over HTTP did not start:\n${text.slice(-3000)}`);
    }
    await sleep(50);
  }
  const url = text.match(/listening on (\S+)/)[1];
  return {
    proc,
    url,
    port: Number(new URL(url).port),
    stderr: () => text,
    async stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return;
      proc.kill('SIGTERM');
      await new Promise((resolve) => (proc.exitCode !== null ? resolve() : proc.on('exit', resolve)));
    },
  };
}
