// End-to-end tests of the job tools (submit_job, poll_job, list_jobs, cancel_job) of `ns-hpc run`
// over stdio with the MCP TypeScript SDK client: states, output tails, waits with and without
// detach, cancellation of whole process trees, limits, progress, cancelled waits, many jobs at
// once, jobs that outlive the server (clean exit and kill -9), sharing the instance with
// terminal_execute, and the audit log.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
  NSHPC_BINARY,
  RawChild,
  ajv,
  childEnv,
  compileSchema,
  connectNshpc,
  createInstance,
  hostProcessesWith,
  makeHome,
  nshpcArgs,
  removeHome,
  sleep,
  textOf,
  until,
} from './lib.mjs';

const ID = 'jobs';
const JOB_TOOLS = ['submit_job', 'poll_job', 'list_jobs', 'cancel_job'];
const FINAL = ['completed', 'failed', 'cancelled', 'timed_out', 'lost', 'out_of_memory', 'output_limit'];
const IS_ROOT = typeof process.geteuid === 'function' && process.geteuid() === 0;



// Whether a job provably never started: bwrap never reported a sandbox (no child-pid in its
// status file) and the job wrote nothing.
function neverStarted(home, instance, jobId) {
  const base = path.join(home.instancesDir, instance);
  const read = (p) => {
    try {
      return fs.readFileSync(p, 'utf8');
    } catch {
      return '';
    }
  };
  return (
    !/child-pid/.test(read(path.join(base, 'status', `${jobId}.status`))) &&
    read(path.join(base, 'workspace', '.ns_hpc_output', `${jobId}.out`)) === '' &&
    read(path.join(base, 'workspace', '.ns_hpc_output', `${jobId}.err`)) === ''
  );
}

// The cgroup folders of a job that exist on the host (<hierarchy>/.../ns-hpc/<instance>/<job>).
function jobCgroups(instance, jobId) {
  const found = [];
  const walk = (dir, depth) => {
    let entries;
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      const p = path.join(dir, e.name);
      if (e.name === 'ns-hpc') {
        const j = path.join(p, instance, jobId);
        if (fs.existsSync(j)) found.push(j);
      } else if (depth < 3) {
        walk(p, depth + 1);
      }
    }
  };
  walk('/sys/fs/cgroup', 0);
  return found;
}

// Tool-calling helpers around one SDK client: every successful result of a job tool is checked
// against the tool's outputSchema.
function jobApi(client, validators) {
  async function call(name, args, options) {
    const result = await client.callTool({ name, arguments: args }, undefined, options);
    assert.ok(Array.isArray(result.content), `${name}: content is an array`);
    if (!result.isError && validators[name]) {
      assert.ok(result.structuredContent, `${name}: structuredContent present`);
      const problem = validators[name](result.structuredContent);
      assert.equal(problem, null, `${name}: structuredContent matches outputSchema: ${problem}`);
    }
    return result;
  }
  async function ok(name, args, options) {
    const result = await call(name, args, options);
    assert.notEqual(result.isError, true, `${name}(${JSON.stringify(args).slice(0, 300)}) failed: ${textOf(result)}`);
    return result;
  }
  async function refused(name, args, pattern) {
    const result = await call(name, args);
    assert.equal(result.isError, true, `${name}(${JSON.stringify(args)}) should be refused: ${textOf(result).slice(0, 500)}`);
    assert.match(textOf(result), pattern);
    return textOf(result);
  }
  return {
    call,
    ok,
    refused,
    submit: async (instance, args, options) =>
      (await ok('submit_job', { instance_id: instance, ...args }, options)).structuredContent,
    poll: async (instance, job, args = {}) =>
      (await ok('poll_job', { instance_id: instance, job_id: job, ...args })).structuredContent,
    cancel: async (instance, job) => (await ok('cancel_job', { instance_id: instance, job_id: job })).structuredContent,
    list: async (instance, args = {}) => (await ok('list_jobs', { instance_id: instance, ...args })).structuredContent,
  };
}

async function outputValidators(client) {
  const { tools } = await client.listTools();
  const a = ajv();
  const validators = {};
  for (const name of [...JOB_TOOLS, 'terminal_execute']) {
    const t = tools.find((x) => x.name === name);
    assert.ok(t, `${name} is listed (got ${tools.map((x) => x.name)})`);
    validators[name] = compileSchema(a, t.outputSchema);
  }
  return { tools, validators };
}

describe('job tools', () => {
  let home;
  let conn;
  let client;
  let api;
  let tools;

  before(async () => {
    home = makeHome('jobs');
    conn = await connectNshpc(home);
    client = conn.client;
    const found = await outputValidators(client);
    tools = found.tools;
    api = jobApi(client, found.validators);
    await createInstance(client, { instance_id: ID, network: 'off' });
  });

  after(async () => {
    // Nothing of ours may be left running.
    if (api) {
      try {
        for (const j of (await api.list(ID, { status: 'running', limit: 500 })).jobs) await api.cancel(ID, j.job_id);
      } catch {
        // the server may be gone already
      }
    }
    if (conn) await conn.close();
    removeHome(home);
  });

  test('tools/list: the four job tools with valid schemas', () => {
    for (const name of JOB_TOOLS) {
      const t = tools.find((x) => x.name === name);
      assert.equal(t.inputSchema.type, 'object', `${name}: inputSchema`);
      assert.ok(t.inputSchema.required.includes('instance_id'), `${name} requires instance_id`);
      assert.equal(t.outputSchema.type, 'object', `${name}: outputSchema`);
    }
    const submit = tools.find((x) => x.name === 'submit_job');
    // command or args: neither is required on its own.
    assert.deepEqual([...submit.inputSchema.required].sort(), ['instance_id']);
    for (const l of ['cpus', 'memory', 'pids', 'time', 'output'])
      assert.ok(submit.inputSchema.properties.limits.properties[l], `limit ${l} in the schema`);
    assert.equal(tools.find((x) => x.name === 'list_jobs').annotations.readOnlyHint, true);
  });

  test('1. a job that completes: status, exit code, tails, sandbox paths, text', async () => {
    const command = 'echo hi; echo err >&2';
    const result = await api.ok('submit_job', { instance_id: ID, command });
    const job = result.structuredContent;
    assert.match(job.job_id, /^[0-9a-f]{12}$/);
    assert.equal(job.instance_id, ID);
    assert.equal(job.status, 'completed');
    assert.equal(job.exit_code, 0);
    assert.equal(job.command, command);
    assert.equal(job.stdout_tail, 'hi');
    assert.equal(job.stderr_tail, 'err');
    assert.equal(job.stdout_path, `/workspace/.ns_hpc_output/${job.job_id}.out`);
    assert.equal(job.stderr_path, `/workspace/.ns_hpc_output/${job.job_id}.err`);
    assert.equal(typeof job.duration_s, 'number');
    assert.ok(job.duration_s >= 0 && job.duration_s < 30, `duration_s ${job.duration_s}`);
    assert.equal(job.limits.memory, 4096, 'the default memory limit applies');
    assert.equal(job.limits.time, 3600, 'the default time limit applies');
    // The files are where the sandbox paths say (the workspace on the host).
    const ws = path.join(home.instancesDir, ID, 'workspace');
    assert.equal(fs.readFileSync(path.join(ws, '.ns_hpc_output', `${job.job_id}.out`), 'utf8'), 'hi\n');
    assert.equal(fs.readFileSync(path.join(ws, '.ns_hpc_output', `${job.job_id}.err`), 'utf8'), 'err\n');
    const text = textOf(result);
    assert.match(text, /completed/);
    assert.ok(text.includes(job.job_id), 'text names the job');
    assert.match(text, /\bhi\b/);
    assert.match(text, /\berr\b/);
    // poll_job of a finished job returns the same.
    const again = await api.poll(ID, job.job_id);
    assert.equal(again.status, 'completed');
    assert.equal(again.stdout_tail, 'hi');
  });

  test('2. a non-zero exit is failed with its code', async () => {
    const result = await api.ok('submit_job', { instance_id: ID, command: 'exit 42' });
    const job = result.structuredContent;
    assert.equal(job.status, 'failed');
    assert.equal(job.exit_code, 42);
    assert.match(job.reason, /42/);
    assert.match(textOf(result), /failed/);
    assert.match(textOf(result), /42/);
  });

  test('3. the wait runs out with detach: the job keeps running until cancel_job', async () => {
    const t0 = Date.now();
    const job = await api.submit(ID, { command: 'sleep 30', timeout: 1 });
    assert.ok(Date.now() - t0 < 10_000, `returned after ${Date.now() - t0} ms`);
    assert.equal(job.status, 'running');
    assert.ok(!('exit_code' in job), 'no exit code yet: left out, never null');
    const looked = await api.poll(ID, job.job_id, { timeout: 0 });
    assert.equal(looked.status, 'running');
    await sleep(1000);
    assert.equal((await api.poll(ID, job.job_id)).status, 'running', 'poll_job did not cancel it');
    const running = await api.list(ID, { status: 'running' });
    assert.ok(running.jobs.some((j) => j.job_id === job.job_id), 'listed as running');
    const cancelled = await api.cancel(ID, job.job_id);
    assert.equal(cancelled.status, 'cancelled');
    const listed = await api.list(ID);
    const entry = listed.jobs.find((j) => j.job_id === job.job_id);
    assert.ok(entry, 'listed');
    assert.equal(entry.status, 'cancelled');
    // Cancelling again leaves it as it is.
    assert.equal((await api.cancel(ID, job.job_id)).status, 'cancelled');
  });

  test('4. the wait runs out without detach: cancelled; a zero-timeout poll never cancels', async () => {
    const job = await api.submit(ID, { command: 'sleep 30', timeout: 1, detach: false });
    assert.equal(job.status, 'cancelled');
    assert.equal((await api.poll(ID, job.job_id)).status, 'cancelled');

    const other = await api.submit(ID, { command: 'sleep 30', timeout: 0 });
    assert.equal(other.status, 'running');
    const looked = await api.poll(ID, other.job_id, { timeout: 0, detach: false });
    assert.equal(looked.status, 'running');
    await sleep(1000);
    assert.equal((await api.poll(ID, other.job_id)).status, 'running', 'still running after a timeout-0 poll with detach=false');
    // A real wait with detach=false that runs out does cancel it.
    const waited = await api.poll(ID, other.job_id, { timeout: 1, detach: false });
    assert.equal(waited.status, 'cancelled');
  });

  test('5. cancel_job kills a setsid, SIGTERM-ignoring process tree', async () => {
    const n = 600_000 + Math.floor(Math.random() * 300_000);
    const marker = String(n + 1); // only the sandboxed shell computes it
    const command = `setsid sh -c 'trap "" TERM; exec sleep $((${n}+1)).5' & trap '' TERM; sleep $((${n}+1)).6`;
    const job = await api.submit(ID, { command, timeout: 0 });
    assert.equal(job.status, 'running');
    const inner = `sleep\0${marker}.5`;
    const outer = `sleep\0${marker}.6`;
    assert.ok(
      await until(() => hostProcessesWith(inner).length > 0 && hostProcessesWith(outer).length > 0, 10_000),
      `both sleeps started: ${hostProcessesWith(marker)}`,
    );
    const t0 = Date.now();
    const cancelled = await api.cancel(ID, job.job_id);
    assert.equal(cancelled.status, 'cancelled');
    assert.ok(Date.now() - t0 < 30_000, `cancel_job took ${Date.now() - t0} ms`);
    assert.ok(await until(() => hostProcessesWith(marker).length === 0, 5000), `left: ${hostProcessesWith(marker)}`);
  });

  test('6. limits: time, memory, over the maximum, unknown', async () => {
    // time
    const timed = await api.submit(ID, { command: 'sleep 30', timeout: 30, limits: { time: 1 } });
    assert.equal(timed.status, 'timed_out', JSON.stringify(timed));
    assert.match(timed.reason, /time limit/);
    assert.equal(timed.limits.time, 1);

    // memory (root only: cgroups)
    if (IS_ROOT) {
      const probe = await api.submit(ID, { command: 'true', limits: { memory: 64 } });
      assert.equal(probe.status, 'completed');
      assert.ok(
        !(probe.unenforced ?? []).some((u) => /memory/.test(u)),
        `the memory limit is enforced as root: unenforced ${JSON.stringify(probe.unenforced)}`,
      );
      const hog = await api.submit(ID, {
        command: "perl -e '@a=(); while(1){push @a, q(x) x (1<<20)}'",
        timeout: 60,
        limits: { memory: 64, time: 60 },
      });
      assert.equal(hog.status, 'out_of_memory', JSON.stringify(hog));
      assert.match(hog.reason, /out of memory/);
    }

    // Refused limits run nothing.
    const before = (await api.list(ID, { limit: 500 })).total;
    const over = await api.refused('submit_job', { instance_id: ID, command: 'touch over.txt', limits: { memory: 999999999 } }, /262144/);
    assert.match(over, /memory/);
    await api.refused('submit_job', { instance_id: ID, command: 'touch over.txt', limits: { gpus: 1 } }, /gpus/);
    await api.refused('submit_job', { instance_id: ID, command: 'touch over.txt', limits: { time: -1 } }, /time/);
    assert.equal((await api.list(ID, { limit: 500 })).total, before, 'no job was recorded');
    assert.ok(!fs.existsSync(path.join(home.instancesDir, ID, 'workspace', 'over.txt')), 'nothing ran');
  });

  test('7. progress notifications while submit_job waits carry the newest output lines', async () => {
    const seen = [];
    const job = await api.submit(ID, { command: 'echo step 1; sleep 1.6; echo step 2; sleep 1.6; echo slept', timeout: 10 },
      { onprogress: (p) => seen.push(p) });
    assert.equal(job.status, 'completed');
    assert.equal(job.stdout_tail, 'step 1\nstep 2\nslept');
    assert.ok(seen.length >= 2, `progress seen: ${JSON.stringify(seen)}`);
    assert.equal(seen[0].total, 10);
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress, 'progress increases');
    const messages = seen.map((p) => p.message);
    assert.ok(messages.every((m) => /^waiting for the job \(running, \d+ s\)/.test(m)), JSON.stringify(messages));
    assert.ok(messages.some((m) => m.endsWith('\nstep 1')), JSON.stringify(messages));
    assert.ok(messages.some((m) => m.endsWith('\nstep 1\nstep 2')), JSON.stringify(messages));
  });

  test('8. cancelling the call stops the wait, not the job', async () => {
    const tag = `abort-${process.pid}-${Math.floor(Math.random() * 1e6)}`;
    const command = `sleep 30; echo ${tag}`;
    const controller = new AbortController();
    const pending = client.callTool(
      { name: 'submit_job', arguments: { instance_id: ID, command, timeout: 60 } },
      undefined,
      { signal: controller.signal, timeout: 120_000 },
    );
    pending.catch(() => {}); // observed below
    await sleep(1000);
    const t0 = Date.now();
    controller.abort('test cancels the wait');
    await assert.rejects(pending);
    assert.ok(Date.now() - t0 < 2000, 'rejected promptly');
    await client.ping();
    const running = await api.list(ID, { status: 'running', limit: 500 });
    const entry = running.jobs.find((j) => j.command === command);
    assert.ok(entry, `the job is still running: ${JSON.stringify(running.jobs)}`);
    // And stays so (the server's wait ended quietly, the job did not).
    await sleep(1500);
    assert.equal((await api.poll(ID, entry.job_id)).status, 'running');
    assert.equal((await api.cancel(ID, entry.job_id)).status, 'cancelled');
  });

  test('9. 200 concurrent jobs in one instance', async () => {
    const many = 'many';
    await createInstance(client, { instance_id: many });
    const N = 200;
    const IN_FLIGHT = 100; // below the server's cap of concurrent requests per session (mcp max_in_flight, 128)
    const submitOne = (i) =>
      api.call('submit_job', { instance_id: many, command: `echo job-${i}`, timeout: 30 }, { timeout: 120_000 }).then(
        (result) => ({ result }),
        (error) => ({ error }),
      );
    // All 200 at once: those over the session's in-flight cap must be refused cleanly (a JSON-RPC
    // "server busy" error, no job recorded); every accepted one must complete.
    const outcomes = await Promise.all(Array.from({ length: N }, (_, i) => submitOne(i)));
    const refused = [];
    const problems = [];
    const ids = new Set();
    const check = (i, { result, error }) => {
      if (error) {
        if (error.code === -32000 && /too many requests in flight \(limit \d+\)/.test(error.message)) refused.push(i);
        else problems.push(`${i}: ${error.message}`);
        return;
      }
      const s = result.structuredContent;
      if (result.isError) problems.push(`${i}: tool error ${textOf(result)}`);
      else if (s.status !== 'completed' || s.stdout_tail !== `job-${i}` || s.exit_code !== 0)
        problems.push(`${i}: ${s.status} ${s.exit_code} ${JSON.stringify(s.stdout_tail)} ${s.reason}`);
      else ids.add(s.job_id);
    };
    outcomes.forEach((o, i) => check(i, o));
    assert.deepEqual(problems, [], `${problems.length} of ${N} simultaneous submissions went wrong`);
    assert.ok(ids.size >= IN_FLIGHT, `at least ${IN_FLIGHT} accepted at once (got ${ids.size})`);
    assert.equal(ids.size + refused.length, N);
    assert.equal((await api.list(many, { limit: 500 })).total, ids.size, 'refused submissions recorded no job');
    // The refused ones again, with up to 60 in flight.
    const queue = [...refused];
    const again = [];
    await Promise.all(
      Array.from({ length: Math.min(60, queue.length) }, async () => {
        while (queue.length) {
          const i = queue.shift();
          again.push([i, await submitOne(i)]);
        }
      }),
    );
    for (const [i, o] of again) check(i, o);
    assert.deepEqual(problems, [], `${problems.length} of the resubmitted jobs went wrong`);
    assert.equal(ids.size, N, `all ${N} jobs ran (distinct ids)`);
    // A page holds what fits in [mcp] max_result_chars; next_offset leads to the rest.
    const listed = { jobs: [] };
    for (let offset = 0; offset !== undefined; ) {  // the last page has no next_offset
      const page = await api.list(many, { limit: 500, offset });
      assert.equal(page.total, N);
      assert.ok(page.jobs.length > 0);
      listed.jobs.push(...page.jobs);
      offset = page.next_offset;
    }
    assert.equal(listed.jobs.length, N);
    assert.equal(new Set(listed.jobs.map((j) => j.job_id)).size, N);
    assert.ok(listed.jobs.every((j) => j.status === 'completed'));
    assert.equal((await api.list(many, { status: 'completed', limit: 500 })).total, N);
    // Paging: default limit 15, newest first.
    const page = await api.list(many);
    assert.equal(page.jobs.length, 15);
    assert.equal(page.next_offset, 15);
    for (let i = 1; i < page.jobs.length; i++) assert.ok(page.jobs[i - 1].created_at >= page.jobs[i].created_at, 'newest first');
  });

  test('tail: the last lines of the output', async () => {
    const seq = await api.submit(ID, { command: 'seq 100; seq 3 >&2' });
    assert.equal(seq.stdout_tail, Array.from({ length: 50 }, (_, i) => String(51 + i)).join('\n'), 'default: 50 lines');
    assert.equal(seq.stderr_tail, '1\n2\n3');
    assert.equal((await api.poll(ID, seq.job_id, { tail: 2 })).stdout_tail, '99\n100');
    assert.equal((await api.poll(ID, seq.job_id, { tail: 1 })).stdout_tail, '100');
    assert.equal((await api.poll(ID, seq.job_id, { tail: 0 })).stdout_tail, undefined, 'an empty tail is left out');
    assert.equal((await api.poll(ID, seq.job_id, { tail: 1000 })).stdout_tail.split('\n').length, 100);
    const noNewline = await api.submit(ID, { command: 'printf "a\\nb\\nc"', tail: 2 });
    assert.equal(noNewline.stdout_tail, 'b\nc');
    // The result's output budget ([mcp] max_result_chars 30000 less 600) is shared by its two
    // copies (text and structuredContent) and, in each, by the two streams: 7,350 per tail.
    const wide = await api.submit(ID, { command: 'head -c 100000 /dev/zero | tr "\\0" a' });
    assert.ok(wide.stdout_tail.length <= 7350 + 1, `tail of ${wide.stdout_tail.length} characters`);
    assert.match(wide.stdout_tail, /a{7000}$/);
  });

  test(
    'tail: blank lines count as lines',
    {},
    async () => {
      const job = await api.submit(ID, { command: 'printf "a\\n\\n\\nc\\n"', tail: 2 });
      assert.equal(job.status, 'completed');
      assert.equal(job.stdout_tail, '\nc', 'tail 2 of "a", "", "", "c"');
    },
  );

  test('12. terminal_execute and jobs share the instance workspace', async () => {
    const wrote = await api.ok('terminal_execute', { instance_id: ID, command: 'echo shared-x > f' });
    assert.equal(wrote.structuredContent.exit_code, 0);
    const job = await api.submit(ID, { command: 'cat f; pwd' });
    assert.equal(job.status, 'completed');
    assert.equal(job.stdout_tail, 'shared-x\n/workspace');
    // And back: a file written by a job is read by terminal_execute.
    await api.submit(ID, { command: 'echo from-job > g' });
    const read = await api.ok('terminal_execute', { instance_id: ID, command: 'cat g' });
    assert.equal(read.structuredContent.stdout, 'from-job\n');
  });

  test('13. audit: one job.running and one final line per finished job', async () => {
    // Its own jobs: one that completes, one that fails (whatever ran before).
    const jobs = {};
    for (const [command, status] of [['true', 'completed'], ['exit 3', 'failed']]) {
      const job = (await api.ok('submit_job', { instance_id: ID, command })).structuredContent;
      assert.equal(job.status, status);
      jobs[job.job_id] = status;
    }
    const log = path.join(home.instancesDir, ID, 'audit.log');
    const records = fs
      .readFileSync(log, 'utf8')
      .split('\n')
      .filter((l) => l.trim())
      .map((l) => JSON.parse(l));
    for (const [id, status] of Object.entries(jobs)) {
      const mine = records.filter((r) => r.job_id === id && typeof r.event === 'string' && r.event.startsWith('job.'));
      const events = mine.map((r) => r.event);
      assert.equal(events.filter((e) => e === 'job.running').length, 1, `${id}: one job.running in ${events}`);
      const finals = events.filter((e) => FINAL.includes(e.slice(4)));
      assert.deepEqual(finals, [`job.${status}`], `${id}: one final line`);
    }
  });

  test('unknown instance and job ids are refused', async () => {
    await api.refused('submit_job', { instance_id: 'nope-404', command: 'true' }, /nope-404/);
    await api.refused('poll_job', { instance_id: ID, job_id: '000000000000' }, /000000000000/);
    await api.refused('poll_job', { instance_id: ID, job_id: '../x' }, /job id/);
    await api.refused('cancel_job', { instance_id: ID, job_id: '000000000000' }, /000000000000/);
    await api.refused('submit_job', { instance_id: ID, command: '  ' }, /empty/);
    await client.ping();
  });
});

describe('jobs across server restarts', () => {
  const RID = 'restart';
  let home;
  const conns = [];

  before(async () => {
    home = makeHome('jobs-restart');
    const c = await connectNshpc(home);
    conns.push(c);
    await createInstance(c.client, { instance_id: RID });
    await c.close();
  });

  after(async () => {
    for (const c of conns) await c.close();
    // Cancel whatever is left running.
    try {
      const c = await connectNshpc(home);
      const api = jobApi(c.client, {});
      for (const j of (await api.list(RID, { status: 'running', limit: 500 })).jobs) await api.cancel(RID, j.job_id);
      await c.close();
    } catch {
      // nothing to clean
    }
    // Empty cgroups the server left behind (reported by test 11): rmdir fails on busy ones.
    try {
      for (const f of fs.readdirSync(path.join(home.instancesDir, RID, '.ns_hpc_jobs'))) {
        if (!f.endsWith('.state')) continue;
        for (const dir of jobCgroups(RID, f.slice(0, -'.state'.length))) {
          try {
            fs.rmdirSync(dir);
          } catch {
            // busy or gone
          }
        }
      }
    } catch {
      // no jobs folder
    }
    removeHome(home);
  });

  async function server() {
    const c = await connectNshpc(home);
    conns.push(c);
    const { validators } = await outputValidators(c.client);
    return { conn: c, api: jobApi(c.client, validators) };
  }

  test('10a. a job survives the server exiting on EOF; the next server records its real end', async () => {
    const a = await server();
    const job = await a.api.submit(RID, { command: 'sleep 2; echo done; exit 3', timeout: 0 });
    assert.equal(job.status, 'running');
    const child = a.conn.transport._process;
    await a.conn.close();
    assert.equal(child.exitCode, 0, `server A exited by itself on EOF (code ${child.exitCode}, signal ${child.signalCode})`);
    await sleep(3000);
    const b = await server();
    const seen = await b.api.poll(RID, job.job_id, { timeout: 10 });
    assert.equal(seen.status, 'failed', JSON.stringify(seen));
    assert.equal(seen.exit_code, 3);
    assert.equal(seen.stdout_tail, 'done');
    await b.conn.close();
  });

  test('10b. a job running across a restart is watched by the next server', async () => {
    const a = await server();
    const job = await a.api.submit(RID, { command: 'sleep 4; echo later', timeout: 0 });
    assert.equal(job.status, 'running');
    await a.conn.close();
    const b = await server();
    const t0 = Date.now();
    const seen = await b.api.poll(RID, job.job_id, { timeout: 20 });
    assert.equal(seen.status, 'completed', JSON.stringify(seen));
    assert.equal(seen.exit_code, 0);
    assert.equal(seen.stdout_tail, 'later');
    assert.ok(Date.now() - t0 < 15_000, `poll_job returned ${Date.now() - t0} ms after the job ended`);
    await b.conn.close();
  });

  test('11. kill -9 in the middle of submit_job, 10 rounds: no corrupt or stuck records', async (t) => {
    const ROUNDS = 10;
    for (let k = 0; k < ROUNDS; k++) {
      const raw = new RawChild(NSHPC_BINARY, nshpcArgs(home), childEnv(home));
      try {
        await raw.initialize();
        raw.send({
          jsonrpc: '2.0',
          id: 1,
          method: 'tools/call',
          params: { name: 'submit_job', arguments: { instance_id: RID, command: `echo round-${k}`, timeout: 5 } },
        });
        await sleep(Math.floor(Math.random() * 301));
      } finally {
        await raw.kill();
      }
    }
    const c = await server();
    const listed = await c.api.list(RID, { limit: 500 });
    const jobsDir = path.join(home.instancesDir, RID, '.ns_hpc_jobs');
    const stateFiles = fs.readdirSync(jobsDir).filter((f) => f.endsWith('.state'));
    assert.equal(listed.total, stateFiles.length, `every state file is readable: ${stateFiles}`);
    const rounds = listed.jobs.filter((j) => /^echo round-\d+$/.test(j.command));
    assert.ok(rounds.length <= ROUNDS);
    const problems = [];
    const stuck = [];
    const tally = {};
    for (const j of rounds) {
      let seen = await c.api.poll(RID, j.job_id, { timeout: 10 });
      if (seen.status === 'pending') stuck.push(j.job_id);
      tally[seen.status] = (tally[seen.status] || 0) + 1;
      const k = j.command.replace('echo ', '');
      if (seen.status === 'completed') {
        if (seen.stdout_tail !== k || seen.exit_code !== 0) problems.push(`${j.job_id} ${k}: completed with ${JSON.stringify(seen.stdout_tail)}`);
      } else if (seen.status === 'lost') {
        // Only when it provably never started: no sandbox recorded, no output.
        if (!neverStarted(home, RID, j.job_id) || (seen.stdout_tail ?? '') !== '')
          problems.push(`${j.job_id} ${k}: lost although it started (stdout ${JSON.stringify(seen.stdout_tail)}; ${seen.reason})`);
      } else {
        problems.push(`${j.job_id} ${k}: ${seen.status} ${seen.reason} (created ${seen.created_at})`);
      }
    }
    t.diagnostic(`${rounds.length} of ${ROUNDS} rounds recorded a job: ${JSON.stringify(tally)}`);
    assert.deepEqual(stuck, [], 'jobs still pending after a poll by the next server');
    const leaked = rounds.flatMap((j) => jobCgroups(RID, j.job_id));
    assert.deepEqual(leaked, [], 'cgroups of finished jobs left behind');
    assert.deepEqual(problems, [], `rounds: ${rounds.length}`);
    await c.conn.close();
  });

  // The record a server leaves when it is killed right after recording a job as pending, before
  // the sandbox has started: made from a real record of a finished job, under a new id that
  // starts with `prefix`.
  async function pendingRecord(prefix) {
    const c = await server();
    const done = await c.api.submit(RID, { command: 'true' });
    await c.conn.close();
    const rec = JSON.parse(fs.readFileSync(path.join(recordsDir(), `${done.job_id}.state`), 'utf8'));
    const id = prefix + Math.floor(Math.random() * 0xffffff).toString(16).padStart(6, '0');
    const swap = (p) => p.replaceAll(done.job_id, id);
    Object.assign(rec, {
      job_id: id,
      status: 'pending',
      reason: '',
      exit_code: null,
      created_at: rec.created_at.replace(/^.{19}/, new Date().toISOString().slice(0, 19)),
      started_at: '',
      finished_at: '',
      stdout_path: swap(rec.stdout_path),
      stderr_path: swap(rec.stderr_path),
      handle: {
        backend: rec.handle.backend,
        version: rec.handle.version,
        data: { status_path: swap(rec.handle.data.status_path) },
      },
    });
    return { id, rec };
  }
  const recordsDir = () => path.join(home.instancesDir, RID, '.ns_hpc_jobs');
  const writeRecord = (id, rec) =>
    fs.writeFileSync(path.join(recordsDir(), `${id}.state`), JSON.stringify(rec, null, 2) + '\n');

  test(
    '11b. a job whose server died before its sandbox started is final at the next look',
    {},
    async () => {
      // The state a server leaves when it is killed right after recording a job as pending,
      // before the sandbox starts: made from a real record of a finished job.
      const { id, rec } = await pendingRecord('dead00');
      writeRecord(id, rec);
      const b = await server();
      try {
        // Nothing can start it any more: poll_job and cancel_job must see that at once.
        const seen = await b.api.poll(RID, id, { timeout: 10 });
        assert.equal(seen.status, 'lost', `poll_job timeout 10: ${seen.status}`);
        assert.ok(FINAL.includes((await b.api.cancel(RID, id)).status), 'cancel_job leaves it final');
      } finally {
        // Whatever the server says, settle it so the instance is not held (after 30 s it does).
        await b.api.poll(RID, id, { timeout: 40 });
        await b.conn.close();
      }
    },
  );

  test('11c. a job whose server died after starting its keeper is watched through the keeper, not lost', async () => {
    // The server was killed after the job keeper started but before the sandbox wrote its pid:
    // the keeper goes on and reports the end. A stand-in keeper (a shell holding the job's status
    // file open, as the keeper does) plays that part, from a real record of a finished job.
    const { id, rec } = await pendingRecord('cafe00');
    const status = fs.openSync(rec.handle.data.status_path, 'a', 0o600);
    const keeper = spawn(
      'sh',
      ['-c', 'printf \'{"ns-hpc-keeper": %d}\\n\' $$ >&3; sleep 2; printf \'{"exit-code": 0}\\n{"ns-hpc-ended": %s000}\\n\' "$(date +%s)" >&3'],
      { stdio: ['ignore', 'ignore', 'inherit', status] },
    );
    fs.closeSync(status);
    const keeperEnded = new Promise((resolve) => keeper.on('exit', resolve));
    await sleep(300);
    writeRecord(id, rec);
    const b = await server();
    try {
      const seen = await b.api.poll(RID, id, { timeout: 20 });
      assert.equal(seen.status, 'completed', `${seen.status}: ${seen.reason}`);
      assert.equal(seen.exit_code, 0);
    } finally {
      await keeperEnded;
      await b.conn.close();
    }
  });
});
