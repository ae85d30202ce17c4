// End-to-end tests of the dashboard as an MCP App (ui://ns-hpc/dashboard, the
// io.modelcontextprotocol/ui extension of @modelcontextprotocol/ext-apps 2.0.4) and of desktop_url:
//   - both entry points advertise the extension, list the App with its _meta and serve its HTML
//     with the extension's mime type and nothing external in it; list_instances (`ns-hpc run`)
//     and computer_ui (`ns-hpc computer`) carry _meta.ui.resourceUri, and computer_ui's text says
//     where the dashboard is or why a browser cannot reach it;
//   - the App itself in Chromium, framed by a host page that answers ui/initialize and forwards
//     its tools/call to the real server through the SDK client: the instance list renders, a
//     hostile description as text;
//   - desktop_url names the dashboard's live desktop over HTTP while a desktop is on, and is null
//     on stdio and while it is off.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { chromium } from 'playwright-core';

import { connectHttp, makeHttpHome, startServer } from './http_lib.mjs';
import { childEnv, connectClient, hostHas, makeHome, NSHPC_BINARY, removeHome, textOf, until } from './lib.mjs';

const APP_URI = 'ui://ns-hpc/dashboard';
const APP_MIME = 'text/html;profile=mcp-app';
const EXTENSION = 'io.modelcontextprotocol/ui';
const CHROMIUM = process.env.NSHPC_CHROMIUM || '/usr/bin/chromium-headless-shell';
const HOSTILE = '<img src=x onerror="parent.postMessage({pwned:1},\'*\')"><b>bold</b> & "quotes"';

const desktopSkip = ['Xvfb', 'xfwm4'].every(hostHas) ? false : 'the host has no Xvfb/Xfce (make deps installs them)';

const cache = process.getuid() === 0
  ? '/var/cache/ns-hpc-test'
  : path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'ns-hpc-test');
const imageSkip = fs.existsSync(path.join(cache, 'images', 'test'))
  ? false
  : `no image 'test' in ${cache} (scripts/test-image.sh, run by make test, builds it)`;

async function ok(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.ok(!r.isError, `${name}: ${textOf(r)}`);
  return r;
}

// What every face must offer: the extension, the App listed and read as ext-apps defines it.
async function checkApp(client) {
  assert.deepEqual(client.getServerCapabilities().extensions?.[EXTENSION], { mimeTypes: [APP_MIME] });
  const { resources } = await client.listResources();
  const listed = resources.find((r) => r.uri === APP_URI);
  assert.ok(listed, `resources/list: ${resources.map((r) => r.uri).join(', ')}`);
  assert.equal(listed.mimeType, APP_MIME);
  assert.deepEqual(listed._meta?.ui?.csp, { connectDomains: [], resourceDomains: [] });
  const read = await client.readResource({ uri: APP_URI });
  assert.equal(read.contents.length, 1);
  const [item] = read.contents;
  assert.equal(item.mimeType, APP_MIME);
  assert.deepEqual(item._meta?.ui?.csp, { connectDomains: [], resourceDomains: [] });
  const html = item.text;
  assert.match(html, /^<!doctype html>/i);
  assert.equal(listed.size, Buffer.byteLength(html));
  // One document: nothing it loads, no address outside it.
  assert.doesNotMatch(html, /\b(?:https?|wss?):\/\//i, 'an external URL');
  assert.doesNotMatch(html, /<script[^>]*\bsrc=|<link\b|<iframe\b|@import|url\(/i, 'something loaded');
  // Data goes in as text only.
  assert.doesNotMatch(html, /innerHTML|outerHTML|insertAdjacentHTML|document\.write/);
  return html;
}

// The App in Chromium, framed by a host page: the parent answers ui/initialize and forwards the
// App's tools/call to `client` (the real server). Returns {page, frame, requests, errors, calls}.
async function hostApp(browser, html, client) {
  const page = await browser.newPage();
  const requests = [];
  const errors = [];
  const calls = [];
  page.on('request', (r) => requests.push(r.url()));
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(e.message));
  await page.exposeFunction('forwardToolCall', async (params) => {
    calls.push(params.name);
    return client.callTool(params);
  });
  const pwned = [];
  await page.exposeFunction('reportForeign', (data) => pwned.push(data));
  await page.setContent(`<!doctype html><html><body>
    <iframe id="app" sandbox="allow-scripts" style="width:900px;height:500px"></iframe>
    <script>
      const frame = document.getElementById('app');
      window.addEventListener('message', async (event) => {
        if (event.source !== frame.contentWindow) return;
        const msg = event.data;
        if (!msg || msg.jsonrpc !== '2.0') { window.reportForeign(JSON.stringify(msg)); return; }
        const reply = (body) => frame.contentWindow.postMessage({ jsonrpc: '2.0', id: msg.id, ...body }, '*');
        if (msg.method === 'ui/initialize') {
          reply({ result: { protocolVersion: msg.params.protocolVersion, hostInfo: { name: 'test-host', version: '1' },
                            hostCapabilities: { serverTools: {} }, hostContext: { theme: 'light' } } });
        } else if (msg.method === 'tools/call') {
          try { reply({ result: await window.forwardToolCall(msg.params) }); }
          catch (e) { reply({ error: { code: -32603, message: String(e && e.message || e) } }); }
        } else if (msg.id !== undefined) {
          reply({ error: { code: -32601, message: 'not here: ' + msg.method } });
        }
      });
    </script></body></html>`);
  await page.evaluate((text) => {
    document.getElementById('app').srcdoc = text;
  }, html);
  const frame = await (await page.waitForSelector('#app')).contentFrame();
  return { page, frame, requests, errors, calls, pwned };
}

describe('the dashboard as an MCP App, over stdio', () => {
  let home;
  let run;
  before(async () => {
    home = makeHome('app', '[desktop]\nhost_root = true\n');
    run = await connectClient({ command: NSHPC_BINARY, args: ['--config', home.config, 'run'], env: childEnv(home) });
  });
  after(async () => {
    if (run) {
      await run.client.callTool({ name: 'stop_instance', arguments: { instance_id: 'desk' } }).catch(() => {});
      await run.close();
    }
    removeHome(home);
  });

  test('ns-hpc run: the App is listed and read as ext-apps defines it; list_instances opens it', async () => {
    await checkApp(run.client);
    const { tools } = await run.client.listTools();
    const opening = tools.filter((t) => t._meta?.ui?.resourceUri === APP_URI).map((t) => t.name);
    assert.deepEqual(opening, ['list_instances']);
  });

  test('the App in Chromium lists the instances through the host, a hostile description as text', {
    skip: !fs.existsSync(CHROMIUM) && `${CHROMIUM} is not installed`,
  }, async () => {
    await ok(run.client, 'create_instance', { instance_id: 'plain', description: 'a plain one' });
    await ok(run.client, 'create_instance', { instance_id: 'hostile', description: HOSTILE });
    const html = (await run.client.readResource({ uri: APP_URI })).contents[0].text;
    const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    try {
      const app = await hostApp(browser, html, run.client);
      const rows = app.frame.locator('#instances tbody tr');
      await rows.first().waitFor({ timeout: 15_000 });
      const table = await app.frame.$$eval('#instances tbody tr', (trs) =>
        trs.map((tr) => [...tr.children].map((td) => td.textContent)));
      const byId = Object.fromEntries(table.map((cells) => [cells[0], cells]));
      assert.deepEqual(Object.keys(byId).sort(), ['hostile', 'plain']);
      assert.equal(byId.plain[3], 'a plain one');
      assert.equal(byId.hostile[3], HOSTILE, 'the description is shown as the text it is');
      // Not markup: no element came of it, nothing ran, nothing was fetched.
      assert.equal(await app.frame.locator('#instances img, #instances b').count(), 0);
      const activity = await app.frame.$$eval('#activity li', (lis) => lis.map((li) => li.textContent));
      assert.ok(activity.some((l) => l.includes('hostile') && l.includes(HOSTILE)), activity.join('\n'));
      assert.match(await app.frame.textContent('#status'), /^2 instance\(s\)/);
      assert.deepEqual(app.calls, ['list_instances']);
      // Refresh asks again, and shows what changed.
      await ok(run.client, 'create_instance', { instance_id: 'later' });
      await app.frame.click('#refresh');
      await app.frame.locator('#instances td.id', { hasText: 'later' }).waitFor({ timeout: 10_000 });
      assert.deepEqual(app.calls, ['list_instances', 'list_instances']);
      assert.deepEqual(app.pwned, []);
      assert.deepEqual(app.requests.filter((u) => !u.startsWith('about:') && !u.startsWith('data:')), []);
      assert.deepEqual(app.errors, []);
      fs.mkdirSync(path.join(import.meta.dirname, 'screenshots'), { recursive: true });
      await app.page.screenshot({ path: path.join(import.meta.dirname, 'screenshots', 'mcp-app.png') });
    } finally {
      await browser.close();
    }
  });

  test('desktop_url is null on stdio, desktop on or off', { skip: desktopSkip }, async () => {
    await ok(run.client, 'create_instance', { instance_id: 'desk', persistent: true, network: 'off' });
    let described = (await ok(run.client, 'describe_instance', { instance_id: 'desk' })).structuredContent;
    assert.equal(described.desktop_url, null);
    const on = await ok(run.client, 'set_desktop_environment', { instance_id: 'desk', enabled: true });
    assert.equal(on.structuredContent.desktop_environment, true, textOf(on));
    described = (await ok(run.client, 'describe_instance', { instance_id: 'desk' })).structuredContent;
    assert.ok('desktop_url' in described);
    assert.equal(described.desktop_url, null);
  });
});

// A home for `ns-hpc computer`: computers on make test's image 'test'.
function computerHome(prefix) {
  const home = makeHome(prefix);
  const text = fs.readFileSync(home.config, 'utf8').replace('default_image = ""', 'default_image = "test"');
  fs.writeFileSync(home.config,
    text.replace('[namespace]\n', `[namespace]\nimages_dir = ${JSON.stringify(path.join(cache, 'images'))}\n`));
  return home;
}

describe('computer_ui on ns-hpc computer (stdio)', { skip: imageSkip }, () => {
  let home;
  let conn;
  before(async () => {
    home = computerHome('app-computer');
    conn = await connectClient({
      command: NSHPC_BINARY, args: ['--config', home.config, 'computer'],
      env: { ...childEnv(home), COMPUTER_ID: 'app-e2e' },
    });
  });
  after(async () => {
    if (conn) {
      await conn.client.callTool({ name: 'computer_delete', arguments: {} }).catch(() => {});
      await conn.close();
    }
    removeHome(home);
  });

  test('the App is listed and read; computer_ui opens it and its text says how to reach the dashboard', async () => {
    await checkApp(conn.client);
    const { tools } = await conn.client.listTools();
    const ui = tools.find((t) => t.name === 'computer_ui');
    assert.ok(ui, tools.map((t) => t.name).join(','));
    assert.deepEqual(ui._meta, { ui: { resourceUri: APP_URI } });
    assert.ok(ui.description.length <= 80, ui.description);
    const r = await ok(conn.client, 'computer_ui', {});
    const result = JSON.parse(textOf(r));
    assert.deepEqual(result, r.structuredContent);
    assert.equal(result.operation, 'idle');
    assert.equal(result.computer_id, 'app-e2e');
    assert.equal(result.resource_uri, APP_URI);
    assert.equal(result.url, APP_URI, 'on stdio no browser URL exists');
    assert.equal(result.desktop_url, null);
    assert.match(result.message, /stdio/);
    assert.match(result.message, /--transport http/);
  });
});

describe('desktop_url over HTTP', { skip: desktopSkip }, () => {
  let home;
  let server;
  let mcp;
  before(async () => {
    home = makeHttpHome('app-http', '[desktop]\nhost_root = true\n');
    server = await startServer(home);
    mcp = await connectHttp(server.url, { token: server.token });
    await ok(mcp.client, 'create_instance', { instance_id: 'seen', persistent: true, network: 'off' });
  });
  after(async () => {
    if (mcp) {
      await mcp.client.callTool({ name: 'stop_instance', arguments: { instance_id: 'seen' } }).catch(() => {});
      await mcp.close();
    }
    if (server) await server.stop();
    removeHome(home);
  });

  test('describe_instance names the dashboard\'s live desktop while the desktop is on', async () => {
    await checkApp(mcp.client);
    let r = await ok(mcp.client, 'describe_instance', { instance_id: 'seen' });
    assert.equal(r.structuredContent.desktop_url, null, 'no desktop yet');
    const on = await ok(mcp.client, 'set_desktop_environment', { instance_id: 'seen', enabled: true });
    assert.equal(on.structuredContent.desktop_environment, true, textOf(on));
    r = await ok(mcp.client, 'describe_instance', { instance_id: 'seen' });
    const expected = `http://127.0.0.1:${server.port}/#/instances/seen/desktop`;
    assert.equal(r.structuredContent.desktop_url, expected);
    assert.ok(textOf(r).includes(`Live desktop: ${expected}`), textOf(r));
    await ok(mcp.client, 'set_desktop_environment', { instance_id: 'seen', enabled: false });
    r = await ok(mcp.client, 'describe_instance', { instance_id: 'seen' });
    assert.equal(r.structuredContent.desktop_url, null, 'the desktop is off again');
  });
});

describe('computer_ui on ns-hpc computer over HTTP', { skip: imageSkip }, () => {
  const token = 'app-e2e-token-0123456789abcdef0123';
  let home;
  let proc;
  let mcp;
  let port;
  before(async () => {
    home = computerHome('app-computer-http');
    proc = spawn(NSHPC_BINARY, ['--config', home.config, 'computer', '--transport', 'http', '--port', '0',
      '--auth-token', token], { env: { ...childEnv(home), COMPUTER_ID: 'app-web' }, stdio: ['ignore', 'ignore', 'pipe'] });
    let text = '';
    proc.stderr.on('data', (chunk) => {
      text += chunk.toString();
    });
    assert.ok(await until(() => /listening on (\S+)/.test(text), 15_000), `the server did not start:\n${text}`);
    const url = text.match(/listening on (\S+)/)[1];
    port = Number(new URL(url).port);
    mcp = await connectHttp(url, { token });
  });
  after(async () => {
    if (mcp) {
      await mcp.client.callTool({ name: 'computer_delete', arguments: {} }).catch(() => {});
      await mcp.close();
    }
    if (proc) {
      proc.kill('SIGTERM');
      await new Promise((resolve) => (proc.exitCode !== null ? resolve() : proc.on('exit', resolve)));
    }
    removeHome(home);
  });

  test('computer_ui names the dashboard a browser opens', async () => {
    await checkApp(mcp.client);
    const r = await ok(mcp.client, 'computer_ui', {});
    const result = JSON.parse(textOf(r));
    assert.equal(result.url, `http://127.0.0.1:${port}/`);
    assert.equal(result.resource_uri, APP_URI);
    assert.ok(result.message.includes(`http://127.0.0.1:${port}/`), result.message);
    assert.equal(result.desktop_url, null, 'a headless computer has no live desktop');
  });
});
