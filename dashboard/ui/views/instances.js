// The instances list: one page of 100 at a time, filtered and sorted by the server (1,000
// instances stay fast), rendered into one DocumentFragment; reloaded when the live stream says an
// instance changed.
import { api, showError } from '../api.js';
import { badge, cut, debounce, el, formatBytes, formatPercent, timeEl } from '../dom.js';
import { on } from '../events.js';
import * as act from './actions.js';

const PAGE = 100;

export function mount(root, { query }) {
  const state = { offset: 0, filter: query.get('filter') ?? '', sort: 'last_activity', controller: null };
  let renders = 0;

  const filter = el('input', {
    type: 'search', id: 'instance-filter', value: state.filter, placeholder: 'Filter by id or description',
    'aria-label': 'Filter instances', autocomplete: 'off', spellcheck: 'false',
  });
  const sort = el('select', { 'aria-label': 'Sort by' },
    el('option', { value: 'last_activity' }, 'Last activity'),
    el('option', { value: 'id' }, 'ID'));
  const createButton = el('button', { type: 'button', class: 'primary' }, 'New instance');
  const count = el('span', { class: 'muted', 'aria-live': 'polite' }, '');
  const prev = el('button', { type: 'button', disabled: true }, 'Previous');
  const next = el('button', { type: 'button', disabled: true }, 'Next');
  const tbody = el('tbody');
  const list = el('table', { class: 'instances', 'aria-label': 'Instances' },
    el('thead', {}, el('tr', {},
      ['Instance', 'State', 'Network', 'Desktop', 'Disk', 'Memory', 'CPU', 'Jobs', 'Last activity', 'Actions']
        .map((h) => el('th', { scope: 'col' }, h)))),
    tbody);
  const emptyNote = el('p', { class: 'empty', hidden: true }, '');

  root.append(
    el('div', { class: 'page-head' }, el('h1', {}, 'Instances'), createButton),
    el('div', { class: 'toolbar' }, filter, sort, el('span', { class: 'spacer' }), count, prev, next),
    el('div', { class: 'table-wrap' }, list),
    emptyNote,
  );

  async function load() {
    if (state.controller) state.controller.abort();
    const controller = new AbortController();
    state.controller = controller;
    try {
      const page = await api('GET', '/api/instances', {
        query: { filter: state.filter, sort: state.sort, offset: state.offset, limit: PAGE },
        signal: controller.signal,
      });
      if (controller.signal.aborted) return;
      render(page);
    } catch (err) {
      showError(err);
    }
  }

  function render(page) {
    const items = page.instances ?? [];
    const total = page.total ?? items.length;
    if (items.length === 0 && state.offset > 0 && total > 0) {
      // The page emptied (instances deleted): go back to the last page that has some.
      state.offset = Math.max(0, Math.floor((total - 1) / PAGE) * PAGE);
      load();
      return;
    }
    const fragment = document.createDocumentFragment();
    for (const inst of items) fragment.appendChild(row(inst));
    tbody.replaceChildren(fragment);
    const first = total === 0 ? 0 : state.offset + 1;
    count.textContent = `${first}–${state.offset + items.length} of ${total.toLocaleString()}`;
    prev.disabled = state.offset === 0;
    next.disabled = state.offset + items.length >= total;
    emptyNote.hidden = items.length > 0;
    emptyNote.textContent = state.filter
      ? 'No instance matches the filter.'
      : 'No instances yet. Create one here, or let an agent call create_instance.';
    root.dataset.renders = String(++renders);
  }

  function row(inst) {
    const id = inst.id;
    const running = inst.state === 'running';
    const living = inst.persistent ? undefined : 'Only a persistent instance has a living sandbox to start or restart';
    const network = el('select', { 'aria-label': `Network of ${id}` },
      act.NETWORK_MODES.map(([v]) => el('option', { value: v, selected: v === inst.network }, v)));
    if (!act.NETWORK_MODES.some(([v]) => v === inst.network))
      network.prepend(el('option', { value: inst.network ?? '', selected: true }, String(inst.network ?? '?')));
    network.addEventListener('change', async () => {
      if (!(await act.setNetwork(id, network.value))) network.value = inst.network;
      refresh();
    });
    const more = el('details', { class: 'menu' },
      el('summary', { 'aria-label': `More actions for ${id}` }, 'More'),
      el('div', { class: 'menu-items' },
        menuItem('Snapshot…', () => act.snapshot(id)),
        menuItem('Factory reset…', () => act.reset(id)),
        menuItem('Archive…', () => act.archive(id)),
        menuItem('Delete…', () => act.remove(id), 'danger')));
    const usage = inst.usage ?? {};
    return el('tr', { dataset: { id } },
      el('td', { class: 'ident' },
        el('a', { href: `#/instances/${encodeURIComponent(id)}` }, id),
        inst.description ? el('div', { class: 'desc' }, cut(inst.description, 80)) : null),
      el('td', {}, badge(inst.state)),
      el('td', {}, network),
      el('td', {}, inst.desktop ? 'on' : 'off'),
      el('td', { class: 'num' }, formatBytes(inst.disk_bytes)),
      el('td', { class: 'num' }, formatBytes(usage.memory_bytes ?? inst.memory_bytes)),
      el('td', { class: 'num' }, formatPercent(usage.cpu_percent)),
      el('td', { class: 'num' }, inst.jobs_running === null || inst.jobs_running === undefined ? '—' : String(inst.jobs_running)),
      el('td', {}, timeEl(inst.last_activity)),
      el('td', { class: 'row-actions' },
        running
          ? el('button', { type: 'button', onclick: () => act.stop(id).then(refresh) }, 'Stop')
          : el('button', { type: 'button', disabled: Boolean(living), title: living, onclick: () => act.start(id).then(refresh) }, 'Start'),
        el('button', { type: 'button', disabled: Boolean(living), title: living, onclick: () => act.restart(id).then(refresh) }, 'Restart'),
        more));
  }

  function menuItem(label, fn, cls) {
    return el('button', {
      type: 'button', class: cls,
      onclick: (e) => {
        e.target.closest('details').open = false;
        fn().then(refresh);
      },
    }, label);
  }

  const refresh = debounce(load, 250);
  const onFilter = debounce(() => {
    state.filter = filter.value.trim();
    state.offset = 0;
    load();
  }, 150);
  filter.addEventListener('input', onFilter);
  sort.addEventListener('change', () => {
    state.sort = sort.value;
    state.offset = 0;
    load();
  });
  prev.addEventListener('click', () => {
    state.offset = Math.max(0, state.offset - PAGE);
    load();
  });
  next.addEventListener('click', () => {
    state.offset += PAGE;
    load();
  });
  createButton.addEventListener('click', async () => {
    const created = await act.create();
    if (created) load();
  });
  // An open "More" menu closes when the person clicks elsewhere.
  const closeMenus = (e) => {
    for (const d of root.querySelectorAll('details.menu[open]')) if (!d.contains(e.target)) d.open = false;
  };
  document.addEventListener('click', closeMenus);

  const offs = [on('instances', refresh), on('jobs', refresh), on('reconnected', refresh)];
  load();
  filter.focus();
  return () => {
    refresh.cancel();
    onFilter.cancel();
    if (state.controller) state.controller.abort();
    document.removeEventListener('click', closeMenus);
    for (const off of offs) off();
  };
}
