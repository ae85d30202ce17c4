// Jobs as MCP Tasks and confirmations in both eras (issue 37), with real clients over stdio and
// streamable HTTP:
//   - 2026-07-28 with the Tasks extension (@modelcontextprotocol/ext-tasks 0.2.2 on the v2 client
//     2.4.0): submit_job answers a task, followed with tasks/get to the CallToolResult poll_job
//     gives; one cancelled with tasks/cancel (its process gone); one that outlives a server
//     restart; a modern client without the extension gets the plain result and tasks/get -32021;
//   - 2025-11-25 with SDK 1.32.2's client.experimental.tasks: a task-augmented submit_job,
//     tasks/get, tasks/result, tasks/list, tasks/cancel; a call without params.task as before;
//   - confirmations with [mcp] confirm_destructive = true: delete_instance answered yes and no in
//     each era (legacy elicitation/create, modern input_required fulfilled by the v2 client), a
//     forged and a replayed requestState refused, a client with neither told to pass confirm:
//     true; with confirm_destructive off delete_instance works at once.
// The ns-hpc computer part runs on make test's image 'test' (scripts/test-image.sh); without it,
// it skips.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { CallToolResultSchema, CreateTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';

import { NSHPC_BINARY, childEnv, hostProcessesWith, makeHome, nshpcArgs, removeHome, textOf, until } from './lib.mjs';
import { makeHttpHome, startServer } from './http_lib.mjs';
import { IMAGES_DIR, haveTestImage, modernPost, modernRequest, startComputerHttp, useTestImage } from './eras_lib.mjs';
import { TASKS_EXTENSION, answering, connectV1, connectV2, modernMeta, tasksSession, withExtension } from './tasks_lib.mjs';

const INSTANCE = 'tasks';
const COMPUTER = 'tasks-box';
const TRANSPORTS = ['stdio', 'http'];
// ISO 8601 UTC: Z or +00:00.
const ISO = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]00:00)$/;
let uniq = 0;
const fresh = (base) => `${base}-${process.pid % 10000}-${++uniq}`;

function cli(home, ...args) {
  return execFileSync(NSHPC_BINARY, ['--config', home.config, ...args], { env: childEnv(home), encoding: 'utf8' });
}
function deleteQuietly(home, id) {
  try {
    cli(home, 'instance', 'delete', '--force', id);
  } catch {
    // never created, or gone
  }
}

// A sandboxed `sleep` only the job's shell names (the arithmetic keeps the number out of every
// other command line): the needle finds its host process.
function sleeper() {
  const n = 700_000 + Math.floor(Math.random() * 200_000);
  return { command: `exec sleep $((${n}+1)).5`, needle: `sleep\0${n + 1}.5` };
}

// The tools/call answer as it went over the wire (the raw dispatcher's log), the last one.
function wireAnswer(c, method) {
  const found = c.raw.log.filter(([m]) => m.method === method);
  assert.ok(found.length > 0, `a ${method} on the wire (have ${c.raw.log.map(([m]) => m.method)})`);
  return found.at(-1)[1];
}

// tasks/get as a raw modern request, with or without the extension in its capabilities.
async function rawGet(c, taskId, { extension = true } = {}) {
  const caps = extension ? withExtension() : {};
  return c.raw({ method: 'tasks/get', params: { taskId, _meta: modernMeta(caps) } });
}

function assertCreateTaskResult(created) {
  assert.equal(created.resultType, 'task', JSON.stringify(created));
  assert.equal(typeof created.taskId, 'string');
  assert.ok(['working', 'completed', 'failed', 'cancelled', 'input_required'].includes(created.status), JSON.stringify(created));
  assert.match(created.createdAt, ISO);
  assert.match(created.lastUpdatedAt, ISO);
  assert.ok('ttlMs' in created && (created.ttlMs === null || Number.isInteger(created.ttlMs)), `ttlMs: ${JSON.stringify(created)}`);
  assert.ok(Number.isInteger(created.pollIntervalMs) && created.pollIntervalMs > 0, `pollIntervalMs: ${JSON.stringify(created)}`);
}

// What a target needs: how to reach the server over each transport, submit_job's and poll_job's
// arguments.
// A task's id is "<instance>/<job>" (src/tools/tasks.hpp): job ids are unique per instance.
const jobOf = (taskId) => taskId.slice(taskId.lastIndexOf('/') + 1);
function runJobs() {
  return {
    submit: (args) => ({ instance_id: INSTANCE, ...args }),
    poll: (taskId) => ({ instance_id: INSTANCE, job_id: jobOf(taskId) }),
    taskId: new RegExp(`^${INSTANCE}/[0-9a-f]{12}$`),
  };
}

// --- 2026-07-28 with the Tasks extension ----------------------------------------------------------
async function modernTaskCompletes(target, endpointId, jobs) {
  const c = await connectV2(target);
  const session = tasksSession(c, endpointId);
  try {
    assert.deepEqual(c.client.getServerCapabilities()?.extensions?.[TASKS_EXTENSION], {}, 'server/discover lists the Tasks extension');
    const marker = fresh('task-done');
    const execution = await session.callTool('submit_job', jobs.submit({ command: `sleep 1; echo ${marker}` }));
    assert.equal(execution.kind, 'task', 'submit_job answered a task');
    const created = wireAnswer(c, 'tools/call').result;
    assertCreateTaskResult(created);
    assert.equal(created.taskId, execution.handle.taskId);
    assert.match(created.taskId, jobs.taskId, 'the task id names the job');
    assert.equal(created.status, 'working', 'a one-second job is still working when submit_job answers');

    const { outcome } = await execution.settle();
    assert.equal(outcome.status, 'completed', `outcome ${JSON.stringify(outcome.status)} ${outcome.error?.message ?? ''}`);
    const result = outcome.result;
    assert.match(textOf(result), new RegExp(marker), 'the job output in the result');
    assert.equal(result.structuredContent?.status, 'completed');
    assert.equal(result.structuredContent?.exit_code, 0);
    assert.equal(result.structuredContent?.job_id, jobOf(created.taskId));
    const gets = c.raw.log.filter(([m]) => m.method === 'tasks/get').map(([, a]) => a.result?.status);
    assert.equal(gets.at(-1), 'completed', `tasks/get followed it (${gets})`);

    // What a finished poll_job gives, the same.
    const polled = await c.client.callTool({ name: 'poll_job', arguments: jobs.poll(created.taskId) });
    assert.ok(!polled.isError, textOf(polled));
    assert.deepEqual(result.structuredContent, polled.structuredContent, 'structuredContent as poll_job gives it');
    assert.deepEqual(result.content, polled.content, 'content as poll_job gives it');
    // And tasks/get of the finished task, again: result inline, resultType complete.
    const again = await rawGet(c, created.taskId);
    assert.equal(again.kind, 'result', JSON.stringify(again));
    assert.equal(again.result.resultType, 'complete');
    assert.equal(again.result.status, 'completed');
    assert.deepEqual(again.result.result.structuredContent, polled.structuredContent);
    // A task id that names no job: -32602, saying which.
    const unknown = `${created.taskId.split('/')[0]}/000000000000`;
    const none = await rawGet(c, unknown);
    assert.equal(none.error?.code, -32602, JSON.stringify(none));
    assert.ok(none.error.message.includes('000000000000'), none.error.message);
  } catch (err) {
    err.message += `\nserver stderr tail:\n${(target.stderr?.() ?? c.stderr()).slice(-2000)}`;
    throw err;
  } finally {
    await session.close();
    await c.close();
  }
}

async function modernTaskCancelled(target, endpointId, jobs) {
  const c = await connectV2(target);
  const session = tasksSession(c, endpointId);
  const { command, needle } = sleeper();
  try {
    // timeout 2: should the server wait before answering, a plain answer costs 2 s, not 30.
    const execution = await session.callTool('submit_job', jobs.submit({ command, timeout: 2 }));
    assert.equal(execution.kind, 'task');
    const taskId = execution.handle.taskId;
    assert.ok(await until(() => hostProcessesWith(needle).length > 0, 15_000), 'the job is running');
    await execution.cancel();
    const cancelCall = wireAnswer(c, 'tasks/cancel');
    assert.ok(!cancelCall.error, `tasks/cancel: ${JSON.stringify(cancelCall)}`);
    const got = await rawGet(c, taskId);
    assert.equal(got.result?.status, 'cancelled', JSON.stringify(got));
    assert.ok(await until(() => hostProcessesWith(needle).length === 0, 15_000), `its process is gone: ${hostProcessesWith(needle)}`);
    const polled = await c.client.callTool({ name: 'poll_job', arguments: jobs.poll(taskId) });
    assert.equal(polled.structuredContent?.status, 'cancelled', 'poll_job says cancelled too');
  } finally {
    for (const line of hostProcessesWith(needle)) process.kill(Number(line.split(':')[0]), 'SIGKILL');
    await session.close();
    await c.close();
  }
}

// `restart()` stops the server and starts a new one on the same instances folder; resolves the
// new target.
async function modernTaskOutlivesRestart(target, endpointId, jobs, restart) {
  const marker = fresh('task-restart');
  const c1 = await connectV2(target);
  const s1 = tasksSession(c1, endpointId);
  let reference;
  try {
    const execution = await s1.callTool('submit_job', jobs.submit({ command: `sleep 4; echo ${marker}` }));
    assert.equal(execution.kind, 'task');
    assert.equal(wireAnswer(c1, 'tools/call').result.status, 'working');
    reference = execution.serializeReference();
    await execution.detach();
  } finally {
    // Not s1.close(): ext-tasks 0.2.2 cancels even a detached execution on a session's close.
    // The client going away is what a crash or a restart looks like.
    await c1.close();
  }
  const next = await restart();
  const c2 = await connectV2(next);
  const s2 = tasksSession(c2, endpointId);
  try {
    const resumed = await s2.resumeTask(reference);
    const { outcome } = await resumed.settle();
    assert.equal(outcome.status, 'completed', `after the restart: ${outcome.status} ${outcome.error?.message ?? ''}`);
    assert.match(textOf(outcome.result), new RegExp(marker));
    assert.equal(outcome.result.structuredContent?.job_id, jobOf(reference.taskId));
  } catch (err) {
    err.message += `\nserver stderr tail:\n${(next.stderr?.() ?? c2.stderr()).slice(-2000)}`;
    throw err;
  } finally {
    await s2.close();
    await c2.close();
  }
}

async function modernWithoutExtension(target, jobs) {
  const c = await connectV2(target);
  try {
    const marker = fresh('plain');
    const result = await c.client.callTool({ name: 'submit_job', arguments: jobs.submit({ command: `echo ${marker}` }) });
    assert.ok(!result.isError, textOf(result));
    assert.equal(result.structuredContent?.status, 'completed', 'the plain submit_job result: the job waited for');
    assert.match(textOf(result), new RegExp(marker));
    assert.ok(!('taskId' in result), 'no task');
    const got = await rawGet(c, `${jobs.instance ?? INSTANCE}/${result.structuredContent.job_id}`, { extension: false });
    assert.equal(got.kind, 'error', `tasks/get without the extension: ${JSON.stringify(got)}`);
    assert.equal(got.error.code, -32021, JSON.stringify(got.error));
    assert.match(got.error.message, /tasks/);
  } finally {
    await c.close();
  }
}

// terminal_execute asked for more than 60 s: a command that ends within 5 s is answered as ever, a
// slower one becomes a task whose result is terminal_execute's.
async function terminalAsTask(target, endpointId) {
  const c = await connectV2(target);
  const session = tasksSession(c, endpointId);
  try {
    const quick = await session.callTool('terminal_execute', { instance_id: INSTANCE, command: 'echo quick-one', timeout: 120 });
    assert.equal(quick.kind, 'immediate', 'a quick command is answered as ever');
    const { outcome: now } = await quick.settle();
    assert.match(textOf(now.result), /quick-one/);
    const marker = fresh('slow-terminal');
    const slow = await session.callTool('terminal_execute', { instance_id: INSTANCE, command: `sleep 6; echo ${marker}`, timeout: 120 });
    assert.equal(slow.kind, 'task', 'a command past 5 s became a task');
    const { outcome } = await slow.settle();
    assert.equal(outcome.status, 'completed', `${outcome.status} ${outcome.error?.message ?? ''}`);
    assert.match(textOf(outcome.result), new RegExp(marker), "terminal_execute's output in the task's result");
  } finally {
    await session.close();
    await c.close();
  }
}

// --- 2025-11-25 experimental tasks (SDK 1.32.2) -----------------------------------------------
async function legacyTasks(target, jobs) {
  const c = await connectV1(target);
  const { client } = c;
  const { command, needle } = sleeper();
  try {
    const caps = client.getServerCapabilities()?.tasks;
    assert.ok(caps?.requests?.tools?.call, `the tasks capability: ${JSON.stringify(client.getServerCapabilities())}`);
    assert.ok(caps.list && caps.cancel, JSON.stringify(caps));
    const { tools } = await client.listTools();
    assert.equal(tools.find((t) => t.name === 'submit_job')?.execution?.taskSupport, 'optional');

    // A task-augmented call followed to its result (callToolStream: tasks/get, tasks/result).
    const marker = fresh('legacy-task');
    const seen = [];
    for await (const message of client.experimental.tasks.callToolStream(
      { name: 'submit_job', arguments: jobs.submit({ command: `sleep 1; echo ${marker}` }) },
      CallToolResultSchema,
      { task: { ttl: 600_000 } },
    ))
      seen.push(message);
    assert.equal(seen[0]?.type, 'taskCreated', JSON.stringify(seen[0]));
    const taskId = seen[0].task.taskId;
    assert.match(taskId, jobs.taskId);
    assert.match(seen[0].task.createdAt, ISO);
    const last = seen.at(-1);
    assert.equal(last.type, 'result', `the stream ended with ${JSON.stringify(last)}`);
    assert.match(textOf(last.result), new RegExp(marker));
    assert.equal(last.result.structuredContent?.status, 'completed');

    const got = await client.experimental.tasks.getTask(taskId);
    assert.equal(got.status, 'completed');
    assert.equal(got.taskId, taskId);
    const result = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
    assert.deepEqual(result.structuredContent, last.result.structuredContent);
    const polled = await client.callTool({ name: 'poll_job', arguments: jobs.poll(taskId) });
    assert.deepEqual(result.structuredContent, polled.structuredContent, 'tasks/result is what poll_job gives');
    const listed = await client.experimental.tasks.listTasks();
    assert.ok(listed.tasks.some((t) => t.taskId === taskId), `tasks/list has ${taskId}: ${JSON.stringify(listed.tasks.map((t) => t.taskId))}`);

    // One cancelled: tasks/cancel answers the task, cancelled; its process is gone.
    const created = await client.request(
      { method: 'tools/call', params: { name: 'submit_job', arguments: jobs.submit({ command }), task: { ttl: 600_000 } } },
      CreateTaskResultSchema,
    );
    const longId = created.task.taskId;
    assert.equal(created.task.status, 'working');
    assert.ok(await until(() => hostProcessesWith(needle).length > 0, 15_000), 'the job is running');
    const cancelled = await client.experimental.tasks.cancelTask(longId);
    assert.equal(cancelled.status, 'cancelled', JSON.stringify(cancelled));
    assert.equal((await client.experimental.tasks.getTask(longId)).status, 'cancelled');
    assert.ok(await until(() => hostProcessesWith(needle).length === 0, 15_000), `its process is gone: ${hostProcessesWith(needle)}`);

    // Without params.task: today's result.
    const plain = await client.callTool({ name: 'submit_job', arguments: jobs.submit({ command: `echo ${marker}-plain` }) });
    assert.ok(!plain.isError && !('task' in plain), JSON.stringify(plain).slice(0, 500));
    assert.equal(plain.structuredContent?.status, 'completed');
    assert.match(textOf(plain), new RegExp(`${marker}-plain`));
  } catch (err) {
    err.message += `\nserver stderr tail:\n${(target.stderr?.() ?? c.stderr()).slice(-2000)}`;
    throw err;
  } finally {
    for (const line of hostProcessesWith(needle)) process.kill(Number(line.split(':')[0]), 'SIGKILL');
    await c.close();
  }
}

describe('jobs as tasks on ns-hpc run', () => {
  let home;
  let server;
  const jobs = runJobs();
  const target = (transport) =>
    transport === 'stdio'
      ? { stdio: { command: NSHPC_BINARY, args: nshpcArgs(home), env: childEnv(home) } }
      : { url: server.url, token: server.token, stderr: () => server.stderr() };
  const endpoint = (transport) => `nshpc-e2e-run-${transport}-${home.root}`;

  before(async () => {
    home = makeHttpHome('tasks-run');
    cli(home, 'instance', 'create', INSTANCE, '--persistent', '--network', 'off');
    server = await startServer(home);
  });
  after(async () => {
    await server?.stop();
    deleteQuietly(home, INSTANCE);
    removeHome(home);
  });

  for (const transport of TRANSPORTS) {
    test(`2026-07-28 + Tasks extension over ${transport}: submit_job is a task; tasks/get to what poll_job gives`, () =>
      modernTaskCompletes(target(transport), endpoint(transport), jobs));
    test(`2026-07-28 + Tasks extension over ${transport}: tasks/cancel cancels it, its process gone`, () =>
      modernTaskCancelled(target(transport), endpoint(transport), jobs));
    test(`2026-07-28 + Tasks extension over ${transport}: the task outlives a server restart`, () =>
      modernTaskOutlivesRestart(target(transport), endpoint(transport), jobs, async () => {
        if (transport === 'stdio') return target(transport); // the client's close ended its server
        await server.stop();
        server = await startServer(home);
        return target(transport);
      }));
    test(`2026-07-28 without the extension over ${transport}: the plain result; tasks/get is -32021`, () =>
      modernWithoutExtension(target(transport), jobs));
    test(`2026-07-28 + Tasks extension over ${transport}: terminal_execute (timeout 120) answered at once, or as a task when slow`, () =>
      terminalAsTask(target(transport), endpoint(transport)));
    test(`2025-11-25 (SDK 1.32.2 experimental.tasks) over ${transport}: task, tasks/get|result|list|cancel; a plain call`, () =>
      legacyTasks(target(transport), jobs));
  }
});

describe('jobs as tasks on ns-hpc computer', { skip: haveTestImage() ? false : `no image 'test' in ${IMAGES_DIR}` }, () => {
  let stdioHome;
  let httpHome;
  let server;
  const TOKEN = 'tasks-e2e-token-0123456789abcdef';
  const jobs = { submit: (args) => args, poll: (taskId) => ({ job_id: jobOf(taskId) }), taskId: new RegExp(`^${COMPUTER}/[0-9a-f]{12}$`), instance: COMPUTER };
  const target = (transport) =>
    transport === 'stdio'
      ? { stdio: { command: NSHPC_BINARY, args: ['--config', stdioHome.config, 'computer'], env: { ...childEnv(stdioHome), COMPUTER_ID: COMPUTER } } }
      : { url: server.url, token: TOKEN, stderr: () => server.stderr() };
  before(async () => {
    stdioHome = useTestImage(makeHome('tasks-computer'));
    httpHome = useTestImage(makeHome('tasks-computer-http'));
    server = await startComputerHttp(httpHome, COMPUTER, childEnv(httpHome), ['--auth-token', TOKEN]);
  });
  after(async () => {
    await server?.stop();
    removeHome(stdioHome);
    removeHome(httpHome);
  });
  for (const transport of TRANSPORTS) {
    test(`2026-07-28 + Tasks extension over ${transport}: submit_job is a task; tasks/get to what poll_job gives`, () =>
      modernTaskCompletes(target(transport), `nshpc-e2e-computer-${transport}`, jobs));
    test(`2026-07-28 without the extension over ${transport}: the plain result; tasks/get is -32021`, () =>
      modernWithoutExtension(target(transport), jobs));
  }
});

// A Slurm job above [mcp] confirm_slurm_cpu_hours from a client with the Tasks extension: a task
// in input_required whose question ext-tasks hands to its onInputRequest and answers with
// tasks/update; no ends it cancelled with nothing submitted, yes submits it once. The scheduler's
// commands are fakes that note their calls (no cluster here).
describe('a big Slurm job as a task awaiting the user (2026-07-28, ext-tasks, stdio)', () => {
  let home;
  let calls;
  let target;
  before(() => {
    home = makeHome('tasks-slurm');
    calls = path.join(home.root, 'sbatch.calls');
    const fake = (name, body) => {
      const file = path.join(home.root, name);
      fs.writeFileSync(file, `#!/bin/sh\n${body}`, { mode: 0o755 });
      return file;
    };
    const sbatch = fake('sbatch', `echo "$@" >> '${calls}'\necho 4242\n`);
    const quiet = (name) => JSON.stringify([fake(name, 'exit 0\n')]);
    fs.appendFileSync(
      home.config,
      `[jobs.slurm]\nsbatch_command = ${JSON.stringify([sbatch, '--cpus-per-task={cpus}'])}\n` +
        `squeue_command = ${quiet('squeue')}\nsacct_command = ${quiet('sacct')}\nscancel_command = ${quiet('scancel')}\n` +
        'poll_interval = 60\n[jobs.slurm.limit]\ncpus = { default = 1, max = 64 }\n' +
        '[mcp]\nconfirm_destructive = true\nconfirm_slurm_cpu_hours = 2\n',
    );
    cli(home, 'instance', 'create', 'hpc', '--network', 'off');
    target = { stdio: { command: NSHPC_BINARY, args: nshpcArgs(home), env: childEnv(home) } };
  });
  after(() => removeHome(home));
  const submitted = () => (fs.existsSync(calls) ? fs.readFileSync(calls, 'utf8').split('\n').filter(Boolean).length : 0);
  const big = { instance_id: 'hpc', command: 'make -j', mode: 'slurm', resources: { cpus: 8 } };

  for (const answer of ['decline', 'accept']) {
    test(`answered ${answer === 'accept' ? 'yes: submitted once' : 'no: cancelled, nothing submitted'}`, async () => {
      const asked = [];
      const c = await connectV2(target);
      const session = tasksSession(c, `nshpc-e2e-slurm-${home.root}`, {
        onInputRequest: async (request) => {
          asked.push(request);
          return answer === 'accept' ? { action: 'accept', content: { confirm: true } } : { action: 'decline' };
        },
      });
      const before = submitted();
      try {
        const execution = await session.callTool('submit_job', big);
        assert.equal(execution.kind, 'task');
        const created = wireAnswer(c, 'tools/call').result;
        assert.equal(created.status, 'input_required', JSON.stringify(created));
        assert.equal(submitted(), before, 'nothing goes to Slurm before the answer');
        const settled = execution.settle();
        settled.catch(() => {});
        if (answer === 'decline') {
          const { outcome } = await settled;
          assert.equal(outcome.status, 'cancelled', JSON.stringify(outcome.status));
          assert.equal(submitted(), before, 'nothing submitted after a no');
        } else {
          assert.ok(await until(() => submitted() === before + 1, 15_000), 'sbatch called after the yes');
          // sbatch notes its call before it answers: the task moves on once the server has the answer.
          let got;
          await until(async () => (got = await rawGet(c, created.taskId)).result?.status !== 'input_required', 10_000);
          assert.equal(got.result?.status, 'working', `the task follows the Slurm job under its id: ${JSON.stringify(got)}`);
          // Not cancelled: cancelling a Slurm job waits for the scheduler to let it go (about 35 s
          // with these fakes); the home goes with its records.
          await execution.detach();
          assert.equal(submitted(), before + 1, 'submitted once');
        }
        assert.equal(asked.length, 1, `asked once: ${JSON.stringify(asked)}`);
        assert.equal(asked[0].kind, 'elicitation');
        assert.match(JSON.stringify(asked[0].params), /8 CPU\(s\)/);
        const updates = c.raw.log.filter(([m]) => m.method === 'tasks/update');
        assert.equal(updates.length, 1, 'the answer went as tasks/update');
      } catch (err) {
        err.message += `\nserver stderr tail:\n${c.stderr().slice(-2000)}`;
        throw err;
      } finally {
        // A session's close would cancel the task it still holds (ext-tasks 0.2.2): the client
        // goes without it.
        if (answer === 'decline') await session.close();
        await c.close();
      }
    });
  }
});

// --- confirmations ------------------------------------------------------------------------------
const CONFIRM_ON = '[mcp]\nconfirm_destructive = true\n';
const del = (id, extra = {}) => ({ name: 'delete_instance', arguments: { instance_id: id, ...extra } });
// A tool's refusal: an isError result (or a JSON-RPC error) with its message.
const refusal = (r) => (r.kind === 'error' ? r.error.message : r.result?.isError ? textOf(r.result) : '');

describe('confirmations with [mcp] confirm_destructive = true', () => {
  let home;
  let server;
  const target = (transport) =>
    transport === 'stdio'
      ? { stdio: { command: NSHPC_BINARY, args: nshpcArgs(home), env: childEnv(home) } }
      : { url: server.url, token: server.token, stderr: () => server.stderr() };
  const exists = (id) => fs.existsSync(path.join(home.instancesDir, id));
  function instance() {
    const id = fresh('doomed');
    cli(home, 'instance', 'create', id, '--network', 'off');
    assert.ok(exists(id), `${id} created`);
    return id;
  }

  before(async () => {
    home = makeHttpHome('tasks-confirm', CONFIRM_ON);
    server = await startServer(home);
  });
  after(async () => {
    await server?.stop();
    removeHome(home);
  });

  for (const transport of TRANSPORTS) {
    for (const [era, connect] of [
      ['2025-11-25 elicitation/create (SDK 1.32.2)', (t, o) => connectV1(t, o)],
      ['2026-07-28 input_required (v2 client auto-fulfilment)', (t, o) => connectV2(t, o)],
    ]) {
      for (const action of ['accept', 'decline']) {
        test(`${era} over ${transport}: delete_instance answered ${action === 'accept' ? 'yes: deleted' : 'no: kept'}`, async () => {
          const id = instance();
          const asked = [];
          const c = await connect(target(transport), { capabilities: { elicitation: {} }, elicit: answering(action, asked) });
          try {
            const result = await c.client.callTool(del(id));
            assert.equal(asked.length, 1, `the user was asked once (asked: ${JSON.stringify(asked)})`);
            assert.ok(JSON.stringify(asked[0]).includes(id), `the question names ${id}: ${JSON.stringify(asked[0])}`);
            assert.equal(asked[0].requestedSchema?.properties?.confirm?.type, 'boolean', JSON.stringify(asked[0]));
            if (action === 'accept') {
              assert.ok(!result.isError, textOf(result));
              assert.equal(result.structuredContent?.deleted, id);
              assert.ok(!exists(id), `${id} deleted`);
            } else {
              assert.ok(result.isError, `declined is an error result: ${textOf(result)}`);
              assert.match(textOf(result), /declined/);
              assert.ok(exists(id), `${id} kept`);
            }
          } catch (err) {
            err.message += `\nserver stderr tail:\n${(target(transport).stderr?.() ?? c.stderr()).slice(-2000)}`;
            throw err;
          } finally {
            await c.close();
            deleteQuietly(home, id);
          }
        });
      }
    }

    test(`a client with neither capability over ${transport} (both eras): told to pass confirm: true, then deleted with it`, async () => {
      for (const connect of [connectV1, connectV2]) {
        const id = instance();
        const c = await connect(target(transport));
        try {
          const refused = await c.client.callTool(del(id));
          assert.ok(refused.isError, `refused without confirmation: ${textOf(refused)}`);
          assert.match(textOf(refused), /confirm: true/);
          assert.ok(exists(id), `${id} kept`);
          const done = await c.client.callTool(del(id, { confirm: true }));
          assert.ok(!done.isError, textOf(done));
          assert.ok(!exists(id), `${id} deleted with confirm: true`);
        } finally {
          await c.close();
          deleteQuietly(home, id);
        }
      }
    });
  }

  // Raw modern POSTs: a real input_required answer, its requestState forged and replayed.
  const elicitCaps = { elicitation: {} };
  async function ask(id) {
    const r = await modernPost(server.url, server.token, modernRequest('tools/call', del(id), {}, { capabilities: elicitCaps }));
    assert.equal(r.status, 200, r.text);
    const result = r.json?.result;
    assert.equal(result?.resultType, 'input_required', r.text);
    const keys = Object.keys(result.inputRequests ?? {});
    assert.equal(keys.length, 1, r.text);
    assert.equal(result.inputRequests[keys[0]].method, 'elicitation/create', r.text);
    assert.equal(typeof result.requestState, 'string');
    return { key: keys[0], state: result.requestState };
  }
  async function retry(id, key, state) {
    const params = { ...del(id), inputResponses: { [key]: { action: 'accept', content: { confirm: true } } }, requestState: state };
    const r = await modernPost(server.url, server.token, modernRequest('tools/call', params, {}, { capabilities: elicitCaps }));
    assert.equal(r.status, 200, r.text);
    return r.json.error ? { kind: 'error', error: r.json.error } : { kind: 'result', result: r.json.result };
  }

  test('HTTP, raw 2026-07-28: a forged requestState (one byte flipped) is refused, nothing deleted', async () => {
    const id = instance();
    try {
      const { key, state } = await ask(id);
      const i = Math.floor(state.length / 3);
      const forged = state.slice(0, i) + (state[i] === 'A' ? 'B' : 'A') + state.slice(i + 1);
      const r = await retry(id, key, forged);
      assert.match(refusal(r), /refused/, `a forged state: ${JSON.stringify(r)}`);
      assert.ok(exists(id), `${id} kept`);
    } finally {
      deleteQuietly(home, id);
    }
  });

  test('HTTP, raw 2026-07-28: a replayed requestState is refused (the instance made again is kept)', async () => {
    const id = instance();
    try {
      const { key, state } = await ask(id);
      const first = await retry(id, key, state);
      assert.equal(refusal(first), '', `the genuine retry: ${JSON.stringify(first)}`);
      assert.ok(!exists(id), `${id} deleted by the genuine retry`);
      cli(home, 'instance', 'create', id, '--network', 'off'); // the same arguments would delete it again
      const second = await retry(id, key, state);
      assert.match(refusal(second), /refused/, `a replayed state: ${JSON.stringify(second)}`);
      assert.ok(exists(id), `${id} kept`);
    } finally {
      deleteQuietly(home, id);
    }
  });
});

describe('confirmations off (the default): delete_instance works at once', () => {
  let home;
  before(() => {
    home = makeHome('tasks-noconfirm');
  });
  after(() => removeHome(home));

  test('stdio, both eras, clients that could be asked: deleted without a question', async () => {
    const target = { stdio: { command: NSHPC_BINARY, args: nshpcArgs(home), env: childEnv(home) } };
    for (const connect of [connectV1, connectV2]) {
      const id = fresh('plain-delete');
      cli(home, 'instance', 'create', id, '--network', 'off');
      const asked = [];
      const c = await connect(target, { capabilities: { elicitation: {} }, elicit: answering('decline', asked) });
      try {
        const result = await c.client.callTool(del(id));
        assert.ok(!result.isError, textOf(result));
        assert.equal(asked.length, 0, 'nobody was asked');
        assert.ok(!fs.existsSync(path.join(home.instancesDir, id)), `${id} deleted`);
      } finally {
        await c.close();
        deleteQuietly(home, id);
      }
    }
  });
});
