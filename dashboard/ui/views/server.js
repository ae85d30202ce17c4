// The server: version and where it serves, sessions and peers of the HTTP transport, caps in use,
// jobs, and doctor's checks on demand.
import { api, showError } from '../api.js';
import { debounce, el, empty, formatBytes, section, table, timeEl } from '../dom.js';
import { on } from '../events.js';

export function mount(root) {
  const controller = new AbortController();
  const overview = el('div', { class: 'grid' });
  const capsBody = el('div');
  const peersBody = el('div');
  const checksBody = el('div', {}, empty('Not run yet.'));
  const runChecks = el('button', { type: 'button', class: 'primary' }, 'Run checks');
  const refresh = el('button', { type: 'button' }, 'Refresh');
  root.append(
    el('div', { class: 'page-head' }, el('h1', {}, 'Server'), refresh),
    overview,
    section('Caps in use', null, capsBody),
    section('Peers', null, peersBody),
    section('Checks (ns-hpc doctor)', [runChecks], checksBody));

  async function load() {
    let s;
    try {
      s = await api('GET', '/api/server', { signal: controller.signal });
    } catch (err) {
      showError(err);
      return;
    }
    const http = s.http ?? {};
    const jobs = s.jobs ?? {};
    const stat = (label, value) => el('div', { class: 'stat' }, el('div', { class: 'stat-label' }, label), el('div', { class: 'stat-value' }, value));
    overview.replaceChildren(
      stat('Version', s.version ?? '—'),
      stat('Entry point', s.entry_point ?? '—'),
      stat('Started', timeEl(s.started_at)),
      stat('PID', String(s.pid ?? '—')),
      stat('MCP URL', el('code', {}, s.mcp_url || http.url || '—')),
      stat('Instances folder', el('code', {}, s.instances_dir ?? '—')),
      stat('Default image', s.default_image || 'host system'),
      stat('Connections', String(http.connections ?? 0)),
      stat('Sessions', String(http.sessions ?? 0)),
      stat('Requests', String(http.requests ?? 0)),
      stat('Event streams', String(http.event_streams ?? 0)),
      stat('Bytes held', formatBytes(http.bytes_held ?? 0)),
      stat('Jobs followed', String(jobs.watched ?? 0)));
    runChecks.hidden = s.doctor === false;
    const caps = Object.entries(http.caps ?? {});
    capsBody.replaceChildren(caps.length === 0 ? empty('No caps reported.') : table(['Setting', 'In use', 'Limit', ''],
      caps.map(([key, [used, limit]]) => {
        const share = limit > 0 ? Math.min(1, used / limit) : 0;
        const meter = el('meter', { min: '0', max: '1', value: String(share), low: '0.7', high: '0.9', optimum: '0', 'aria-label': `${key} in use` });
        const show = key.endsWith('bytes') ? formatBytes : String;
        return el('tr', {}, el('td', { class: 'mono' }, key), el('td', { class: 'num' }, show(used)), el('td', { class: 'num' }, show(limit)), el('td', {}, meter));
      })));
    const peers = http.peers ?? [];
    peersBody.replaceChildren(peers.length === 0 ? empty('No peers connected.') : table(['Peer', 'Connections', 'Sessions', 'Requests'],
      peers.map((p) => el('tr', {}, el('td', {}, p.peer ?? ''), el('td', { class: 'num' }, String(p.connections ?? 0)),
        el('td', { class: 'num' }, String(p.sessions ?? 0)), el('td', { class: 'num' }, String(p.requests ?? 0))))));
    root.dataset.loaded = 'true';
  }

  runChecks.addEventListener('click', async () => {
    runChecks.disabled = true;
    runChecks.textContent = 'Running…';
    try {
      const report = await api('POST', '/api/server/doctor', { signal: controller.signal });
      const checks = report.checks ?? [];
      const failed = checks.filter((c) => !c.ok);
      const failedRequired = failed.filter((c) => c.required !== false);
      const verdict = failed.length === 0 ? 'Every check passed.'
        : failedRequired.length === 0 ? `Every required check passed; ${failed.length} optional ${failed.length === 1 ? 'one does' : 'ones do'} not.`
          : `${failedRequired.length} required ${failedRequired.length === 1 ? 'check fails' : 'checks fail'}: ns-hpc cannot work fully until ${failedRequired.length === 1 ? 'it is' : 'they are'} fixed.`;
      checksBody.replaceChildren(
        el('p', { class: failedRequired.length ? 'bad' : 'good' }, verdict),
        table(['', 'Check', 'Detail'], checks.map((c) => el('tr', {},
          el('td', { class: c.ok ? 'good' : c.required === false ? 'warn' : 'bad', title: c.ok ? 'passed' : c.required === false ? 'optional, not passed' : 'failed' },
            c.ok ? '✓' : c.required === false ? '○' : '✗'),
          el('td', {}, c.name ?? ''),
          el('td', {}, String(c.detail ?? ''), c.fix && !c.ok ? el('div', { class: 'hint' }, `Fix: ${c.fix}`) : null)))));
    } catch (err) {
      showError(err);
    } finally {
      runChecks.disabled = false;
      runChecks.textContent = 'Run checks';
    }
  });
  refresh.addEventListener('click', load);
  const reload = debounce(load, 500);
  const offs = [on('instances', reload), on('jobs', reload), on('reconnected', reload)];
  load();
  return () => {
    controller.abort();
    reload.cancel();
    for (const off of offs) off();
  };
}
