// MCP 2026-07-28 beside 2025-11-25 on the same endpoints (issue 36), with real clients:
//   - @modelcontextprotocol/client 2.4.0 with versionNegotiation left out (legacy), {mode: 'auto'} and
//     {mode: {pin: '2026-07-28'}}, and @modelcontextprotocol/sdk 1.32.2, over stdio and streamable
//     HTTP, on `ns-hpc run` and `ns-hpc computer`: the era connected on, tools listed, a command run,
//     a file read back, and on the modern ones subscriptions/listen hearing an instance change;
//   - the initialize-after-discover client (raw stdio), served in the legacy era;
//   - raw JSON-RPC error cases over HTTP and stdio, each a clear error and the server answering after;
//   - nothing provisioned by a probing client before its first tools/call;
//   - W3C trace context from _meta reaching the command ($TRACEPARENT) and the audit log.
// The computer parts run on make test's image 'test' (scripts/test-image.sh); without it they skip.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { NSHPC_BINARY, RawChild, childEnv, connectClient, makeHome, nshpcArgs, removeHome, sleep, textOf, until } from './lib.mjs';
import { RawSession, connectHttp, makeHttpHome, startServer } from './http_lib.mjs';
import {
  IMAGES_DIR,
  LEGACY,
  MODERN,
  connectV2Http,
  connectV2Stdio,
  expectedEra,
  haveTestImage,
  modernPost,
  modernRequest,
  startComputerHttp,
  useTestImage,
} from './eras_lib.mjs';

const computerSkip = haveTestImage() ? false : `no image 'test' in ${IMAGES_DIR} (scripts/test-image.sh, run by make test, builds it)`;
const CLIENTS = ['v1', 'legacy', 'auto', 'pin']; // v1: @modelcontextprotocol/sdk 1.32.2; the rest: v2 modes
const INSTANCE = 'eras';
const COMPUTER = 'eras-box';
let uniq = 0;
const fresh = (base) => `${base}-${process.pid % 10000}-${++uniq}`;

// What each entry point needs: the stdio argv and env, how to run a command and read a file, and
// an instance change a subscription hears: on `run` a new instance (resources list_changed; the
// computer entry point lists no instance resources), on `computer` its desktop switched off, which
// is fast on a headless computer (tools list_changed: the screen tools' listing may change).
function runTarget(home) {
  return {
    name: 'run',
    stdio: { command: NSHPC_BINARY, args: nshpcArgs(home), env: childEnv(home) },
    exec: (command) => ({ name: 'terminal_execute', arguments: { instance_id: INSTANCE, command } }),
    read: (file) => ({ name: 'read_file', arguments: { instance_id: INSTANCE, path: file } }),
    change: () => ({ name: 'create_instance', arguments: { instance_id: fresh('eras-new'), network: 'off' } }),
    filter: { resourcesListChanged: true },
    notification: 'notifications/resources/list_changed',
    tool: 'terminal_execute',
  };
}
function computerTarget(home) {
  return {
    name: 'computer',
    stdio: { command: NSHPC_BINARY, args: ['--config', home.config, 'computer'], env: { ...childEnv(home), COMPUTER_ID: COMPUTER } },
    exec: (command) => ({ name: 'terminal_execute', arguments: { command } }),
    read: (file) => ({ name: 'read_file', arguments: { path: file } }),
    change: () => ({ name: 'set_desktop_environment', arguments: { enabled: false } }),
    filter: { toolsListChanged: true },
    notification: 'notifications/tools/list_changed',
    tool: 'terminal_execute',
  };
}

async function call(client, params) {
  const result = await client.callTool(params);
  assert.ok(!result.isError, `${params.name} failed: ${textOf(result)}`);
  return result;
}

async function connect(kind, transport, target, server) {
  if (transport === 'stdio') {
    if (kind === 'v1') return connectClient({ ...target.stdio, name: 'eras-v1' });
    return connectV2Stdio({ ...target.stdio, mode: kind });
  }
  if (kind === 'v1') return connectHttp(server.url, { token: server.token });
  return connectV2Http(server.url, { token: server.token, mode: kind });
}

// The matrix row: connect, era, tools/list, a command, a file read back, and for the modern era
// subscriptions/listen hearing an instance change, then the subscription closed (and nothing
// heard after it closed).
async function exercise(kind, transport, target, server) {
  const c = await connect(kind, transport, target, server);
  const { client } = c;
  try {
    if (kind === 'v1') {
      const version = transport === 'stdio' ? c.negotiated() : c.transport.protocolVersion;
      assert.equal(version, LEGACY, 'the v1 SDK negotiates 2025-11-25');
    } else {
      assert.equal(client.getProtocolEra(), expectedEra(kind), `the v2 client in mode ${kind}`);
      if (kind !== 'legacy') assert.equal(client.getNegotiatedProtocolVersion(), MODERN);
    }
    const { tools } = await client.listTools();
    assert.ok(tools.some((t) => t.name === target.tool), `${target.tool} listed (got ${tools.map((t) => t.name)})`);

    const marker = `${kind}-${transport}-${target.name}-${Date.now()}`;
    const ran = await call(client, target.exec(`echo ${marker} | tee eras-${kind}-${transport}.txt`));
    assert.match(textOf(ran), new RegExp(marker), 'the command ran and its output came back');
    const read = await call(client, target.read(`eras-${kind}-${transport}.txt`));
    assert.match(textOf(read), new RegExp(marker), 'read_file returns what the command wrote');

    if (expectedEra(kind) === 'modern' && kind !== 'v1') {
      const heard = [];
      client.setNotificationHandler(target.notification, (n) => {
        heard.push(n);
      });
      const sub = await client.listen(target.filter);
      assert.deepEqual(sub.honoredFilter, target.filter, 'the server honours the filter');
      await call(client, target.change());
      assert.ok(await until(() => heard.length > 0, 10_000), `${target.notification} on the subscription`);
      await sub.close();
      assert.equal(await sub.closed, 'local');
      // Closed means closed: the next change is not heard; the connection goes on.
      const mark = heard.length;
      await call(client, target.change());
      await sleep(300);
      assert.equal(heard.length, mark, `${target.notification} after the subscription closed`);
      assert.ok((await client.listTools()).tools.length > 0);
    }
  } catch (err) {
    if (c.stderr) err.message += `\nserver stderr tail:\n${(typeof c.stderr === 'function' ? c.stderr() : c.stderr.text).slice(-2000)}`;
    if (server?.stderr) err.message += `\nHTTP server stderr tail:\n${server.stderr().slice(-2000)}`;
    throw err;
  } finally {
    await c.close();
  }
}

describe('eras on ns-hpc run', () => {
  let home;
  let target;
  let server;
  before(async () => {
    home = makeHttpHome('eras-run');
    execFileSync(NSHPC_BINARY, ['--config', home.config, 'instance', 'create', INSTANCE, '--persistent'], { env: childEnv(home) });
    target = runTarget(home);
    server = await startServer(home);
  });
  after(async () => {
    await server?.stop();
    // The living instance's sandbox outlives the server: delete it before the folder goes.
    try {
      execFileSync(NSHPC_BINARY, ['--config', home.config, 'instance', 'delete', '--force', INSTANCE], { env: childEnv(home), stdio: 'ignore' });
    } catch {
      // never created
    }
    removeHome(home);
  });

  for (const transport of ['stdio', 'http'])
    for (const kind of CLIENTS)
      test(`${kind} over ${transport}: era, tools, command, file${kind === 'auto' || kind === 'pin' ? ', listen' : ''}`, () =>
        exercise(kind, transport, target, server));

  test('trace context: _meta.traceparent reaches the command ($TRACEPARENT) and the audit log', async () => {
    const traceId = [...Array(32)].map(() => Math.floor(Math.random() * 16).toString(16)).join('');
    const tp = `00-${traceId}-00f067aa0ba902b7-01`;
    const c = await connectV2Stdio({ ...target.stdio, mode: 'pin' });
    try {
      const params = target.exec('echo "tp=$TRACEPARENT"');
      const result = await c.client.callTool({ ...params, _meta: { traceparent: tp } });
      assert.ok(!result.isError, textOf(result));
      assert.match(textOf(result), new RegExp(`tp=${tp}`), 'TRACEPARENT in the command environment');
    } finally {
      await c.close();
    }
    const log = path.join(home.instancesDir, INSTANCE, 'audit.log');
    assert.ok(
      await until(() => fs.existsSync(log) && fs.readFileSync(log, 'utf8').includes(traceId), 5000),
      `the trace id ${traceId} in ${log}`,
    );
  });

  test('listen over HTTP: resourceSubscriptions hears the living instance stop (notifications/resources/updated)', async () => {
    const uri = `resource://ns-hpc/instances/${INSTANCE}`;
    const c = await connectV2Http(server.url, { token: server.token, mode: 'pin' });
    try {
      // Running first, so that stopping it is a change.
      assert.ok(!(await c.client.callTool(target.exec('true'))).isError);
      const heard = [];
      c.client.setNotificationHandler('notifications/resources/updated', (n) => {
        heard.push(n.params.uri);
      });
      const sub = await c.client.listen({ resourceSubscriptions: [uri] });
      assert.deepEqual(sub.honoredFilter, { resourceSubscriptions: [uri] });
      const stopped = await c.client.callTool({ name: 'stop_instance', arguments: { instance_id: INSTANCE } });
      assert.ok(!stopped.isError, textOf(stopped));
      assert.ok(await until(() => heard.includes(uri), 15_000), `resources/updated for ${uri} (heard: ${heard})`);
      await sub.close();
    } finally {
      await c.close();
    }
  });

  // --- raw JSON-RPC error cases over HTTP: each a clear error, the server answering after -------
  async function stillAnswers() {
    const r = await modernPost(server.url, server.token, modernRequest('tools/list'));
    assert.equal(r.status, 200, r.text);
    assert.ok(Array.isArray(r.json?.result?.tools) && r.json.result.tools.length > 0, r.text);
  }
  const rawCases = [
    ['a wrong Mcp-Name header', () => modernRequest('tools/call', { name: 'list_instances', arguments: {} }), { 'Mcp-Name': 'delete_instance' }, 400, -32020],
    ['a missing Mcp-Method header', () => modernRequest('tools/list'), { 'Mcp-Method': null }, 400, -32020],
    ['an unknown version in the envelope', () => modernRequest('tools/list', {}, {}, { version: '2099-01-01' }), {}, 400, -32022],
    ['no clientCapabilities in the envelope', () => modernRequest('tools/list', {}, {}, { capabilities: null }), {}, 400, -32602],
    [
      'initialize with a modern envelope',
      () => modernRequest('initialize', { protocolVersion: MODERN, capabilities: {}, clientInfo: { name: 'x', version: '1' } }),
      {},
      404,
      -32601,
    ],
  ];
  for (const [what, message, headers, status, code] of rawCases) {
    test(`HTTP: ${what} is HTTP ${status}, JSON-RPC ${code}; the server answers after`, async () => {
      const msg = message();
      const r = await modernPost(server.url, server.token, msg, { headers });
      assert.equal(r.status, status, `HTTP status; body: ${r.text}`);
      assert.equal(r.json?.error?.code, code, `JSON-RPC error; body: ${r.text}`);
      assert.ok(typeof r.json.error.message === 'string' && r.json.error.message.length > 10, 'a message that says what was wrong');
      if (code === -32022) {
        const supported = r.json.error.data?.supported;
        assert.ok(Array.isArray(supported) && supported.includes(MODERN) && supported.includes(LEGACY), `data.supported: ${r.text}`);
      }
      await stillAnswers();
    });
  }

  test('HTTP: a modern request on a legacy session (its Mcp-Session-Id) is 400, -32600; the session goes on', async () => {
    const s = new RawSession(server.url, server.token);
    await s.initialize();
    const r = await modernPost(server.url, server.token, modernRequest('tools/list'), {
      headers: { 'Mcp-Session-Id': s.sessionId },
    });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json?.error?.code, -32600, r.text);
    const listed = await s.request('tools/list', {});
    assert.ok(listed.result.tools.length > 0, 'the legacy session still answers');
    await stillAnswers();
  });

  // --- stdio ---------------------------------------------------------------------------------
  function rawStdio() {
    return new RawChild(NSHPC_BINARY, nshpcArgs(home), childEnv(home));
  }
  const raw = (method, params, meta, opts) => {
    const m = modernRequest(method, params, meta, opts);
    return [m.method, m.params];
  };

  test('stdio: server/discover, then initialize, then tools/list without envelope is served in the legacy era', async () => {
    const child = rawStdio();
    try {
      const disc = await child.request(...raw('server/discover'));
      assert.ok(disc.result, JSON.stringify(disc));
      assert.ok(disc.result.supportedVersions.includes(MODERN), JSON.stringify(disc.result));
      const init = await child.initialize(LEGACY);
      assert.equal(init.result?.protocolVersion, LEGACY, JSON.stringify(init));
      const listed = await child.request('tools/list', {});
      assert.ok(listed.result?.tools?.length > 0, JSON.stringify(listed));
      assert.equal(listed.result.resultType, undefined, 'a legacy result has no resultType');
    } finally {
      await child.kill();
    }
  });

  test('stdio: the error cases of a connection, each a clear error, the connection answering after', async () => {
    // A fresh connection: an unknown version, then no clientCapabilities.
    const modern = rawStdio();
    try {
      const unknown = await modern.request(...raw('tools/list', {}, {}, { version: '2099-01-01' }));
      assert.equal(unknown.error?.code, -32022, JSON.stringify(unknown));
      assert.ok(unknown.error.data?.supported?.includes(MODERN), JSON.stringify(unknown));
      const nocaps = await modern.request(...raw('tools/list', {}, {}, { capabilities: null }));
      assert.equal(nocaps.error?.code, -32602, JSON.stringify(nocaps));
      const init = await modern.request(...raw('initialize', { protocolVersion: MODERN, capabilities: {}, clientInfo: { name: 'x', version: '1' } }));
      assert.equal(init.error?.code, -32601, `initialize with a modern envelope: ${JSON.stringify(init)}`);
      // The connection is modern now: a legacy request without the envelope is -32602.
      const ok = await modern.request(...raw('tools/list'));
      assert.ok(ok.result?.tools?.length > 0, JSON.stringify(ok));
      assert.equal(ok.result.resultType, 'complete');
      const bare = await modern.request('tools/list', {});
      assert.equal(bare.error?.code, -32602, `a request without envelope on a modern connection: ${JSON.stringify(bare)}`);
      const again = await modern.request(...raw('tools/list'));
      assert.ok(again.result?.tools?.length > 0, 'answers after');
    } finally {
      await modern.kill();
    }
    // A legacy connection: a modern request after initialize is -32600.
    const legacy = rawStdio();
    try {
      await legacy.initialize(LEGACY);
      const m = await legacy.request(...raw('tools/list'));
      assert.equal(m.error?.code, -32600, `a modern request on a legacy connection: ${JSON.stringify(m)}`);
      const listed = await legacy.request('tools/list', {});
      assert.ok(listed.result?.tools?.length > 0, 'answers after');
    } finally {
      await legacy.kill();
    }
  });
});

describe('eras on ns-hpc computer', { skip: computerSkip }, () => {
  let stdioHome;
  let httpHome;
  let server;
  before(async () => {
    stdioHome = useTestImage(makeHome('eras-computer'));
    httpHome = useTestImage(makeHome('eras-computer-http'));
    server = await startComputerHttp(httpHome, COMPUTER, childEnv(httpHome), ['--auth-token', 'eras-e2e-token-0123456789abcdef']);
    server.token = 'eras-e2e-token-0123456789abcdef';
  });
  after(async () => {
    await server?.stop();
    removeHome(stdioHome);
    removeHome(httpHome);
  });

  for (const transport of ['stdio', 'http'])
    for (const kind of CLIENTS)
      test(`${kind} over ${transport}: era, tools, command, file${kind === 'auto' || kind === 'pin' ? ', listen' : ''}`, () =>
        exercise(kind, transport, computerTarget(transport === 'stdio' ? stdioHome : httpHome), server));

  test("nothing provisioned: an {mode: 'auto'} client's connect, tools/list and server/discover make no computer; its first tools/call does", async () => {
    const home = useTestImage(makeHome('eras-lazy'));
    const entries = () => (fs.existsSync(home.instancesDir) ? fs.readdirSync(home.instancesDir) : []);
    const c = await connectV2Stdio({ ...computerTarget(home).stdio, mode: 'auto' });
    try {
      assert.equal(c.client.getProtocolEra(), 'modern');
      assert.ok((await c.client.listTools()).tools.length > 0);
      const disc = await c.client.discover();
      assert.ok(disc.supportedVersions.includes(MODERN));
      assert.deepEqual(entries(), [], 'no computer or instance in the instances folder');
      await call(c.client, computerTarget(home).exec('true'));
      assert.ok(fs.existsSync(path.join(home.instancesDir, COMPUTER)), `the first tools/call made ${COMPUTER} (have ${entries()})`);
    } finally {
      await c.close();
      removeHome(home);
    }
  });
});

// A missing default image is built in the background from the first tools/call on, never for a
// probe. The servers run in a network namespace of their own (unshare -n, root): should a build
// start after all, it reaches no mirror, and the test sees its .building entry.
describe('nothing provisioned: no image build for a probing client', { skip: process.getuid() !== 0 && 'needs root: runs the server in a network namespace of its own' }, () => {
  for (const entry of ['run', 'computer']) {
    test(`ns-hpc ${entry} with its default image missing: connect ({mode: 'auto'}), tools/list and server/discover start no build`, async () => {
      const home = makeHome(`eras-nobuild-${entry}`);
      const images = path.join(home.root, 'images');
      fs.mkdirSync(images);
      const text = fs.readFileSync(home.config, 'utf8').replace('default_image = ""', 'default_image = "eras-missing"');
      fs.writeFileSync(home.config, text.replace('[namespace]\n', `[namespace]\nimages_dir = ${JSON.stringify(images)}\n`));
      const argv = ['--config', home.config, entry];
      const env = entry === 'computer' ? { ...childEnv(home), COMPUTER_ID: COMPUTER } : childEnv(home);
      const c = await connectV2Stdio({ command: 'unshare', args: ['--net', '--', NSHPC_BINARY, ...argv], env, mode: 'auto' });
      try {
        assert.equal(c.client.getProtocolEra(), 'modern');
        assert.ok((await c.client.listTools()).tools.length > 0);
        assert.ok((await c.client.discover()).supportedVersions.includes(MODERN));
        await sleep(500); // a build would have made its folder and log by now
        assert.deepEqual(fs.readdirSync(images), [], `nothing in the images folder (${images})`);
        assert.doesNotMatch(c.stderr(), /building it in the background/);
        assert.deepEqual(fs.existsSync(home.instancesDir) ? fs.readdirSync(home.instancesDir) : [], [], 'no instance');
      } finally {
        await c.close();
        removeHome(home);
      }
    });
  }
});
