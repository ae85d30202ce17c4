// submit_job with mode "slurm" through `ns-hpc run` (stdio, the TypeScript SDK client) against the
// real single-node cluster. Runs only with NSHPC_SLURM_TESTS=1 (tests/slurm/run-tests.sh starts
// the cluster and sets it); skipped elsewhere.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ajv, compileSchema, connectNshpc, createInstance, makeHome, removeHome, textOf } from './lib.mjs';

const ENABLED = process.env.NSHPC_SLURM_TESTS === '1';

describe('submit_job mode "slurm" against a real cluster', { skip: !ENABLED && 'no Slurm cluster (tests/slurm/run-tests.sh runs this)' }, () => {
  let home;
  let conn;
  let validate;

  before(async () => {
    home = makeHome('slurm', '[jobs.slurm]\npoll_interval = 0.5\n[jobs.slurm.limit]\ncpus = { default = 1, max = 64 }\nmemory = { default = 300, max = 2048 }\n');
    conn = await connectNshpc(home);
    const { tools } = await conn.client.listTools();
    const submit = tools.find((t) => t.name === 'submit_job');
    assert.deepEqual(submit.inputSchema.properties.mode.enum, ['local', 'slurm']);
    assert.ok(submit.inputSchema.properties.resources.properties.cpus, 'resources.cpus is offered');
    validate = compileSchema(ajv(), submit.outputSchema);
    await createInstance(conn.client, { instance_id: 'hpc' });
  });

  after(async () => {
    await conn?.close();
    removeHome(home);
  });

  test('a job runs on the cluster and returns its output; list_jobs shows mode and scheduler state', async () => {
    const r = await conn.client.callTool(
      { name: 'submit_job', arguments: { instance_id: 'hpc', command: 'echo on-the-cluster', mode: 'slurm', resources: { cpus: 1, memory: 256 }, timeout: 120 } },
      undefined,
      { timeout: 180_000 },
    );
    assert.ok(!r.isError, textOf(r));
    assert.equal(validate(r.structuredContent), null);
    assert.equal(r.structuredContent.status, 'completed', textOf(r));
    assert.equal(r.structuredContent.mode, 'slurm');
    assert.equal(r.structuredContent.stdout_tail, 'on-the-cluster');
    assert.match(textOf(r), /Slurm job \d+: COMPLETED/);
    const list = await conn.client.callTool({ name: 'list_jobs', arguments: { instance_id: 'hpc' } });
    const job = list.structuredContent.jobs.find((j) => j.job_id === r.structuredContent.job_id);
    assert.equal(job.mode, 'slurm');
    assert.equal(job.scheduler_state, 'COMPLETED');
    assert.match(textOf(list), /\[slurm \d+ COMPLETED\]/);
  });

  test('a job asking more CPUs than the node has waits as pending with the reason, and cancel_job removes it', async () => {
    const r = await conn.client.callTool({
      name: 'submit_job',
      arguments: { instance_id: 'hpc', command: 'true', mode: 'slurm', resources: { cpus: 64 }, timeout: 3 },
    });
    assert.ok(!r.isError, textOf(r));
    assert.equal(r.structuredContent.status, 'pending', textOf(r));
    assert.ok(r.structuredContent.scheduler_reason && r.structuredContent.scheduler_reason !== 'None', textOf(r));
    const c = await conn.client.callTool({ name: 'cancel_job', arguments: { instance_id: 'hpc', job_id: r.structuredContent.job_id } }, undefined, { timeout: 120_000 });
    assert.equal(c.structuredContent.status, 'cancelled', textOf(c));
  });

  test('bad resources are refused before anything is submitted', async () => {
    for (const resources of [{ cpus: 65 }, { gpus: 1 }, { memory: -1 }, { cpus: 'two' }]) {
      const r = await conn.client.callTool({ name: 'submit_job', arguments: { instance_id: 'hpc', command: 'true', mode: 'slurm', resources } });
      assert.ok(r.isError, `refused: ${JSON.stringify(resources)}`);
    }
    const limits = await conn.client.callTool({ name: 'submit_job', arguments: { instance_id: 'hpc', command: 'true', mode: 'slurm', limits: { cpus: 1 } } });
    assert.ok(limits.isError && /resources/.test(textOf(limits)), textOf(limits));
    const list = await conn.client.callTool({ name: 'list_jobs', arguments: { instance_id: 'hpc' } });
    assert.equal(list.structuredContent.total, 2, 'only the two real jobs are on record');
  });
});
