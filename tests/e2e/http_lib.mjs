// Helpers of the HTTP end-to-end tests: start `ns-hpc run` with an HTTP transport in a temporary
// home (URL, token and client configuration read from its stderr), stop it, SDK clients over
// streamable HTTP / legacy SSE (TCP or a Unix socket), raw HTTP requests (node:http, which may
// set any Host header) and a small SSE reader for raw fetch streams.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { SSEClientTransport } from '@modelcontextprotocol/sdk/client/sse.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Agent, fetch as undiciFetch } from 'undici';

import { NSHPC_BINARY, childEnv } from './home.mjs';
import { sleep } from './lib.mjs';

export { makeHttpHome } from './home.mjs';

export const PROTOCOL_VERSION = '2025-11-25';

// Starts `ns-hpc --config <home> run --transport <transport> [--port 0] ...args` and waits for
// the "listening on" line (and the client configuration line after it). Returns a server handle:
// {proc, url, port, origin, token, tokenFile, clientConfig, stderr(), exited, stop(), kill()}.
// With `expectExit`, resolves with {code, signal, stderr} once the process exits instead.
export async function startServer(
  home,
  { transport = 'streamable-http', args = [], env = {}, port = true, timeout = 15_000, expectExit = false } = {},
) {
  const argv = ['--config', home.config, 'run', '--transport', transport];
  if (port && !args.includes('--uds') && !args.includes('--port')) argv.push('--port', '0');
  argv.push(...args);
  const proc = spawn(NSHPC_BINARY, argv, { env: { ...childEnv(home), ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let text = '';
  let stdout = '';
  proc.stdout.on('data', (c) => {
    stdout += c.toString();
  });
  const waiters = new Set();
  proc.stderr.on('data', (c) => {
    text += c.toString();
    if (text.length > 400_000) text = text.slice(-200_000);
    for (const w of [...waiters]) w();
  });
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => resolve({ code, signal }));
    proc.on('error', (err) => resolve({ code: null, signal: null, error: err.message }));
  });
  exited.then(() => {
    for (const w of [...waiters]) w();
  });
  if (expectExit) {
    let timer;
    const t = new Promise((resolve) => {
      timer = setTimeout(() => resolve(null), timeout);
    });
    const r = await Promise.race([exited, t]);
    clearTimeout(timer);
    if (!r) {
      proc.kill('SIGKILL');
      await exited;
      return { code: null, signal: 'timeout', stderr: text, stdout };
    }
    await sleep(50); // the last stderr bytes
    return { ...r, stderr: text, stdout };
  }

  const started = await new Promise((resolve) => {
    let exitedEarly = false;
    const check = () => {
      const m = text.match(/ns-hpc: MCP \(([^)]+)\) listening on (\S+)\n[\s\S]*?ns-hpc: MCP client configuration:\n(\{.*\})\n/);
      if (m) {
        waiters.delete(check);
        clearTimeout(timer);
        resolve({ kind: m[1], url: m[2], clientConfig: JSON.parse(m[3]) });
      } else if (exitedEarly || proc.exitCode !== null || proc.signalCode !== null) {
        waiters.delete(check);
        clearTimeout(timer);
        resolve(null);
      }
    };
    const timer = setTimeout(() => {
      waiters.delete(check);
      resolve(null);
    }, timeout);
    waiters.add(check);
    exited.then(() => {
      exitedEarly = true;
      check();
    });
    check();
  });
  if (!started) {
    proc.kill('SIGKILL');
    await exited;
    throw new Error(`ns-hpc run ${argv.join(' ')} did not start listening; stderr:\n${text.slice(-4000)}`);
  }
  const tokenLine = text.match(/ns-hpc: bearer token \(kept in (.+?)\): (\S+)\n/);
  const server = {
    proc,
    kind: started.kind,
    url: started.url,
    clientConfig: started.clientConfig,
    token: tokenLine ? tokenLine[2] : env.NS_HPC_AUTH_TOKEN,
    tokenFile: tokenLine ? tokenLine[1] : undefined,
    exited,
    stderr: () => text,
    stdout: () => stdout,
    async waitExit(ms = 10_000) {
      let timer;
      const t = new Promise((resolve) => {
        timer = setTimeout(() => resolve(null), ms);
      });
      const r = await Promise.race([exited, t]);
      clearTimeout(timer);
      return r;
    },
    // SIGTERM, then SIGKILL if it is still there after `ms`. Returns the exit {code, signal}.
    async stop(ms = 10_000) {
      if (proc.exitCode !== null || proc.signalCode !== null) return exited;
      proc.kill('SIGTERM');
      const r = await server.waitExit(ms);
      if (r) return r;
      proc.kill('SIGKILL');
      return exited;
    },
    async kill() {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      return exited;
    },
  };
  if (server.url.startsWith('http')) {
    const u = new URL(server.url);
    server.port = Number(u.port);
    server.origin = `${u.protocol}//${u.host}`;
    server.path = u.pathname;
  } else {
    const m = server.url.match(/^unix:(.+):(\/[^:]*)$/);
    server.socketPath = m && m[1];
    server.path = m && m[2];
  }
  return server;
}

// A fetch that goes over the Unix socket `socketPath` (any http://localhost/... URL).
export function unixFetch(socketPath) {
  const agent = new Agent({ connect: { socketPath } });
  const f = (url, init = {}) => undiciFetch(url, { ...init, dispatcher: agent });
  f.agent = agent;
  return f;
}

// An SDK client connected to `url` over streamable HTTP (kind 'streamable') or the legacy
// HTTP+SSE transport (kind 'sse'). Every message the client receives is also kept in `received`.
export async function connectHttp(url, { token, kind = 'streamable', fetch, name = 'nshpc-e2e-http' } = {}) {
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  let transport;
  if (kind === 'sse') {
    const baseFetch = fetch ?? globalThis.fetch;
    transport = new SSEClientTransport(new URL(url), {
      requestInit: { headers },
      // The EventSource's own fetch, with the token too.
      eventSourceInit: {
        fetch: (u, init) => {
          const h = new Headers(init?.headers);
          for (const [k, v] of Object.entries(headers)) h.set(k, v);
          return baseFetch(u, { ...init, headers: h });
        },
      },
      fetch,
    });
  } else {
    transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers }, fetch });
  }
  const client = new Client({ name, version: '1.0.0' }, { capabilities: {} });
  await client.connect(transport);
  const received = [];
  const original = transport.onmessage;
  transport.onmessage = (message, extra) => {
    received.push(message);
    original?.(message, extra);
  };
  return {
    client,
    transport,
    received,
    sessionId: () => transport.sessionId,
    async close() {
      try {
        if (kind !== 'sse' && transport.sessionId) await transport.terminateSession();
      } catch {
        // the server may be gone
      }
      try {
        await client.close();
      } catch {
        // already closed
      }
    },
  };
}

// One raw HTTP request with node:http (any header, Host included). `socketPath` for a Unix
// socket, else `port` on 127.0.0.1. With `headersOnly`, resolves once the status line and
// headers of a 2xx answer are in and closes the connection (for SSE streams). With `chunked`, the body is sent
// with Transfer-Encoding: chunked (no Content-Length). Resolves {status, headers, body, json}.
export function rawRequest({
  port,
  socketPath,
  method = 'GET',
  path = '/',
  headers = {},
  body,
  headersOnly = false,
  chunked = false,
  timeout = 10_000,
}) {
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port, socketPath, method, path, headers, agent: false, setHost: !('Host' in headers || 'host' in headers) },
      (res) => {
        if (headersOnly && res.statusCode >= 200 && res.statusCode < 300) {
          clearTimeout(timer);
          resolve({ status: res.statusCode, headers: res.headers, body: '', json: undefined });
          res.destroy();
          req.destroy();
          return;
        }
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (c) => {
          data += c;
        });
        res.on('end', () => {
          clearTimeout(timer);
          let parsed;
          try {
            parsed = JSON.parse(data);
          } catch {
            parsed = undefined;
          }
          resolve({ status: res.statusCode, headers: res.headers, body: data, json: parsed });
        });
        res.on('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
      },
    );
    const timer = setTimeout(() => {
      req.destroy(new Error(`${method} ${path}: no answer within ${timeout} ms`));
    }, timeout);
    req.on('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    if (body !== undefined) {
      if (chunked) {
        // Two writes without a Content-Length: node sends it chunked.
        const half = Math.floor(body.length / 2);
        req.write(body.slice(0, half));
        req.write(body.slice(half));
      } else {
        req.setHeader('Content-Length', Buffer.byteLength(body));
        req.write(body);
      }
    }
    req.end();
  });
}

// Reads SSE events from a fetch Response body: `next()` resolves the next event
// {id, event, data, json, raw} or null at the end of the stream.
export function sseReader(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let done = false;
  const events = [];
  async function fill() {
    while (!done) {
      const sep = buffer.search(/\r?\n\r?\n/);
      if (sep >= 0) {
        const block = buffer.slice(0, sep);
        buffer = buffer.slice(sep).replace(/^\r?\n\r?\n/, '');
        const ev = { id: undefined, event: 'message', data: '', raw: block };
        const dataLines = [];
        let hasField = false;
        for (const line of block.split(/\r?\n/)) {
          if (line.startsWith(':')) continue;
          const colon = line.indexOf(':');
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? '' : line.slice(colon + 1);
          if (value.startsWith(' ')) value = value.slice(1);
          hasField = true;
          if (field === 'id') ev.id = value;
          else if (field === 'event') ev.event = value;
          else if (field === 'data') dataLines.push(value);
          else if (field === 'retry') ev.retry = Number(value);
        }
        if (!hasField) continue; // a comment (keepalive)
        ev.data = dataLines.join('\n');
        try {
          ev.json = ev.data ? JSON.parse(ev.data) : undefined;
        } catch {
          ev.json = undefined;
        }
        return ev;
      }
      const { value, done: end } = await reader.read();
      if (end) {
        done = true;
        return null;
      }
      buffer += decoder.decode(value, { stream: true });
    }
    return null;
  }
  return {
    events,
    async next() {
      const ev = await fill();
      if (ev) events.push(ev);
      return ev;
    },
    async cancel() {
      done = true;
      try {
        await reader.cancel();
      } catch {
        // already gone
      }
    },
  };
}

// A raw streamable-HTTP MCP session over fetch: initialize, then post messages.
export class RawSession {
  constructor(url, token, { fetch = globalThis.fetch } = {}) {
    this.url = url;
    this.token = token;
    this.fetch = fetch;
    this.sessionId = undefined;
    this.nextId = 1;
  }

  headers(extra = {}) {
    const h = {
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
      Authorization: `Bearer ${this.token}`,
    };
    if (this.sessionId) {
      h['Mcp-Session-Id'] = this.sessionId;
      h['MCP-Protocol-Version'] = PROTOCOL_VERSION;
    }
    return { ...h, ...extra };
  }

  post(message, { headers = {}, signal } = {}) {
    return this.fetch(this.url, {
      method: 'POST',
      headers: this.headers(headers),
      body: typeof message === 'string' ? message : JSON.stringify(message),
      signal,
    });
  }

  // Posts a request and returns its response message (from JSON or the SSE stream).
  async request(method, params, { headers } = {}) {
    const id = this.nextId++;
    const res = await this.post({ jsonrpc: '2.0', id, method, params }, { headers });
    if (!res.ok) throw new Error(`${method}: HTTP ${res.status}: ${await res.text()}`);
    const type = res.headers.get('content-type') || '';
    if (type.startsWith('application/json')) return res.json();
    const sse = sseReader(res);
    for (;;) {
      const ev = await sse.next();
      if (!ev) throw new Error(`${method}: the stream ended without a response`);
      if (ev.json && ev.json.id === id && ('result' in ev.json || 'error' in ev.json)) {
        await sse.cancel();
        return ev.json;
      }
    }
  }

  async initialize() {
    const res = await this.post({
      jsonrpc: '2.0',
      id: this.nextId++,
      method: 'initialize',
      params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'nshpc-e2e-raw-http', version: '1.0.0' } },
    });
    if (res.status !== 200) throw new Error(`initialize: HTTP ${res.status}: ${await res.text()}`);
    this.sessionId = res.headers.get('mcp-session-id');
    if (!this.sessionId) throw new Error('initialize: no Mcp-Session-Id header');
    const type = res.headers.get('content-type') || '';
    let body;
    if (type.startsWith('application/json')) body = await res.json();
    else {
      const sse = sseReader(res);
      for (let ev = await sse.next(); ev; ev = await sse.next()) if (ev.json && 'result' in ev.json) body = ev.json;
    }
    const ack = await this.post({ jsonrpc: '2.0', method: 'notifications/initialized' });
    if (ack.status !== 202) throw new Error(`notifications/initialized: HTTP ${ack.status}`);
    await ack.text();
    return body;
  }

  async callTool(name, args) {
    const msg = await this.request('tools/call', { name, arguments: args });
    if (msg.error) throw new Error(`${name}: ${JSON.stringify(msg.error)}`);
    return msg.result;
  }
}
