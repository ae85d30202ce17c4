// What a person can do to an instance, shared by the instances list and the instance's page.
// Each action asks first when it ends processes or removes something, calls the API, says what
// happened in the notice bar and resolves with true when it was done.
import { api, instancePath, showError, showNotice } from '../api.js';
import { confirmAction, formDialog } from '../dialog.js';
import { el, field } from '../dom.js';

export const NETWORK_MODES = [
  ['off', 'off — no network'],
  ['nat', 'nat — internet through NAT'],
  ['filtered', 'filtered — allowed domains only'],
  ['host', "host — the host's network"],
];

async function attempt(fn, done) {
  try {
    await fn();
    if (done) showNotice(done);
    return true;
  } catch (err) {
    showError(err);
    return false;
  }
}

export async function start(id) {
  return attempt(() => api('POST', instancePath(id, 'start')), `Started ${id}.`);
}

export async function stop(id) {
  if (!(await confirmAction(`Stop ${id}?`, 'Every process in it ends, and its jobs are cancelled.', 'Stop'))) return false;
  return attempt(() => api('POST', instancePath(id, 'stop')), `Stopped ${id}.`);
}

export async function restart(id) {
  if (!(await confirmAction(`Restart ${id}?`, 'Every process in it ends, then it starts again.', 'Restart'))) return false;
  return attempt(() => api('POST', instancePath(id, 'restart')), `Restarted ${id}.`);
}

export async function setNetwork(id, mode) {
  return attempt(async () => {
    const answer = await api('PUT', instancePath(id, 'network'), { body: { mode } });
    const how = answer && answer.applied === 'restarted' ? ' (it was restarted to apply it)' : '';
    showNotice(`${id}: network ${mode}${how}.`);
  });
}

export async function snapshot(id) {
  const name = el('input', { name: 'name', autocomplete: 'off', pattern: '[A-Za-z0-9][A-Za-z0-9_.\\-]{0,62}' });
  const values = await formDialog(`Snapshot ${id}`, [
    field('Name', name, 'Letters, digits, dot, dash, underscore; empty: snap-<time>.'),
  ], 'Take snapshot', () => ({ name: name.value.trim() || undefined }));
  if (!values) return false;
  return attempt(() => api('POST', instancePath(id, 'snapshots'), { body: values }), `Snapshot of ${id} taken.`);
}

export async function restore(id, name) {
  if (!(await confirmAction(`Restore ${id} to "${name}"?`, 'Its files return to the snapshot; what changed since is lost.', 'Restore'))) return false;
  return attempt(() => api('POST', instancePath(id, 'snapshots', name, 'restore')), `${id} restored to ${name}.`);
}

export async function deleteSnapshot(id, name) {
  if (!(await confirmAction(`Delete snapshot "${name}"?`, 'The snapshot cannot be brought back.', 'Delete'))) return false;
  return attempt(() => api('DELETE', instancePath(id, 'snapshots', name)), `Snapshot ${name} deleted.`);
}

export async function reset(id) {
  const workspace = el('input', { type: 'checkbox', name: 'include_workspace' });
  const values = await formDialog(`Factory-reset ${id}?`, [
    el('p', {}, 'Its system returns to the image: what was installed or changed outside the workspace and output is lost.'),
    el('label', { class: 'check' }, workspace, 'Also empty its workspace'),
  ], 'Reset', () => ({ include_workspace: workspace.checked || undefined }), { danger: true });
  if (!values) return false;
  return attempt(() => api('POST', instancePath(id, 'reset'), { body: values }), `${id} reset.`);
}

export async function archive(id) {
  if (!(await confirmAction(`Archive ${id}?`, 'It stops and is packed into an archive; it leaves the list.', 'Archive'))) return false;
  return attempt(async () => {
    const answer = await api('POST', instancePath(id, 'archive'));
    const name = answer && (answer.archive_name ?? answer.name);
    showNotice(name ? `${id} archived as ${name}.` : `${id} archived.`);
  });
}

export async function remove(id) {
  if (!(await confirmAction(`Delete ${id}?`, 'Its files, jobs and snapshots are removed for good.', 'Delete'))) return false;
  return attempt(() => api('DELETE', instancePath(id)), `${id} deleted.`);
}

// Asks for the new instance's settings; resolves with the created Instance, or null.
export async function create() {
  const id = el('input', { name: 'id', autocomplete: 'off', pattern: '[A-Za-z0-9][A-Za-z0-9_.\\-]{0,62}', placeholder: 'made up when empty' });
  const description = el('input', { name: 'description', autocomplete: 'off' });
  const network = el('select', { name: 'network' },
    NETWORK_MODES.map(([v, label]) => el('option', { value: v }, label)));
  const image = el('input', { name: 'image', autocomplete: 'off', placeholder: 'the host\'s system when empty' });
  const persistent = el('input', { type: 'checkbox', name: 'persistent' });
  const desktop = el('input', { type: 'checkbox', name: 'desktop' });
  const values = await formDialog('New instance', [
    field('ID', id),
    field('Description', description),
    field('Network', network),
    field('Image', image),
    el('label', { class: 'check' }, persistent, 'Persistent (a living sandbox that keeps its processes)'),
    el('label', { class: 'check' }, desktop, 'Desktop'),
  ], 'Create', () => ({
    id: id.value.trim() || undefined,
    description: description.value || undefined,
    network: network.value,
    image: image.value.trim() || undefined,
    persistent: persistent.checked || undefined,
    desktop: desktop.checked || undefined,
  }));
  if (!values) return null;
  try {
    const created = await api('POST', '/api/instances', { body: values });
    showNotice(`Created ${created?.id ?? 'the instance'}.`);
    return created;
  } catch (err) {
    showError(err);
    return null;
  }
}
