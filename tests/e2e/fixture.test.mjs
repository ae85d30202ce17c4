// Progress, cancellation and concurrency of ns-hpc's MCP core, through the fixture server
// (tests/fixtures/mcp_fixture.cpp: tools `slow` and `echo`) and the SDK client.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { LoggingMessageNotificationSchema, McpError } from '@modelcontextprotocol/sdk/types.js';

import { NSHPC_FIXTURE, RawChild, childEnv, connectClient, makeHome, removeHome, sleep, textOf } from './lib.mjs';

const PROMPT_MS = 5000;

describe('MCP core through the fixture server', () => {
  let home;
  let conn;
  let client;
  const errors = []; // client.onerror: late progress / responses for finished requests land here
  const logs = [];

  before(async () => {
    home = makeHome('fixture');
    conn = await connectClient({ command: NSHPC_FIXTURE, args: [], env: childEnv(home) });
    client = conn.client;
    client.onerror = (err) => errors.push({ at: Date.now(), message: String(err?.message ?? err) });
    client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logs.push(n.params));
  });

  after(async () => {
    if (conn) await conn.close();
    removeHome(home);
  });

  // Resolves when `cond()` holds, polling; rejects after `timeout`.
  async function until(cond, timeout, what) {
    const end = Date.now() + timeout;
    while (!cond()) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
      await sleep(10);
    }
  }

  test('initialize against the fixture', () => {
    assert.equal(client.getServerVersion().name, 'ns-hpc-fixture');
    assert.equal(conn.negotiated(), '2025-11-25');
    const { tools } = client.getServerCapabilities();
    assert.ok(tools);
  });

  test('progress notifications arrive and increase', async () => {
    const progress = [];
    const result = await client.callTool({ name: 'slow', arguments: { steps: 8, step_ms: 20 } }, undefined, {
      onprogress: (p) => progress.push(p),
    });
    assert.ok(!result.isError, textOf(result));
    assert.match(textOf(result), /completed 8 steps/);
    assert.deepEqual(result.structuredContent, { steps: 8 });
    assert.ok(progress.length >= 2, `several progress notifications (got ${progress.length})`);
    for (let i = 1; i < progress.length; i++) {
      assert.ok(progress[i].progress > progress[i - 1].progress, `progress increases: ${JSON.stringify(progress)}`);
    }
    assert.ok(progress.every((p) => p.total === 8), 'total is given');
    assert.ok(progress.at(-1).progress <= 8);
    // Not asserted here: that the last step arrives. The SDK runs notification handlers in a
    // microtask but drops a request's progress handler as soon as its response is read, so a
    // progress notification read in the same chunk as the response is lost on the client side
    // (it lands in onerror as "unknown token"). The raw test below checks the wire order.
    assert.match(progress[0].message ?? '', /step 1 of 8/);
  });

  test('raw: every progress step is sent, in order, before the response', async () => {
    const raw = new RawChild(NSHPC_FIXTURE, [], childEnv(home));
    try {
      await raw.initialize();
      const from = raw.messages.length;
      const res = await raw.request('tools/call', {
        name: 'slow',
        arguments: { steps: 6, step_ms: 10 },
        _meta: { progressToken: 'tok-1' },
      });
      assert.ok(!res.result.isError, JSON.stringify(res));
      const upToResponse = raw.messages.slice(from, raw.messages.indexOf(res));
      const steps = upToResponse
        .filter((m) => m.method === 'notifications/progress')
        .map((m) => {
          assert.equal(m.params.progressToken, 'tok-1');
          return m.params.progress;
        });
      assert.deepEqual(steps, [1, 2, 3, 4, 5, 6]);
    } finally {
      await raw.kill();
    }
  });

  test('no progress without a progress token', async () => {
    const before = errors.length;
    const result = await client.callTool({ name: 'slow', arguments: { steps: 3, step_ms: 10 } });
    assert.ok(!result.isError);
    await sleep(100);
    assert.ok(
      !errors.slice(before).some((e) => /progress/.test(e.message)),
      `no stray progress: ${JSON.stringify(errors.slice(before))}`,
    );
  });

  test('cancellation: an aborted call rejects promptly and the server stops working on it', async () => {
    const controller = new AbortController();
    const progress = [];
    const started = Date.now();
    // 2000 steps of 50 ms: 100 s if nothing stops it.
    const call = client.callTool({ name: 'slow', arguments: { steps: 2000, step_ms: 50 } }, undefined, {
      signal: controller.signal,
      onprogress: (p) => progress.push(p),
      timeout: 300_000,
    });
    const settled = call.then(
      () => ({ ok: true, at: Date.now() }),
      (err) => ({ ok: false, err, at: Date.now() }),
    );
    await until(() => progress.length >= 2, PROMPT_MS, 'the slow call to report progress');
    const abortedAt = Date.now();
    controller.abort('e2e cancels');
    const outcome = await settled;
    assert.equal(outcome.ok, false, 'the aborted call rejects');
    assert.ok(outcome.at - abortedAt < PROMPT_MS, `rejected promptly (${outcome.at - abortedAt} ms)`);
    assert.ok(outcome.at - started < 20_000, 'well under the full 100 s');

    // The server honours notifications/cancelled: after a grace period no more progress (nor
    // a response) for the cancelled request reaches the client.
    await sleep(500);
    const mark = errors.length;
    await sleep(1000);
    const late = errors.slice(mark);
    assert.deepEqual(late, [], 'no progress or response after cancellation');

    // And the server is fine.
    await client.ping();
    const echo = await client.callTool({ name: 'echo', arguments: { message: 'after cancel' } });
    assert.equal(textOf(echo), 'after cancel');
  });

  test('ping and echo answer while a long call runs', async () => {
    const progress = [];
    let slowDoneAt = 0;
    const slow = client
      .callTool({ name: 'slow', arguments: { steps: 40, step_ms: 100 } }, undefined, {
        onprogress: (p) => progress.push(p),
        timeout: 120_000,
      })
      .then((r) => {
        slowDoneAt = Date.now();
        return r;
      });
    await until(() => progress.length >= 1, PROMPT_MS, 'the slow call to start');

    const t0 = Date.now();
    await client.ping();
    const pingDoneAt = Date.now();
    const logsBefore = logs.length;
    const echo = await client.callTool({ name: 'echo', arguments: { message: 'hello while slow' } });
    const echoDoneAt = Date.now();
    assert.equal(textOf(echo), 'hello while slow');
    assert.equal(slowDoneAt, 0, 'ping and echo finished before the slow call');
    assert.ok(pingDoneAt - t0 < PROMPT_MS, `ping took ${pingDoneAt - t0} ms`);
    assert.ok(echoDoneAt - pingDoneAt < PROMPT_MS, `echo took ${echoDoneAt - pingDoneAt} ms`);

    const result = await slow;
    assert.ok(!result.isError, textOf(result));
    assert.ok(slowDoneAt >= echoDoneAt);

    // echo logs at info (the default level): a notifications/message with its data.
    await until(
      () => logs.slice(logsBefore).some((l) => l.data?.echo === 'hello while slow'),
      PROMPT_MS,
      'the echo log message',
    );
    const log = logs.slice(logsBefore).find((l) => l.data?.echo === 'hello while slow');
    assert.equal(log.level, 'info');
  });

  test('two slow calls run concurrently', async () => {
    const steps = 20;
    const stepMs = 150; // 3 s each; 6 s if run one after the other
    const first = { progress: [], doneAt: 0 };
    const second = { progress: [], doneAt: 0 };
    const t0 = Date.now();
    const run = (box) =>
      client
        .callTool({ name: 'slow', arguments: { steps, step_ms: stepMs } }, undefined, {
          onprogress: (p) => box.progress.push({ ...p, at: Date.now() }),
          timeout: 120_000,
        })
        .then((r) => {
          box.doneAt = Date.now();
          return r;
        });
    const [r1, r2] = await Promise.all([run(first), run(second)]);
    const total = Date.now() - t0;
    assert.ok(!r1.isError && !r2.isError);
    // Order, not timing: each call made progress before the other one finished.
    assert.ok(first.progress.length > 0 && second.progress.length > 0);
    assert.ok(second.progress[0].at < first.doneAt, 'the second call started before the first finished');
    assert.ok(first.progress[0].at < second.doneAt, 'the first call started before the second finished');
    // Timing, generously: one call is 3 s, two in sequence would be at least 6 s.
    assert.ok(total < 5500, `both calls took ${total} ms together (sequential would be >= 6000 ms)`);
  });

  test('a tool error and an unknown tool', async () => {
    const bad = await client.callTool({ name: 'slow', arguments: { steps: 'many' } });
    assert.equal(bad.isError, true);
    assert.match(textOf(bad), /steps/);
    await assert.rejects(client.callTool({ name: 'nope', arguments: {} }), (err) => {
      assert.ok(err instanceof McpError);
      assert.equal(err.code, -32602);
      return true;
    });
    await client.ping();
  });
});
