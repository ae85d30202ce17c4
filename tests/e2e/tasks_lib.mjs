// Helpers of tasks.test.mjs (issue 37: jobs as MCP Tasks, confirmations) — real clients of both
// eras over stdio and streamable HTTP:
//   - @modelcontextprotocol/client 2.4.0 with any capabilities (elicitation for confirmations),
//     pinned to 2026-07-28 or legacy;
//   - @modelcontextprotocol/ext-tasks 0.2.2 on such a client: its 2026-07-28 Tasks session needs a
//     raw request path (the SDK's codecs reject task-shaped results), which rawDispatcher gives
//     over the client's own transport, recording every exchange for wire-level asserts;
//   - @modelcontextprotocol/sdk 1.32.2 (client.experimental.tasks) with any capabilities.
import { Client as ClientV2, StreamableHTTPClientTransport as HttpV2 } from '@modelcontextprotocol/client';
import { StdioClientTransport as StdioV2 } from '@modelcontextprotocol/client/stdio';
import { createTaskSessionFromClient } from '@modelcontextprotocol/ext-tasks/client';
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport as StdioV1 } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport as HttpV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

import { MODERN, META_CAPABILITIES, META_CLIENT_INFO, META_VERSION } from './eras_lib.mjs';
import { sleep } from './lib.mjs';

export const TASKS_EXTENSION = 'io.modelcontextprotocol/tasks';
const CLIENT_INFO = { name: 'nshpc-e2e-tasks', version: '2.4.0' };

function keepStderr(stream) {
  const box = { text: '' };
  stream?.on('data', (c) => {
    box.text += c.toString();
    if (box.text.length > 200_000) box.text = box.text.slice(-100_000);
  });
  return box;
}

async function closeQuietly(client) {
  try {
    await client.close();
  } catch {
    // already closed
  }
}

// A server to connect to: {stdio: {command, args, env}} or {url, token}.
function transportV2(target) {
  if (target.stdio) return new StdioV2({ ...target.stdio, stderr: 'pipe' });
  return new HttpV2(new URL(target.url), { requestInit: { headers: { Authorization: `Bearer ${target.token}` } } });
}

// A v2 client (2.4.0) connected to `target`: `modern` pins 2026-07-28, else the 2025 handshake.
// `capabilities` are declared (a modern client sends them in every request's envelope);
// `elicit(request)` answers elicitation/create (the legacy request, or a modern input_required
// round fulfilled by the client itself). Returns {client, transport, raw (rawDispatcher),
// stderr(), close()}.
export async function connectV2(target, { modern = true, capabilities = {}, elicit, name } = {}) {
  const transport = transportV2(target);
  const box = keepStderr(transport.stderr);
  const client = new ClientV2(
    { ...CLIENT_INFO, name: name ?? CLIENT_INFO.name },
    { capabilities, ...(modern ? { versionNegotiation: { mode: { pin: MODERN } } } : {}) },
  );
  if (elicit) client.setRequestHandler('elicitation/create', (request) => elicit(request));
  try {
    await client.connect(transport);
  } catch (err) {
    await sleep(100);
    throw new Error(`v2 client could not connect to ${target.url ?? target.stdio.command}: ${err.message}\n${box.text.slice(-3000)}`);
  }
  return {
    client,
    transport,
    raw: rawDispatcher(transport),
    stderr: () => box.text,
    close: () => closeQuietly(client),
  };
}

// The request path the ext-tasks session needs for 2026-07-28 task traffic (and the tests for raw
// requests): sends {method, params} with an id of its own on the client's transport and takes its
// answer off the transport before the client sees it. Resolves {kind: 'result', result} or
// {kind: 'error', error}. `log` holds every [request, answer].
export function rawDispatcher(transport, { timeout = 120_000 } = {}) {
  const pending = new Map();
  const log = [];
  let n = 0;
  const original = transport.onmessage;
  transport.onmessage = (message, extra) => {
    const waiter = message && pending.get(message.id);
    if (waiter && ('result' in message || 'error' in message)) {
      pending.delete(message.id);
      waiter(message);
      return;
    }
    original?.call(transport, message, extra);
  };
  const dispatch = async (request, options = {}) => {
    const id = `raw-${process.pid}-${++n}`;
    const message = { jsonrpc: '2.0', id, ...request };
    let timer;
    const answer = new Promise((resolve, reject) => {
      pending.set(id, resolve);
      timer = setTimeout(() => {
        pending.delete(id);
        reject(new Error(`no answer to ${request.method} in ${timeout} ms`));
      }, timeout);
      options.signal?.addEventListener('abort', () => {
        pending.delete(id);
        reject(options.signal.reason ?? new Error('aborted'));
      });
    });
    try {
      await transport.send(message);
      const got = await answer;
      log.push([message, got]);
      return 'error' in got ? { kind: 'error', error: got.error } : { kind: 'result', result: got.result };
    } finally {
      clearTimeout(timer);
    }
  };
  dispatch.log = log;
  return dispatch;
}

// The 2026-07-28 envelope of a raw request: version, client info, the given capabilities.
export function modernMeta(capabilities = {}) {
  return { [META_VERSION]: MODERN, [META_CLIENT_INFO]: CLIENT_INFO, [META_CAPABILITIES]: capabilities };
}
export const withExtension = (capabilities = {}) => ({
  ...capabilities,
  extensions: { ...(capabilities.extensions ?? {}), [TASKS_EXTENSION]: {} },
});

// An ext-tasks session over a connected modern v2 client `c` (connectV2). `endpointId` names the
// server for serialized task references: the same id resumes a task on a restarted server.
export function tasksSession(c, endpointId, { onInputRequest } = {}) {
  return createTaskSessionFromClient(c.client, {
    endpointId,
    rawDispatch: c.raw,
    v2RequestFraming: { protocolVersion: MODERN, clientInfo: CLIENT_INFO, clientCapabilities: {} },
    ...(onInputRequest ? { onInputRequest } : {}),
  });
}

// An SDK 1.32.2 client (2025-11-25) connected to `target` with `capabilities`; `elicit(request)`
// answers elicitation/create. Returns {client, transport, stderr(), close()}.
export async function connectV1(target, { capabilities = {}, elicit, name = 'nshpc-e2e-tasks-v1' } = {}) {
  const transport = target.stdio
    ? new StdioV1({ ...target.stdio, stderr: 'pipe' })
    : new HttpV1(new URL(target.url), { requestInit: { headers: { Authorization: `Bearer ${target.token}` } } });
  const box = keepStderr(transport.stderr);
  const client = new ClientV1({ name, version: '1.0.0' }, { capabilities });
  if (elicit) {
    const { ElicitRequestSchema } = await import('@modelcontextprotocol/sdk/types.js');
    client.setRequestHandler(ElicitRequestSchema, (request) => elicit(request));
  }
  try {
    await client.connect(transport);
  } catch (err) {
    await sleep(100);
    throw new Error(`v1 client could not connect to ${target.url ?? target.stdio.command}: ${err.message}\n${box.text.slice(-3000)}`);
  }
  return {
    client,
    transport,
    stderr: () => box.text,
    async close() {
      if (!target.stdio && transport.sessionId) {
        try {
          await transport.terminateSession();
        } catch {
          // the server may be gone
        }
      }
      await closeQuietly(client);
    },
  };
}

// Elicitation answers: yes (accept, confirm: true), no (decline). Each records the request.
export function answering(action, seen) {
  return async (request) => {
    seen.push(request.params);
    return action === 'accept' ? { action: 'accept', content: { confirm: true } } : { action };
  };
}
