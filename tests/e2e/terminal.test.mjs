// End-to-end tests of the terminal_execute tool (`ns-hpc run` over stdio, MCP TypeScript SDK
// client): the mcp-virtual-computer contract (arguments, validation messages, result object),
// timeouts and the output limit, cancellation, and that nothing the command started survives it.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  ajv,
  compileSchema,
  connectNshpc,
  createInstance,
  hostProcessesWith,
  makeHome,
  removeHome,
  sleep,
  textOf,
  until,
} from './lib.mjs';

const TOOL = 'terminal_execute';
const ID = 'term';
const MIB2 = 2 * 1024 * 1024; // 2,097,152: the stdin limit and the output limit
const OUTPUT_LIMIT_NOTE =
  '[ns-hpc: output limit exceeded (2097152 bytes of stdout+stderr); the command was killed. ' +
  'Re-run with head, tail or grep, or write the output to a file.]';

// A marker no other process on the host has: `sleep <marker>` is found through /proc.
const uniqueMarker = (base) => `${base}.${process.pid % 1000}${Math.floor(Math.random() * 1000)}`;



describe('terminal_execute', () => {
  let home;
  let conn;
  let client;
  let tool;
  let validateOutput;

  before(async () => {
    home = makeHome('terminal');
    conn = await connectNshpc(home);
    client = conn.client;
    const { tools } = await client.listTools();
    tool = tools.find((t) => t.name === TOOL);
    assert.ok(tool, `${TOOL} is listed (got ${tools.map((t) => t.name)})`);
    validateOutput = compileSchema(ajv(), tool.outputSchema);
    await createInstance(client, { instance_id: ID, network: 'off' });
  });

  after(async () => {
    if (conn) await conn.close();
    removeHome(home);
  });

  // A successful call: checks the result shape, returns {result, out} (out = structuredContent).
  async function run(args, { instance = ID, options } = {}) {
    const result = await client.callTool({ name: TOOL, arguments: { instance_id: instance, ...args } }, undefined, options);
    assert.notEqual(result.isError, true, `${JSON.stringify(args).slice(0, 200)} failed: ${textOf(result)}`);
    const out = result.structuredContent;
    assert.ok(out, 'structuredContent present');
    assert.equal(validateOutput(out), null, `structuredContent matches the outputSchema`);
    assert.equal(out.instance_id, instance);
    // The text is a readable summary with the output (never a second JSON copy of structuredContent).
    assert.equal(result.content.length, 1);
    const text = result.content[0].text;
    assert.ok(text.startsWith(`exit code ${out.exit_code} (`), `a readable summary: ${text.slice(0, 80)}`);
    if (out.stdout) assert.ok(text.includes(`--- stdout`) && text.includes(out.stdout), 'the stdout is in the text');
    if (out.stderr) assert.ok(text.includes(`--- stderr`) && text.includes(out.stderr), 'the stderr is in the text');
    return { result, out };
  }

  // A refused call: isError with `pattern` in the message.
  async function refused(args, pattern, { instance = ID } = {}) {
    const result = await client.callTool({ name: TOOL, arguments: { instance_id: instance, ...args } });
    assert.equal(result.isError, true, `${JSON.stringify(args).slice(0, 200)} should be refused: ${textOf(result).slice(0, 300)}`);
    assert.match(textOf(result), pattern);
    return textOf(result);
  }

  test('tools/list: schemas and annotations', () => {
    assert.equal(tool.inputSchema.type, 'object');
    assert.deepEqual(tool.inputSchema.required, ['instance_id']);
    for (const p of ['instance_id', 'command', 'args', 'stdin', 'working_directory', 'timeout'])
      assert.ok(tool.inputSchema.properties[p], `input property ${p}`);
    assert.equal(tool.inputSchema.properties.timeout.type, 'integer');
    assert.deepEqual([...tool.outputSchema.required].sort(), ['exec_duration_ms', 'exit_code', 'instance_id', 'network', 'stderr', 'stdout']);
    // Not read-only, destructive, open world: MCP's defaults, so no annotation says otherwise.
    assert.equal(tool.annotations, undefined);
    for (const phrase of [/fresh/, /\/workspace/, /\/output/, /124/, /2 MiB/, /30000 characters/])
      assert.match(tool.description, phrase);
  });

  test('exit codes 0 and 42 (a non-zero exit is not a tool error)', async () => {
    const ok = await run({ command: 'true' });
    assert.equal(ok.out.exit_code, 0);
    assert.equal(typeof ok.out.exec_duration_ms, 'number');
    const fail = await run({ command: 'exit 42' });
    assert.equal(fail.out.exit_code, 42);
    assert.equal(fail.result.isError, undefined);
  });

  test('stdout and stderr are separated', async () => {
    const { out } = await run({ command: 'echo to-out; echo to-err >&2; echo more-out' });
    assert.equal(out.stdout, 'to-out\nmore-out\n');
    assert.equal(out.stderr, 'to-err\n');
    assert.equal(out.exit_code, 0);
  });

  test('args are executed directly, each argument kept exactly', async () => {
    const args = ['/usr/bin/printf', '[%s]\\n', 'a b', `it's "quoted"`, '', '$HOME *', ' lead'];
    const { out } = await run({ args });
    assert.equal(out.stdout, `[a b]\n[it's "quoted"]\n[]\n[$HOME *]\n[ lead]\n`);
    assert.equal(out.exit_code, 0);
    // Legacy {"input": {...}} wrapper.
    const wrapped = await client.callTool({ name: TOOL, arguments: { input: { instance_id: ID, args: ['echo', 'wrapped'] } } });
    assert.notEqual(wrapped.isError, true, textOf(wrapped));
    assert.equal(wrapped.structuredContent.stdout, 'wrapped\n');
  });

  test('stdin round-trips through cat (quotes, newlines, non-ASCII)', async () => {
    let input = '';
    for (let i = 0; input.length < 4000; i++) input += `line ${i}: 'single' "double" \`back\` $VAR \\ é ü 漢字 🚀\n`;
    input += 'no trailing newline';
    const { out } = await run({ command: 'cat', stdin: input });
    assert.equal(out.stdout, input);
    assert.equal(out.exit_code, 0);
    // stdin "" counts as absent: EOF at once.
    const empty = await run({ command: 'cat; echo done', stdin: '' });
    assert.equal(empty.out.stdout, 'done\n');
  });

  test('a file written through stdin persists in /workspace for the next call', async () => {
    const content = 'first "line"\nsecond $line é\n';
    const w = await run({ command: 'cat > f.txt', stdin: content });
    assert.equal(w.out.exit_code, 0);
    const r = await run({ command: 'cat f.txt; pwd' });
    assert.equal(r.out.stdout, content + '/workspace\n');
    assert.equal(fs.readFileSync(path.join(home.instancesDir, ID, 'workspace', 'f.txt'), 'utf8'), content);
  });

  test('working_directory', async () => {
    await run({ command: 'mkdir -p sub/dir' });
    const { out } = await run({ command: 'pwd', working_directory: '/workspace/sub/dir' });
    assert.equal(out.stdout, '/workspace/sub/dir\n');
    const tmp = await run({ args: ['pwd'], working_directory: '/tmp' });
    assert.equal(tmp.out.stdout, '/tmp\n');
    const dflt = await run({ command: 'pwd', working_directory: '' });
    assert.equal(dflt.out.stdout, '/workspace\n');
    // A folder that does not exist: the command cannot be run, exit 127 with the sandbox's message.
    const nodir = await run({ command: 'pwd', working_directory: '/workspace/no/such/dir' });
    assert.equal(nodir.out.exit_code, 127);
    assert.match(nodir.out.stderr, /\/workspace\/no\/such\/dir/);
    // A program that does not exist: exit 127 with the message in stderr, as args and through the shell.
    const direct = await run({ args: ['no-such-program-x', 'a'] });
    assert.equal(direct.out.exit_code, 127);
    assert.match(direct.out.stderr, /no-such-program-x/);
    const sh = await run({ command: 'no-such-program-x' });
    assert.equal(sh.out.exit_code, 127);
    assert.match(sh.out.stderr, /not found/);
  });

  test('timeout: killed, exit 124, partial output kept', async () => {
    const t0 = Date.now();
    const { out } = await run({ command: 'echo partial; echo err-partial >&2; sleep 30', timeout: 1 });
    const elapsed = Date.now() - t0;
    assert.ok(elapsed < 10_000, `returned after ${elapsed} ms`);
    assert.equal(out.exit_code, 124);
    assert.equal(out.stdout, 'partial\n');
    assert.equal(out.stderr, 'err-partial\n[ns-hpc: command timed out after 1 s; the sandbox was killed]');
    assert.ok(out.exec_duration_ms >= 900 && out.exec_duration_ms < 10_000, `exec_duration_ms ${out.exec_duration_ms}`);
    // Nothing printed: the note alone.
    const quiet = await run({ command: 'sleep 30', timeout: 1 });
    assert.equal(quiet.out.exit_code, 124);
    assert.equal(quiet.out.stdout, '');
    assert.equal(quiet.out.stderr, '[ns-hpc: command timed out after 1 s; the sandbox was killed]');
  });

  // The whole (cut) output of a result: the file it names, read on the host.
  const wholeSize = (file) => fs.statSync(path.join(home.instancesDir, ID, 'workspace', file.slice('/workspace/'.length))).size;

  test('output limit: killed, exit 1, the first 2 MiB kept in a file; the result carries 30000 characters', async () => {
    const { out } = await run({ command: 'yes | head -c 3000000; echo not-reached' });
    assert.equal(out.exit_code, 1);
    assert.ok(out.stdout.length <= 30000, `cut to [mcp] max_result_chars: ${out.stdout.length}`);
    assert.ok(out.stdout.startsWith('y\ny\ny\n'));
    assert.match(out.stdout, /characters cut here; the whole output is in \/workspace\/\.ns_hpc_output\/term-/);
    assert.equal(wholeSize(out.stdout_file), MIB2);
    assert.ok(!out.stdout.includes('not-reached'));
    assert.equal(out.stderr, OUTPUT_LIMIT_NOTE);
    // Combined: stdout and stderr together.
    const both = await run({ command: 'head -c 1500000 /dev/zero | tr "\\0" a; head -c 1500000 /dev/zero | tr "\\0" b >&2' });
    assert.equal(both.out.exit_code, 1);
    assert.ok(both.out.stderr.endsWith('\n' + OUTPUT_LIMIT_NOTE));
    const errKept = wholeSize(both.out.stderr_file) - OUTPUT_LIMIT_NOTE.length - 1;
    assert.equal(wholeSize(both.out.stdout_file) + errKept, MIB2, 'stdout + stderr kept = the limit');
    assert.match(both.out.stdout, /^a+\n\[ns-hpc: [0-9,]+ characters cut here; [^\]]*\]\na+$/);
    // Exactly 2 MiB is allowed.
    const exact = await run({ command: 'yes | head -c 2097152' });
    assert.equal(exact.out.exit_code, 0);
    assert.equal(wholeSize(exact.out.stdout_file), MIB2);
    assert.equal(exact.out.stderr, '');
  });

  test('validation errors run nothing', async () => {
    const probe = path.join(home.instancesDir, ID, 'workspace', 'ran.txt');
    await refused(
      { command: 'touch ran.txt', args: ['touch', 'ran.txt'] },
      /^Cannot provide both 'command' and 'args'\. Use 'command' for shell commands or 'args' for direct execution\.$/,
    );
    await refused({}, /^Must provide either 'command' or 'args'\.$/);
    await refused({ command: '', args: [] }, /^Must provide either 'command' or 'args'\.$/);
    await refused({ command: 'touch ran.txt', working_directory: 'workspace' }, /^working_directory must be an absolute path, got: workspace$/);
    // The bounds are the schema's (minimum 1, maximum [jobs] max_timeout), as the server enforces.
    await refused({ command: 'touch ran.txt', timeout: 0 }, /timeout.*>= 1/);
    await refused({ command: 'touch ran.txt', timeout: -5 }, /timeout.*>= 1/);
    await refused({ command: 'touch ran.txt', timeout: 3601 }, /timeout.*3600/);
    await refused({ command: 'touch ran.txt', timeout: 1e20 }, /timeout.*3600/);
    await refused(
      { command: 'touch ran.txt', stdin: 'x'.repeat(MIB2 + 1) },
      /^stdin content exceeds the 2 MiB limit \(2097153 bytes\)\. Split into smaller chunks or use a different approach\.$/,
    );
    // The size is counted in UTF-8 bytes: 'é' is 2.
    await refused({ command: 'touch ran.txt', stdin: 'é'.repeat(MIB2 / 2) + 'x' }, /\(2097153 bytes\)/);
    assert.ok(!fs.existsSync(probe), 'no refused command ran');
    // Exactly 2 MiB is accepted (and fully written to the command).
    const { out } = await run({ command: 'wc -c', stdin: 'é'.repeat(MIB2 / 2) });
    assert.equal(out.stdout.trim(), String(MIB2));
    // Empty command with args, or empty args with a command: the empty one is absent.
    assert.equal((await run({ command: '', args: ['echo', 'x'] })).out.stdout, 'x\n');
    assert.equal((await run({ command: 'echo y', args: [] })).out.stdout, 'y\n');
    // Wrong types are refused by the input schema.
    await refused({ command: 'true', timeout: 'ten' }, /timeout/);
  });

  test('unknown and archived instances are refused', async () => {
    await refused({ command: 'true' }, /nope-404/, { instance: 'nope-404' });
    const c = await client.callTool({ name: 'create_instance', arguments: { instance_id: 'gone' } });
    assert.ok(!c.isError, textOf(c));
    const a = await client.callTool({ name: 'archive_instance', arguments: { instance_id: 'gone' } });
    assert.ok(!a.isError, textOf(a));
    await refused({ command: 'true' }, /gone/, { instance: 'gone' });
  });

  test('non-UTF-8 output does not break the response', async () => {
    const { out } = await run({ command: "printf '\\xff\\xfe ok'; printf 'bad \\xc3 err' >&2" });
    assert.equal(out.exit_code, 0);
    assert.ok(out.stdout.includes('\uFFFD'), JSON.stringify(out.stdout));
    assert.ok(out.stdout.endsWith(' ok'));
    assert.ok(out.stderr.startsWith('bad ') && out.stderr.endsWith(' err') && out.stderr.includes('\uFFFD'));
    await client.ping();
  });

  test('a background process does not survive the call', async () => {
    const marker = uniqueMarker(7771);
    const t0 = Date.now();
    const { out } = await run({ command: `sleep ${marker} & echo started` });
    assert.ok(Date.now() - t0 < 10_000, 'the call does not wait for the background process');
    assert.equal(out.stdout, 'started\n');
    assert.ok(await until(() => hostProcessesWith(`sleep\0${marker}`).length === 0), `left: ${hostProcessesWith(marker)}`);
    // Nor a daemonised one (setsid, output closed).
    const marker2 = uniqueMarker(7773);
    await run({ command: `setsid sleep ${marker2} </dev/null >/dev/null 2>&1 & echo ok` });
    assert.ok(await until(() => hostProcessesWith(`sleep\0${marker2}`).length === 0), `left: ${hostProcessesWith(marker2)}`);
  });

  test('progress notifications while the command runs carry its newest output lines', async () => {
    const seen = [];
    const { out } = await run(
      { command: 'echo first; sleep 1.5; seq 1 1000; echo warned >&2; sleep 1.5; echo done', timeout: 30 },
      { options: { onprogress: (p) => seen.push(p) } },
    );
    assert.equal(out.stdout.slice(-5), 'done\n');
    assert.ok(seen.length >= 2, `progress seen: ${JSON.stringify(seen)}`);
    assert.equal(seen[0].total, 30);
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress);
    const messages = seen.map((p) => p.message);
    assert.ok(messages.every((m) => /^running, \d+ s/.test(m)), JSON.stringify(messages));
    // The lines that came since the notification before, the newest at most 3 (stderr marked).
    assert.ok(messages.includes('running, 1 s\nfirst'), JSON.stringify(messages));
    assert.ok(messages.some((m) => m.endsWith('\n999\n1000\n[stderr] warned')), JSON.stringify(messages));
    assert.ok(messages.every((m) => m.split('\n').length <= 4 && m.length <= 600), JSON.stringify(messages));
  });

  test('cancellation kills the sandbox', async () => {
    const marker = uniqueMarker(7772);
    const controller = new AbortController();
    const pending = client.callTool(
      { name: TOOL, arguments: { instance_id: ID, command: `sleep ${marker}` } },
      undefined,
      { signal: controller.signal, timeout: 120_000 },
    );
    pending.catch(() => {}); // observed below
    assert.ok(await until(() => hostProcessesWith(`sleep\0${marker}`).length > 0, 10_000), 'the command started');
    const t0 = Date.now();
    controller.abort('test cancels');
    await assert.rejects(pending);
    assert.ok(Date.now() - t0 < 2000, 'rejected promptly');
    assert.ok(await until(() => hostProcessesWith(marker).length === 0), `left: ${hostProcessesWith(marker)}`);
    // The server carries on.
    await client.ping();
    assert.equal((await run({ command: 'echo after' })).out.stdout, 'after\n');
  });

  test('calls are audited with their exit code', () => {
    const log = path.join(home.instancesDir, ID, 'audit.log');
    const records = fs
      .readFileSync(log, 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l))
      .filter((r) => r.event === 'mcp.tool_call' && r.tool === TOOL);
    assert.ok(records.length > 10, `terminal_execute records: ${records.length}`);
    assert.ok(records.some((r) => r.exit_code === 42 && r.is_error === false), 'exit 42 audited');
    assert.ok(records.some((r) => r.exit_code === 124), 'the timeout audited');
    assert.ok(records.some((r) => r.is_error === true && /timeout.*>= 1/.test(r.error)), 'a refusal audited');
    assert.ok(records.every((r) => typeof r.duration_ms === 'number'));
  });
});
