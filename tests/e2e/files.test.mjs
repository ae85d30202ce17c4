// End-to-end tests of the file tools (`ns-hpc run` over stdio, MCP TypeScript SDK client):
// read_file / write_file / edit_file with mcp-virtual-computer's arguments and messages, line
// ranges, images as image content, binary files, list_directory, search_files (rg inside the
// sandbox), file_info, move/copy/delete, the files resource, the audit log, and links planted
// by a sandbox command that point at host files.
import assert from 'node:assert/strict';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { ajv, compileSchema, connectNshpc, createInstance, makeHome, makePng, removeHome, textOf } from './lib.mjs';

const ID = 'files-e2e';
const FILE_TOOLS = [
  'read_file',
  'write_file',
  'edit_file',
  'list_directory',
  'search_files',
  'file_info',
  'move_file',
  'copy_file',
  'delete_file',
];

const sha256 = (data) => crypto.createHash('sha256').update(data).digest('hex');


describe('file tools', () => {
  let home;
  let conn;
  let client;
  const validators = {};
  let hostSecret;

  before(async () => {
    home = makeHome('files');
    hostSecret = path.join(home.root, 'host-secret.txt');
    fs.writeFileSync(hostSecret, 'HOST-SECRET-CONTENT\n');
    conn = await connectNshpc(home);
    client = conn.client;
    const { tools } = await client.listTools();
    const a = ajv();
    for (const name of FILE_TOOLS) {
      const tool = tools.find((t) => t.name === name);
      assert.ok(tool, `${name} is listed`);
      assert.ok(tool.outputSchema, `${name} declares an outputSchema`);
      assert.ok(tool.description.length < 600, `${name}'s description is short (${tool.description.length})`);
      validators[name] = compileSchema(a, tool.outputSchema);
    }
    await createInstance(client, { instance_id: ID, network: 'off' });
  });

  after(async () => {
    if (conn) await conn.close();
    removeHome(home);
  });

  async function call(name, args) {
    return client.callTool({ name, arguments: { instance_id: ID, ...args } });
  }
  // A call that must succeed; its structuredContent must match the declared schema.
  async function ok(name, args) {
    const r = await call(name, args);
    assert.notEqual(r.isError, true, `${name} ${JSON.stringify(args).slice(0, 300)} failed: ${textOf(r)}`);
    if (validators[name]) assert.equal(validators[name](r.structuredContent), null, `${name} result matches its schema`);
    return r;
  }
  async function fails(name, args, pattern) {
    const r = await call(name, args);
    assert.equal(r.isError, true, `${name} ${JSON.stringify(args).slice(0, 300)} should fail, got: ${textOf(r)}`);
    if (pattern) assert.match(textOf(r), pattern);
    return textOf(r);
  }
  async function sh(command) {
    const r = await call('terminal_execute', { command });
    assert.equal(r.structuredContent.exit_code, 0, `${command}: ${r.structuredContent.stderr}`);
    return r.structuredContent.stdout;
  }

  test('write_file then read_file: raw content, line numbers only in the text, sha256, sandbox ownership', async () => {
    const content = 'alpha\nbeta\n\tgamma\n';
    const w = await ok('write_file', { path: 'notes/a.txt', content });
    assert.equal(w.structuredContent.created, true);
    assert.equal(w.structuredContent.created_parent_directories, true);
    assert.equal(w.structuredContent.sha256, sha256(content));
    const r = await ok('read_file', { path: '/workspace/notes/a.txt' });
    assert.equal(r.structuredContent.content, content, 'structuredContent.content is the raw text');
    assert.equal(r.structuredContent.total_lines, 3);
    assert.equal(r.structuredContent.sha256, sha256(content));
    assert.match(textOf(r), /^\s+1\talpha$/m);
    assert.match(textOf(r), /^\s+3\t\tgamma$/m);
    // The sandbox sees the file as its own and with the same bytes.
    const seen = await sh('stat -c %u notes/a.txt; id -u; sha256sum notes/a.txt');
    const [owner, uid, sum] = seen.trim().split('\n');
    assert.equal(owner, uid, 'the file belongs to the sandbox uid');
    assert.ok(sum.startsWith(sha256(content)));
  });

  test('mcp-virtual-computer messages: missing file, missing parent, directory', async () => {
    await fails('read_file', { path: 'nope.txt' }, /File does not exist/);
    await fails(
      'write_file',
      { path: 'missing-dir/x.txt', content: 'x', create_parent_directories: false },
      /Parent directory does not exist/,
    );
    await fails('read_file', { path: '/workspace' }, /is a directory/);
    await fails('read_file', { path: '/etc/passwd' }, /outside this instance's files/);
    await fails('read_file', { path: '../metadata.json' }, /outside this instance's files/);
  });

  test('read_file ranges: default 2,000 lines, offset/limit, long lines cut with a marker', async () => {
    await sh('seq 1 5000 > big.txt; head -c 5000 /dev/zero | tr "\\0" a > long.txt; echo >> long.txt');
    // The first 2,000 lines at most, fewer where they would not fit the result bound (30,000
    // characters for the numbered text view and the raw content together); next_offset goes on.
    const r = await ok('read_file', { path: 'big.txt' });
    const first = r.structuredContent.lines;
    assert.ok(first > 1000 && first <= 2000, `${first} lines`);
    assert.ok(textOf(r).length + r.structuredContent.content.length <= 30000);
    assert.equal(r.structuredContent.total_lines, 5000);
    assert.equal(r.structuredContent.next_offset, first + 1);
    assert.match(textOf(r), new RegExp(`read_file with offset ${first + 1}`));
    assert.equal(r.structuredContent.content, Array.from({ length: first }, (_, i) => `${i + 1}\n`).join(''));
    const tail = await ok('read_file', { path: 'big.txt', offset: 4990, limit: 50 });
    assert.equal(tail.structuredContent.content, Array.from({ length: 11 }, (_, i) => `${4990 + i}\n`).join(''));
    assert.equal(tail.structuredContent.next_offset, undefined);
    // Never more than the result bound ([mcp] max_result_chars, 30,000): fewer lines, and where to go on.
    await sh('for i in $(seq 1 3000); do printf "%0100d\\n" $i; done > wide.txt');
    const wide = await ok('read_file', { path: 'wide.txt' });
    assert.ok(textOf(wide).length + wide.structuredContent.content.length <= 30000,
      `text of ${textOf(wide).length} and content of ${wide.structuredContent.content.length} characters`);
    assert.ok(wide.structuredContent.lines > 100 && wide.structuredContent.lines < 300, `${wide.structuredContent.lines} lines`);
    assert.equal(wide.structuredContent.next_offset, wide.structuredContent.lines + 1);
    const next = await ok('read_file', { path: 'wide.txt', offset: wide.structuredContent.next_offset, limit: 1 });
    assert.equal(next.structuredContent.content, `${String(wide.structuredContent.lines + 1).padStart(100, '0')}\n`);
    const long = await ok('read_file', { path: 'long.txt' });
    assert.match(textOf(long), /line cut: 5000 bytes/);
    assert.ok(textOf(long).length < 3000, 'the text view holds at most 2,000 characters of the line');
    assert.equal(long.structuredContent.content, 'a'.repeat(5000) + '\n');
  });

  test('a symlink planted by a sandbox command pointing at a host file is never followed out', async () => {
    const depth = '../'.repeat(20);
    await sh(
      `ln -s ${hostSecret} evil-abs; ln -s ${depth}${hostSecret.slice(1)} evil-rel; ` +
        `ln -s ${path.dirname(hostSecret)} evil-dir; ln -s /proc/self/root${hostSecret} evil-proc`,
    );
    for (const p of ['evil-abs', 'evil-rel', 'evil-dir/host-secret.txt', 'evil-proc']) {
      const r = await call('read_file', { path: p });
      assert.equal(r.isError, true, `${p} was read: ${textOf(r)}`);
      assert.doesNotMatch(JSON.stringify(r), /HOST-SECRET/);
    }
    const info = await ok('file_info', { path: 'evil-abs' });
    assert.equal(info.structuredContent.type, 'symlink');
    // Writing, copying and deleting through the link never touch the host file.
    await ok('write_file', { path: 'evil-abs', content: 'replaced' });
    await fails('copy_file', { source: 'evil-rel', destination: 'stolen.txt' });
    await ok('delete_file', { path: 'evil-dir' });
    assert.equal(fs.readFileSync(hostSecret, 'utf8'), 'HOST-SECRET-CONTENT\n');
    assert.equal(await sh('cat evil-abs; test ! -L evil-abs && echo notalink'), 'replacednotalink\n');
    const res = await client.readResource({ uri: `resource://ns-hpc/instances/${ID}/files/workspace/evil-rel` }).then(
      (v) => v,
      (e) => e,
    );
    assert.doesNotMatch(JSON.stringify(res), /HOST-SECRET/);
  });

  test('images come back as image content, scaled down past the limit', async () => {
    const small = makePng(40, 30);
    await ok('write_file', { path: 'img/small.png', content: small.toString('base64'), encoding: 'base64' });
    const r = await ok('read_file', { path: 'img/small.png' });
    const img = r.content.find((c) => c.type === 'image');
    assert.ok(img, 'an image content block');
    assert.equal(img.mimeType, 'image/png');
    assert.equal(Buffer.from(img.data, 'base64').compare(small), 0, 'a small image comes back as it is');
    assert.equal(r.structuredContent.width, 40);
    assert.equal(r.structuredContent.scaled, false);

    // Made inside the sandbox by a command: a large image with transparency.
    const big = makePng(3000, 200, { alpha: true });
    const made = await call('terminal_execute', { args: ['sh', '-c', 'base64 -d > img/big.png'], stdin: big.toString('base64') });
    assert.equal(made.structuredContent.exit_code, 0, made.structuredContent.stderr);
    const b = await ok('read_file', { path: 'img/big.png' });
    const bimg = b.content.find((c) => c.type === 'image');
    assert.ok(bimg);
    assert.equal(b.structuredContent.width, 3000);
    assert.equal(b.structuredContent.scaled, true);
    assert.equal(b.structuredContent.shown_width, 1568);
    const data = Buffer.from(bimg.data, 'base64');
    assert.equal(data.subarray(1, 4).toString(), 'PNG', 'transparency keeps PNG');
    assert.equal(data.readUInt32BE(16), 1568, 'the PNG is 1568 pixels wide');

    // A corrupt image is an error that says so; the server survives it.
    const corrupt = Buffer.concat([small.subarray(0, 40), Buffer.alloc(200, 0xff)]);
    await ok('write_file', { path: 'img/bad.png', content: corrupt.toString('base64'), encoding: 'base64' });
    await fails('read_file', { path: 'img/bad.png' }, /could not be shown/);
    await ok('file_info', { path: 'img/small.png' });
  });

  test('binary files are described, not dumped', async () => {
    const elf = Buffer.concat([Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]), Buffer.alloc(100, 0)]);
    await ok('write_file', { path: 'bin/prog', content: elf.toString('base64'), encoding: 'base64' });
    const r = await ok('read_file', { path: 'bin/prog' });
    assert.equal(r.structuredContent.type, 'binary');
    assert.equal(r.structuredContent.size_bytes, 108);
    assert.equal(r.structuredContent.sha256, sha256(elf));
    assert.match(textOf(r), /binary file \(ELF/);
  });

  test('edit_file: unique match, counts, near-miss, CRLF kept, sha256 guard', async () => {
    await ok('write_file', { path: 'e.py', content: 'def f():\n    return 1\n\ndef g():\n    return 1\n' });
    const many = await fails('edit_file', { path: 'e.py', old_text: 'return 1', new_text: 'return 2' });
    assert.match(many, /old_text occurs 2 times in \/workspace\/e\.py; provide more surrounding text or set replace_all=true/);
    const one = await ok('edit_file', { path: 'e.py', old_text: 'def g():\n    return 1', new_text: 'def g():\n    return 3' });
    assert.equal(one.structuredContent.replacements, 1);
    const all = await ok('edit_file', { path: 'e.py', old_text: 'return', new_text: 'yield', replace_all: true });
    assert.equal(all.structuredContent.replacements, 2);
    assert.equal(await sh('cat e.py'), 'def f():\n    yield 1\n\ndef g():\n    yield 3\n');
    const miss = await fails('edit_file', { path: 'e.py', old_text: 'def f():\n  yield 1', new_text: 'x' });
    assert.match(miss, /old_text was not found in \/workspace\/e\.py/);
    assert.match(miss, /differs only in whitespace/);
    assert.match(miss, /^\s+2\t    yield 1$/m);

    await ok('write_file', { path: 'win.txt', content: 'one\r\ntwo\r\nthree\r\n' });
    await ok('edit_file', { path: 'win.txt', old_text: 'two\nthree', new_text: 'TWO\nTHREE' });
    const crlf = await ok('read_file', { path: 'win.txt' });
    assert.equal(crlf.structuredContent.content, 'one\r\nTWO\r\nTHREE\r\n');
    assert.equal(crlf.structuredContent.eol, 'crlf');

    const stale = sha256('something else');
    await fails('edit_file', { path: 'win.txt', old_text: 'one', new_text: '1', expected_sha256: stale }, /changed since it was read/);
    await fails('write_file', { path: 'win.txt', content: 'x', expected_sha256: stale }, /has sha256/);
    const fresh = crlf.structuredContent.sha256;
    await ok('write_file', { path: 'win.txt', content: 'ok\n', expected_sha256: fresh });
    await fails('edit_file', { path: 'win.txt', old_text: 'same', new_text: 'same' }, /nothing to change/);
  });

  test('write_file keeps the mode of the file it replaces', async () => {
    await sh('printf "#!/bin/sh\\necho hi\\n" > run.sh; chmod 750 run.sh');
    const w = await ok('write_file', { path: 'run.sh', content: '#!/bin/sh\necho bye\n' });
    assert.equal(w.structuredContent.created, false);
    assert.equal(w.structuredContent.mode, '0750');
    assert.equal(await sh('./run.sh; stat -c %a run.sh'), 'bye\n750\n');
  });

  test('list_directory: depth, globs, types, paging', async () => {
    await sh('mkdir -p tree/a/b && touch tree/x.py tree/a/y.py tree/a/b/z.py tree/a/readme.md');
    const top = await ok('list_directory', { path: 'tree' });
    assert.deepEqual(top.structuredContent.entries.map((e) => e.name), ['a', 'x.py']);
    const deep = await ok('list_directory', { path: 'tree', depth: 3, include: ['*.py'] });
    assert.deepEqual(
      deep.structuredContent.entries.map((e) => e.path),
      ['/workspace/tree/a/b/z.py', '/workspace/tree/a/y.py', '/workspace/tree/x.py'],
    );
    const dirs = await ok('list_directory', { path: 'tree', depth: 3, types: ['directory'] });
    assert.deepEqual(dirs.structuredContent.entries.map((e) => e.name), ['a', 'b']);
    const page = await ok('list_directory', { path: 'tree', depth: 3, limit: 2 });
    assert.equal(page.structuredContent.total, 6);
    assert.equal(page.structuredContent.next_offset, 2);
    const page2 = await ok('list_directory', { path: 'tree', depth: 3, limit: 2, offset: 2 });
    assert.equal(page2.structuredContent.entries[0].path, '/workspace/tree/a/b/z.py');
  });

  test('search_files runs rg in the sandbox: lines with context, files, counts, filter before cut', async () => {
    await sh(
      'mkdir -p s && for i in $(seq 1 300); do echo "nothing here $i" > s/f$i.txt; done; ' +
        'printf "a\\nb\\nNEEDLE one\\nc\\n" > s/zz.txt; printf "NEEDLE two\\nNEEDLE three\\n" > s/zz.md',
    );
    const lines = await ok('search_files', { pattern: 'NEEDLE', path: 's', context: 1, limit: 10 });
    assert.equal(lines.structuredContent.total, 3);
    assert.match(textOf(lines), /s\/zz\.txt:3:NEEDLE one/);
    assert.match(textOf(lines), /s\/zz\.txt-2-b/);
    // Paged, the filter applied to every file first.
    const first = await ok('search_files', { pattern: 'NEEDLE', path: 's', limit: 1, glob: ['*.txt'] });
    assert.equal(first.structuredContent.total, 1);
    assert.equal(first.structuredContent.items[0].text, 'NEEDLE one');
    const p1 = await ok('search_files', { pattern: 'NEEDLE', path: 's', limit: 2 });
    assert.equal(p1.structuredContent.next_offset, 2);
    const p2 = await ok('search_files', { pattern: 'NEEDLE', path: 's', limit: 2, offset: 2 });
    assert.equal(p2.structuredContent.items.filter((i) => i.match).length, 1);
    const names = await ok('search_files', { glob: ['zz.*'], path: 's' });
    assert.deepEqual(names.structuredContent.items.map((i) => i.path).sort(), ['s/zz.md', 's/zz.txt']);
    const counts = await ok('search_files', { pattern: 'NEEDLE', mode: 'counts', path: 's' });
    assert.deepEqual(
      counts.structuredContent.items.map((i) => [i.path, i.count]),
      [['s/zz.md', 2], ['s/zz.txt', 1]],
    );
    // Without a path: the whole workspace, paths relative to it.
    const everywhere = await ok('search_files', { pattern: 'NEEDLE one' });
    assert.deepEqual(everywhere.structuredContent.items.map((i) => i.path), ['s/zz.txt']);
    const none = await ok('search_files', { pattern: 'NO_SUCH_THING_ANYWHERE', path: 's' });
    assert.equal(none.structuredContent.total, 0);
  });

  test('file_info, move_file, copy_file, delete_file', async () => {
    await ok('write_file', { path: 'm/one.txt', content: 'one\n' });
    const info = await ok('file_info', { path: 'm/one.txt' });
    assert.equal(info.structuredContent.type, 'file');
    assert.equal(info.structuredContent.kind, 'text');
    assert.equal(info.structuredContent.sha256, sha256('one\n'));
    await ok('copy_file', { source: 'm', destination: '/output/m-copy' });
    await ok('move_file', { source: 'm/one.txt', destination: 'm/two.txt' });
    await fails('move_file', { source: 'm/two.txt', destination: '/output/m-copy/one.txt' }, /already exists/);
    await ok('move_file', { source: 'm/two.txt', destination: '/output/m-copy/one.txt', overwrite: true });
    assert.equal(await sh('cat /output/m-copy/one.txt; ls m | wc -l'), 'one\n0\n');
    await fails('delete_file', { path: '/output/m-copy' }, /recursive=true/);
    await ok('delete_file', { path: '/output/m-copy', recursive: true });
    await fails('file_info', { path: '/output/m-copy' }, /does not exist/);
    await fails('delete_file', { path: '/workspace', recursive: true }, /the folder itself/);
  });

  test('files as resources: text and blobs', async () => {
    await ok('write_file', { path: 'res/r.txt', content: 'resource text\n' });
    const t = await client.readResource({ uri: `resource://ns-hpc/instances/${ID}/files/workspace/res/r.txt` });
    assert.equal(t.contents[0].text, 'resource text\n');
    const png = makePng(4, 4);
    await ok('write_file', { path: '/output/p.png', content: png.toString('base64'), encoding: 'base64' });
    const b = await client.readResource({ uri: `resource://ns-hpc/instances/${ID}/files/output%2Fp.png` });
    assert.equal(b.contents[0].mimeType, 'image/png');
    assert.equal(Buffer.from(b.contents[0].blob, 'base64').compare(png), 0);
    const { resourceTemplates } = await client.listResourceTemplates();
    assert.ok(resourceTemplates.some((t) => t.uriTemplate === 'resource://ns-hpc/instances/{id}/files/{path}'));
    await assert.rejects(client.readResource({ uri: `resource://ns-hpc/instances/${ID}/files/workspace/absent.txt` }));
  });

  test('every file tool call is in the instance audit log', async () => {
    const log = fs.readFileSync(path.join(home.instancesDir, ID, 'audit.log'), 'utf8');
    const tools = new Set(
      log
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l))
        .filter((e) => e.event === 'mcp.tool_call')
        .map((e) => e.tool ?? e.fields?.tool),
    );
    for (const name of FILE_TOOLS) assert.ok(tools.has(name), `${name} is audited (saw ${[...tools]})`);
  });
});
