// Building the page's DOM. Everything shown comes from a sandbox or an agent at some point, so it
// only ever becomes text: nodes are made with createElement and filled with textContent (or
// text nodes); attributes are set one by one. No string is ever parsed as HTML anywhere in the page
// (tests/unit/test_dashboard_assets.cpp greps every module for the APIs that would).

// el('button', {class: 'primary', onclick: fn, 'aria-label': 'Stop'}, 'Stop', otherNode)
// Children: strings (become text nodes), nodes, arrays of either, null/undefined/false (skipped).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') node.addEventListener(key.slice(2), value);
    else if (key === 'class') node.className = value;
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key === 'value' || key === 'checked' || key === 'disabled' || key === 'selected') node[key] = value;
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else if (child instanceof Node) node.appendChild(child);
    else node.appendChild(document.createTextNode(String(child)));
  }
}

export function clear(node) {
  node.replaceChildren();
}

// A long value cut to `max` characters with an ellipsis; the whole of it in the tooltip.
export function cut(value, max = 120) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  if (text === undefined) return el('span', {}, '');
  if (text.length <= max) return el('span', {}, text);
  return el('span', { title: text.slice(0, 4000) }, text.slice(0, max - 1) + '…');
}

export function formatBytes(n) {
  if (n === undefined || n === null) return '—';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let v = Number(n);
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v >= 10 || i === 0 ? Math.round(v) : v.toFixed(1)} ${units[i]}`;
}

export function formatPercent(n) {
  if (n === undefined || n === null) return '—';
  return `${Number(n).toFixed(Number(n) < 10 ? 1 : 0)}%`;
}

// "3 min ago"; the exact time in a tooltip of the element made by `timeEl`.
export function ago(iso) {
  if (!iso) return '—';
  const t = Date.parse(iso);
  if (Number.isNaN(t)) return String(iso);
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 5) return 'just now';
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

export function timeEl(iso) {
  return el('time', { datetime: iso || undefined, title: iso || undefined }, ago(iso));
}

// A state as a coloured badge: running, stopped, failed, …
export function badge(state) {
  const s = String(state ?? 'unknown');
  return el('span', { class: `badge badge-${s.replace(/[^a-z_-]/gi, '')}` }, s);
}

// Calls `fn` once `ms` after the last of a burst of calls.
export function debounce(fn, ms) {
  let timer = null;
  const wrapped = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
  wrapped.cancel = () => clearTimeout(timer);
  return wrapped;
}

// A labelled form field: <label>Text <input …></label>
export function field(label, control, hint) {
  return el('label', { class: 'field' }, el('span', { class: 'field-label' }, label), control,
    hint ? el('span', { class: 'hint' }, hint) : null);
}

// A section with a heading and optional buttons on the heading's line.
export function section(title, actions, ...body) {
  return el('section', { class: 'card' },
    el('div', { class: 'card-head' }, el('h2', {}, title), el('div', { class: 'actions' }, actions ?? [])),
    ...body);
}

// A table from column headings and row nodes.
export function table(headings, rows, attrs = {}) {
  return el('table', attrs,
    el('thead', {}, el('tr', {}, headings.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows));
}

export function empty(text) {
  return el('p', { class: 'empty' }, text);
}
