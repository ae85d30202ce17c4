// The ns-hpc dashboard: plain ES modules, no framework, no build step, and no npm at build or run
// time. The files under dashboard/ui are embedded in the ns-hpc binary as they are (gzipped by
// the build, see src/dashboard/assets.cmake), so what you read here is what the browser runs.
//
// Layout: main.js (this file) routes the hash (#/instances, #/instances/<id>[/desktop|/terminal],
// #/activity, #/server) to a view; each view in views/ exports mount(root, params), which builds its part of
// the page and returns a function that tears it down. api.js calls the JSON API (docs/api.md),
// events.js holds the one live EventSource, dom.js builds DOM nodes (text only: nothing a
// sandbox wrote ever becomes markup), dialog.js asks before destructive actions.
import { hideNotice, showError } from './api.js';
import { connect } from './events.js';
import * as activityView from './views/activity.js';
import * as instanceView from './views/instance.js';
import * as instancesView from './views/instances.js';
import * as serverView from './views/server.js';

const routes = [
  { pattern: /^\/instances\/?$/, view: instancesView, nav: 'instances' },
  { pattern: /^\/instances\/([^/]+)\/?$/, view: instanceView, nav: 'instances' },
  // An instance opened on a tab: the desktop_url agents are given (#/instances/<id>/desktop).
  { pattern: /^\/instances\/([^/]+)\/(desktop|terminal)\/?$/, view: instanceView, nav: 'instances' },
  { pattern: /^\/activity\/?$/, view: activityView, nav: 'activity' },
  { pattern: /^\/server\/?$/, view: serverView, nav: 'server' },
];

let teardown = null;

function route() {
  const hash = location.hash.replace(/^#/, '') || '/instances';
  const [path, queryString] = hash.split('?');
  const match = routes.map((r) => ({ r, m: r.pattern.exec(path) })).find((x) => x.m);
  if (!match) {
    location.replace('#/instances');
    return;
  }
  if (teardown) teardown();
  teardown = null;
  hideNotice();
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.view === match.r.nav) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const root = document.getElementById('view');
  root.replaceChildren();
  delete root.dataset.loaded;  // set again by the new view once its data is in
  const params = {
    id: match.m[1] === undefined ? undefined : decodeURIComponent(match.m[1]),
    tab: match.m[2],
    query: new URLSearchParams(queryString ?? ''),
  };
  try {
    teardown = match.r.view.mount(root, params) ?? null;
  } catch (err) {
    showError(err);
  }
}

async function logout() {
  try {
    await fetch('/logout', { method: 'POST', credentials: 'same-origin' });
  } finally {
    location.assign('/login');
  }
}

document.getElementById('logout').addEventListener('click', logout);
document.getElementById('notice-close').addEventListener('click', hideNotice);
window.addEventListener('hashchange', route);
connect();
route();
