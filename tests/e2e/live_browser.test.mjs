// The dashboard's live views in a real browser (chromium-headless-shell + playwright-core), on a
// server whose instances may run a desktop on the host's root ([desktop] host_root = true):
//   - Desktop tab: noVNC shows the instance's desktop (the canvas has real pixels), and what the
//     agent's `computer` tool types into Mousepad appears in it; the browser's clicks and keys do
//     nothing while view-only (no desktop.input in the audit, the text area unchanged), and after
//     "Take control" they reach the desktop (desktop.control and desktop.input with pointer and key
//     counts in the audit, the typed text appears);
//   - Terminal tab: xterm.js echoes `echo hi`, `stty size` follows the page's size, the exit code
//     is shown and Reconnect opens a new shell;
//   - throughout: the CSP header, no console error, no request or WebSocket off loopback.
// Screenshots of both widgets go to $NSHPC_SCREENSHOTS (default tests/e2e/screenshots/).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';

import { chromium } from 'playwright-core';

import { connectHttp, makeHttpHome, startServer } from './http_lib.mjs';
import { hostHas, removeHome, sleep, textOf, until } from './lib.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const SHOTS = process.env.NSHPC_SCREENSHOTS || path.join(here, 'screenshots');
const CHROMIUM = process.env.NSHPC_CHROMIUM || '/usr/bin/chromium-headless-shell';
const CSP = "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; script-src 'self'; " +
  "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

const skip = !fs.existsSync(CHROMIUM)
  ? `${CHROMIUM} is not installed`
  : !['Xvfb', 'xfwm4', 'x11vnc', 'mousepad'].every(hostHas) && 'the host has no Xvfb/Xfce/x11vnc/Mousepad (make deps installs them)';

describe('live desktop and terminal in a browser', { skip }, () => {
  let home;
  let server;
  let mcp;
  let browser;
  let page;
  const requests = [];
  const consoleErrors = [];
  const started = Date.now();

  async function ok(name, args) {
    const result = await mcp.client.callTool({ name, arguments: args });
    assert.notEqual(result.isError, true, `${name} ${JSON.stringify(args)} failed: ${textOf(result)}`);
    return result;
  }

  function audit(event) {
    const file = path.join(home.instancesDir, 'live', 'audit.log');
    if (!fs.existsSync(file)) return [];
    return fs.readFileSync(file, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)).filter((l) => l.event === event);
  }

  async function shot(name) {
    fs.mkdirSync(SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(SHOTS, `dashboard-${name}.png`), fullPage: true });
  }

  // Pixels of the noVNC canvas (at the desktop's own size, whatever the scaling) in a rectangle:
  // how many differ clearly from the rectangle's most common colour, and how many colours there are.
  function inkIn(rect) {
    return page.evaluate(([x, y, w, h]) => {
      const canvas = document.querySelector('.desktop-screen canvas');
      const data = canvas.getContext('2d').getImageData(x, y, w, h).data;
      const counts = new Map();
      for (let i = 0; i < data.length; i += 4) {
        const c = (data[i] << 16) | (data[i + 1] << 8) | data[i + 2];
        counts.set(c, (counts.get(c) ?? 0) + 1);
      }
      const bg = [...counts.entries()].sort((a, b) => b[1] - a[1])[0][0];
      const [r, g, b] = [bg >> 16, (bg >> 8) & 255, bg & 255];
      let ink = 0;
      for (let i = 0; i < data.length; i += 4)
        if (Math.abs(data[i] - r) + Math.abs(data[i + 1] - g) + Math.abs(data[i + 2] - b) > 120) ink++;
      return { ink, colours: counts.size, size: [canvas.width, canvas.height] };
    }, rect);
  }

  // Waits for the live view's status line to say `text`; fails with what it says instead.
  async function statusSays(text, timeout = 10_000) {
    let now = '';
    const ok = await until(async () => {
      now = (await page.locator('#view .tabpanel:not([hidden]) .live-status').textContent()) ?? '';
      return now.includes(text);
    }, timeout);
    assert.ok(ok, `the status line says ${JSON.stringify(now)}, not ${JSON.stringify(text)}`);
  }

  // The terminal's screen as text lines (xterm's DOM renderer).
  function terminalLines() {
    return page.evaluate(() => [...document.querySelectorAll('.terminal-screen .xterm-rows > div')].map((d) => d.textContent.trimEnd()));
  }

  before(async () => {
    home = makeHttpHome('live-browser', '[desktop]\nhost_root = true\n');
    server = await startServer(home);
    mcp = await connectHttp(server.url, { token: server.token });
    await ok('create_instance', { instance_id: 'live', persistent: true, network: 'off' });
    await ok('set_desktop_environment', { instance_id: 'live', enabled: true });

    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    const context = await browser.newContext({ viewport: { width: 1360, height: 900 } });
    page = await context.newPage();
    page.on('request', (r) => requests.push(r.url()));
    page.on('websocket', (ws) => requests.push(ws.url()));
    page.on('console', (m) => {
      if (m.type() === 'error') consoleErrors.push(m.text());
    });
    page.on('pageerror', (e) => consoleErrors.push(`page error: ${e.message}`));
    const line = server.stderr().match(/Dashboard: (http\S+)/);
    if (line) {
      assert.equal((await page.goto(line[1])).status(), 200);
    } else {
      await page.goto(`${server.origin}/login`);
      await page.fill('input[name=token]', server.token);
      await Promise.all([page.waitForURL(`${server.origin}/**`), page.press('input[name=token]', 'Enter')]);
    }
  });

  after(async () => {
    await browser?.close();
    if (mcp) {
      await mcp.client.callTool({ name: 'stop_instance', arguments: { instance_id: 'live' } }).catch(() => {});
      await mcp.close();
    }
    await server?.stop();
    removeHome(home);
    console.log(`# live browser tests took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  });

  test('the page carries the CSP, and the first load has neither noVNC nor xterm.js', async () => {
    const doc = await page.request.get(`${server.origin}/`);
    assert.equal(doc.headers()['content-security-policy'], CSP);
    await page.goto(`${server.origin}/#/instances/live`);
    await page.locator('[role=tab]', { hasText: 'Desktop' }).waitFor();
    assert.deepEqual(requests.filter((u) => /\/ui\/[^/]+\/(vendor|live)\//.test(u)), []);
  });

  test('the desktop: pixels, the agent typing shows, view-only ignores the browser, control delivers', async () => {
    // Mousepad, opened by the agent, waits for text.
    await ok('terminal_execute', { instance_id: 'live', command: 'setsid mousepad /workspace/note.txt >/dev/null 2>&1 </dev/null &' });
    let win;
    assert.ok(await until(async () => {
      const r = await mcp.client.callTool({ name: 'list_windows', arguments: { instance_id: 'live' } });
      win = r.structuredContent?.windows?.find((w) => w.title.includes('note.txt'));
      return Boolean(win);
    }, 20_000), 'the Mousepad window');

    await page.locator('[role=tab]', { hasText: 'Desktop' }).click();
    await statusSays('Live, view only', 15_000);
    assert.ok(requests.some((u) => u.includes('/vendor/novnc/core/rfb.js')), 'noVNC loaded when the tab opened');
    assert.ok(!requests.some((u) => u.includes('/vendor/xterm/')), 'xterm.js is not loaded for the desktop');
    // The whole screen: a real desktop, not one colour.
    let whole;
    assert.ok(await until(async () => {
      whole = await inkIn([0, 0, 1280, 800]);
      return whole.colours > 20;
    }, 10_000), `the canvas shows a desktop: ${JSON.stringify(whole)}`);
    assert.deepEqual(whole.size, [1280, 800]);

    // The first lines of Mousepad's text area (the window's frame starts at win.y; then its title
    // and menu bars).
    const area = [win.x + 10, win.y + 58, Math.min(600, win.width - 30), 40];
    await sleep(1500);  // frames settle
    const before = await inkIn(area);
    await ok('computer', {
      instance_id: 'live',
      actions: [
        { action: 'left_click', coordinate: [win.x + 100, win.y + 130] },
        { action: 'type', text: 'WWWW MMMM typed by the agent' },
      ],
    });
    let afterAgent;
    assert.ok(await until(async () => {
      afterAgent = await inkIn(area);
      return afterAgent.ink > before.ink + 300;
    }, 10_000), `the agent's text shows in the browser: ink ${before.ink} → ${afterAgent.ink}`);
    await shot('desktop-view-only');

    // View-only: the browser's click and keys go nowhere.
    const canvas = page.locator('.desktop-screen canvas');
    const box = await canvas.boundingBox();
    const scale = box.width / 1280;
    const at = (x, y) => [box.x + x * scale, box.y + y * scale];
    await page.mouse.click(...at(win.x + 100, win.y + 160));
    await page.keyboard.type('QQQQQQQQ');
    await sleep(2500);  // beyond the relay's audit batch interval
    const still = await inkIn(area);
    assert.ok(Math.abs(still.ink - afterAgent.ink) < 100, `view-only: the text area did not change (${afterAgent.ink} → ${still.ink})`);
    assert.equal(audit('desktop.input').length, 0, 'no input passed while view-only');
    assert.equal(audit('desktop.control').length, 0);

    // Take control: audited, and the browser's click and keys now reach Mousepad.
    await page.getByRole('button', { name: 'Take control' }).click();
    await statusSays('in control', 5000);
    assert.equal(await page.getByRole('button', { name: 'Give back control' }).getAttribute('aria-pressed'), 'true');
    await page.mouse.click(...at(win.x + 100, win.y + 130));
    await page.keyboard.press('End');
    await page.keyboard.type(' MMMMWWWW MMMMWWWW from the browser');
    let afterBrowser;
    assert.ok(await until(async () => {
      afterBrowser = await inkIn(area);
      return afterBrowser.ink > afterAgent.ink + 300;
    }, 10_000), `the browser's typing shows: ink ${afterAgent.ink} → ${afterBrowser.ink}`);
    await shot('desktop-in-control');
    let input = [];
    assert.ok(await until(() => {
      input = audit('desktop.input');
      return input.reduce((n, l) => n + l.pointer, 0) > 0 && input.reduce((n, l) => n + l.keys, 0) > 0;
    }, 10_000), `desktop.input with pointer and keys: ${JSON.stringify(input)}`);
    const control = audit('desktop.control');
    assert.equal(control.length, 1);
    assert.equal(control[0].enabled, true);
    // What the browser typed is in the file once saved (a key combination through noVNC, too).
    await page.keyboard.press('Control+s');
    let saved;
    assert.ok(await until(async () => {
      const r = await mcp.client.callTool({ name: 'terminal_execute', arguments: { instance_id: 'live', command: 'cat /workspace/note.txt' } });
      saved = r.structuredContent?.stdout ?? '';
      return saved.includes('from the browser');
    }, 10_000), `note.txt holds ${JSON.stringify(saved)}`);
    assert.ok(saved.includes('typed by the agent') && !saved.includes('QQQQ'), `note.txt: ${JSON.stringify(saved)}`);

    // Giving control back: view-only again.
    await page.getByRole('button', { name: 'Give back control' }).click();
    await statusSays('Live, view only', 5000);
  });

  test('the terminal: echo, resize, exit code, reconnect', async () => {
    await page.locator('[role=tab]', { hasText: 'Terminal' }).click();
    await statusSays('Live: a shell', 15_000);
    assert.ok(requests.some((u) => u.includes('/vendor/xterm/xterm.mjs')), 'xterm.js loaded when the tab opened');
    await page.locator('.terminal-screen .xterm-helper-textarea').focus();
    await page.keyboard.type('echo hi\n');
    let lines = [];
    assert.ok(await until(async () => {
      lines = await terminalLines();
      return lines.includes('hi');
    }, 10_000), `the terminal shows hi: ${JSON.stringify(lines)}`);

    let asked = 0;
    const size = async () => {
      asked += 1;
      await page.keyboard.type(`echo size${asked} $(stty size)\n`);
      let found;
      const shape = new RegExp(`^size${asked} (\\d+) (\\d+)$`);
      assert.ok(await until(async () => {
        lines = await terminalLines();
        found = lines.map((l) => shape.exec(l)).find(Boolean);
        return Boolean(found);
      }, 10_000), `stty size: ${JSON.stringify(lines)}`);
      return [Number(found[1]), Number(found[2])];
    };
    const rowsShown = () => page.evaluate(() => document.querySelectorAll('.terminal-screen .xterm-rows > div').length);
    const first = await size();
    assert.equal(first[0], await rowsShown(), 'the shell has as many rows as the page shows');
    await shot('terminal');
    await page.setViewportSize({ width: 900, height: 650 });
    assert.ok(await until(async () => (await rowsShown()) !== first[0], 5000), 'the terminal refits to the smaller page');
    const second = await size();
    assert.equal(second[0], await rowsShown(), 'stty size follows the resize');
    assert.ok(second[0] < first[0] && second[1] < first[1], `${first} → ${second}`);

    await page.keyboard.type('exit 3\n');
    await statusSays('exit code 3', 10_000);
    await page.getByRole('button', { name: 'Reconnect' }).click();
    await statusSays('Live: a shell', 15_000);
    await page.locator('.terminal-screen .xterm-helper-textarea').focus();
    await page.keyboard.type('echo again$((1+1))\n');
    assert.ok(await until(async () => (await terminalLines()).includes('again2'), 10_000), 'a new shell after Reconnect');
    await page.setViewportSize({ width: 1360, height: 900 });
  });

  test("describe_instance's desktop_url opens the instance on its live desktop", async () => {
    const described = await ok('describe_instance', { instance_id: 'live' });
    const url = described.structuredContent?.desktop_url;
    assert.match(url ?? '', /\/#\/instances\/live\/desktop$/, JSON.stringify(described.structuredContent));
    await page.goto(url);
    await page.locator('[role=tab][aria-selected=true]', { hasText: 'Desktop' }).waitFor({ timeout: 10_000 });
    await statusSays('Live, view only', 15_000);
    await page.goto(url.replace(/\/desktop$/, '/terminal'));
    await page.locator('[role=tab][aria-selected=true]', { hasText: 'Terminal' }).waitFor({ timeout: 10_000 });
  });

  test('no request left loopback, no console error', async () => {
    assert.ok(requests.length > 10, `requests seen: ${requests.length}`);
    for (const u of requests) {
      const url = new URL(u);
      assert.ok(['127.0.0.1', 'localhost', '[::1]'].includes(url.hostname), `a request left loopback: ${u}`);
    }
    assert.ok(requests.some((u) => u.startsWith('ws://') && u.endsWith('/desktop/live/vnc')), 'the desktop WebSocket');
    assert.ok(requests.some((u) => u.startsWith('ws://') && u.includes('/terminal/live?rows=')), 'the terminal WebSocket');
    assert.deepEqual(consoleErrors, []);
  });
});
