// The twelve agent tasks of agent_tasks.mjs on both entry points (`ns-hpc run`, `ns-hpc computer`),
// with what a model reads held to its budget: tools/list of `ns-hpc run` at most 23 KiB and of
// `ns-hpc computer` at most 8.5 KiB (default config: no proxied servers, host commands or desktop),
// no tool result over 64 KiB, and each task ending as the user expects (the tests pass, the edit is
// there, the plot comes back as an image, the page served inside opens from the host, ...).
//
// The computer runs on make test's image 'test' (scripts/test-image.sh); without it that part
// skips. The install and network tasks need root (a network namespace as "the outside world").
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
  COMPUTER_LIST_BUDGET,
  RESULT_BUDGET,
  RUN_LIST_BUDGET,
  TASK_NAMES,
  World,
  canMakeWorld,
  formatReport,
  haveImage,
  runEntry,
  testCache,
} from './agent_tasks.mjs';

const entries = [
  { kind: 'run', budget: RUN_LIST_BUDGET, skip: false },
  {
    kind: 'computer',
    budget: COMPUTER_LIST_BUDGET,
    skip: haveImage ? false : `no image 'test' in ${testCache} (scripts/test-image.sh, run by make test, builds it)`,
  },
];

for (const { kind, budget, skip } of entries) {
  describe(`an agent's tasks on ns-hpc ${kind}`, { skip }, () => {
    let world;
    let report;
    before(
      async () => {
        if (canMakeWorld) world = await World.start();
        report = await runEntry(kind, { world });
      },
      { timeout: 170_000 },
    );
    after(() => world?.remove());

    test(`tools/list is at most ${budget} bytes`, (t) => {
      t.diagnostic(formatReport(report));
      const sizes = Object.entries(report.perTool)
        .sort((x, y) => y[1] - x[1])
        .map(([name, bytes]) => `${name} ${bytes}`)
        .join(', ');
      assert.ok(report.toolsListBytes <= budget, `tools/list is ${report.toolsListBytes} bytes (${sizes})`);
    });

    test(`no tool result is over ${RESULT_BUDGET} bytes`, () => {
      assert.deepEqual(report.summary.overBudget, []);
    });

    for (const name of TASK_NAMES) {
      test(`${name}`, (t) => {
        const task = report.tasks.find((x) => x.name === name);
        if (task.outcome.skipped) {
          t.skip(task.outcome.skipped);
          return;
        }
        const calls = task.calls.map((c) => `${c.tool}${c.isError ? ` (error: ${c.error})` : ''}`).join('; ');
        assert.ok(
          task.outcome.ok,
          `${task.what}: expected ${task.outcome.expected}; got ${task.outcome.got}` +
            `${task.outcome.surface ? `\n(${task.outcome.surface})` : ''}\ncalls: ${calls}`,
        );
      });
    }
  });
}
