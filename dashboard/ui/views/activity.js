// What agents did: the audit events of every ns-hpc process on this instances folder, newest
// first, filtered by instance, session and kind, new ones arriving live. Values come cut as the
// audit cut them and with secrets redacted by the server; the page cuts long ones again for the
// table (the whole event is behind "Details").
import { api, showError } from '../api.js';
import { cut, el, empty, field, timeEl } from '../dom.js';
import { on } from '../events.js';

const KINDS = ['', 'mcp.tool_call', 'instance.', 'job.', 'dashboard.', 'dashboard.files'];
const SHOWN_MAX = 1000; // rows kept on the page
const PAGE = 100;

export function mount(root, { query }) {
  const controller = new AbortController();
  const filters = {
    instance: el('input', { name: 'instance', value: query.get('instance') ?? '', autocomplete: 'off', spellcheck: 'false' }),
    session: el('input', { name: 'session', value: query.get('session') ?? '', autocomplete: 'off', spellcheck: 'false' }),
    kind: el('input', { name: 'kind', value: query.get('kind') ?? '', list: 'activity-kinds', autocomplete: 'off', spellcheck: 'false' }),
  };
  const kinds = el('datalist', { id: 'activity-kinds' }, KINDS.filter(Boolean).map((k) => el('option', { value: k })));
  const form = el('form', { class: 'toolbar filters' },
    field('Instance', filters.instance), field('Session', filters.session), field('Kind', filters.kind), kinds,
    el('button', { type: 'submit' }, 'Apply'),
    el('button', { type: 'button', class: 'quiet', onclick: () => { for (const f of Object.values(filters)) f.value = ''; apply(); } }, 'Clear'));
  const tbody = el('tbody');
  const list = el('table', { class: 'activity', 'aria-label': 'Activity' },
    el('thead', {}, el('tr', {}, ['Time', 'Instance', 'Kind', 'Actor', 'Tool', 'Arguments', 'Outcome', 'ms', '']
      .map((h) => el('th', { scope: 'col' }, h)))),
    tbody);
  const more = el('button', { type: 'button', hidden: true }, 'Older events');
  const note = el('p', { class: 'empty', hidden: true }, 'No events match.');
  root.append(el('div', { class: 'page-head' }, el('h1', {}, 'Activity')), form,
    el('div', { class: 'table-wrap' }, list), note, el('p', { class: 'center' }, more));

  let nextBefore = null;
  let current = {};
  // Ids shown: an event can come both in a page and live (the stream and the page overlap).
  const shown = new Set();

  function values() {
    return {
      instance: filters.instance.value.trim(),
      session: filters.session.value.trim(),
      kind: filters.kind.value.trim(),
    };
  }

  function apply() {
    current = values();
    const params = new URLSearchParams(Object.entries(current).filter(([, v]) => v));
    const hash = `#/activity${params.toString() ? `?${params}` : ''}`;
    if (location.hash !== hash) history.replaceState(null, '', hash);
    tbody.replaceChildren();
    shown.clear();
    load();
  }

  async function load(before) {
    try {
      const answer = await api('GET', '/api/activity', { query: { ...current, before, limit: PAGE }, signal: controller.signal });
      const fragment = document.createDocumentFragment();
      for (const event of answer.events ?? []) {
        if (shown.has(event.id)) continue;
        shown.add(event.id);
        fragment.appendChild(row(event));
      }
      tbody.appendChild(fragment);
      nextBefore = answer.next_before ?? null;
      more.hidden = !nextBefore || (answer.events ?? []).length < PAGE;
      note.hidden = tbody.childElementCount > 0;
      root.dataset.loaded = 'true';
    } catch (err) {
      showError(err);
    }
  }

  function matches(event) {
    if (current.instance && event.instance !== current.instance) return false;
    if (current.session && event.session !== current.session) return false;
    if (current.kind && event.kind !== current.kind) return false;
    return true;
  }

  function row(event) {
    const outcome = event.error ? `${event.outcome ?? 'error'}: ${typeof event.error === 'string' ? event.error : JSON.stringify(event.error)}`
      : event.outcome ?? '';
    const failed = event.outcome === 'error' || Boolean(event.error);
    const details = el('details', {},
      el('summary', { 'aria-label': 'Details of this event' }, 'Details'),
      el('pre', { class: 'event-json' }, JSON.stringify(event, null, 2).slice(0, 20000)));
    return el('tr', { dataset: { kind: event.kind ?? '' } },
      el('td', {}, timeEl(event.timestamp)),
      el('td', { class: 'mono' }, event.instance
        ? el('a', { href: `#/instances/${encodeURIComponent(event.instance)}` }, event.instance) : '—'),
      el('td', {}, event.kind ?? ''),
      el('td', {}, cut(event.actor ?? '', 40)),
      el('td', { class: 'mono' }, event.tool ?? ''),
      el('td', { class: 'mono args' }, event.arguments !== undefined ? cut(event.arguments, 100)
        : event.fields && Object.keys(event.fields).length ? cut(event.fields, 100) : ''),
      el('td', { class: failed ? 'bad' : undefined }, cut(outcome, 60)),
      el('td', { class: 'num' }, event.duration_ms ?? ''),
      el('td', {}, details));
  }

  form.addEventListener('submit', (e) => {
    e.preventDefault();
    apply();
  });
  more.addEventListener('click', () => load(nextBefore));

  const offs = [
    on('activity', (event) => {
      if (!matches(event) || shown.has(event.id)) return;
      shown.add(event.id);
      tbody.prepend(row(event));
      note.hidden = true;
      while (tbody.childElementCount > SHOWN_MAX) tbody.lastElementChild.remove();
    }),
    on('reconnected', apply),
  ];
  current = values();
  load();
  return () => {
    controller.abort();
    for (const off of offs) off();
  };
}
