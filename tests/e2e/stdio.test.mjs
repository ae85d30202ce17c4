// End-to-end tests of `ns-hpc run` (stdio) through the MCP TypeScript SDK client.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  McpError,
  ResourceListChangedNotificationSchema,
  ResourceUpdatedNotificationSchema,
} from '@modelcontextprotocol/sdk/types.js';

import {
  ajv,
  compileSchema,
  connectNshpc,
  makeHome,
  removeHome,
  sleep,
  textOf,
} from './lib.mjs';

const TOOL_NAMES = [
  'create_instance',
  'list_instances',
  'list_archived_instances',
  'describe_instance',
  'update_instance',
  'archive_instance',
  'restore_instance',
  'delete_instance',
];
const BUILTIN_DOCS = ['ns-hpc.md', 'jobs.md', 'sandbox.md', 'slurm.md'];
const CONTEXT = 'resource://ns-hpc/context/';
const INSTANCE = 'resource://ns-hpc/instances/';
const CUSTOM_DOC = 'e2e-custom-notes.md';
const CUSTOM_TEXT = '# E2E custom notes\n\nThe marker is zebra-7781.\n';

// Polls `cond` until it is true or `timeout` ms pass.
async function eventually(cond, timeout = 5000, what = 'condition') {
  const end = Date.now() + timeout;
  while (Date.now() < end) {
    if (cond()) return;
    await sleep(25);
  }
  assert.fail(`timed out waiting for ${what}`);
}

describe('ns-hpc run over stdio (SDK client)', () => {
  let home;
  let conn;
  let client;
  const validators = {}; // tool name -> {input, output}
  const tools = {}; // tool name -> tool
  const updated = []; // notifications/resources/updated params
  const listChanged = []; // notifications/resources/list_changed params
  const auditWarnings = []; // tool results that reported an audit failure

  before(async () => {
    home = makeHome('stdio');
    fs.writeFileSync(path.join(home.contextDir, CUSTOM_DOC), CUSTOM_TEXT);
    fs.writeFileSync(path.join(home.contextDir, 'not-a-doc.txt'), 'not matched by *.md\n');
    conn = await connectNshpc(home);
    client = conn.client;
    client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => {
      updated.push(n.params);
    });
    client.setNotificationHandler(ResourceListChangedNotificationSchema, (n) => {
      listChanged.push(n.params ?? {});
    });
  });

  after(async () => {
    if (conn) await conn.close();
    removeHome(home);
  });

  // Calls a tool, checks the result against the tool's outputSchema when it is not an error.
  async function call(name, args) {
    const result = await client.callTool({ name, arguments: args });
    assert.ok(Array.isArray(result.content), `${name}: content is an array`);
    // Auditing is the server's business: a call must never come back with an audit failure.
    // Collected here, asserted by its own test so the other checks still run.
    if (/audit log not written/.test(textOf(result))) {
      auditWarnings.push(`${name}(${JSON.stringify(args)}): ${textOf(result)}`);
    }
    if (!result.isError && validators[name]?.output) {
      assert.ok(result.structuredContent, `${name}: structuredContent present`);
      const problem = validators[name].output(result.structuredContent);
      assert.equal(problem, null, `${name}: structuredContent matches outputSchema: ${problem}`);
    }
    return result;
  }

  async function expectToolError(name, args, pattern) {
    const result = await call(name, args);
    assert.equal(result.isError, true, `${name}(${JSON.stringify(args)}) should be an error: ${JSON.stringify(result)}`);
    const text = textOf(result);
    assert.ok(text.length > 0, 'the error has a message');
    assert.match(text, pattern, `${name}(${JSON.stringify(args)}) error message`);
    // The server keeps working after a tool error.
    await client.ping();
    return text;
  }

  test('initialize: server info, instructions, capabilities, protocol version', () => {
    const info = client.getServerVersion();
    assert.equal(info.name, 'ns-hpc');
    assert.equal(typeof info.version, 'string');
    assert.ok(info.version.length > 0, 'version is non-empty');
    const instructions = client.getInstructions();
    assert.equal(typeof instructions, 'string');
    assert.ok(instructions.trim().length > 0, 'instructions are non-empty');
    const caps = client.getServerCapabilities();
    assert.ok(caps.tools, 'tools capability');
    assert.ok(caps.resources, 'resources capability');
    assert.equal(caps.resources.subscribe, true, 'resources.subscribe');
    assert.ok(caps.prompts, 'prompts capability');
    assert.ok(caps.logging, 'logging capability');
    assert.equal(conn.negotiated(), '2025-11-25');
  });

  test('tools/list: the tools with descriptions, valid schemas, annotations (MCP defaults left out)', async () => {
    const { tools: list } = await client.listTools();
    const names = list.map((t) => t.name);
    for (const name of TOOL_NAMES) assert.ok(names.includes(name), `tool ${name} listed (got ${names})`);
    const a = ajv();
    for (const t of list) {
      tools[t.name] = t;
      assert.equal(t.title, undefined, `${t.name}: no title (the name says it; tools/list has a budget)`);
      assert.ok(typeof t.description === 'string' && t.description.length > 0, `${t.name}: description`);
      assert.equal(t.inputSchema?.type, 'object', `${t.name}: inputSchema is an object schema`);
      assert.ok(t.outputSchema, `${t.name}: outputSchema`);
      assert.equal(t.outputSchema.type, 'object', `${t.name}: outputSchema is an object schema`);
      let input, output;
      assert.doesNotThrow(() => {
        input = compileSchema(a, t.inputSchema);
      }, `${t.name}: inputSchema compiles`);
      assert.doesNotThrow(() => {
        output = compileSchema(a, t.outputSchema);
      }, `${t.name}: outputSchema compiles`);
      validators[t.name] = { input, output };
      t.annotations ??= {};
      for (const [hint, value] of Object.entries({ readOnlyHint: false, destructiveHint: true, idempotentHint: false, openWorldHint: true }))
        assert.notEqual(t.annotations[hint], value, `${t.name}: ${hint} is MCP's default, left out`);
    }
    assert.equal(tools.list_instances.annotations.readOnlyHint, true);
    assert.equal(tools.list_archived_instances.annotations.readOnlyHint, true);
    assert.equal(tools.describe_instance.annotations.readOnlyHint, true);
    assert.equal(tools.delete_instance.annotations.destructiveHint ?? true, true);
    assert.notEqual(tools.create_instance.annotations.readOnlyHint, true);
    // The input schemas accept the arguments the tests send.
    assert.equal(validators.create_instance.input({ instance_id: 'x1', network: 'off' }), null);
    assert.notEqual(validators.create_instance.input({ network: 'bogus' }), null);
    assert.notEqual(validators.describe_instance.input({}), null, 'describe requires instance_id');
  });

  test('create_instance with an id', async () => {
    const result = await call('create_instance', {
      instance_id: 'alpha',
      description: 'first e2e instance',
      network: 'off',
    });
    assert.ok(!result.isError, textOf(result));
    assert.match(textOf(result), /Created instance 'alpha'/);
    assert.match(textOf(result), /network off/);
    const s = result.structuredContent;
    assert.equal(s.id, 'alpha');
    assert.equal(s.description, 'first e2e instance');
    assert.equal(s.network, 'off');
    assert.equal(s.workspace, '/workspace');
    assert.equal(s.output, '/output');
    assert.ok(!Number.isNaN(Date.parse(s.created_at)), `created_at is a date: ${s.created_at}`);
    assert.ok(fs.existsSync(path.join(home.instancesDir, 'alpha')), 'instance folder under the temp instances_dir');
  });

  let generatedId;
  test('create_instance without an id generates one', async () => {
    const result = await call('create_instance', {});
    assert.ok(!result.isError, textOf(result));
    generatedId = result.structuredContent.id;
    assert.match(generatedId, /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/);
    assert.match(textOf(result), new RegExp(`Created instance '${generatedId.replace(/\./g, '\\.')}'`));
  });

  test('create_instance with an empty instance_id generates one too', async () => {
    const result = await call('create_instance', { instance_id: '' });
    assert.ok(!result.isError, textOf(result));
    const id = result.structuredContent.id;
    assert.match(id, /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/);
    const deleted = await call('delete_instance', { instance_id: id });
    assert.ok(!deleted.isError, textOf(deleted));
  });

  test('list_instances lists both', async () => {
    const result = await call('list_instances', {});
    assert.ok(!result.isError, textOf(result));
    const ids = result.structuredContent.instances.map((i) => i.id);
    assert.ok(ids.includes('alpha'), `alpha listed: ${ids}`);
    assert.ok(ids.includes(generatedId), `${generatedId} listed: ${ids}`);
    assert.equal(result.structuredContent.count, ids.length);
    const text = textOf(result);
    assert.match(text, /alpha/);
    assert.ok(text.includes(generatedId));
    assert.match(text, /first e2e instance/);
  });

  test('describe_instance', async () => {
    const result = await call('describe_instance', { instance_id: 'alpha' });
    assert.ok(!result.isError, textOf(result));
    const text = textOf(result);
    assert.match(text, /Instance 'alpha'/);
    assert.match(text, /first e2e instance/);
    assert.match(text, /Network: off/);
    assert.equal(result.structuredContent.id, 'alpha');
    assert.equal(result.structuredContent.network, 'off');
  });

  test('update_instance changes description and network', async () => {
    const result = await call('update_instance', {
      instance_id: 'alpha',
      description: 'renamed',
      network: 'host',
    });
    assert.ok(!result.isError, textOf(result));
    assert.match(textOf(result), /Updated instance 'alpha'/);
    assert.match(textOf(result), /renamed/);
    assert.equal(result.structuredContent.description, 'renamed');
    assert.equal(result.structuredContent.network, 'host');
    const again = await call('describe_instance', { instance_id: 'alpha' });
    assert.equal(again.structuredContent.description, 'renamed');
    assert.equal(again.structuredContent.network, 'host');
  });

  test('legacy {"input": {...}} arguments', async () => {
    const created = await call('create_instance', { input: { instance_id: 'legacy-1', description: 'old style' } });
    assert.ok(!created.isError, textOf(created));
    assert.equal(created.structuredContent.id, 'legacy-1');
    assert.equal(created.structuredContent.description, 'old style');
    const described = await call('describe_instance', { input: { instance_id: 'legacy-1' } });
    assert.ok(!described.isError, textOf(described));
    assert.equal(described.structuredContent.id, 'legacy-1');
    const listed = await call('list_instances', { input: {} });
    assert.ok(!listed.isError, textOf(listed));
    assert.ok(listed.structuredContent.instances.some((i) => i.id === 'legacy-1'));
  });

  let archiveName;
  test('archive_instance and list_archived_instances', async () => {
    const result = await call('archive_instance', { instance_id: 'legacy-1' });
    assert.ok(!result.isError, textOf(result));
    archiveName = result.structuredContent.archive_name;
    assert.equal(result.structuredContent.instance_id, 'legacy-1');
    assert.ok(archiveName.startsWith('legacy-1__'), `archive name ${archiveName}`);
    assert.ok(textOf(result).includes(archiveName), 'text names the archive');
    assert.match(textOf(result), /Archived instance 'legacy-1'/);

    const listed = await call('list_instances', {});
    assert.ok(!listed.structuredContent.instances.some((i) => i.id === 'legacy-1'), 'archived is not active');

    const archived = await call('list_archived_instances', {});
    assert.ok(!archived.isError, textOf(archived));
    const entry = archived.structuredContent.archives.find((a) => a.name === archiveName);
    assert.ok(entry, `archive listed: ${JSON.stringify(archived.structuredContent)}`);
    assert.equal(entry.id, 'legacy-1');
    assert.equal(archived.structuredContent.count, archived.structuredContent.archives.length);
    assert.ok(textOf(archived).includes(archiveName));
  });

  test('delete_instance: an active instance', async () => {
    const result = await call('delete_instance', { instance_id: generatedId });
    assert.ok(!result.isError, textOf(result));
    assert.deepEqual(result.structuredContent, { deleted: generatedId, archived: false });
    assert.ok(textOf(result).includes(generatedId));
    assert.match(textOf(result), /Deleted instance/);
    const listed = await call('list_instances', {});
    assert.ok(!listed.structuredContent.instances.some((i) => i.id === generatedId));
    assert.ok(!fs.existsSync(path.join(home.instancesDir, generatedId)), 'its folder is gone');
  });

  test('delete_instance: an archive by archive_name', async () => {
    const result = await call('delete_instance', { archive_name: archiveName });
    assert.ok(!result.isError, textOf(result));
    assert.deepEqual(result.structuredContent, { deleted: archiveName, archived: true });
    assert.match(textOf(result), /Deleted archive/);
    const archived = await call('list_archived_instances', {});
    assert.ok(!archived.structuredContent.archives.some((a) => a.name === archiveName));
  });

  test('tool errors are isError results naming the problem; the server keeps working', async () => {
    await expectToolError('describe_instance', { instance_id: 'no-such-instance' }, /no-such-instance/);
    await expectToolError('update_instance', { instance_id: 'no-such-instance', description: 'x' }, /no-such-instance/);
    await expectToolError('archive_instance', { instance_id: 'no-such-instance' }, /no-such-instance/);
    await expectToolError('delete_instance', { instance_id: 'no-such-instance' }, /no-such-instance/);
    await expectToolError('create_instance', { instance_id: '../x' }, /invalid instance id|\.\.\/x/);
    await expectToolError('describe_instance', { instance_id: '../x' }, /invalid instance id|\.\.\/x/);
    await expectToolError('create_instance', { instance_id: 'output' }, /reserved/);
    await expectToolError('create_instance', { instance_id: 'alpha' }, /alpha/); // taken
    await expectToolError('update_instance', { instance_id: 'alpha' }, /nothing to update/);
    await expectToolError(
      'delete_instance',
      { instance_id: 'alpha', archive_name: 'alpha__20260101T000000Z' },
      /exactly one of instance_id and archive_name/,
    );
    await expectToolError('delete_instance', {}, /exactly one of instance_id and archive_name/);
    // Arguments that do not match the input schema: the message names the field.
    await expectToolError('create_instance', { instance_id: 'beta', network: 'bogus' }, /network/);
    await expectToolError('describe_instance', {}, /instance_id/);
    await expectToolError('list_instances', { unexpected: 1 }, /unexpected/);
    // Still working, and nothing was created by the refused calls.
    const listed = await call('list_instances', {});
    assert.ok(!listed.isError);
    const ids = listed.structuredContent.instances.map((i) => i.id).sort();
    assert.deepEqual(ids, ['alpha']);
    assert.ok(!fs.existsSync(path.join(home.root, 'x')), 'no folder escaped the instances dir');
  });

  test('resources/list: built-in docs, the custom doc, instances', async () => {
    const { resources } = await client.listResources();
    const uris = resources.map((r) => r.uri);
    for (const doc of BUILTIN_DOCS) assert.ok(uris.includes(CONTEXT + doc), `${doc} listed: ${uris}`);
    assert.ok(uris.includes(CONTEXT + CUSTOM_DOC), `custom doc listed: ${uris}`);
    assert.ok(!uris.includes(CONTEXT + 'not-a-doc.txt'), 'files not matching resource_patterns are not listed');
    const builtin = resources.find((r) => r.uri === CONTEXT + 'ns-hpc.md');
    assert.equal(builtin.mimeType, 'text/markdown');
    const inst = resources.find((r) => r.uri === INSTANCE + 'alpha');
    assert.ok(inst, `instance alpha listed: ${uris}`);
    assert.equal(inst.mimeType, 'application/json');
  });

  test('resources/read: ns-hpc.md, the custom doc, an instance', async () => {
    const doc = await client.readResource({ uri: CONTEXT + 'ns-hpc.md' });
    assert.equal(doc.contents.length, 1);
    assert.equal(doc.contents[0].uri, CONTEXT + 'ns-hpc.md');
    assert.equal(doc.contents[0].mimeType, 'text/markdown');
    assert.ok(doc.contents[0].text.trim().length > 0, 'ns-hpc.md is non-empty');
    assert.match(doc.contents[0].text, /ns-hpc/);

    const custom = await client.readResource({ uri: CONTEXT + CUSTOM_DOC });
    assert.equal(custom.contents[0].text, CUSTOM_TEXT);
    assert.equal(custom.contents[0].mimeType, 'text/markdown');

    const inst = await client.readResource({ uri: INSTANCE + 'alpha' });
    assert.equal(inst.contents[0].mimeType, 'application/json');
    const data = JSON.parse(inst.contents[0].text);
    assert.equal(data.id, 'alpha');
    assert.equal(data.description, 'renamed');
  });

  test('resources/templates/list has the instance template', async () => {
    const { resourceTemplates } = await client.listResourceTemplates();
    const t = resourceTemplates.find((r) => r.uriTemplate === 'resource://ns-hpc/instances/{id}');
    assert.ok(t, `template listed: ${JSON.stringify(resourceTemplates)}`);
    assert.equal(t.mimeType, 'application/json');
  });

  test('resources/read of an unknown resource is JSON-RPC error -32002', async () => {
    for (const uri of [
      CONTEXT + 'no-such-doc.md',
      CONTEXT + 'not-a-doc.txt',
      INSTANCE + 'no-such-instance',
      INSTANCE + '..',
      'resource://elsewhere/x',
    ]) {
      await assert.rejects(
        client.readResource({ uri }),
        (err) => {
          assert.ok(err instanceof McpError, `McpError for ${uri}: ${err}`);
          assert.equal(err.code, -32002, `code for ${uri}`);
          return true;
        },
        uri,
      );
    }
    await client.ping();
  });

  test('subscribe: update_instance sends notifications/resources/updated', async () => {
    const uri = INSTANCE + 'alpha';
    await client.subscribeResource({ uri });
    const before = updated.length;
    const result = await call('update_instance', { instance_id: 'alpha', description: 'watched' });
    assert.ok(!result.isError, textOf(result));
    await eventually(() => updated.slice(before).some((p) => p.uri === uri), 5000, 'resources/updated');
    assert.ok(updated.slice(before).every((p) => p.uri === uri), 'only the subscribed uri');

    // After unsubscribe no more updates for it. The server sends the notification before the
    // tool's response, so by the time the response is here one would have arrived.
    await client.unsubscribeResource({ uri });
    const mark = updated.length;
    const again = await call('update_instance', { instance_id: 'alpha', description: 'unwatched' });
    assert.ok(!again.isError, textOf(again));
    await sleep(300);
    assert.equal(updated.length, mark, `no update after unsubscribe: ${JSON.stringify(updated.slice(mark))}`);
  });

  test('create/archive/delete send notifications/resources/list_changed', async () => {
    let mark = listChanged.length;
    const created = await call('create_instance', { instance_id: 'gamma' });
    assert.ok(!created.isError, textOf(created));
    await eventually(() => listChanged.length > mark, 5000, 'list_changed after create');
    const { resources } = await client.listResources();
    assert.ok(resources.some((r) => r.uri === INSTANCE + 'gamma'), 'the new instance is a resource');

    mark = listChanged.length;
    const archived = await call('archive_instance', { instance_id: 'gamma' });
    assert.ok(!archived.isError, textOf(archived));
    await eventually(() => listChanged.length > mark, 5000, 'list_changed after archive');
    const after = await client.listResources();
    assert.ok(!after.resources.some((r) => r.uri === INSTANCE + 'gamma'), 'archived: no longer a resource');

    mark = listChanged.length;
    const created2 = await call('create_instance', { instance_id: 'delta' });
    assert.ok(!created2.isError, textOf(created2));
    await eventually(() => listChanged.length > mark, 5000, 'list_changed after second create');
    mark = listChanged.length;
    const deleted = await call('delete_instance', { instance_id: 'delta' });
    assert.ok(!deleted.isError, textOf(deleted));
    await eventually(() => listChanged.length > mark, 5000, 'list_changed after delete');
  });

  test('prompts: list and get work_in_sandbox', async () => {
    const { prompts } = await client.listPrompts();
    const p = prompts.find((x) => x.name === 'work_in_sandbox');
    assert.ok(p, `work_in_sandbox listed: ${JSON.stringify(prompts)}`);
    const goalArg = p.arguments.find((a) => a.name === 'goal');
    assert.ok(goalArg && goalArg.required === true, 'goal is a required argument');
    assert.ok(p.arguments.some((a) => a.name === 'instance_id' && !a.required), 'instance_id optional');

    const goal = 'compile the quantum flux capacitor';
    const got = await client.getPrompt({ name: 'work_in_sandbox', arguments: { goal } });
    assert.ok(got.messages.length >= 1);
    const msg = got.messages[0];
    assert.equal(msg.role, 'user');
    assert.equal(msg.content.type, 'text');
    assert.ok(msg.content.text.includes(goal), `the message mentions the goal: ${msg.content.text}`);

    const withInst = await client.getPrompt({ name: 'work_in_sandbox', arguments: { goal, instance_id: 'alpha' } });
    assert.match(withInst.messages[0].content.text, /alpha/);
  });

  test('prompts/get without the required goal is an error', async () => {
    await assert.rejects(client.getPrompt({ name: 'work_in_sandbox', arguments: {} }), (err) => {
      assert.ok(err instanceof McpError, String(err));
      assert.equal(err.code, -32602);
      assert.match(err.message, /goal/);
      return true;
    });
    await assert.rejects(client.getPrompt({ name: 'no_such_prompt', arguments: {} }), (err) => {
      assert.ok(err instanceof McpError, String(err));
      assert.equal(err.code, -32602);
      assert.match(err.message, /no_such_prompt/);
      return true;
    });
    await client.ping();
  });

  test('every tool call is audited', async () => {
    const storeLog = path.join(home.instancesDir, '.audit.log');
    const alphaLog = path.join(home.instancesDir, 'alpha', 'audit.log');
    const parse = (file) =>
      fs
        .readFileSync(file, 'utf8')
        .split('\n')
        .filter((l) => l.trim())
        .map((l) => JSON.parse(l));
    const calls = (file) => parse(file).filter((r) => r.event === 'mcp.tool_call');

    const storeCalls = calls(storeLog);
    const storeTools = new Set(storeCalls.map((r) => r.tool));
    // Calls that named no existing instance land in the store-level log.
    for (const t of ['list_instances', 'list_archived_instances', 'create_instance', 'delete_instance']) {
      assert.ok(storeTools.has(t), `${t} in .audit.log (got ${[...storeTools]})`);
    }
    const refused = storeCalls.find((r) => r.tool === 'describe_instance' && r.is_error === true);
    assert.ok(refused, 'a refused call is audited with is_error');
    // Calls refused for an invalid or reserved id are audited too (store-level log).
    for (const bad of ['../x', 'output']) {
      assert.ok(
        storeCalls.some((r) => r.tool === 'create_instance' && r.is_error === true && r.arguments.includes(bad)),
        `the refused create_instance of '${bad}' is audited`,
      );
    }
    // A create with an empty instance_id (a generated id) is audited.
    assert.ok(
      storeCalls.some((r) => r.tool === 'create_instance' && r.is_error === false && /"instance_id":""/.test(r.arguments)),
      'create_instance with instance_id "" is audited',
    );
    assert.ok(storeCalls.every((r) => String(r.actor).includes('nshpc-e2e')), 'actor names the client');

    const alphaTools = new Set(calls(alphaLog).map((r) => r.tool));
    for (const t of ['describe_instance', 'update_instance']) {
      assert.ok(alphaTools.has(t), `${t} in alpha/audit.log (got ${[...alphaTools]})`);
    }
    const raw = fs.readFileSync(alphaLog, 'utf8');
    assert.match(raw, /mcp\.tool_call/);
  });

  test('no tool call reported an audit failure', () => {
    assert.deepEqual(auditWarnings, []);
  });
});
