// One instance: its state and actions, then tabs for its jobs (output streaming while they run,
// a new-job form), files (list, download, upload, new folder, delete), snapshots, exposed ports,
// limits and usage, and the live views: the desktop (when it is on) and a terminal, whose modules
// (live/, with noVNC and xterm.js) are loaded only when their tab first opens.
import { api, instancePath, showError, showNotice } from '../api.js';
import { confirmAction, formDialog } from '../dialog.js';
import { badge, cut, el, empty, field, formatBytes, formatPercent, section, table, timeEl } from '../dom.js';
import { on } from '../events.js';
import * as act from './actions.js';

const OUTPUT_LIMIT = 1_000_000; // characters of job output kept on the page

export function mount(root, { id, tab }) {
  // Opened on a tab (#/instances/<id>/desktop): that tab once the instance is known to have it.
  let wanted = tab === 'desktop' ? 'Desktop' : tab === 'terminal' ? 'Terminal' : null;
  const controller = new AbortController();
  const signal = controller.signal;
  let info = null;
  let outputSource = null;

  const title = el('h1', {}, id);
  const stateBadge = el('span');
  const description = el('p', { class: 'lead' });
  const actions = el('div', { class: 'actions' });
  const summary = el('dl', { class: 'facts' });
  const tabs = ['Jobs', 'Files', 'Snapshots', 'Ports', 'Limits and usage', 'Desktop', 'Terminal'];
  const panels = new Map(tabs.map((t) => [t, el('div', { role: 'tabpanel', class: 'tabpanel', 'aria-label': t, hidden: true })]));
  const tabButtons = tabs.map((t) => el('button', {
    type: 'button', role: 'tab', 'aria-selected': 'false', onclick: () => select(t), hidden: t === 'Desktop',
  }, t));
  const tabList = el('div', { role: 'tablist', class: 'tabs', 'aria-label': 'Instance sections' }, tabButtons);
  tabList.addEventListener('keydown', (e) => {
    const i = tabButtons.indexOf(document.activeElement);
    if (i < 0 || (e.key !== 'ArrowRight' && e.key !== 'ArrowLeft')) return;
    let j = i;
    do j = (j + (e.key === 'ArrowRight' ? 1 : tabs.length - 1)) % tabs.length; while (tabButtons[j].hidden);
    tabButtons[j].focus();
    select(tabs[j]);
  });

  root.append(
    el('p', { class: 'crumbs' }, el('a', { href: '#/instances' }, 'Instances'), ' / ', id),
    el('div', { class: 'page-head' }, el('div', {}, el('div', { class: 'title-line' }, title, stateBadge), description), actions),
    summary,
    tabList,
    ...panels.values(),
  );

  function select(name) {
    tabButtons.forEach((b, i) => {
      const on = tabs[i] === name;
      b.setAttribute('aria-selected', String(on));
      b.tabIndex = on ? 0 : -1;
    });
    for (const [t, p] of panels) p.hidden = t !== name;
    if (name === 'Desktop' || name === 'Terminal') openLive(name);
  }

  // ---- the live views ----
  const liveTeardowns = new Map();  // tab → its widget's teardown, once mounted
  let liveBuilt = null;  // vendor/live.json: which live views this build embeds

  async function openLive(name) {
    if (liveTeardowns.has(name)) return;
    liveTeardowns.set(name, null);
    const box = panels.get(name);
    box.replaceChildren(el('p', { class: 'muted' }, 'Loading…'));
    try {
      liveBuilt ??= await fetch(new URL('../vendor/live.json', import.meta.url), { credentials: 'same-origin' }).then((r) => r.json());
      const key = name === 'Desktop' ? 'desktop' : 'terminal';
      if (!liveBuilt[key]) {
        box.replaceChildren(empty(`The live ${key} is not built into this ns-hpc (it was built without npm: run make deps-ui, then build again).`));
        return;
      }
      const teardown = name === 'Desktop'
        ? (await import('../live/desktop.js')).mountDesktop(box, id)
        : (await import('../live/terminal.js')).mountTerminal(box, id);
      if (signal.aborted) teardown();
      else liveTeardowns.set(name, teardown);
    } catch (err) {
      liveTeardowns.delete(name);
      box.replaceChildren(empty(`The live view could not be loaded: ${err.message}`));
    }
  }

  // The Desktop tab is there while the instance's desktop is on; turned off, its view closes.
  function renderDesktopTab() {
    const button = tabButtons[tabs.indexOf('Desktop')];
    button.hidden = !info.desktop;
    if (!info.desktop) {
      const teardown = liveTeardowns.get('Desktop');
      if (teardown) teardown();
      liveTeardowns.delete('Desktop');
      if (button.getAttribute('aria-selected') === 'true') select('Jobs');
    }
  }

  // ---- the instance itself ----
  async function loadInfo() {
    try {
      info = await api('GET', instancePath(id), { signal });
    } catch (err) {
      if (err.status === 404) {
        root.replaceChildren(el('p', { class: 'crumbs' }, el('a', { href: '#/instances' }, 'Instances')),
          empty(`There is no instance ${id} (any more).`));
        return;
      }
      showError(err);
      return;
    }
    renderInfo();
    if (wanted && !tabButtons[tabs.indexOf(wanted)].hidden) select(wanted);
    wanted = null;
  }

  function renderInfo() {
    stateBadge.replaceChildren(badge(info.state));
    description.textContent = info.description || '';
    const running = info.state === 'running';
    const living = info.persistent ? undefined : 'Only a persistent instance has a living sandbox to start, stop or restart';
    const network = el('select', { 'aria-label': 'Network mode' },
      act.NETWORK_MODES.map(([v, label]) => el('option', { value: v, selected: v === info.network }, label)));
    network.addEventListener('change', async () => {
      if (!(await act.setNetwork(id, network.value))) network.value = info.network;
      loadInfo();
    });
    const after = (p) => p.then(loadInfo);
    actions.replaceChildren(
      running
        ? el('button', { type: 'button', onclick: () => after(act.stop(id)) }, 'Stop')
        : el('button', { type: 'button', disabled: Boolean(living), title: living, onclick: () => after(act.start(id)) }, 'Start'),
      el('button', { type: 'button', disabled: Boolean(living), title: living, onclick: () => after(act.restart(id)) }, 'Restart'),
      el('label', { class: 'inline' }, 'Network ', network),
      el('button', { type: 'button', onclick: () => act.snapshot(id).then(loadSnapshots) }, 'Snapshot…'),
      el('button', { type: 'button', onclick: () => after(act.reset(id)) }, 'Reset…'),
      el('button', { type: 'button', onclick: async () => { if (await act.archive(id)) location.assign('#/instances'); } }, 'Archive…'),
      el('button', { type: 'button', class: 'danger', onclick: async () => { if (await act.remove(id)) location.assign('#/instances'); } }, 'Delete…'),
    );
    const usage = info.usage ?? {};
    const fact = (k, v) => el('div', {}, el('dt', {}, k), el('dd', {}, v));
    summary.replaceChildren(
      fact('Network', info.network ?? '—'),
      fact('Desktop', info.desktop ? 'on' : 'off'),
      fact('Image', info.image || 'host system'),
      fact('Persistent', info.persistent ? 'yes' : 'no'),
      fact('Memory', formatBytes(usage.memory_bytes)),
      fact('CPU', formatPercent(usage.cpu_percent)),
      fact('Disk', formatBytes(info.disk_bytes)),
      fact('Jobs running', String(info.jobs_running ?? 0)),
      fact('Created', timeEl(info.created_at)),
      fact('Last activity', timeEl(info.last_activity)),
      fact('Activity', el('a', { href: `#/activity?instance=${encodeURIComponent(id)}` }, 'what agents did here')),
    );
    renderPorts();
    renderLimits();
    renderDesktopTab();
    if (info.snapshots) renderSnapshots(info.snapshots);
  }

  // ---- jobs ----
  const jobsBody = el('div');
  const outputTitle = el('h3', {}, 'Output');
  const outputState = el('span', { class: 'muted' });
  const output = el('pre', { class: 'output', 'aria-live': 'off', tabindex: '0' });
  const outputBox = el('div', { class: 'output-box', hidden: true }, el('div', { class: 'card-head' }, outputTitle, outputState), output);
  const command = el('input', { name: 'command', required: true, autocomplete: 'off', spellcheck: 'false', placeholder: 'e.g. make -j2 test' });
  const workdir = el('input', { name: 'workdir', autocomplete: 'off', placeholder: '/workspace' });
  const timeout = el('input', { name: 'timeout', type: 'number', min: '1', placeholder: 'seconds' });
  const jobForm = el('form', { class: 'inline-form' },
    field('Command', command), field('Working folder', workdir), field('Timeout', timeout),
    el('button', { type: 'submit', class: 'primary' }, 'Run'));
  jobForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const job = await api('POST', instancePath(id, 'jobs'), {
        body: { command: command.value, workdir: workdir.value.trim() || undefined, timeout: timeout.value ? Number(timeout.value) : undefined },
      });
      command.value = '';
      await loadJobs();
      if (job && job.job_id) showOutput(job);
    } catch (err) {
      showError(err);
    }
  });
  panels.get('Jobs').append(section('Run a job', null, jobForm), section('Jobs', null, jobsBody), outputBox);

  async function loadJobs() {
    let answer;
    try {
      answer = await api('GET', instancePath(id, 'jobs'), { query: { limit: 50 }, signal });
    } catch (err) {
      showError(err);
      return;
    }
    const jobs = answer.jobs ?? [];
    if (jobs.length === 0) {
      jobsBody.replaceChildren(empty('No jobs yet.'));
      return;
    }
    jobsBody.replaceChildren(table(['Job', 'Command', 'State', 'Exit', 'Submitted', ''], jobs.map((job) => el('tr', { dataset: { job: job.job_id } },
      el('td', { class: 'mono' }, job.job_id),
      el('td', { class: 'mono' }, cut(job.command, 90)),
      el('td', {}, badge(job.status), job.reason ? el('div', { class: 'hint' }, cut(job.reason, 80)) : null),
      el('td', { class: 'num' }, job.exit_code ?? '—'),
      el('td', {}, timeEl(job.created_at)),
      el('td', { class: 'row-actions' },
        el('button', { type: 'button', onclick: () => showOutput(job) }, 'Output'),
        job.status === 'running' || job.status === 'pending'
          ? el('button', {
            type: 'button',
            onclick: async () => {
              if (!(await confirmAction(`Cancel job ${job.job_id}?`, 'Its processes are ended.', 'Cancel job'))) return;
              try {
                await api('POST', instancePath(id, 'jobs', job.job_id, 'cancel'));
                showNotice(`Job ${job.job_id} cancelled.`);
              } catch (err) {
                showError(err);
              }
              loadJobs();
            },
          }, 'Cancel')
          : null)))));
  }

  // The job's output as it grows: server-sent events until `end`.
  function showOutput(job) {
    if (outputSource) outputSource.close();
    outputBox.hidden = false;
    outputTitle.textContent = `Output of ${job.job_id}`;
    outputState.textContent = 'streaming…';
    output.replaceChildren();
    let kept = 0;
    const source = new EventSource(`/api/jobs/${encodeURIComponent(id)}/${encodeURIComponent(job.job_id)}/output`);
    outputSource = source;
    source.addEventListener('output', (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return;
      }
      const text = String(data.text ?? '');
      const stick = output.scrollTop + output.clientHeight >= output.scrollHeight - 4;
      const span = el('span', { class: data.stream === 'stderr' ? 'stderr' : undefined }, text);
      output.appendChild(span);
      kept += text.length;
      while (kept > OUTPUT_LIMIT && output.firstChild) {
        kept -= output.firstChild.textContent.length;
        output.firstChild.remove();
      }
      if (stick) output.scrollTop = output.scrollHeight;
    });
    source.addEventListener('end', (event) => {
      source.close(); // else the browser would reconnect and read it all again
      let data = {};
      try {
        data = JSON.parse(event.data);
      } catch {
        // keep the defaults
      }
      const exit = data.exit_code !== undefined && data.exit_code !== null ? `, exit ${data.exit_code}` : '';
      outputState.textContent = `${data.state ?? 'ended'}${exit}${data.reason ? ` (${data.reason})` : ''}`;
      loadJobs();
    });
    source.addEventListener('error', () => {
      if (source.readyState === EventSource.CLOSED) outputState.textContent = 'the stream was refused; is the job still there?';
    });
  }

  // ---- files ----
  let cwd = '/workspace';
  const filesBody = el('div');
  const pathLabel = el('code', { class: 'path' });
  const upload = el('input', { type: 'file', multiple: true, id: 'upload-input', class: 'visually-hidden' });
  const upButton = el('button', { type: 'button', onclick: () => goUp() }, 'Up');
  const rootSelect = el('select', { 'aria-label': 'Folder' },
    el('option', { value: '/workspace' }, '/workspace'), el('option', { value: '/output' }, '/output'));
  rootSelect.addEventListener('change', () => {
    cwd = rootSelect.value;
    loadFiles();
  });
  const filesActions = [
    rootSelect,
    upButton,
    el('button', { type: 'button', onclick: () => newFolder() }, 'New folder…'),
    el('label', { class: 'button', for: 'upload-input', tabindex: '0', role: 'button', onkeydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); upload.click(); } } }, 'Upload…'),
    upload,
  ];
  upload.addEventListener('change', async () => {
    for (const file of upload.files) {
      try {
        await api('PUT', instancePath(id, 'files', 'content'), { query: { path: join(cwd, file.name) }, body: file });
        showNotice(`Uploaded ${file.name}.`);
      } catch (err) {
        showError(err);
      }
    }
    upload.value = '';
    loadFiles();
  });
  panels.get('Files').append(section('Files', filesActions, el('p', {}, pathLabel), filesBody));

  function join(dir, name) {
    return `${dir.replace(/\/+$/, '')}/${name}`;
  }

  // The API serves /workspace and /output (and what is beneath them): Up stops there.
  const atRoot = () => cwd === '/workspace' || cwd === '/output';

  function goUp() {
    if (atRoot()) return;
    cwd = cwd.replace(/\/[^/]*\/?$/, '') || '/workspace';
    loadFiles();
  }

  async function newFolder() {
    const name = el('input', { name: 'folder', required: true, autocomplete: 'off' });
    const value = await formDialog(`New folder in ${cwd}`, [field('Name', name)], 'Create', () => name.value.trim());
    if (!value) return;
    try {
      await api('POST', instancePath(id, 'files', 'folder'), { body: { path: join(cwd, value) } });
    } catch (err) {
      showError(err);
    }
    loadFiles();
  }

  async function loadFiles() {
    pathLabel.textContent = cwd;
    upButton.disabled = atRoot();
    rootSelect.value = cwd.startsWith('/output') ? '/output' : '/workspace';
    let answer;
    try {
      answer = await api('GET', instancePath(id, 'files'), { query: { path: cwd }, signal });
    } catch (err) {
      filesBody.replaceChildren(empty('This folder cannot be listed.'));
      showError(err);
      return;
    }
    const entries = [...(answer.entries ?? [])].sort((a, b) =>
      (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || String(a.name).localeCompare(String(b.name)));
    if (entries.length === 0) {
      filesBody.replaceChildren(empty('This folder is empty.'));
      return;
    }
    filesBody.replaceChildren(table(['Name', 'Type', 'Size', 'Modified', ''], entries.map((entry) => {
      const full = join(answer.path ?? cwd, entry.name);
      const name = entry.type === 'dir'
        ? el('a', { href: '#', onclick: (e) => { e.preventDefault(); cwd = full; loadFiles(); } }, `${entry.name}/`)
        : entry.type === 'file'
          ? el('a', { href: `${instancePath(id, 'files', 'content')}?${new URLSearchParams({ path: full })}`, download: entry.name }, entry.name)
          : el('span', {}, entry.name);
      return el('tr', { dataset: { name: entry.name } },
        el('td', { class: 'mono' }, name),
        el('td', {}, entry.type),
        el('td', { class: 'num' }, entry.type === 'file' ? formatBytes(entry.size) : ''),
        el('td', {}, timeEl(entry.modified)),
        el('td', { class: 'row-actions' }, el('button', {
          type: 'button', 'aria-label': `Delete ${entry.name}`,
          onclick: async () => {
            const what = entry.type === 'dir' ? 'The folder and everything in it are removed.' : 'The file is removed.';
            if (!(await confirmAction(`Delete ${full}?`, what, 'Delete'))) return;
            try {
              await api('DELETE', instancePath(id, 'files'), { query: { path: full } });
            } catch (err) {
              showError(err);
            }
            loadFiles();
          },
        }, 'Delete')));
    })));
  }

  // ---- snapshots ----
  const snapshotsBody = el('div');
  panels.get('Snapshots').append(section('Snapshots',
    [el('button', { type: 'button', onclick: () => act.snapshot(id).then(loadSnapshots) }, 'Take snapshot…')], snapshotsBody));

  async function loadSnapshots() {
    try {
      const answer = await api('GET', instancePath(id, 'snapshots'), { signal });
      renderSnapshots(answer.snapshots ?? []);
    } catch (err) {
      showError(err);
    }
  }

  function renderSnapshots(list) {
    if (list.length === 0) {
      snapshotsBody.replaceChildren(empty('No snapshots.'));
      return;
    }
    snapshotsBody.replaceChildren(table(['Name', 'Taken', 'Size', 'System layer', ''], list.map((s) => el('tr', {},
      el('td', { class: 'mono' }, s.name),
      el('td', {}, timeEl(s.created_at)),
      el('td', { class: 'num' }, formatBytes(s.bytes)),
      el('td', {}, s.has_layer ? 'yes' : 'no'),
      el('td', { class: 'row-actions' },
        el('button', { type: 'button', onclick: () => act.restore(id, s.name).then(loadInfo) }, 'Restore…'),
        el('button', { type: 'button', onclick: () => act.deleteSnapshot(id, s.name).then(loadSnapshots) }, 'Delete…'))))));
  }

  // ---- ports ----
  const portsBody = el('div');
  const portInput = el('input', { type: 'number', min: '1', max: '65535', required: true, name: 'port' });
  const hostPortInput = el('input', { type: 'number', min: '1', max: '65535', name: 'host_port', placeholder: 'any' });
  const portForm = el('form', { class: 'inline-form' },
    field('Port in the sandbox', portInput), field('Host port', hostPortInput),
    el('button', { type: 'submit', class: 'primary' }, 'Expose'));
  portForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    try {
      const answer = await api('POST', instancePath(id, 'ports'), {
        body: { port: Number(portInput.value), host_port: hostPortInput.value ? Number(hostPortInput.value) : undefined },
      });
      showNotice(answer && answer.url ? `Exposed at ${answer.url}.` : 'Exposed.');
      portInput.value = '';
      hostPortInput.value = '';
    } catch (err) {
      showError(err);
    }
    loadInfo();
  });
  panels.get('Ports').append(section('Exposed ports', null, portsBody, portForm));

  function renderPorts() {
    const ports = Array.isArray(info.ports) ? info.ports : [];
    if (ports.length === 0) {
      portsBody.replaceChildren(empty('No ports exposed.'));
      return;
    }
    portsBody.replaceChildren(table(['Port', 'Host port', 'URL', ''], ports.map((p) => el('tr', {},
      el('td', { class: 'num' }, String(p.port ?? '')),
      el('td', { class: 'num' }, String(p.host_port ?? '')),
      el('td', { class: 'mono' }, p.url ? cut(p.url, 80) : ''),
      el('td', { class: 'row-actions' }, el('button', {
        type: 'button',
        onclick: async () => {
          if (!(await confirmAction(`Close port ${p.port}?`, 'Connections through it end.', 'Close'))) return;
          try {
            await api('DELETE', instancePath(id, 'ports', String(p.port)));
          } catch (err) {
            showError(err);
          }
          loadInfo();
        },
      }, 'Close'))))));
  }

  // ---- limits and usage ----
  const limitsBody = el('div');
  panels.get('Limits and usage').append(limitsBody);

  function renderLimits() {
    limitsBody.replaceChildren(
      section('Limits', null, keyValues(info.limits)),
      section('Disk', null, keyValues(info.disk)),
      section('Processes', null, processes(info.process_list ?? info.processes)));
  }

  // An object of the API as a two-column table; sizes (keys ending in "bytes") in KB/MB/GB,
  // nested values as compact JSON text.
  function keyValues(obj) {
    if (!obj || typeof obj !== 'object' || Object.keys(obj).length === 0) return empty('Nothing reported.');
    return table(['', ''], Object.entries(obj).map(([k, v]) => el('tr', {},
      el('th', { scope: 'row' }, k.replaceAll('_', ' ')),
      el('td', { class: typeof v === 'number' ? 'num' : undefined },
        typeof v === 'number' && k.endsWith('bytes') ? formatBytes(v) : v !== null && typeof v === 'object' ? cut(v, 160) : String(v ?? '—')))),
    { class: 'kv' });
  }

  function processes(list) {
    if (!Array.isArray(list) || list.length === 0) return empty(typeof list === 'number' ? `${list} processes.` : 'No processes.');
    return table(['PID', 'Command'], list.slice(0, 200).map((p) => el('tr', {},
      el('td', { class: 'num' }, String(p.pid ?? '')),
      el('td', { class: 'mono' }, cut(p.command ?? p.cmdline ?? p, 120)))));
  }

  // ---- live ----
  const offs = [
    on('instances', (data) => { if (!data.ids || data.ids.includes(id)) loadInfo(); }),
    on('jobs', (data) => {
      if (data.instance_id === id) loadJobs();
    }),
    on('reconnected', () => { loadInfo(); loadJobs(); }),
  ];

  select('Jobs');
  loadInfo();
  loadJobs();
  loadFiles();
  loadSnapshots();
  return () => {
    controller.abort();
    if (outputSource) outputSource.close();
    for (const teardown of liveTeardowns.values()) if (teardown) teardown();
    for (const off of offs) off();
  };
}
