// End-to-end tests of the desktop with the official MCP SDK over stdio, for both entry points:
//   - `ns-hpc computer` with DESKTOP_ENVIRONMENT=true on make test's desktop image 'test-desktop'
//     (as root, after scripts/test-image.sh built it): every result says desktop_environment,
//     the screen shows Xfce, set_desktop_environment switches it with tools/list_changed and the
//     screen tools appear and go, restart and factory reset keep it, a headless computer answers
//     the seed's message;
//   - `ns-hpc run` on the host's root ([desktop] host_root, the host's Xfce): the agent turns the
//     desktop on, starts a program with terminal_execute and sees its window, types into it and
//     reads back what it wrote.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { ToolListChangedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';

import { childEnv, connectClient, connectNshpc, hostHas, makeHome, NSHPC_BINARY, removeHome, textOf, until } from './lib.mjs';

const root = process.getuid() === 0;
const cache = '/var/cache/ns-hpc-test';
const haveDesktopImage = root && fs.existsSync(path.join(cache, 'images', 'test-desktop'));
const haveImage = root && fs.existsSync(path.join(cache, 'images', 'test'));
const computerSkip = haveDesktopImage && haveImage
  ? false
  : "as root, with images 'test' and 'test-desktop' in /var/cache/ns-hpc-test (scripts/test-image.sh builds them)";

const hostSkip = ['Xvfb', 'xfwm4', 'xfce4-panel', 'mousepad'].every(hostHas)
  ? false
  : 'the host has no Xvfb/Xfce/Mousepad (make deps installs the desktop group)';

const SCREEN_TOOLS = ['computer', 'look_at_screen', 'click', 'type', 'scroll', 'list_windows', 'switch_window',
  'maximize_window', 'restore_window', 'minimize_window', 'close_window', 'move_window', 'clipboard', 'open'];

async function toolNames(client) {
  return (await client.listTools()).tools.map((t) => t.name);
}

function imageOf(result) {
  return result.content.find((c) => c.type === 'image');
}

// Width and height of a PNG or JPEG.
function imageSize(image) {
  const b = Buffer.from(image.data, 'base64');
  if (image.mimeType === 'image/png') return [b.readUInt32BE(16), b.readUInt32BE(20)];
  for (let i = 2; i < b.length;) {
    const marker = b[i + 1];
    const length = b.readUInt16BE(i + 2);
    if (marker >= 0xc0 && marker <= 0xc2) return [b.readUInt16BE(i + 7), b.readUInt16BE(i + 5)];
    i += 2 + length;
  }
  return [0, 0];
}

describe('the desktop of ns-hpc computer', { skip: computerSkip }, () => {
  let home;
  let conn;
  const changed = [];
  before(async () => {
    home = makeHome('desktop-computer', `[desktop]\nimage = "test-desktop"\n`);
    const text = fs.readFileSync(home.config, 'utf8')
      .replace('default_image = ""', 'default_image = "test"')
      .replace('[namespace]\n', `[namespace]\nimages_dir = ${JSON.stringify(path.join(cache, 'images'))}\n`);
    fs.writeFileSync(home.config, text);
    conn = await connectClient({
      command: NSHPC_BINARY,
      args: ['--config', home.config, 'computer'],
      env: { ...childEnv(home), COMPUTER_ID: 'desk-e2e', DESKTOP_ENVIRONMENT: 'true' },
      name: 'desktop-e2e',
    });
    conn.client.setNotificationHandler(ToolListChangedNotificationSchema, () => changed.push(Date.now()));
  });
  after(async () => {
    if (conn) {
      await conn.client.callTool({ name: 'computer_delete', arguments: {} }).catch(() => {});
      await conn.close();
    }
    removeHome(home);
  });

  test('DESKTOP_ENVIRONMENT=true: the computer runs Xfce, and every result says so', async () => {
    const r = await conn.client.callTool({ name: 'terminal_execute', arguments: { command: 'echo $DISPLAY; pgrep -c xfwm4' } });
    const body = JSON.parse(textOf(r));
    assert.equal(body.desktop_environment, true, textOf(r));
    assert.equal(body.desktop_url, null);
    assert.equal(body.stdout, ':0\n1\n', textOf(r));
    const names = await toolNames(conn.client);
    for (const t of SCREEN_TOOLS) assert.ok(names.includes(t), t);
    const shot = await conn.client.callTool({ name: 'computer', arguments: { action: 'screenshot', format: 'png' } });
    assert.ok(!shot.isError, textOf(shot));
    assert.deepEqual(imageSize(imageOf(shot)), [1280, 800]);
    assert.match(textOf(shot), /Screen 1280x800/);
    // Xfce's panel is a window of the desktop.
    const windows = await conn.client.callTool({ name: 'list_windows', arguments: {} });
    assert.ok(!windows.isError, textOf(windows));
  });

  test('set_desktop_environment switches in place with list_changed; restart and factory reset keep it', async () => {
    await conn.client.callTool({ name: 'terminal_execute', arguments: { command: 'echo kept > /workspace/kept.txt' } });
    let mark = changed.length;
    const off = await conn.client.callTool({ name: 'set_desktop_environment', arguments: { enabled: false } });
    assert.equal(JSON.parse(textOf(off)).desktop_environment, false, textOf(off));
    assert.ok(await until(() => changed.length > mark, 5000), 'notifications/tools/list_changed');
    assert.ok(!(await toolNames(conn.client)).includes('computer'));
    const refused = await conn.client.callTool({ name: 'computer', arguments: { action: 'screenshot' } });
    assert.ok(refused.isError);
    assert.match(textOf(refused), /set_desktop_environment/);

    mark = changed.length;
    const on = await conn.client.callTool({ name: 'set_desktop_environment', arguments: { enabled: true } });
    assert.equal(JSON.parse(textOf(on)).desktop_environment, true, textOf(on));
    assert.ok(await until(() => changed.length > mark, 5000), 'notifications/tools/list_changed');
    assert.ok((await toolNames(conn.client)).includes('computer'));
    const kept = await conn.client.callTool({ name: 'terminal_execute', arguments: { command: 'cat /workspace/kept.txt' } });
    assert.equal(JSON.parse(textOf(kept)).stdout, 'kept\n');

    await conn.client.callTool({ name: 'computer_restart', arguments: {} });
    const after = await conn.client.callTool({ name: 'terminal_execute', arguments: { command: 'pgrep -c Xvfb' } });
    assert.equal(JSON.parse(textOf(after)).desktop_environment, true);
    assert.equal(JSON.parse(textOf(after)).stdout, '1\n', textOf(after));

    const reset = await conn.client.callTool({ name: 'computer_factory_reset', arguments: {} });
    assert.ok(!reset.isError, textOf(reset));
    const shot = await conn.client.callTool({ name: 'computer', arguments: { action: 'screenshot' } });
    assert.ok(!shot.isError, textOf(shot));
    assert.deepEqual(imageSize(imageOf(shot)), [1280, 800]);
  });

  test('a headless computer answers the seed message and stays as it was', async () => {
    const made = await conn.client.callTool({ name: 'computer_create', arguments: { computer_id: 'headless-e2e' } });
    assert.ok(!made.isError, textOf(made));
    const r = await conn.client.callTool({
      name: 'set_desktop_environment', arguments: { enabled: true, computer_id: 'headless-e2e' },
    });
    assert.ok(r.isError);
    assert.deepEqual(JSON.parse(textOf(r)), {
      error: 'This existing computer was created from a headless or custom image and cannot start Xfce in place. '
        + 'Its data was left untouched; use factory_reset_computer only if replacing it is intentional.',
    });
  });
});

describe('the desktop of ns-hpc run on the host root', { skip: hostSkip }, () => {
  let home;
  let conn;
  before(async () => {
    home = makeHome('desktop-run', `[desktop]\nhost_root = true\n`);
    conn = await connectNshpc(home, { name: 'desktop-run-e2e' });
    const made = await conn.client.callTool({
      name: 'create_instance', arguments: { instance_id: 'screen', persistent: true, network: 'off' },
    });
    assert.ok(!made.isError, textOf(made));
  });
  after(async () => {
    if (conn) {
      await conn.client.callTool({ name: 'stop_instance', arguments: { instance_id: 'screen' } }).catch(() => {});
      await conn.close();
    }
    removeHome(home);
  });

  test('an agent turns the desktop on, opens a program, sees its window and types into it', async () => {
    const on = await conn.client.callTool({ name: 'set_desktop_environment', arguments: { instance_id: 'screen', enabled: true } });
    assert.ok(!on.isError, textOf(on));
    const start = await conn.client.callTool({
      name: 'terminal_execute',
      arguments: { instance_id: 'screen', command: 'setsid mousepad /workspace/note.txt >/dev/null 2>&1 </dev/null &' },
    });
    assert.ok(!start.isError, textOf(start));
    let window;
    assert.ok(await until(async () => {
      const r = await conn.client.callTool({ name: 'list_windows', arguments: { instance_id: 'screen' } });
      window = r.structuredContent?.windows?.find((w) => w.title.includes('note.txt'));
      return Boolean(window);
    }, 20000), 'the Mousepad window');
    const batch = await conn.client.callTool({
      name: 'computer',
      arguments: {
        instance_id: 'screen',
        actions: [
          { action: 'left_click', coordinate: [window.x + 100, window.y + 120] },
          { action: 'type', text: 'hello 😀' },
          { action: 'key', text: 'ctrl+s' },
        ],
      },
    });
    assert.ok(!batch.isError, textOf(batch));
    assert.ok(imageOf(batch), 'a screenshot after the batch');
    let saved;
    assert.ok(await until(async () => {
      const r = await conn.client.callTool({
        name: 'terminal_execute', arguments: { instance_id: 'screen', command: 'cat /workspace/note.txt' },
      });
      saved = r.structuredContent?.stdout;
      return saved === 'hello 😀';
    }, 10000), `note.txt holds ${JSON.stringify(saved)}`);
  });
});
