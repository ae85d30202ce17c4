// In-page dialogs on the one <dialog> of index.html: a question before anything destructive
// (never window.confirm), and small forms. Escape or Cancel answers "no".
import { clear, el } from './dom.js';

let busy = Promise.resolve();

// Shows the dialog with `content` (nodes) and resolves with true when the person chose OK.
function show(title, content, okLabel, danger) {
  const run = () => new Promise((resolve) => {
    const dialog = document.getElementById('dialog');
    const ok = document.getElementById('dialog-ok');
    document.getElementById('dialog-title').textContent = title;
    const body = document.getElementById('dialog-body');
    clear(body);
    body.append(...content);
    ok.textContent = okLabel;
    ok.className = danger ? 'danger' : 'primary';
    dialog.returnValue = '';
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
    const first = body.querySelector('input, select, textarea');
    (first ?? (danger ? document.getElementById('dialog-cancel') : ok)).focus();
  });
  // One dialog at a time: a second question waits for the first answer.
  busy = busy.then(run, run);
  return busy;
}

// confirmAction('Delete instance "a"?', 'Its files and snapshots are removed.', 'Delete')
export function confirmAction(title, message, okLabel = 'OK', { danger = true } = {}) {
  return show(title, [el('p', {}, message)], okLabel, danger);
}

// A form in the dialog: `fields` are nodes (made with dom.field); `read()` gathers the values
// after OK. Resolves with read()'s result, or null when cancelled.
export async function formDialog(title, fields, okLabel, read, { danger = false } = {}) {
  const confirmed = await show(title, fields, okLabel, danger);
  return confirmed ? read() : null;
}
