// End-to-end security tests of `ns-hpc run` over HTTP: the bearer token on every route but
// /healthz, Host/Origin (DNS rebinding), the refusal of an unauthenticated non-loopback listener,
// the generated token file, bad input (malformed JSON, sessions, protocol version, body limit),
// and a sandbox that never sees the token and cannot call the server.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { removeHome, textOf } from './lib.mjs';
import { PROTOCOL_VERSION, RawSession, makeHttpHome, connectHttp, rawRequest, startServer } from './http_lib.mjs';

const INIT = JSON.stringify({
  jsonrpc: '2.0',
  id: 1,
  method: 'initialize',
  params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'sec', version: '1' } },
});
const JSON_HEADERS = { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' };
const NON_LOOPBACK_REFUSAL = 'A non-loopback HTTP listener can execute arbitrary sandbox commands';

// Every route, with what it answers to a client holding the right token.
const ROUTES = [
  { method: 'POST', path: '/mcp', headers: JSON_HEADERS, body: INIT, ok: 200 }, // initialize
  { method: 'GET', path: '/mcp', headers: { Accept: 'text/event-stream' }, ok: 400 }, // no session
  { method: 'DELETE', path: '/mcp', ok: 400 }, // no session
  { method: 'GET', path: '/sse', headers: { Accept: 'text/event-stream' }, ok: 200, headersOnly: true },
  { method: 'POST', path: '/messages/', headers: JSON_HEADERS, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}', ok: 400 },
  { method: 'POST', path: '/messages/?session_id=0123456789abcdef0123456789abcdef', headers: JSON_HEADERS, body: '{}', ok: 404 },
  { method: 'GET', path: '/dav/x', ok: 404 },
  { method: 'PROPFIND', path: '/dav/x', ok: 404 },
  { method: 'GET', path: '/api/anything', ok: 404 },
  { method: 'GET', path: '/api/instances', ok: 200 },
  { method: 'GET', path: '/api/events', headers: { Accept: 'text/event-stream' }, ok: 200, headersOnly: true },
  { method: 'GET', path: '/', ok: 200 }, // the dashboard
  { method: 'GET', path: '/nothing-here', ok: 404 },
];

function request(server, route, extra = {}) {
  return rawRequest({
    port: server.port,
    method: route.method,
    path: route.path,
    headers: { ...(route.headers || {}), ...extra },
    body: route.body,
    headersOnly: route.headersOnly,
  });
}

// One server for most tests here, with a small message limit for the 413 test.
let sharedHome;
let server;

before(async () => {
  sharedHome = makeHttpHome('http-sec', '[mcp]\nmax_message_bytes = 4096\n');
  server = await startServer(sharedHome);
});

after(async () => {
  if (server) await server.stop();
  removeHome(sharedHome);
});

describe('authentication and Host/Origin checks', () => {
  const auth = () => ({ Authorization: `Bearer ${server.token}` });

  for (const route of ROUTES) {
    test(`${route.method} ${route.path}: 401 without or with a wrong token, ${route.ok} with it`, async () => {
      const none = await request(server, route);
      assert.equal(none.status, 401, none.body);
      assert.match(none.headers['www-authenticate'] || '', /^Bearer\b/, 'WWW-Authenticate: Bearer');
      assert.ok(none.json && none.json.error, `a JSON-RPC error body: ${none.body}`);
      for (const wrong of [`Bearer ${'0'.repeat(64)}`, `Bearer ${server.token}x`, `Bearer ${server.token.slice(0, -1)}`, `Basic ${server.token}`, 'Bearer']) {
        const r = await request(server, route, { Authorization: wrong });
        assert.equal(r.status, 401, `${wrong.slice(0, 20)}…: ${r.body}`);
        assert.match(r.headers['www-authenticate'] || '', /^Bearer\b/);
      }
      const good = await request(server, route, auth());
      assert.notEqual(good.status, 401, good.body);
      assert.equal(good.status, route.ok, good.body);
    });
  }

  test('/healthz answers without a token', async () => {
    const r = await rawRequest({ port: server.port, path: '/healthz' });
    assert.equal(r.status, 200);
    assert.deepEqual(r.json, { status: 'ok' });
  });

  test('a foreign Host is refused (403), loopback names are accepted', async () => {
    for (const host of ['evil.example.com', `evil.example.com:${server.port}`, `127.0.0.1.evil.example.com:${server.port}`]) {
      const r = await rawRequest({ port: server.port, method: 'POST', path: '/mcp', headers: { ...JSON_HEADERS, ...auth(), Host: host }, body: INIT });
      assert.equal(r.status, 403, `Host ${host}: ${r.body}`);
      assert.ok(r.json?.error, r.body);
    }
    for (const host of [`localhost:${server.port}`, `127.0.0.1:${server.port}`, `[::1]:${server.port}`]) {
      const r = await rawRequest({ port: server.port, method: 'POST', path: '/mcp', headers: { ...JSON_HEADERS, ...auth(), Host: host }, body: INIT });
      assert.equal(r.status, 200, `Host ${host}: ${r.body}`);
    }
  });

  test('a foreign Origin is refused (403); the server\'s own origins are accepted', async () => {
    for (const origin of ['http://evil.example.com', `http://evil.example.com:${server.port}`, 'null', `http://localhost.evil.example.com:${server.port}`]) {
      const r = await rawRequest({ port: server.port, method: 'POST', path: '/mcp', headers: { ...JSON_HEADERS, ...auth(), Origin: origin }, body: INIT });
      assert.equal(r.status, 403, `Origin ${origin}: ${r.body}`);
    }
    // The SSE GET too (a browser's EventSource sends Origin).
    const sse = await rawRequest({ port: server.port, path: '/sse', headers: { Accept: 'text/event-stream', ...auth(), Origin: 'http://evil.example.com' }, headersOnly: true });
    assert.equal(sse.status, 403);
    for (const origin of [`http://localhost:${server.port}`, `http://127.0.0.1:${server.port}`]) {
      const r = await rawRequest({ port: server.port, method: 'POST', path: '/mcp', headers: { ...JSON_HEADERS, ...auth(), Origin: origin }, body: INIT });
      assert.equal(r.status, 200, `Origin ${origin}: ${r.body}`);
    }
  });

  test('--allowed-host and --allowed-origin widen the checks', async () => {
    const h = makeHttpHome('http-allowed');
    const s = await startServer(h, { args: ['--allowed-host', 'mcp.example.org', '--allowed-origin', 'https://app.example.org'] });
    try {
      const base = { ...JSON_HEADERS, Authorization: `Bearer ${s.token}` };
      const host = await rawRequest({ port: s.port, method: 'POST', path: '/mcp', headers: { ...base, Host: `mcp.example.org:${s.port}` }, body: INIT });
      assert.equal(host.status, 200, host.body);
      const origin = await rawRequest({ port: s.port, method: 'POST', path: '/mcp', headers: { ...base, Origin: 'https://app.example.org' }, body: INIT });
      assert.equal(origin.status, 200, origin.body);
      const other = await rawRequest({ port: s.port, method: 'POST', path: '/mcp', headers: { ...base, Host: 'evil.example.com' }, body: INIT });
      assert.equal(other.status, 403);
    } finally {
      await s.stop();
      removeHome(h);
    }
  });
});

describe('start-up: non-loopback listeners and the token file', () => {
  test('--host 0.0.0.0 without a token is refused; --allow-unauthenticated-http starts', async () => {
    const home = makeHttpHome('http-public');
    try {
      const refused = await startServer(home, { args: ['--host', '0.0.0.0'], expectExit: true });
      assert.notEqual(refused.code, 0, `exit ${refused.code}/${refused.signal}; stderr:\n${refused.stderr}`);
      assert.notEqual(refused.signal, 'timeout', 'it must refuse, not serve');
      assert.ok(refused.stderr.includes(NON_LOOPBACK_REFUSAL), refused.stderr);
      assert.ok(!fs.existsSync(path.join(home.stateDir, 'http-token')), 'no token was generated');

      const open = await startServer(home, { args: ['--host', '0.0.0.0', '--allow-unauthenticated-http'] });
      try {
        assert.equal(open.token, undefined, 'no token printed');
        assert.equal(open.clientConfig.mcpServers['ns-hpc'].headers, undefined);
        assert.match(open.stderr(), /without a token/);
        const r = await rawRequest({ port: open.port, method: 'POST', path: '/mcp', headers: JSON_HEADERS, body: INIT });
        assert.equal(r.status, 200, r.body);
      } finally {
        await open.stop();
      }

      const withEnv = await startServer(home, { args: ['--host', '0.0.0.0'], env: { NS_HPC_AUTH_TOKEN: 'e2e-env-token-0123456789abcdef' } });
      try {
        assert.match(withEnv.stderr(), /bearer token from NS_HPC_AUTH_TOKEN/);
        assert.ok(!withEnv.stderr().includes('e2e-env-token-0123456789abcdef'), 'a token from the environment is not printed');
        const anon = await rawRequest({ port: withEnv.port, method: 'POST', path: '/mcp', headers: JSON_HEADERS, body: INIT });
        assert.equal(anon.status, 401);
        const r = await rawRequest({
          port: withEnv.port,
          method: 'POST',
          path: '/mcp',
          headers: { ...JSON_HEADERS, Authorization: 'Bearer e2e-env-token-0123456789abcdef' },
          body: INIT,
        });
        assert.equal(r.status, 200, r.body);
      } finally {
        await withEnv.stop();
      }
    } finally {
      removeHome(home);
    }
  });

  test('the generated token file is 0600 and reused on restart', async () => {
    const home = makeHttpHome('http-tokenfile');
    try {
      const first = await startServer(home);
      const token = first.token;
      const file = first.tokenFile;
      await first.stop();
      assert.match(token, /^[0-9a-f]{64}$/);
      const st = fs.statSync(file);
      assert.equal(st.mode & 0o777, 0o600, `token file mode ${(st.mode & 0o777).toString(8)}`);
      // Others may pass through it (as root the instances folder lies inside it), never list or write it.
      assert.equal(fs.statSync(path.dirname(file)).mode & 0o066, 0, 'the state folder cannot be listed or written by others');
      assert.equal(fs.readFileSync(file, 'utf8').trim(), token);

      const second = await startServer(home);
      try {
        assert.equal(second.token, token, 'the same token after a restart');
        assert.equal(second.tokenFile, file);
        const r = await rawRequest({ port: second.port, method: 'POST', path: '/mcp', headers: { ...JSON_HEADERS, Authorization: `Bearer ${token}` }, body: INIT });
        assert.equal(r.status, 200, r.body);
      } finally {
        await second.stop();
      }

      // A token file others can read is refused, not used.
      fs.chmodSync(file, 0o644);
      const loose = await startServer(home, { expectExit: true });
      assert.notEqual(loose.code, 0, loose.stderr);
      assert.match(loose.stderr, /readable by other users/);
    } finally {
      removeHome(home);
    }
  });
});

describe('bad input over HTTP', () => {
  let s;

  before(async () => {
    s = new RawSession(server.url, server.token);
    await s.initialize();
  });

  const expectRpcError = async (res, status) => {
    const text = await res.text();
    assert.equal(res.status, status, text);
    let body;
    assert.doesNotThrow(() => {
      body = JSON.parse(text);
    }, `a JSON body: ${text}`);
    assert.equal(body.jsonrpc, '2.0');
    assert.equal(body.id, null);
    assert.equal(typeof body.error?.code, 'number', text);
    assert.equal(typeof body.error?.message, 'string', text);
    return body;
  };

  test('malformed JSON: 400 with a JSON-RPC parse error (-32700)', async () => {
    const body = await expectRpcError(await s.post('{"jsonrpc": "2.0", "id": 5, "method": '), 400);
    assert.equal(body.error.code, -32700);
  });

  test('no Mcp-Session-Id: 400; an unknown one: 404', async () => {
    const { sessionId } = s;
    const headers = { Authorization: `Bearer ${server.token}`, ...JSON_HEADERS, 'MCP-Protocol-Version': PROTOCOL_VERSION };
    const msg = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' });
    await expectRpcError(await fetch(server.url, { method: 'POST', headers, body: msg }), 400);
    await expectRpcError(await fetch(server.url, { method: 'POST', headers: { ...headers, 'Mcp-Session-Id': 'f'.repeat(32) }, body: msg }), 404);
    assert.equal(s.sessionId, sessionId);
  });

  test('an unsupported MCP-Protocol-Version: 400', async () => {
    const body = await expectRpcError(await s.post({ jsonrpc: '2.0', id: 8, method: 'tools/list' }, { headers: { 'MCP-Protocol-Version': '1999-01-01' } }), 400);
    assert.match(body.error.message, /1999-01-01/);
  });

  test('a body over [mcp] max_message_bytes: 413 (with Content-Length and chunked)', async () => {
    const big = JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'ping', params: { pad: 'x'.repeat(10_000) } });
    const headers = { ...JSON_HEADERS, Authorization: `Bearer ${server.token}`, 'Mcp-Session-Id': s.sessionId, 'MCP-Protocol-Version': PROTOCOL_VERSION };
    const sized = await rawRequest({ port: server.port, method: 'POST', path: '/mcp', headers, body: big });
    assert.equal(sized.status, 413, sized.body);
    assert.ok(sized.json?.error, sized.body);
    const chunked = await rawRequest({ port: server.port, method: 'POST', path: '/mcp', headers, body: big, chunked: true });
    assert.equal(chunked.status, 413, chunked.body);
  });

  test('wrong Content-Type: 415; Accept without JSON or SSE: 406', async () => {
    await expectRpcError(await s.post('{"jsonrpc":"2.0","id":10,"method":"ping"}', { headers: { 'Content-Type': 'text/plain' } }), 415);
    await expectRpcError(await s.post('{"jsonrpc":"2.0","id":11,"method":"ping"}', { headers: { Accept: 'text/html' } }), 406);
  });

  test('after all that, the session and the server still work', async () => {
    const list = await s.request('tools/list', {});
    assert.ok(list.result.tools.length > 5, JSON.stringify(list).slice(0, 300));
    const fresh = new RawSession(server.url, server.token);
    const init = await fresh.initialize();
    assert.equal(init.result.serverInfo.name, 'ns-hpc');
    assert.equal(server.proc.exitCode, null, 'still running');
  });
});

describe('the sandbox never sees the token and cannot call the server', () => {
  const CURL = '/usr/bin/curl';
  const PY = '/usr/bin/python3';

  // What to run inside for an HTTP POST to the server that prints only the status code.
  function httpProbe(port) {
    const url = `http://127.0.0.1:${port}/mcp`;
    if (fs.existsSync(CURL))
      return `curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' --data '${INIT}' ${url}`;
    if (fs.existsSync(PY))
      return (
        `python3 -c 'import urllib.request as u, urllib.error as e, sys\n` +
        `r=u.Request(sys.argv[1], data=sys.argv[2].encode(), headers={"Content-Type":"application/json","Accept":"application/json, text/event-stream"})\n` +
        `try: print(u.urlopen(r).status, end="")\n` +
        `except e.HTTPError as x: print(x.code, end="")' ${url} '${INIT}'`
      );
    return null;
  }

  async function check(t, server) {
    const conn = await connectHttp(server.url, { token: server.token });
    try {
      const created = await conn.client.callTool({ name: 'create_instance', arguments: { instance_id: 'probe', network: 'host' } });
      assert.notEqual(created.isError, true, textOf(created));
      const run = async (command) => {
        const r = await conn.client.callTool({ name: 'terminal_execute', arguments: { instance_id: 'probe', command } });
        assert.notEqual(r.isError, true, textOf(r));
        return r.structuredContent;
      };
      const env = await run('env; cat /proc/self/environ | tr "\\0" "\\n"');
      assert.equal(env.exit_code, 0, env.stderr);
      assert.ok(env.stdout.includes('PATH='), 'env ran');
      assert.ok(!env.stdout.includes(server.token), 'the token is not in the sandbox environment');
      assert.ok(!/NS_HPC_AUTH_TOKEN/.test(env.stdout), 'NS_HPC_AUTH_TOKEN is not passed in');

      const probe = httpProbe(server.port);
      if (!probe) {
        t.diagnostic(`no HTTP client (${CURL}, ${PY}) on this host: the call from inside is not tried`);
      } else {
        const r = await run(probe);
        assert.equal(r.stdout, '401', `an HTTP call from inside the sandbox: stdout ${r.stdout} stderr ${r.stderr}`);
      }
      if (server.tokenFile) {
        const r = await run(`cat ${server.tokenFile}; ls -la ${path.dirname(server.tokenFile)}`);
        assert.notEqual(r.exit_code, 0, 'the token file cannot be read from inside');
        assert.ok(!r.stdout.includes(server.token) && !r.stderr.includes(server.token), 'the token is not shown');
      }
    } finally {
      await conn.close();
    }
  }

  // From every mode but host the server is not even reachable: curl makes no connection (000).
  // A mode this host cannot serve (nat without /dev/net/tun) is refused at create and skipped.
  test('off, nat and filtered cannot connect to the server at all', async (t) => {
    if (!fs.existsSync(CURL)) return t.skip(`no ${CURL} on this host`);
    const conn = await connectHttp(server.url, { token: server.token });
    try {
      for (const network of ['off', 'nat', 'filtered']) {
        const id = `reach-${network}`;
        const created = await conn.client.callTool({ name: 'create_instance', arguments: { instance_id: id, network } });
        if (created.isError) {
          assert.match(textOf(created), /network|tun|pasta/, textOf(created));
          t.diagnostic(`${network} is not served here: ${textOf(created)}`);
          continue;
        }
        // --noproxy: in filtered the call goes straight, as a program ignoring the proxy would.
        const direct = `curl --noproxy '*' -m 5 -s -o /dev/null -w '%{http_code}' -X POST --data '{}' http://127.0.0.1:${server.port}/mcp`;
        const viaProxy = `curl -m 5 -s -o /dev/null -w '%{http_code}' -X POST --data '{}' http://127.0.0.1:${server.port}/mcp`;
        for (const command of network === 'filtered' ? [direct, viaProxy] : [direct]) {
          const r = await conn.client.callTool({ name: 'terminal_execute', arguments: { instance_id: id, command } });
          assert.notEqual(r.isError, true, textOf(r));
          const code = r.structuredContent.stdout;
          // 000: no connection; 403: the filtered proxy refused it (the server never saw it).
          assert.ok(code === '000' || (command === viaProxy && code === '403'), `${network}: ${command} gave ${code}`);
        }
        const removed = await conn.client.callTool({ name: 'delete_instance', arguments: { instance_id: id } });
        assert.notEqual(removed.isError, true, textOf(removed));
      }
    } finally {
      await conn.close();
    }
  });

  test('a generated token (file in state_dir)', async (t) => {
    assert.ok(server.tokenFile, 'a token file was generated');
    await check(t, server);
  });

  test('a token from NS_HPC_AUTH_TOKEN', async (t) => {
    const home = makeHttpHome('http-sbx-env');
    const token = 'e2e-sandbox-env-token-4f9d0c2b7a';
    const server = await startServer(home, { env: { NS_HPC_AUTH_TOKEN: token } });
    try {
      assert.equal(server.token, token);
      await check(t, server);
    } finally {
      await server.stop();
      removeHome(home);
    }
  });
});
