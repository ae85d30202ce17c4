// The web dashboard in a real browser (Debian's chromium-headless-shell driven by playwright-core):
// `ns-hpc run --transport streamable-http` on a temporary home, the login link it prints, then
// what a person does: see an instance an agent made, create one, run a job and watch its output
// stream, upload a file (and find it with read_file over MCP), switch the network, see a tool
// call arrive in the activity view, run doctor's checks. Throughout: a hostile description stays
// text, no request leaves loopback, nothing is written to the console as an error, no alert
// fires, the CSP header is there; and without the token every page and API route is 401.
// Screenshots of each view go to $NSHPC_SCREENSHOTS (default tests/e2e/screenshots/).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';

import { chromium } from 'playwright-core';

import { connectHttp, makeHttpHome, startServer } from './http_lib.mjs';
import { removeHome, textOf } from './lib.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.NSHPC_SCREENSHOTS || path.join(here, 'screenshots');
const CHROMIUM = process.env.NSHPC_CHROMIUM || '/usr/bin/chromium-headless-shell';
const HOSTILE = '<img src=x onerror=alert(1)>';
const CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; " +
  "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

describe('dashboard in a browser', { skip: !fs.existsSync(CHROMIUM) && `${CHROMIUM} is not installed` }, () => {
  let home;
  let server;
  let mcp;
  let browser;
  let page;
  let loginLink;
  const requests = [];
  const consoleErrors = [];
  const dialogs = [];
  const started = Date.now();

  async function ok(name, args) {
    const result = await mcp.client.callTool({ name, arguments: args });
    assert.notEqual(result.isError, true, `${name} ${JSON.stringify(args)} failed: ${textOf(result)}`);
    return result;
  }

  // The API as a script sees it (bearer token), to check what the page did.
  async function apiGet(p) {
    const r = await fetch(server.origin + p, { headers: { Authorization: `Bearer ${server.token}` } });
    const text = await r.text();
    assert.equal(r.status, 200, `GET ${p}: ${r.status} ${text}`);
    return JSON.parse(text);
  }

  async function shot(name) {
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS, `dashboard-${name}.png`), fullPage: true });
  }

  before(async () => {
    home = makeHttpHome('dashboard');
    server = await startServer(home);
    const line = server.stderr().match(/Dashboard: (http\S+)/);
    loginLink = line ? line[1] : null;
    mcp = await connectHttp(server.url, { token: server.token });
    // An instance an agent made, with a description that would be markup if the page let it.
    await ok('create_instance', { instance_id: 'seen', network: 'off', description: HOSTILE });

    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    const context = await browser.newContext({ viewport: { width: 1360, height: 860 } });
    page = await context.newPage();
    page.on('request', (r) => requests.push(r.url()));
    page.on('console', (m) => {
      if (m.type() === 'error') consoleErrors.push(m.text());
    });
    page.on('pageerror', (e) => consoleErrors.push(`page error: ${e.message}`));
    page.on('dialog', async (d) => {
      dialogs.push(`${d.type()}: ${d.message()}`);
      await d.dismiss();
    });
  });

  after(async () => {
    await browser?.close();
    await mcp?.close();
    await server?.stop();
    removeHome(home);
    console.log(`# dashboard browser tests took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  });

  test('without the token every page and API route is 401', async () => {
    const routes = ['/', '/?x=1', '/ui/0123456789abcdef/main.js', '/login-not', '/api/server', '/api/instances',
      '/api/instances/seen', '/api/instances/seen/jobs', '/api/instances/seen/files?path=/workspace',
      '/api/instances/seen/files/content?path=/workspace/x', '/api/activity', '/api/events', '/api/jobs/j1/output'];
    for (const p of routes) {
      for (const accept of ['application/json', 'text/html']) {
        const r = await fetch(server.origin + p, { headers: { Accept: accept }, redirect: 'manual' });
        assert.equal(r.status, 401, `GET ${p} (Accept ${accept}) without the token: ${r.status}`);
        await r.body?.cancel();
      }
    }
    for (const [method, p] of [['POST', '/api/instances'], ['DELETE', '/api/instances/seen'],
      ['PUT', '/api/instances/seen/network'], ['POST', '/api/server/doctor'], ['POST', '/api/instances/seen/jobs']]) {
      const r = await fetch(server.origin + p, { method, headers: { 'Content-Type': 'application/json' }, body: '{}' });
      assert.equal(r.status, 401, `${method} ${p} without the token: ${r.status}`);
    }
    // A wrong token is no better than none.
    const wrong = await fetch(`${server.origin}/api/instances`, { headers: { Authorization: 'Bearer nope' } });
    assert.equal(wrong.status, 401);
    const wrongLink = await fetch(`${server.origin}/login?code=0000`, { redirect: 'manual' });
    assert.notEqual(wrongLink.status, 303, 'a made-up login code opens no session');
    assert.equal(wrongLink.headers.get('set-cookie'), null);
  });

  test('logs in through the link and sees the instance an agent made', async () => {
    if (loginLink) {
      const response = await page.goto(loginLink);
      assert.equal(response.status(), 200);
    } else {
      // Until the server prints the Dashboard: line, the token typed into the login form.
      await page.goto(`${server.origin}/login`);
      await page.fill('input[name=token]', server.token);
      await Promise.all([page.waitForURL(`${server.origin}/**`), page.press('input[name=token]', 'Enter')]);
    }
    assert.equal(new URL(page.url()).pathname, '/', `landed on ${page.url()}`);
    const doc = await page.request.get(`${server.origin}/`);
    assert.equal(doc.headers()['content-security-policy'], CSP);
    const row = page.locator('tr[data-id="seen"]');
    await row.waitFor();
    assert.match(await page.locator('#live').textContent(), /live/);
    assert.equal(await row.locator('select').inputValue(), 'off');
  });

  test('a hostile description renders as text and adds no element', async () => {
    const desc = page.locator('tr[data-id="seen"] .desc');
    assert.equal(await desc.textContent(), HOSTILE);
    // index.html has one image (the logo); the description adds none.
    assert.equal(await page.locator('img').count(), 1);
    assert.equal(await page.locator('tr[data-id="seen"] img').count(), 0);
    await page.goto(`${server.origin}/#/instances/seen`);
    await page.locator('p.lead').filter({ hasText: HOSTILE }).waitFor();
    assert.equal(await page.locator('img').count(), 1);
    assert.deepEqual(dialogs, []);
    await page.goto(`${server.origin}/#/instances`);
    await page.locator('tr[data-id="seen"]').waitFor();
    await shot('instances');
  });

  test('creates an instance in the page', async () => {
    await page.getByRole('button', { name: 'New instance' }).click();
    const dialog = page.locator('dialog[open]');
    await dialog.waitFor();
    await dialog.getByLabel('ID').fill('made-in-page');
    await dialog.getByLabel('Description').fill('made by a person in the dashboard');
    await dialog.getByLabel('Network').selectOption('off');
    await shot('create-dialog');
    await dialog.getByRole('button', { name: 'Create' }).click();
    await page.locator('tr[data-id="made-in-page"]').waitFor();
    const made = await apiGet('/api/instances/made-in-page');
    assert.equal(made.id, 'made-in-page');
    assert.equal(made.description, 'made by a person in the dashboard');
    // And an agent sees it too.
    const listed = await ok('list_instances', {});
    assert.match(textOf(listed), /made-in-page/);
  });

  test('a destructive action asks first in the page, and Cancel keeps the instance', async () => {
    const row = page.locator('tr[data-id="made-in-page"]');
    await row.locator('summary').click();
    await row.getByRole('button', { name: 'Delete…' }).click();
    const dialog = page.locator('dialog[open]');
    await dialog.waitFor();
    assert.match(await dialog.textContent(), /Delete made-in-page\?/);
    await shot('confirm-dialog');
    await dialog.getByRole('button', { name: 'Cancel' }).click();
    await page.locator('dialog[open]').waitFor({ state: 'detached' });
    assert.equal((await apiGet('/api/instances/made-in-page')).id, 'made-in-page');
    assert.deepEqual(dialogs, [], 'no window.confirm');
    // Now for real.
    await row.locator('summary').click();
    await row.getByRole('button', { name: 'Delete…' }).click();
    await page.locator('dialog[open]').getByRole('button', { name: 'Delete' }).click();
    await row.waitFor({ state: 'detached' });
    const gone = await fetch(`${server.origin}/api/instances/made-in-page`, { headers: { Authorization: `Bearer ${server.token}` } });
    assert.equal(gone.status, 404);
  });

  test('runs a job and sees its output stream while it runs', async () => {
    await page.goto(`${server.origin}/#/instances/seen`);
    await page.getByLabel('Command').fill('for i in 1 2 3 4; do echo line-$i; sleep 1; done; echo oops >&2');
    await page.getByRole('button', { name: 'Run' }).click();
    const output = page.locator('pre.output');
    await output.filter({ hasText: 'line-1' }).waitFor({ timeout: 20_000 });
    const early = await output.textContent();
    assert.doesNotMatch(early, /line-4/, `the first line shows before the job ends: ${JSON.stringify(early)}`);
    await output.filter({ hasText: 'line-4' }).waitFor({ timeout: 20_000 });
    await page.locator('.output-box .muted').filter({ hasText: /exit 0/ }).waitFor({ timeout: 20_000 });
    assert.equal(await output.locator('.stderr').first().textContent(), 'oops\n');
    await shot('instance-jobs');
  });

  test('uploads a file in the page and read_file finds it', async () => {
    await page.getByRole('tab', { name: 'Files' }).click();
    await page.locator('#upload-input').setInputFiles({
      name: 'from-browser.txt', mimeType: 'text/plain', buffer: Buffer.from('uploaded through the dashboard: kestrel-2291\n'),
    });
    const row = page.locator('tr[data-name="from-browser.txt"]');
    await row.waitFor();
    const read = await ok('read_file', { instance_id: 'seen', path: '/workspace/from-browser.txt' });
    assert.match(textOf(read), /kestrel-2291/);
    // The download link is the content URL, which the cookie authenticates.
    const href = await row.locator('a').getAttribute('href');
    const got = await page.request.get(server.origin + href);
    assert.equal(got.status(), 200);
    assert.equal(await got.text(), 'uploaded through the dashboard: kestrel-2291\n');
    // A new folder, listed.
    await page.getByRole('button', { name: 'New folder…' }).click();
    await page.locator('dialog[open]').getByLabel('Name').fill('made-here');
    await page.locator('dialog[open]').getByRole('button', { name: 'Create' }).click();
    await page.locator('tr[data-name="made-here"]').waitFor();
    await shot('instance-files');
  });

  test('switches the network', async () => {
    await page.getByLabel('Network mode').selectOption('nat');
    await page.locator('#notice').filter({ hasText: /network nat/ }).waitFor();
    const inst = await apiGet('/api/instances/seen');
    assert.equal(inst.network, 'nat');
    await page.getByLabel('Network mode').selectOption('off');
    await page.locator('#notice').filter({ hasText: /network off/ }).waitFor();
    assert.equal((await apiGet('/api/instances/seen')).network, 'off');
  });

  test('a state-changing request with a foreign Origin is refused', async () => {
    const r = await page.request.post(`${server.origin}/api/instances`, {
      headers: { Origin: 'http://evil.example', 'Content-Type': 'application/json' }, data: { id: 'csrf' },
    });
    assert.equal(r.status(), 403);
    const none = await fetch(`${server.origin}/api/instances/csrf`, { headers: { Authorization: `Bearer ${server.token}` } });
    assert.equal(none.status, 404);
  });

  test('a tool call shows up in the activity view as it happens', async () => {
    await page.goto(`${server.origin}/#/activity?instance=seen`);
    await page.locator('#view[data-loaded="true"]').waitFor();
    await ok('terminal_execute', { instance_id: 'seen', command: 'echo activity-marker-7731' });
    const row = page.locator('table.activity tbody tr', { hasText: 'activity-marker-7731' });
    await row.first().waitFor({ timeout: 15_000 });
    assert.match(await row.first().textContent(), /terminal_execute/);
    // Each event once, though the page and the live stream overlap.
    await page.waitForTimeout(1500);
    assert.equal(await row.count(), 1);
    const ids = (await page.locator('table.activity pre.event-json').allTextContents()).map((t) => JSON.parse(t).id);
    assert.ok(ids.length > 3, `events shown: ${ids.length}`);
    assert.equal(new Set(ids).size, ids.length, `an event shown twice: ${ids}`);
    assert.equal(await page.locator('img').count(), 1);
    // The token never shows.
    assert.doesNotMatch(await page.locator('#view').textContent(), new RegExp(server.token));
    await shot('activity');
  });

  test('the server view shows the server and runs doctor', async () => {
    await page.goto(`${server.origin}/#/server`);
    await page.locator('#view[data-loaded="true"]').waitFor();
    assert.match(await page.locator('#view').textContent(), /ns-hpc run/);
    await page.getByRole('button', { name: 'Run checks' }).click();
    await page.locator('#view p').filter({ hasText: /Every check passed|Every required check passed|required checks? fails?/ }).waitFor({ timeout: 120_000 });
    await shot('server');
    await page.emulateMedia({ colorScheme: 'dark' });
    await page.goto(`${server.origin}/#/instances`);
    await page.locator('tr[data-id="seen"]').waitFor();
    await shot('instances-dark');
    await page.emulateMedia({ colorScheme: 'light' });
  });

  test('no request left loopback, no console error, no alert', async () => {
    assert.ok(requests.length > 10, `requests seen: ${requests.length}`);
    for (const u of requests) {
      const url = new URL(u);
      if (url.protocol === 'data:') continue;
      assert.ok(['127.0.0.1', 'localhost', '[::1]'].includes(url.hostname), `a request left loopback: ${u}`);
    }
    assert.deepEqual(consoleErrors, []);
    assert.deepEqual(dialogs, []);
  });
});
