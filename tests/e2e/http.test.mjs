// End-to-end tests of `ns-hpc run` over HTTP with real clients: the MCP TypeScript SDK over
// streamable HTTP and the legacy HTTP+SSE transport (TCP and a Unix socket), two clients at once,
// resuming a dropped SSE stream with Last-Event-ID, idle sessions, DELETE, and SIGTERM while a
// job is being waited for.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { removeHome, sleep, textOf, until } from './lib.mjs';
import { PROTOCOL_VERSION, RawSession, makeHttpHome, connectHttp, rawRequest, sseReader, startServer, unixFetch } from './http_lib.mjs';

const CONTEXT = 'resource://ns-hpc/context/';
const INSTANCE = 'resource://ns-hpc/instances/';
const CUSTOM_DOC = 'e2e-http-notes.md';
const CUSTOM_TEXT = '# HTTP notes\n\nThe marker is heron-4410.\n';

async function ok(client, name, args, options) {
  const result = await client.callTool({ name, arguments: args }, undefined, options);
  assert.notEqual(result.isError, true, `${name} ${JSON.stringify(args)} failed: ${textOf(result)}`);
  return result;
}

async function createInstance(client, id, network = 'off') {
  const r = await ok(client, 'create_instance', { instance_id: id, network });
  assert.equal(r.structuredContent?.id ?? id, id);
}

async function echoHi(client, id) {
  const r = await ok(client, 'terminal_execute', { instance_id: id, command: 'echo hi' });
  assert.equal(r.structuredContent.stdout, 'hi\n');
  assert.equal(r.structuredContent.exit_code, 0);
}

// The basic calls every transport must carry: tools, a command, resources, a prompt, and a job
// whose progress notifications reach the caller.
async function basicCalls(client, instance) {
  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const n of ['create_instance', 'terminal_execute', 'submit_job', 'poll_job'])
    assert.ok(names.includes(n), `${n} listed: ${names}`);
  await createInstance(client, instance);
  await echoHi(client, instance);

  const { resources } = await client.listResources();
  const uris = resources.map((r) => r.uri);
  assert.ok(uris.includes(CONTEXT + 'ns-hpc.md'), `ns-hpc.md listed: ${uris}`);
  assert.ok(uris.includes(INSTANCE + instance), `the instance is listed: ${uris}`);
  const doc = await client.readResource({ uri: CONTEXT + 'ns-hpc.md' });
  assert.equal(doc.contents[0].mimeType, 'text/markdown');
  assert.match(doc.contents[0].text, /ns-hpc/);
  const inst = await client.readResource({ uri: INSTANCE + instance });
  assert.equal(inst.contents[0].mimeType, 'application/json');
  assert.equal(JSON.parse(inst.contents[0].text).id, instance);

  const { prompts } = await client.listPrompts();
  assert.ok(prompts.some((p) => p.name === 'work_in_sandbox'), `prompts: ${JSON.stringify(prompts)}`);
  const got = await client.getPrompt({ name: 'work_in_sandbox', arguments: { goal: 'count the stars', instance_id: instance } });
  assert.equal(got.messages[0].role, 'user');
  assert.match(got.messages[0].content.text, /count the stars/);
  assert.ok(got.messages[0].content.text.includes(instance));

  const seen = [];
  const job = (
    await ok(
      client,
      'submit_job',
      { instance_id: instance, command: 'sleep 2.5; echo slept', timeout: 20 },
      { onprogress: (p) => seen.push(p), timeout: 60_000 },
    )
  ).structuredContent;
  assert.equal(job.status, 'completed');
  assert.equal(job.stdout_tail, 'slept');
  assert.ok(seen.length >= 1, `progress notifications arrived: ${JSON.stringify(seen)}`);
  assert.equal(seen[0].total, 20);
  for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress, 'progress increases');
}

// One server for the tests that need no special flags.
let sharedHome;
let shared;

before(async () => {
  sharedHome = makeHttpHome('http');
  fs.writeFileSync(path.join(sharedHome.contextDir, CUSTOM_DOC), CUSTOM_TEXT);
  shared = await startServer(sharedHome);
});

after(async () => {
  if (shared) await shared.stop();
  removeHome(sharedHome);
});

describe('streamable HTTP with the SDK client', () => {
  let conn;

  before(async () => {
    conn = await connectHttp(shared.url, { token: shared.token });
  });

  after(async () => {
    if (conn) await conn.close();
  });

  test('start-up: URL, generated token and a ready-to-paste client configuration on stderr', async () => {
    assert.match(shared.url, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
    assert.equal(shared.kind, 'streamable HTTP');
    assert.match(shared.token, /^[0-9a-f]{64}$/);
    assert.equal(shared.tokenFile, path.join(sharedHome.stateDir, 'http-token'));
    assert.deepEqual(shared.clientConfig, {
      mcpServers: { 'ns-hpc': { type: 'http', url: shared.url, headers: { Authorization: `Bearer ${shared.token}` } } },
    });
    const health = await fetch(`${shared.origin}/healthz`);
    assert.equal(health.status, 200);
    assert.deepEqual(await health.json(), { status: 'ok' });
  });

  test('initialize: a session id, the server, its capabilities and the protocol version', async () => {
    assert.match(conn.sessionId(), /^[0-9a-f]{32}$/);
    assert.equal(conn.client.getServerVersion().name, 'ns-hpc');
    const caps = conn.client.getServerCapabilities();
    assert.ok(caps.tools && caps.resources && caps.prompts, JSON.stringify(caps));
    assert.equal(conn.transport.protocolVersion, PROTOCOL_VERSION);
  });

  test('tools, terminal_execute, resources, prompts, submit_job with progress', async () => {
    await basicCalls(conn.client, 'web');
    const custom = await conn.client.readResource({ uri: CONTEXT + CUSTOM_DOC });
    assert.equal(custom.contents[0].text, CUSTOM_TEXT);
  });

  test('a tool error comes back as a result with isError, the session goes on', async () => {
    const r = await conn.client.callTool({ name: 'terminal_execute', arguments: { instance_id: 'no-such-inst', command: 'true' } });
    assert.equal(r.isError, true);
    await conn.client.ping();
  });
});

describe('legacy HTTP+SSE with the SDK client', () => {
  test('/sse next to streamable HTTP: the same calls work', async () => {
    const conn = await connectHttp(`${shared.origin}/sse`, { token: shared.token, kind: 'sse' });
    try {
      await basicCalls(conn.client, 'legacy');
    } finally {
      await conn.close();
    }
  });

  test('--transport sse serves the legacy transport at /mcp', async () => {
    const h = makeHttpHome('http-sse-mode');
    const s = await startServer(h, { transport: 'sse' });
    try {
      assert.equal(s.kind, 'legacy HTTP+SSE');
      assert.match(s.url, /^http:\/\/127\.0\.0\.1:\d+\/mcp$/);
      assert.equal(s.clientConfig.mcpServers['ns-hpc'].type, 'sse');
      assert.equal(s.clientConfig.mcpServers['ns-hpc'].url, s.url);
      const conn = await connectHttp(s.url, { token: s.token, kind: 'sse' });
      try {
        const { tools } = await conn.client.listTools();
        assert.ok(tools.some((t) => t.name === 'terminal_execute'));
        await createInstance(conn.client, 'ssemode');
        await echoHi(conn.client, 'ssemode');
        const { prompts } = await conn.client.listPrompts();
        assert.ok(prompts.length >= 1);
      } finally {
        await conn.close();
      }
      // /mcp is the legacy GET endpoint here, not streamable HTTP.
      const post = await fetch(s.url, {
        method: 'POST',
        headers: { Authorization: `Bearer ${s.token}`, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
      });
      assert.equal(post.status, 405);
    } finally {
      await s.stop();
      removeHome(h);
    }
  });
});

describe('a Unix socket (--uds)', () => {
  let home;
  let server;
  let sock;

  before(async () => {
    home = makeHttpHome('http-uds');
    sock = path.join(home.root, 's.sock');
    server = await startServer(home, { args: ['--uds', sock] });
  });

  after(async () => {
    if (server) await server.stop();
    removeHome(home);
  });

  test('the socket is 0600 and the start-up lines name it', () => {
    const st = fs.statSync(sock);
    assert.ok(st.isSocket(), 'a socket');
    assert.equal(st.mode & 0o777, 0o600, `mode ${(st.mode & 0o777).toString(8)}`);
    assert.equal(server.url, `unix:${sock}:/mcp`);
    const entry = server.clientConfig.mcpServers['ns-hpc'];
    assert.equal(entry.socketPath, sock);
    assert.equal(entry.url, 'http://localhost/mcp');
    assert.equal(entry.headers.Authorization, `Bearer ${server.token}`);
  });

  test('the SDK client works over the socket (undici Agent)', async () => {
    const f = unixFetch(sock);
    const conn = await connectHttp('http://localhost/mcp', { token: server.token, fetch: f });
    try {
      await createInstance(conn.client, 'uds');
      await echoHi(conn.client, 'uds');
      const seen = [];
      const job = (
        await ok(conn.client, 'submit_job', { instance_id: 'uds', command: 'sleep 1.5; echo ok', timeout: 10 }, { onprogress: (p) => seen.push(p) })
      ).structuredContent;
      assert.equal(job.stdout_tail, 'ok');
      assert.ok(seen.length >= 1, 'progress over the socket');
    } finally {
      await conn.close();
      await f.agent.close();
    }
  });

  test('no Host/Origin check on the socket, but the token is still needed', async () => {
    const init = JSON.stringify({
      jsonrpc: '2.0',
      id: 1,
      method: 'initialize',
      params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'uds-raw', version: '1' } },
    });
    const headers = {
      Host: 'evil.example.com',
      Origin: 'http://evil.example.com',
      'Content-Type': 'application/json',
      Accept: 'application/json, text/event-stream',
    };
    const good = await rawRequest({ socketPath: sock, method: 'POST', path: '/mcp', headers: { ...headers, Authorization: `Bearer ${server.token}` }, body: init });
    assert.equal(good.status, 200, good.body);
    assert.equal(good.json.result.serverInfo.name, 'ns-hpc');
    const anon = await rawRequest({ socketPath: sock, method: 'POST', path: '/mcp', headers, body: init });
    assert.equal(anon.status, 401, anon.body);
  });

  test('the socket is removed when the server stops', async () => {
    const r = await server.stop();
    assert.equal(r.code, 0, server.stderr().slice(-2000));
    assert.ok(!fs.existsSync(sock), 'socket file removed');
    server = null;
  });
});

describe('two clients at once', () => {
  test('separate sessions; each sees only its own progress and responses', async () => {
    const a = await connectHttp(shared.url, { token: shared.token, name: 'client-a' });
    const b = await connectHttp(shared.url, { token: shared.token, name: 'client-b' });
    try {
      assert.ok(a.sessionId() && b.sessionId());
      assert.notEqual(a.sessionId(), b.sessionId());
      await createInstance(a.client, 'two');
      // The SDK uses the request id as progress token: shift B's ids so the tokens differ.
      for (let i = 0; i < 5; i++) await b.client.ping();
      const sent = { a: [], b: [] };
      for (const [k, c] of [['a', a], ['b', b]]) {
        const send = c.transport.send.bind(c.transport);
        c.transport.send = (m, o) => {
          sent[k].push(m);
          return send(m, o);
        };
      }
      const markA = a.received.length;
      const markB = b.received.length;
      const progA = [];
      const progB = [];
      const [ra, rb] = await Promise.all([
        ok(a.client, 'submit_job', { instance_id: 'two', command: 'sleep 3; echo from-A', timeout: 20 }, { onprogress: (p) => progA.push(p) }),
        ok(b.client, 'submit_job', { instance_id: 'two', command: 'sleep 3; echo from-B', timeout: 20 }, { onprogress: (p) => progB.push(p) }),
      ]);
      assert.equal(ra.structuredContent.stdout_tail, 'from-A');
      assert.equal(rb.structuredContent.stdout_tail, 'from-B');
      assert.notEqual(ra.structuredContent.job_id, rb.structuredContent.job_id);
      const tokenOf = (msgs) => msgs.find((m) => m.method === 'tools/call')?.params?._meta?.progressToken;
      const tokA = tokenOf(sent.a);
      const tokB = tokenOf(sent.b);
      assert.ok(tokA !== undefined && tokB !== undefined && tokA !== tokB, `tokens ${tokA} ${tokB}`);
      const progressIn = (msgs) => msgs.filter((m) => m.method === 'notifications/progress').map((m) => m.params.progressToken);
      const gotA = progressIn(a.received.slice(markA));
      const gotB = progressIn(b.received.slice(markB));
      assert.ok(gotA.length >= 2 && gotB.length >= 2, `progress: A ${gotA} B ${gotB}`);
      assert.deepEqual([...new Set(gotA)], [tokA], 'A gets only its own progress');
      assert.deepEqual([...new Set(gotB)], [tokB], 'B gets only its own progress');
      const responsesIn = (msgs) => msgs.filter((m) => 'result' in m || 'error' in m).map((m) => m.id);
      const idsA = sent.a.filter((m) => 'id' in m).map((m) => m.id);
      const idsB = sent.b.filter((m) => 'id' in m).map((m) => m.id);
      assert.deepEqual(responsesIn(a.received.slice(markA)), idsA, 'A gets exactly the responses to its requests');
      assert.deepEqual(responsesIn(b.received.slice(markB)), idsB, 'B gets exactly the responses to its requests');
      // Ending A's session leaves B's working.
      const idA = a.sessionId();
      await a.close();
      const stale = await fetch(shared.url, {
        method: 'POST',
        headers: { Authorization: `Bearer ${shared.token}`, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', 'Mcp-Session-Id': idA },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping' }),
      });
      assert.equal(stale.status, 404);
      await b.client.ping();
    } finally {
      await a.close();
      await b.close();
    }
  });
});

describe('resuming a dropped SSE stream (Last-Event-ID)', () => {
  test('no message is lost and none repeated', async () => {
    const s = new RawSession(shared.url, shared.token);
    await s.initialize();
    await s.callTool('create_instance', { instance_id: 'resume', network: 'off' });

    const controller = new AbortController();
    const res = await s.post(
      {
        jsonrpc: '2.0',
        id: 'job-1',
        method: 'tools/call',
        params: {
          name: 'submit_job',
          arguments: { instance_id: 'resume', command: 'sleep 4.5; echo resumed', timeout: 30 },
          _meta: { progressToken: 'resume-token' },
        },
      },
      { signal: controller.signal },
    );
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/event-stream/);
    const first = sseReader(res);
    const priming = await first.next();
    assert.ok(priming && priming.id, `a priming event with an id: ${JSON.stringify(priming)}`);
    assert.equal(priming.data, '', 'the priming event carries no message');
    const prefix = priming.id.slice(0, priming.id.indexOf('_') + 1);
    assert.match(priming.id, /^\d+_\d+$/);
    const one = await first.next();
    assert.equal(one.json.method, 'notifications/progress');
    assert.equal(one.json.params.progressToken, 'resume-token');
    const lastSeen = one.id;
    controller.abort();
    await first.cancel();

    // Events keep coming while nobody reads; then resume.
    await sleep(1500);
    const resumed = await fetch(shared.url, {
      method: 'GET',
      headers: {
        Authorization: `Bearer ${shared.token}`,
        Accept: 'text/event-stream',
        'Mcp-Session-Id': s.sessionId,
        'MCP-Protocol-Version': PROTOCOL_VERSION,
        'Last-Event-ID': lastSeen,
      },
    });
    assert.equal(resumed.status, 200, await resumed.clone().text().catch(() => ''));
    const second = sseReader(resumed);
    const rest = [];
    for (let ev = await second.next(); ev; ev = await second.next()) {
      if (ev.data === '') continue; // a priming event, if any
      rest.push(ev);
      if (ev.json && ev.json.id === 'job-1') break;
    }
    await second.cancel();
    const all = [one, ...rest];
    const seqs = all.map((e) => {
      assert.ok(e.id && e.id.startsWith(prefix), `event id ${e.id} is of the same stream ${prefix}`);
      return Number(e.id.slice(prefix.length));
    });
    for (let i = 1; i < seqs.length; i++) assert.equal(seqs[i], seqs[i - 1] + 1, `no gap, no duplicate: ${all.map((e) => e.id)}`);
    const final = rest[rest.length - 1];
    assert.equal(final.json.id, 'job-1', 'the response arrives on the resumed stream');
    assert.equal(final.json.result.structuredContent.status, 'completed');
    assert.equal(final.json.result.structuredContent.stdout_tail, 'resumed');
    const progress = all.filter((e) => e.json.method === 'notifications/progress').map((e) => e.json.params.progress);
    assert.ok(progress.length >= 3, `progress before and after the drop: ${progress}`);
    assert.ok(rest.some((e) => e.json.method === 'notifications/progress'), 'progress sent during the gap is replayed');
    for (let i = 1; i < progress.length; i++) assert.ok(progress[i] > progress[i - 1], `increasing: ${progress}`);
  });
});

describe('resuming right after a drop, while the call is quiet', () => {
  test('a GET with Last-Event-ID after the advertised retry delay gets the response', async () => {
    const s = new RawSession(shared.url, shared.token);
    await s.initialize();
    await s.callTool('create_instance', { instance_id: 'quiet', network: 'off' });
    const controller = new AbortController();
    // No progress token: nothing is sent on the stream until the response.
    const res = await s.post(
      {
        jsonrpc: '2.0',
        id: 'quiet-1',
        method: 'tools/call',
        params: { name: 'terminal_execute', arguments: { instance_id: 'quiet', command: 'sleep 4; echo late' } },
      },
      { signal: controller.signal },
    );
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/event-stream/);
    const first = sseReader(res);
    const priming = await first.next();
    assert.ok(priming?.id, 'a priming event with an id');
    assert.ok(priming.retry > 0, `the priming event advises a retry delay: ${priming.raw}`);
    controller.abort();
    await first.cancel();
    await sleep(priming.retry);
    const resumed = await fetch(shared.url, {
      headers: {
        Authorization: `Bearer ${shared.token}`,
        Accept: 'text/event-stream',
        'Mcp-Session-Id': s.sessionId,
        'MCP-Protocol-Version': PROTOCOL_VERSION,
        'Last-Event-ID': priming.id,
      },
    });
    const status = resumed.status;
    assert.equal(status, 200, `GET Last-Event-ID ${priming.id} ${priming.retry} ms after the drop: ${status} ${status === 200 ? '' : await resumed.text()}`);
    const second = sseReader(resumed);
    let response;
    for (let ev = await second.next(); ev; ev = await second.next()) {
      if (ev.json?.id === 'quiet-1') {
        response = ev.json;
        break;
      }
    }
    await second.cancel();
    assert.equal(response?.result?.structuredContent?.stdout, 'late\n');
  });
});

describe('sessions: idle timeout, DELETE, SIGTERM', () => {
  test('--session-timeout 2: an idle session is gone after a few seconds (404)', async () => {
    const home = makeHttpHome('http-idle');
    const server = await startServer(home, { args: ['--session-timeout', '2'] });
    try {
      const s = new RawSession(server.url, server.token);
      await s.initialize();
      assert.ok((await s.request('ping', {})).result, 'ping answered');
      await sleep(4000);
      const res = await s.post({ jsonrpc: '2.0', id: 99, method: 'ping' });
      assert.equal(res.status, 404, await res.text());
    } finally {
      await server.stop();
      removeHome(home);
    }
  });

  test('DELETE ends a session; it is then unknown (404)', async () => {
    const s = new RawSession(shared.url, shared.token);
    await s.initialize();
    const headers = { Authorization: `Bearer ${shared.token}`, 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': PROTOCOL_VERSION };
    const del = await fetch(shared.url, { method: 'DELETE', headers });
    assert.equal(del.status, 200);
    const gone = await s.post({ jsonrpc: '2.0', id: 2, method: 'ping' });
    assert.equal(gone.status, 404, await gone.text());
    const again = await fetch(shared.url, { method: 'DELETE', headers });
    assert.equal(again.status, 404);
  });

  test('SIGTERM while submit_job waits: exit 0 within shutdown_grace, the job keeps running', async (t) => {
    const grace = 2;
    const home = makeHttpHome('http-term', `[server]\nshutdown_grace = ${grace}\n`);
    const server = await startServer(home);
    let conn;
    try {
      conn = await connectHttp(server.url, { token: server.token });
      await createInstance(conn.client, 'keep');
      const marker = path.join(home.instancesDir, 'keep', 'workspace', 'marker.txt');
      const progress = [];
      const pending = conn.client
        .callTool(
          { name: 'submit_job', arguments: { instance_id: 'keep', command: 'sleep 9; echo done > marker.txt', timeout: 60 } },
          undefined,
          { onprogress: (p) => progress.push(p), timeout: 60_000 },
        )
        .then(
          (r) => ({ r }),
          (e) => ({ e }),
        );
      assert.ok(await until(() => progress.length >= 1, 10_000), 'the wait is running (progress seen)');
      const t0 = Date.now();
      server.proc.kill('SIGTERM');
      const exit = await server.waitExit((grace + 10) * 1000);
      const took = (Date.now() - t0) / 1000;
      assert.ok(exit, 'the server exited');
      const markerAtExit = fs.existsSync(marker);
      assert.equal(exit.code, 0, `exit ${JSON.stringify(exit)}; stderr:\n${server.stderr().slice(-2000)}`);
      assert.ok(!markerAtExit, `the job had not finished when the server exited (${took.toFixed(2)} s after SIGTERM)`);
      // The interrupted call is answered (an error saying why), not left waiting forever.
      const outcome = await Promise.race([pending, sleep(2000).then(() => 'still pending')]);
      assert.notEqual(outcome, 'still pending', 'the call cut by the shutdown got an answer');
      assert.ok(outcome.e, `the call cut by the shutdown failed: ${JSON.stringify(outcome).slice(0, 300)}`);
      assert.match(String(outcome.e.message), /shutting down/);
      assert.ok(await until(() => fs.existsSync(marker), 15_000), 'the job finished after the server was gone');
      assert.equal(fs.readFileSync(marker, 'utf8'), 'done\n');
      // 1 s for the waiting handler to notice the cancellation and the process to end.
      assert.ok(took <= grace + 1, `exited ${took.toFixed(2)} s after SIGTERM; shutdown_grace is ${grace} s`);
    } finally {
      if (conn) await conn.close();
      await server.stop();
      removeHome(home);
    }
  });

  test('SIGTERM with nothing running: a prompt exit 0', async () => {
    const home = makeHttpHome('http-term-idle');
    const server = await startServer(home);
    try {
      const s = new RawSession(server.url, server.token);
      await s.initialize();
      const t0 = Date.now();
      server.proc.kill('SIGTERM');
      const exit = await server.waitExit(15_000);
      const took = (Date.now() - t0) / 1000;
      assert.equal(exit?.code, 0);
      assert.ok(took < 1.5, `exited after ${took.toFixed(2)} s with nothing in flight`);
    } finally {
      await server.stop();
      removeHome(home);
    }
  });
});
