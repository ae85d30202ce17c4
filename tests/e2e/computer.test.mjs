// End-to-end tests of the mcp-virtual-computer entry point (`ns-hpc computer`) with the MCP SDK
// over stdio and HTTP, doing what the seed's README shows: terminal_execute and the file tools on
// one persistent computer (a large output cut under 64 KB, the whole in a file; WHOLE_OUTPUT for
// the seed's whole output), a background job polled and cancelled, a web server inside opened
// to the host with expose_port, restart keeping files, factory reset dropping a package installed
// from make test's local repository, the network switched off cutting a server the test starts
// in a network namespace of its own, temporary computers gone with their sessions (closed, idle
// or crashed), and the permanent one found again by a new server.
//
// Computers run on make test's image 'test' (scripts/test-image.sh); without it these skip.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { NSHPC_BINARY, childEnv, connectClient, makeHome, removeHome, sleep, textOf, until } from './lib.mjs';
import { RawSession, connectHttp, rawRequest } from './http_lib.mjs';

const root = process.getuid() === 0;
const cache = root
  ? '/var/cache/ns-hpc-test'
  : path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'ns-hpc-test');
const haveImage = fs.existsSync(path.join(cache, 'images', 'test'));
const skip = haveImage ? false : `no image 'test' in ${cache} (scripts/test-image.sh, run by make test, builds it)`;

function computerHome(prefix) {
  const home = makeHome(prefix);
  // The image cache of the tests, and computers on its image.
  const text = fs.readFileSync(home.config, 'utf8').replace('default_image = ""', 'default_image = "test"');
  fs.writeFileSync(
    home.config,
    text.replace('[namespace]\n', `[namespace]\nimages_dir = ${JSON.stringify(path.join(cache, 'images'))}\n`),
  );
  return home;
}

function computerArgs(home, extra = []) {
  return ['--config', home.config, 'computer', ...extra];
}

async function connectComputer(home, id, extra = [], env = {}) {
  return connectClient({
    command: NSHPC_BINARY,
    args: computerArgs(home, extra),
    env: { ...childEnv(home), COMPUTER_ID: id, ...env },
    name: 'computer-e2e',
  });
}

// The seed's result: the JSON object as the text, the same object as structuredContent.
function seedResult(result) {
  const text = textOf(result);
  const parsed = JSON.parse(text);
  if (!result.isError) assert.deepEqual(parsed, result.structuredContent);
  return parsed;
}

async function exec(client, args) {
  const result = await client.callTool({ name: 'terminal_execute', arguments: args });
  assert.ok(!result.isError, textOf(result));
  return seedResult(result);
}

async function call(client, name, args = {}) {
  const result = await client.callTool({ name, arguments: args });
  return { error: Boolean(result.isError), body: seedResult(result) };
}

const instanceDir = (home, id) => path.join(home.instancesDir, id);

describe('computer over stdio', { skip }, () => {
  let home;
  let c;
  before(async () => {
    home = computerHome('computer');
    c = await connectComputer(home, 'agent-workstation', ['--output-limit', '4096']);
  });
  after(async () => {
    await c?.close();
    removeHome(home);
  });

  test('the seed 0.2.3 tools, jobs, expose_port and the lifecycle tools are listed; initialize makes no computer', async () => {
    const { tools } = await c.client.listTools();
    const names = tools.map((t) => t.name).sort();
    assert.deepEqual(names, ['computer_create', 'computer_delete', 'computer_factory_reset', 'computer_list',
      'computer_restart', 'computer_ui', 'edit_file', 'expose_port', 'poll_job', 'read_file',
      'set_desktop_environment', 'set_network_access', 'submit_job', 'terminal_execute', 'write_file']);
    const terminal = tools.find((t) => t.name === 'terminal_execute');
    assert.match(terminal.description, /Commands run in bash\./);
    assert.match(terminal.description, /time out after 120 seconds by default/);
    assert.ok(!fs.existsSync(instanceDir(home, 'agent-workstation')), 'no computer before the first call');
  });

  test('terminal_execute answers with the seed fields, its timeout and output-limit results', async () => {
    const r = await exec(c.client, { command: 'cat /etc/debian_version; id -u; pwd; echo oops >&2; exit 3' });
    assert.deepEqual(Object.keys(r).sort(), ['computer_id', 'desktop_environment', 'desktop_url', 'exec_duration_ms',
      'exit_code', 'network_access', 'operation', 'stderr', 'stdout']);
    assert.equal(r.computer_id, 'agent-workstation');
    assert.equal(r.operation, 'terminal_execute');
    assert.equal(r.desktop_environment, false);
    assert.equal(r.desktop_url, null);
    assert.equal(r.network_access, true);
    assert.match(r.stdout, /^12\.\d+\n0\n\/workspace\n$/);
    assert.equal(r.stderr, 'oops\n');
    assert.equal(r.exit_code, 3);

    const t = await exec(c.client, { command: 'echo partial; sleep 30', timeout: 1 });
    assert.deepEqual([t.stdout, t.stderr, t.exit_code], ['', '[kilntainers: command timed out after 1s]', 124]);
    const o = await exec(c.client, { command: 'head -c 10000 /dev/zero | tr "\\0" x' });
    assert.equal(o.stdout, '');
    assert.equal(o.exit_code, 1);
    assert.equal(
      o.stderr,
      '[kilntainers: output limit exceeded (4096 bytes). Command terminated. No output returned. Re-run with head, ' +
        'tail, or grep to manage output size.]',
    );
    const bad = await call(c.client, 'terminal_execute', { command: 'x', args: ['y'] });
    assert.ok(bad.error);
    assert.equal(
      bad.body.error,
      "Cannot provide both 'command' and 'args'. Use 'command' for shell commands or 'args' for direct execution.",
    );
    assert.equal(bad.body.operation, 'terminal_execute');
    // An argument the schema refuses is the same JSON error object, not plain text.
    const unknown = await call(c.client, 'terminal_execute', { command: 'true', cwd: '/tmp' });
    assert.ok(unknown.error);
    assert.deepEqual(Object.keys(unknown.body).sort(), ['computer_id', 'desktop_environment', 'error', 'operation']);
    assert.match(unknown.body.error, /^unknown argument 'cwd'/);
  });

  test('write_file, read_file and edit_file keep the seed contract', async () => {
    const w = await call(c.client, 'write_file', { path: 'notes/today.txt', content: 'héllo\nhéllo\n' });
    assert.ok(!w.error, JSON.stringify(w.body));
    assert.equal(w.body.created_parent_directories, true);
    assert.equal(w.body.path, '/workspace/notes/today.txt');
    const r = await call(c.client, 'read_file', { path: '/workspace/notes/today.txt' });
    assert.equal(r.body.content, 'héllo\nhéllo\n');
    assert.equal(r.body.size_bytes, Buffer.byteLength('héllo\nhéllo\n'));
    assert.equal(r.body.sha256, w.body.sha256);
    const twice = await call(c.client, 'edit_file', { path: 'notes/today.txt', old_text: 'héllo', new_text: 'bye' });
    assert.ok(twice.error);
    assert.equal(
      twice.body.error,
      'old_text occurs 2 times in /workspace/notes/today.txt; provide more surrounding text or set replace_all=true',
    );
    const e = await call(c.client, 'edit_file', { path: 'notes/today.txt', old_text: 'héllo', new_text: 'bye', replace_all: true });
    assert.equal(e.body.replacements, 2);
    assert.equal((await exec(c.client, { command: 'cat notes/today.txt' })).stdout, 'bye\nbye\n');
    // Anywhere in the computer, not only /workspace; the seed's errors.
    assert.match((await call(c.client, 'read_file', { path: '/etc/os-release' })).body.content, /bookworm/);
    assert.equal((await call(c.client, 'read_file', { path: '/nope' })).body.error, 'File does not exist: /nope');
    assert.equal((await call(c.client, 'read_file', { path: '/etc' })).body.error, 'Path is not a regular file: /etc');
    await exec(c.client, { command: 'printf "ok\\377" > bin.dat; head -c 1048577 /dev/zero > big.txt' });
    assert.equal((await call(c.client, 'read_file', { path: 'bin.dat' })).body.error,
      'File is not valid UTF-8 text at byte 2: /workspace/bin.dat');
    // Past the seed's 1 MiB a text comes in pages (here one line longer than a page: cut, said so).
    const big = (await call(c.client, 'read_file', { path: 'big.txt' })).body;
    assert.equal(big.size_bytes, 1048577);
    assert.equal(big.line_cut, true);
    assert.deepEqual(big.lines, { first: 1, last: 1, total: 1 });
    const noParent = await call(c.client, 'write_file', { path: '/srv/a/b.txt', content: 'x', create_parent_directories: false });
    assert.equal(noParent.body.error, 'Parent directory does not exist: /srv/a/b.txt');
  });

  test('restart keeps files; factory reset drops an installed package and the workspace', async () => {
    // A package of the local test repository, installed with dpkg (no network needed).
    const deb = fs.readdirSync(path.join(cache, 'repo')).find((f) => f.startsWith('hello_'));
    assert.ok(deb, 'hello_*.deb in the local repository');
    const workspace = path.join(instanceDir(home, 'agent-workstation'), 'workspace');
    const owner = fs.statSync(workspace);
    fs.copyFileSync(path.join(cache, 'repo', deb), path.join(workspace, 'hello.deb'));
    fs.chownSync(path.join(workspace, 'hello.deb'), owner.uid, owner.gid);
    let r = await exec(c.client, { command: 'dpkg -i hello.deb >/dev/null && hello' });
    assert.equal(r.stdout, 'Hello, world!\n', r.stderr);
    await exec(c.client, { command: 'sleep 600 >/dev/null 2>&1 &' });
    const restarted = await call(c.client, 'computer_restart', {}); // this server's computer by default
    assert.deepEqual(restarted.body, { ok: true, computer_id: 'agent-workstation', sandbox_id: 'agent-workstation', temporary: false });
    r = await exec(c.client, {
      command: 'hello; cat notes/today.txt; for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < $f; echo; done | grep -c "^sleep 600" || true',
    });
    assert.equal(r.stdout, 'Hello, world!\nbye\nbye\n0\n', 'files and installs kept, processes ended');
    const reset = await call(c.client, 'computer_factory_reset', {});
    assert.ok(!reset.error, JSON.stringify(reset.body));
    r = await exec(c.client, { command: 'command -v hello || echo gone; ls -A /workspace | wc -l' });
    assert.equal(r.stdout, 'gone\n0\n');
  });

  test('computer_delete without computer_id deletes this server\'s computer; the next call makes it afresh', async () => {
    await exec(c.client, { command: 'echo old > /workspace/old.txt' });
    const deleted = await call(c.client, 'computer_delete', {});
    assert.deepEqual(deleted.body, { ok: true, computer_id: 'agent-workstation', deleted: true });
    assert.ok(!fs.existsSync(instanceDir(home, 'agent-workstation')));
    const r = await exec(c.client, { command: 'ls /workspace | wc -l' });
    assert.equal(r.stdout, '0\n');
  });
});

// What a result takes on the wire: its text and its structuredContent.
const resultBytes = (result) =>
  Buffer.byteLength(JSON.stringify(textOf(result))) + Buffer.byteLength(JSON.stringify(result.structuredContent ?? null));

describe('computer results, jobs and expose_port', { skip }, () => {
  let home;
  let c;
  before(async () => {
    home = computerHome('computer-more');
    c = await connectComputer(home, 'more-box');
  });
  after(async () => {
    await c?.close();
    removeHome(home);
  });

  test('a large output is cut to head and tail under 64 KB, the whole kept in a file it names', async () => {
    const result = await c.client.callTool({ name: 'terminal_execute', arguments: { command: 'seq 1 300000' } });
    assert.ok(!result.isError, textOf(result));
    assert.ok(resultBytes(result) < 64 * 1024, `${resultBytes(result)} bytes`); // was 4,878,266
    const r = seedResult(result);
    assert.equal(r.exit_code, 0);
    assert.ok(r.stdout.startsWith('1\n2\n3\n'), r.stdout.slice(0, 20));
    assert.ok(r.stdout.endsWith('299999\n300000\n'), r.stdout.slice(-20));
    const marker = r.stdout.match(/\n\[ns-hpc: ([\d,]+) characters cut here; the whole output is in (\S+)\]\n/);
    assert.ok(marker, 'a marker line says how much was cut and where the whole is');
    assert.equal(marker[2], r.stdout_file);
    assert.match(r.stdout_file, /^\/workspace\/\.ns_hpc_output\/term-.*\.out$/);
    const whole = await exec(c.client, { command: `wc -c < ${r.stdout_file}; sha256sum < ${r.stdout_file}; seq 1 300000 | sha256sum` });
    const [size, sum, expected] = whole.stdout.trim().split('\n');
    assert.equal(size, '1988895');
    assert.equal(sum, expected);
    // Output that escapes to many bytes (control characters) is bounded too.
    const binary = await c.client.callTool({ name: 'terminal_execute', arguments: { command: 'head -c 300000 /dev/zero | tr "\\0" "\\1"' } });
    assert.ok(resultBytes(binary) < 64 * 1024, `${resultBytes(binary)} bytes`);
  });

  test('WHOLE_OUTPUT=true (or --whole-output) gives the seed\'s whole output', async () => {
    const whole = await connectComputer(home, 'more-box', [], { WHOLE_OUTPUT: 'true' });
    try {
      const r = await exec(whole.client, { command: 'seq 1 30000; head -c 1048577 /dev/zero > big.txt' });
      assert.equal(r.stdout.length, 168894);
      assert.ok(!('stdout_file' in r));
      // And whole files up to the seed's 1 MiB, refused past it in its words.
      assert.equal((await call(whole.client, 'read_file', { path: 'big.txt' })).body.error,
        'File is 1048577 bytes; text tool limit is 1048576 bytes: /workspace/big.txt');
    } finally {
      await whole.close();
    }
  });

  test('a job runs in the background, is polled with a wait, listed, and another is cancelled', async () => {
    const started = await call(c.client, 'submit_job', {
      command: 'for i in 1 2 3; do echo line $i; sleep 1; done; echo done >&2',
      timeout: 0,
    });
    assert.ok(!started.error, JSON.stringify(started.body));
    assert.equal(started.body.operation, 'submit_job');
    assert.equal(started.body.computer_id, 'more-box');
    assert.equal(started.body.status, 'running');
    assert.ok(!('instance_id' in started.body));
    const done = await call(c.client, 'poll_job', { job_id: started.body.job_id, timeout: 60 });
    assert.equal(done.body.status, 'completed', JSON.stringify(done.body));
    assert.equal(done.body.exit_code, 0);
    assert.equal(done.body.stdout_tail, 'line 1\nline 2\nline 3');
    assert.equal(done.body.stderr_tail, 'done');
    const out = await exec(c.client, { command: `cat ${done.body.stdout_path}` });
    assert.equal(out.stdout, 'line 1\nline 2\nline 3\n');

    const long = await call(c.client, 'submit_job', { args: ['sleep', '600'], timeout: 0 });
    assert.equal(long.body.status, 'running');
    const cancelled = await call(c.client, 'poll_job', { job_id: long.body.job_id, cancel: true });
    assert.equal(cancelled.body.status, 'cancelled', JSON.stringify(cancelled.body));
    const ps = await exec(c.client, { command: 'for f in /proc/[0-9]*/cmdline; do tr "\\0" " " < $f; echo; done | grep -c "^sleep 600" || true' });
    assert.equal(ps.stdout, '0\n', 'the cancelled job\'s processes are gone');

    const listed = await call(c.client, 'poll_job', {});
    assert.equal(listed.body.total, 2);
    assert.deepEqual(listed.body.jobs.map((j) => [j.job_id, j.status]),
      [[long.body.job_id, 'cancelled'], [started.body.job_id, 'completed']]);
    const missing = await call(c.client, 'poll_job', { job_id: '0123456789ab' });
    assert.ok(missing.error);
    assert.match(missing.body.error, /poll_job without a job_id lists the computer's jobs\.$/);
  });

  test('expose_port opens a web server of the computer to the host, fetched with curl over loopback', async () => {
    const port = 8123;
    await exec(c.client, {
      command:
        `nohup perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalPort => ${port}, Listen => 5, ReuseAddr => 1) or die $!; ` +
        `while ($c = $s->accept) { while (<$c>) { last if /^\\r?$/ } print $c "HTTP/1.0 200 OK\\r\\nContent-Length: 20\\r\\n\\r\\nhello from more-box\\n"; close $c }' ` +
        '> /tmp/http.log 2>&1 &',
    });
    assert.ok(await until(async () => (await exec(c.client, {
      command: `perl -MIO::Socket::INET -e 'exit(IO::Socket::INET->new("127.0.0.1:${port}") ? 0 : 1)' && echo up`,
    })).stdout === 'up\n', 10_000), 'the server listens inside');
    const opened = await call(c.client, 'expose_port', { port });
    assert.ok(!opened.error, JSON.stringify(opened.body));
    assert.equal(opened.body.operation, 'expose_port');
    assert.equal(opened.body.url, `http://127.0.0.1:${opened.body.host_port}/`);
    assert.deepEqual(opened.body.exposed_ports, [{ port, host_port: opened.body.host_port, forwarding: true }]);
    let body = '';
    assert.ok(await until(() => {
      try {
        body = execFileSync('curl', ['-sS', '--max-time', '5', opened.body.url], { encoding: 'utf8' });
      } catch {
        body = '';
      }
      return body === 'hello from more-box\n';
    }, 10_000), `curl ${opened.body.url}: ${body}`);
    const closed = await call(c.client, 'expose_port', { port, close: true });
    assert.equal(closed.body.closed, true);
    assert.deepEqual(closed.body.exposed_ports, []);
  });
});

// "The outside world": a network namespace joined to the host by a veth pair, a TCP server in it.
class World {
  constructor() {
    const used = execFileSync('ip', ['-4', '-o', 'addr'], { encoding: 'utf8' });
    for (let i = 0; i < 200; i++) {
      this.x = 20 + ((process.pid + 7 + i) % 200);
      if (!used.includes(` 10.233.${this.x}.`)) break;
    }
    this.name = `nshpc-cw-${process.pid}`;
    this.hostIf = `nsch${process.pid}`.slice(0, 15);
    this.worldIf = `nscw${process.pid}`.slice(0, 15);
    this.worldIp = `10.233.${this.x}.2`;
    const ip = (...a) => execFileSync('ip', a);
    ip('netns', 'add', this.name);
    ip('link', 'add', this.hostIf, 'type', 'veth', 'peer', 'name', this.worldIf, 'netns', this.name);
    ip('addr', 'add', `10.233.${this.x}.1/30`, 'dev', this.hostIf);
    ip('link', 'set', this.hostIf, 'up');
    ip('-n', this.name, 'addr', 'add', `${this.worldIp}/30`, 'dev', this.worldIf);
    ip('-n', this.name, 'link', 'set', this.worldIf, 'up');
    ip('-n', this.name, 'link', 'set', 'lo', 'up');
    this.port = 18000 + (process.pid % 1000);
    const server = `require('net').createServer((s) => { s.write('hello\\n'); }).listen(${this.port}, '${this.worldIp}')`;
    this.server = spawn('ip', ['netns', 'exec', this.name, process.execPath, '-e', server], { stdio: 'ignore' });
  }
  remove() {
    this.server?.kill('SIGKILL');
    for (const a of [['link', 'del', this.hostIf], ['netns', 'del', this.name]]) {
      try {
        execFileSync('ip', a, { stdio: 'ignore' });
      } catch {
        // gone already
      }
    }
  }
}

describe('computer network', { skip: skip || (!root && 'needs root: makes a network namespace and a veth pair') }, () => {
  let home;
  let c;
  let world;
  before(async () => {
    world = new World();
    home = computerHome('computer-net');
    c = await connectComputer(home, 'net-box');
  });
  after(async () => {
    await c?.close();
    removeHome(home);
    world?.remove();
  });

  test('network off cuts a server outside at once, and on reaches it again', async () => {
    const probe = `timeout 3 bash -c 'exec 3<>/dev/tcp/${world.worldIp}/${world.port}; head -1 <&3' 2>/dev/null || echo closed`;
    assert.ok(await until(async () => (await exec(c.client, { command: probe })).stdout === 'hello\n', 10_000),
      'the computer reaches the test server');
    const off = await call(c.client, 'set_network_access', { enabled: false });
    assert.equal(off.body.network_access, false);
    let r = await exec(c.client, { command: probe });
    assert.equal(r.stdout, 'closed\n');
    assert.equal(r.network_access, false);
    await call(c.client, 'set_network_access', { enabled: true });
    r = await exec(c.client, { command: probe });
    assert.equal(r.stdout, 'hello\n');
  });
});

describe('computer lifetimes', { skip }, () => {
  let home;
  before(() => {
    home = computerHome('computer-life');
  });
  after(() => removeHome(home));

  test('a temporary computer goes with its session; a permanent one stays and a new server finds it', async () => {
    const a = await connectComputer(home, 'keeper');
    await exec(a.client, { command: 'echo kept > /workspace/mark.txt' });
    const temp = await call(a.client, 'computer_create', {});
    assert.equal(temp.body.temporary, true);
    assert.match(temp.body.computer_id, /^[a-z]+-[a-z]+-[0-9a-f]{4}$/);
    const inTemp = await exec(a.client, { command: 'hostname', computer_id: temp.body.computer_id });
    assert.equal(inTemp.computer_id, temp.body.computer_id);
    const perm = await call(a.client, 'computer_create', { computer_id: 'stays', temporary: false });
    assert.equal(perm.body.temporary, false);
    // The seed's two messages, its lowercase booleans: one for a computer this server holds...
    const again = await call(a.client, 'computer_create', { computer_id: 'stays' });
    assert.equal(again.body.error,
      "Computer 'stays' already exists with temporary=false; lifecycle mode cannot be changed without a factory reset " +
        'or delete.');
    const listed = (await call(a.client, 'computer_list')).body.computers.map((x) => x.computer_id);
    assert.deepEqual(listed, ['keeper', temp.body.computer_id, 'stays'].sort());
    await a.close();
    assert.ok(await until(() => !fs.existsSync(instanceDir(home, temp.body.computer_id)), 15_000),
      'the temporary computer was deleted when its session ended');

    // Found again by a new server, with the network its command line asks for.
    const b = await connectComputer(home, 'keeper', [], { NETWORK_ACCESS: 'false' });
    const mark = (await call(b.client, 'read_file', { path: 'mark.txt' })).body;
    assert.equal(mark.content, 'kept\n');
    assert.equal(mark.network_access, false);
    const names = (await call(b.client, 'computer_list')).body.computers.map((x) => x.computer_id);
    assert.deepEqual(names, ['keeper', 'stays']);
    // ... and one for a computer found on disk.
    const found = await call(b.client, 'computer_create', { computer_id: 'stays' });
    assert.equal(found.body.error, "Computer 'stays' already exists with temporary=false; requested temporary=true.");
    assert.ok((await call(b.client, 'computer_delete', { computer_id: 'stays' })).body.deleted);
    assert.equal((await call(b.client, 'computer_restart', { computer_id: 'stays' })).body.error,
      "Computer 'stays' was not found. computer_list lists the computers.");
    await b.close();
  });

  test('a temporary computer of a server that crashed goes when the next server starts', async () => {
    const a = await connectComputer(home, 'keeper');
    const temp = await call(a.client, 'computer_create', { computer_id: 'orphan' });
    assert.equal(temp.body.computer_id, 'orphan');
    a.transport._process.kill('SIGKILL');
    await sleep(200);
    assert.ok(fs.existsSync(instanceDir(home, 'orphan')), 'nothing deleted it yet');
    const b = await connectComputer(home, 'keeper');
    assert.ok(await until(() => !fs.existsSync(instanceDir(home, 'orphan')), 15_000));
    await b.close();
  });

  test('[computer] expose_lifecycle_tools = false keeps to the seed 0.2.3 surface', async () => {
    const quiet = computerHome('computer-quiet');
    fs.appendFileSync(quiet.config, '[computer]\nexpose_lifecycle_tools = false\n');
    const a = await connectComputer(quiet, 'quiet-box');
    try {
      const names = (await a.client.listTools()).tools.map((t) => t.name).sort();
      // computer_ui is the seed 0.2.3's too (model-visible there).
      assert.deepEqual(names, ['computer_ui', 'edit_file', 'expose_port', 'poll_job', 'read_file', 'submit_job',
        'terminal_execute', 'write_file']);
    } finally {
      await a.close();
      removeHome(quiet);
    }
  });

  test('the description override and extension; DESKTOP_ENVIRONMENT=true on a headless computer said loudly', async () => {
    const a = await connectComputer(home, 'keeper', ['--tool-instruction-override', 'A Debian shell.']);
    let terminal = (await a.client.listTools()).tools.find((t) => t.name === 'terminal_execute');
    assert.equal(terminal.description, 'A Debian shell.');
    await exec(a.client, { command: 'true' });  // the computer, on the headless image
    await a.close();
    const b = await connectComputer(home, 'keeper', ['--extended-tool-instruction', 'Use /workspace/data.', '--timeout', '30'],
      { DESKTOP_ENVIRONMENT: 'true' });
    terminal = (await b.client.listTools()).tools.find((t) => t.name === 'terminal_execute');
    assert.match(terminal.description, /time out after 30 seconds by default/);
    assert.ok(terminal.description.endsWith('\n\nUse /workspace/data.'), terminal.description);
    assert.equal((await exec(b.client, { command: 'true' })).desktop_environment, false);
    assert.match(b.stderr.text, /warning: DESKTOP_ENVIRONMENT=true, but computer 'keeper' stays without a desktop: This existing computer was created from a headless or custom image/);
    await b.close();
  });

  test('COMPUTER_ID naming an ordinary instance is refused with what to do', async () => {
    execFileSync(NSHPC_BINARY, ['--config', home.config, 'instance', 'create', 'plain'], { env: childEnv(home) });
    const a = await connectComputer(home, 'plain');
    const r = await a.client.callTool({ name: 'terminal_execute', arguments: { command: 'true' } });
    assert.ok(r.isError);
    assert.match(JSON.parse(textOf(r)).error, /'plain' is an ns-hpc instance that is not a computer/);
    await a.close();
  });
});

// The server over HTTP, started on a free port; resolves {url, port, proc, stop()}.
async function startHttp(home, id, extra = []) {
  const proc = spawn(NSHPC_BINARY, computerArgs(home, ['--transport', 'http', '--port', '0', ...extra]), {
    env: { ...childEnv(home), COMPUTER_ID: id },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let text = '';
  proc.stderr.on('data', (chunk) => {
    text += chunk.toString();
  });
  assert.ok(await until(() => /listening on (\S+)/.test(text), 15_000), `the server did not start:\n${text}`);
  const url = text.match(/listening on (\S+)/)[1];
  return {
    url,
    port: Number(new URL(url).port),
    proc,
    stderr: () => text,
    async stop() {
      proc.kill('SIGTERM');
      await new Promise((resolve) => (proc.exitCode !== null ? resolve() : proc.on('exit', resolve)));
    },
  };
}

describe('computer over HTTP', { skip }, () => {
  const token = 'computer-e2e-token-0123456789abcdef';
  let home;
  let server;
  before(async () => {
    home = computerHome('computer-http');
    server = await startHttp(home, 'web-box', ['--auth-token', token, '--session-timeout', '2']);
  });
  after(async () => {
    await server?.stop();
    removeHome(home);
  });

  test('/healthz is open; / and /mcp need the token; / says what the seed says', async () => {
    const health = await rawRequest({ port: server.port, path: '/healthz' });
    assert.equal(health.status, 200);
    assert.deepEqual(health.json, { status: 'ok' });
    assert.equal((await rawRequest({ port: server.port, path: '/' })).status, 401);
    assert.equal((await rawRequest({ port: server.port, method: 'POST', path: '/mcp', body: '{}' })).status, 401);
    const page = await rawRequest({ port: server.port, path: '/', headers: { Authorization: `Bearer ${token}` } });
    assert.equal(page.status, 200);
    assert.equal(page.json.name, 'mcp-virtual-computer');
    assert.equal(page.json.mcp_endpoint, '/mcp');
    assert.equal(page.json.health, '/healthz');
    assert.equal(page.json.computer_id, 'web-box');
    assert.equal(page.json.desktop_environment, false);
    // A browser asking for / gets the dashboard there instead (and its login page without a token).
    const html = { Accept: 'text/html,application/xhtml+xml' };
    const dashboard = await rawRequest({ port: server.port, path: '/', headers: { ...html, Authorization: `Bearer ${token}` } });
    assert.equal(dashboard.status, 200);
    assert.match(dashboard.headers['content-type'], /^text\/html/);
    assert.match(dashboard.body, /<script type="module"/);
    const login = await rawRequest({ port: server.port, path: '/', headers: html });
    assert.equal(login.status, 401);
    assert.match(login.body, /<form[^>]+action="\/login"/);
  });

  test('a long command in one session does not hold up another session', async () => {
    const a = await connectHttp(server.url, { token });
    const b = await connectHttp(server.url, { token });
    await exec(b.client, { command: 'echo ready > r.txt' });
    const long = exec(a.client, { command: 'sleep 4; echo done' });
    await sleep(500);
    const started = Date.now();
    assert.equal((await call(b.client, 'read_file', { path: 'r.txt' })).body.content, 'ready\n');
    assert.equal((await exec(b.client, { command: 'echo quick' })).stdout, 'quick\n');
    assert.ok(Date.now() - started < 2500, `took ${Date.now() - started} ms beside a 4 s command`);
    assert.equal((await long).stdout, 'done\n');
    await a.close();
    await b.close();
  });

  test('temporary computers go when their session is closed, and when it idles out', async () => {
    const a = await connectHttp(server.url, { token });
    const closed = (await call(a.client, 'computer_create', { computer_id: 'closed-one' })).body;
    assert.equal(closed.temporary, true);
    await a.close(); // DELETE /mcp
    assert.ok(await until(() => !fs.existsSync(instanceDir(home, 'closed-one')), 15_000), 'gone after DELETE');

    // A client that goes quiet without closing (no stream held open, no DELETE).
    const b = new RawSession(server.url, token);
    await b.initialize();
    const created = await b.callTool('computer_create', { computer_id: 'idle-one' });
    assert.ok(!created.isError, JSON.stringify(created));
    assert.ok(fs.existsSync(instanceDir(home, 'idle-one')));
    // --session-timeout 2: the session ends after 2 s without a request, and the computer with it.
    assert.ok(await until(() => !fs.existsSync(instanceDir(home, 'idle-one')), 15_000), 'gone after the idle timeout');
  });
});
