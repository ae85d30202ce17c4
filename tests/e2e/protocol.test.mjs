// Raw JSON-RPC over `ns-hpc run`'s stdin/stdout: malformed and hostile input, lifecycle, exit.
import assert from 'node:assert/strict';
import { after, afterEach, describe, test } from 'node:test';

import { NSHPC_BINARY, RawChild, childEnv, makeHome, nshpcArgs, removeHome } from './lib.mjs';

const PROMPT_EXIT_MS = 5000;

// Every stdout line is a JSON-RPC 2.0 message.
function assertOnlyJsonRpc(child) {
  assert.ok(child.lines.length > 0, 'the server wrote something');
  child.lines.forEach((line, i) => {
    let msg;
    assert.doesNotThrow(() => {
      msg = JSON.parse(line);
    }, `stdout line ${i + 1} is JSON: ${line.slice(0, 200)}`);
    assert.equal(typeof msg, 'object', `line ${i + 1} is an object`);
    assert.equal(msg.jsonrpc, '2.0', `line ${i + 1} has jsonrpc "2.0": ${line.slice(0, 200)}`);
  });
  assert.equal(child.buffer, '', 'no unterminated output');
}

describe('ns-hpc run: raw protocol', () => {
  const homes = [];
  const children = [];

  function start(extraConfig = '') {
    const home = makeHome('proto', extraConfig);
    homes.push(home);
    const child = new RawChild(NSHPC_BINARY, nshpcArgs(home), childEnv(home));
    children.push(child);
    return child;
  }

  afterEach(async () => {
    while (children.length) await children.pop().kill();
  });
  after(() => {
    for (const h of homes) removeHome(h);
  });

  test('before initialize: requests are refused, ping is allowed', async () => {
    const c = start();
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
    const early = await c.request('tools/list');
    assert.ok(early.error, `tools/list before initialize is an error: ${JSON.stringify(early)}`);
    assert.equal(typeof early.error.code, 'number');
    assert.match(early.error.message, /initiali[sz]e/i);
    const init = await c.initialize();
    assert.equal(init.result.protocolVersion, '2025-11-25');
    assert.equal(init.result.serverInfo.name, 'ns-hpc');
    const list = await c.request('tools/list');
    assert.ok(Array.isArray(list.result.tools), 'tools/list works after initialize');
    assertOnlyJsonRpc(c);
  });

  test('protocol version negotiation', async () => {
    for (const version of ['2025-06-18', '2025-03-26', '2024-11-05']) {
      const c = start();
      const init = await c.initialize(version);
      assert.equal(init.result.protocolVersion, version, `echoes supported ${version}`);
      await c.kill();
    }
    const c = start();
    const init = await c.initialize('1999-01-01');
    assert.equal(init.result.protocolVersion, '2025-11-25', 'unsupported version: the server offers its newest');
  });

  test('malformed JSON gives -32700 and the next request is served', async () => {
    const c = start();
    await c.initialize();
    const err = await c.rawExpectError('{"jsonrpc": "2.0", "id": 1, "method": \n');
    assert.equal(err.error.code, -32700);
    const err2 = await c.rawExpectError('this is not json\n');
    assert.equal(err2.error.code, -32700);
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
    const list = await c.request('tools/list');
    assert.ok(list.result.tools.length >= 7);
    assertOnlyJsonRpc(c);
  });

  test('unknown method gives -32601', async () => {
    const c = start();
    await c.initialize();
    const res = await c.request('tools/frobnicate', {});
    assert.equal(res.error?.code, -32601, JSON.stringify(res));
    assert.match(res.error.message, /tools\/frobnicate/);
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
  });

  test('invalid params give -32602 naming the field', async () => {
    const c = start();
    await c.initialize();
    const noName = await c.request('tools/call', { arguments: {} });
    assert.equal(noName.error?.code, -32602, JSON.stringify(noName));
    assert.match(noName.error.message, /name/);
    const noUri = await c.request('resources/read', {});
    assert.equal(noUri.error?.code, -32602, JSON.stringify(noUri));
    assert.match(noUri.error.message, /uri/);
    const badUri = await c.request('resources/read', { uri: 42 });
    assert.equal(badUri.error?.code, -32602, JSON.stringify(badUri));
    assert.match(badUri.error.message, /uri/);
    const badArgs = await c.request('tools/call', { name: 'list_instances', arguments: 'nope' });
    assert.equal(badArgs.error?.code, -32602, JSON.stringify(badArgs));
    assert.match(badArgs.error.message, /arguments/);
    const unknownTool = await c.request('tools/call', { name: 'no_such_tool', arguments: {} });
    assert.equal(unknownTool.error?.code, -32602, JSON.stringify(unknownTool));
    assert.match(unknownTool.error.message, /no_such_tool/);
    const badLevel = await c.request('logging/setLevel', { level: 'loud' });
    assert.equal(badLevel.error?.code, -32602, JSON.stringify(badLevel));
    assert.match(badLevel.error.message, /level/);
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
    assertOnlyJsonRpc(c);
  });

  test('a reused request id is refused', async () => {
    const c = start();
    await c.initialize();
    const first = await c.request('ping', undefined, { id: 'dup-1' });
    assert.deepEqual(first.result, {});
    const from = c.messages.length;
    c.send({ jsonrpc: '2.0', id: 'dup-1', method: 'tools/list' });
    const second = await c.waitFor((m) => m.id === 'dup-1', { from, what: 'the reply to the reused id' });
    assert.ok(second.error, `reused id is an error: ${JSON.stringify(second)}`);
    assert.match(second.error.message, /already used|dup-1/);
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
  });

  test('a message over max_message_bytes is refused and the next one is served', async () => {
    const c = start('[mcp]\nmax_message_bytes = 4096\n');
    await c.initialize();
    const big = {
      jsonrpc: '2.0',
      id: 'big',
      method: 'tools/call',
      params: { name: 'create_instance', arguments: { description: 'x'.repeat(10 * 1024) } },
    };
    const from = c.messages.length;
    c.send(big);
    const err = await c.waitFor((m) => 'error' in m, { from, what: 'an error for the oversized message' });
    assert.equal(typeof err.error.code, 'number');
    assert.match(err.error.message, /4096|limit|large/i);
    const list = await c.request('tools/call', { name: 'list_instances', arguments: {} });
    assert.ok(list.result, JSON.stringify(list));
    assert.equal(list.result.structuredContent.count, 0, 'the oversized create did not run');
    assertOnlyJsonRpc(c);
  });

  test('deep nesting gives -32700', async () => {
    const c = start();
    await c.initialize();
    const deep = '['.repeat(200) + ']'.repeat(200);
    const err = await c.rawExpectError(deep + '\n');
    assert.equal(err.error.code, -32700);
    const deepParams = `{"jsonrpc":"2.0","id":77,"method":"ping","params":{"a":${deep}}}`;
    const err2 = await c.rawExpectError(deepParams + '\n');
    assert.equal(err2.error.code, -32700);
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
  });

  test('invalid UTF-8 gives -32700', async () => {
    const c = start();
    await c.initialize();
    const from = c.messages.length;
    const bytes = Buffer.concat([
      Buffer.from('{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":"'),
      Buffer.from([0xc3, 0x28, 0xff, 0xfe]),
      Buffer.from('"}}\n'),
    ]);
    c.writeRaw(bytes);
    const err = await c.waitFor((m) => 'error' in m, { from, what: 'an error for invalid UTF-8' });
    assert.equal(err.error.code, -32700, JSON.stringify(err));
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
    assertOnlyJsonRpc(c);
  });

  test('other invalid requests: batch, no jsonrpc, bad id type', async () => {
    const c = start();
    await c.initialize();
    const batch = await c.rawExpectError('[{"jsonrpc":"2.0","id":1,"method":"ping"}]\n');
    assert.equal(batch.error.code, -32600);
    const from = c.messages.length;
    c.writeRaw('{"id":"nojr","method":"ping"}\n');
    const noVersion = await c.waitFor((m) => m.id === 'nojr', { from, what: 'reply without jsonrpc' });
    assert.equal(noVersion.error?.code, -32600);
    const badId = await c.rawExpectError('{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}\n');
    assert.equal(badId.error.code, -32600);
    const pong = await c.request('ping');
    assert.deepEqual(pong.result, {});
    assertOnlyJsonRpc(c);
  });

  test('EOF on stdin: the process exits 0 promptly', async () => {
    const c = start();
    await c.initialize();
    await c.request('ping');
    const t0 = Date.now();
    c.proc.stdin.end();
    const exit = await c.waitExit(PROMPT_EXIT_MS);
    assert.ok(exit, `exited within ${PROMPT_EXIT_MS} ms of EOF`);
    assert.deepEqual(exit, { code: 0, signal: null }, `stderr: ${c.stderr.text.slice(-2000)}`);
    assert.ok(Date.now() - t0 < PROMPT_EXIT_MS);
    assertOnlyJsonRpc(c);
  });

  test('EOF right after an unterminated last line: it is answered, then exit 0', async () => {
    const c = start();
    c.writeRaw('{"jsonrpc":"2.0","id":"last","method":"ping"}');
    c.proc.stdin.end();
    const exit = await c.waitExit(PROMPT_EXIT_MS);
    assert.deepEqual(exit, { code: 0, signal: null });
    const reply = c.messages.find((m) => m && m.id === 'last');
    assert.deepEqual(reply?.result, {}, `the last line was answered: ${c.lines}`);
    assertOnlyJsonRpc(c);
  });

  test('SIGTERM: the process exits 0 promptly', async () => {
    const c = start();
    await c.initialize();
    await c.request('ping');
    c.proc.kill('SIGTERM');
    const exit = await c.waitExit(PROMPT_EXIT_MS);
    assert.ok(exit, `exited within ${PROMPT_EXIT_MS} ms of SIGTERM`);
    assert.deepEqual(exit, { code: 0, signal: null }, `stderr: ${c.stderr.text.slice(-2000)}`);
    assertOnlyJsonRpc(c);
  });

  test('stdout carries only JSON-RPC over a mixed session', async () => {
    const c = start();
    await c.initialize();
    await c.request('logging/setLevel', { level: 'debug' });
    await c.request('tools/list');
    await c.request('resources/list');
    await c.request('prompts/list');
    await c.request('tools/call', { name: 'create_instance', arguments: { instance_id: 'raw-1' } });
    await c.request('tools/call', { name: 'describe_instance', arguments: { instance_id: 'raw-1' } });
    await c.request('tools/call', { name: 'describe_instance', arguments: { instance_id: 'missing' } });
    await c.request('resources/read', { uri: 'resource://ns-hpc/context/ns-hpc.md' });
    await c.request('resources/read', { uri: 'resource://ns-hpc/instances/missing' });
    await c.request('prompts/get', { name: 'work_in_sandbox', arguments: { goal: 'g' } });
    c.send({ jsonrpc: '2.0', method: 'notifications/cancelled', params: { requestId: 12345 } });
    c.send({ jsonrpc: '2.0', method: 'notifications/unknown' });
    await c.request('ping');
    c.proc.stdin.end();
    const exit = await c.waitExit(PROMPT_EXIT_MS);
    assert.deepEqual(exit, { code: 0, signal: null });
    assertOnlyJsonRpc(c);
    // Every response answers a request we sent: ids are ours.
    for (const m of c.messages) {
      if ('result' in m || 'error' in m) assert.ok(m.id !== undefined);
    }
  });
});
