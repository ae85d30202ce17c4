// [mcp] default_instance: terminal_execute and the job tools may leave instance_id out.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { connectNshpc, createInstance, makeHome, removeHome, textOf } from './lib.mjs';

let home;
let conn;

before(async () => {
  home = makeHome('default', '[mcp]\ndefault_instance = "main"\n');
  conn = await connectNshpc(home);
  await createInstance(conn.client, { instance_id: 'main' });
});

after(async () => {
  await conn?.close();
  if (home) removeHome(home);
});

test('instance_id is optional and named as the default in the schemas', async () => {
  const { tools } = await conn.client.listTools();
  for (const name of ['terminal_execute', 'submit_job', 'poll_job', 'list_jobs', 'cancel_job']) {
    const tool = tools.find((t) => t.name === name);
    assert.ok(tool, name);
    assert.ok(!(tool.inputSchema.required || []).includes('instance_id'), `${name} still requires instance_id`);
    assert.match(tool.inputSchema.properties.instance_id.description, /Default: 'main'/);
  }
});

test('calls without instance_id run in the default instance', async () => {
  const run = await conn.client.callTool({ name: 'terminal_execute', arguments: { command: 'echo $NS_HPC_INSTANCE' } });
  assert.ok(!run.isError, textOf(run));
  assert.equal(run.structuredContent.instance_id, 'main');
  assert.equal(run.structuredContent.stdout, 'main\n');
  const job = await conn.client.callTool({ name: 'submit_job', arguments: { command: 'echo job', timeout: 30 } });
  assert.equal(job.structuredContent.instance_id, 'main');
  assert.equal(job.structuredContent.stdout_tail, 'job');
  const list = await conn.client.callTool({ name: 'list_jobs', arguments: {} });
  assert.equal(list.structuredContent.total, 1);
  // An explicit instance_id still wins (and an unknown one is an error, not the default).
  const other = await conn.client.callTool({ name: 'terminal_execute', arguments: { instance_id: 'nope', command: 'true' } });
  assert.equal(other.isError, true);
  assert.match(textOf(other), /instance 'nope' not found/);
});
