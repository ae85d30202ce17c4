// The temporary homes the ns-hpc end-to-end tests and the load test (tests/e2e/load.mjs) run a
// server in: the binary, the folders and config file, the environment and the argv of `run`.
// Node built-ins only: load.mjs (`make bench`) runs without node_modules.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '..', '..');

export const NSHPC_BINARY = process.env.NSHPC_BINARY || path.join(repo, 'build', 'ns-hpc');

// A fresh temporary home for one server: instances dir, context dir, config file.
// `extraConfig` is appended to the config text (TOML).
export function makeHome(prefix, extraConfig = '') {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), `nshpc-e2e-${prefix}-`));
  // mkdtemp makes it 0700; as root the sandbox runs as namespace.sandbox_uid (65534), which must
  // pass through it to reach the instance folders.
  fs.chmodSync(root, 0o755);
  const home = {
    root,
    instancesDir: path.join(root, 'instances'),
    contextDir: path.join(root, 'context'),
    xdg: path.join(root, 'xdg'),
    config: path.join(root, 'config.toml'),
  };
  fs.mkdirSync(home.contextDir, { recursive: true });
  fs.mkdirSync(home.xdg, { recursive: true });
  fs.writeFileSync(
    home.config,
    `[namespace]\ninstances_dir = ${JSON.stringify(home.instancesDir)}\ndefault_image = ""\n` +
      `[resource]\ncontext_dirs = [${JSON.stringify(home.contextDir)}]\n` +
      extraConfig,
  );
  return home;
}

export function removeHome(home) {
  if (home) fs.rmSync(home.root, { recursive: true, force: true });
}

// The minimal environment the servers get.
export function childEnv(home) {
  return {
    PATH: process.env.PATH || '/usr/local/bin:/usr/bin:/bin',
    HOME: home.root,
    XDG_CONFIG_HOME: home.xdg,
  };
}

export function nshpcArgs(home) {
  return ['--config', home.config, 'run'];
}

// makeHome with the HTTP server's state folder (the generated token) inside the temporary home:
// as root the default is the system-wide /var/lib/ns-hpc, which tests must not touch.
// `extraConfig` may have its own [server] section.
export function makeHttpHome(prefix, extraConfig = '') {
  const home = makeHome(prefix);
  home.stateDir = path.join(home.root, 'state');
  const line = `state_dir = ${JSON.stringify(home.stateDir)}\n`;
  const extra = extraConfig.includes('[server]\n')
    ? extraConfig.replace('[server]\n', `[server]\n${line}`)
    : `${extraConfig}${extraConfig && !extraConfig.endsWith('\n') ? '\n' : ''}[server]\n${line}`;
  fs.appendFileSync(home.config, extra);
  return home;
}
