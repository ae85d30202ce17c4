// The live desktop of an instance: noVNC's RFB over /desktop/<id>/vnc (src/dashboard/relays.cpp).
// The session cookie authenticates the upgrade. It starts view-only twice over: noVNC sends no
// input (rfb.viewOnly) and the relay drops any until the page asks for control with the text
// frame {"control": true}, which the relay audits and answers with {"control": bool}. Loaded
// only when the Desktop tab opens (a dynamic import), so the first load stays small.
import RFB from '../vendor/novnc/core/rfb.js';
import { el } from '../dom.js';

// Mounts the desktop of instance `id` in `box`; returns a function that closes it.
export function mountDesktop(box, id) {
  const status = el('span', { class: 'live-status', role: 'status', 'aria-live': 'polite' });
  const controlButton = el('button', { type: 'button', 'aria-pressed': 'false', disabled: true }, 'Take control');
  const reconnectButton = el('button', { type: 'button', hidden: true }, 'Reconnect');
  const screen = el('div', { class: 'live-screen desktop-screen', 'aria-label': `Desktop of ${id}` });
  box.replaceChildren(el('div', { class: 'live-bar' }, status, controlButton, reconnectButton), screen);

  let ws = null;
  let rfb = null;
  let control = false;
  let live = false;

  const say = (text, kind = '') => {
    status.textContent = text;
    status.className = `live-status ${kind}`;
  };
  const showMode = () => {
    controlButton.textContent = control ? 'Give back control' : 'Take control';
    controlButton.setAttribute('aria-pressed', String(control));
    if (live) say(control ? 'Live, in control: your mouse and keys go to the desktop' : 'Live, view only', control ? 'in-control' : 'ok');
  };

  function connect() {
    control = false;
    live = false;
    reconnectButton.hidden = true;
    controlButton.disabled = true;
    say('Connecting…');
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    // Our own WebSocket handed to noVNC (it accepts one as its channel), so that the page can send
    // its one text frame on the same connection. noVNC reads only binary frames: a text frame is
    // an empty message to it, which it ignores; ours are read here.
    ws = new WebSocket(`${scheme}://${location.host}/desktop/${encodeURIComponent(id)}/vnc`, ['binary']);
    const socket = ws;
    let closeReason = '';
    socket.addEventListener('message', (e) => {
      if (typeof e.data !== 'string') return;
      let message;
      try {
        message = JSON.parse(e.data);
      } catch {
        return;
      }
      if (typeof message.control === 'boolean' && socket === ws) {
        control = message.control;
        rfb.viewOnly = !control;
        if (control) rfb.focus();
        showMode();
      }
    });
    socket.addEventListener('close', (e) => {
      closeReason = e.reason || (e.code === 1006 ? 'the connection was refused or lost' : `code ${e.code}`);
    });
    rfb = new RFB(screen, socket);
    rfb.viewOnly = true;
    rfb.scaleViewport = true;
    rfb.background = 'transparent';
    rfb.addEventListener('connect', () => {
      live = true;
      controlButton.disabled = false;
      showMode();
    });
    rfb.addEventListener('disconnect', (e) => {
      if (socket !== ws) return;
      live = false;
      controlButton.disabled = true;
      reconnectButton.hidden = false;
      const why = closeReason || (e.detail.clean ? 'closed' : 'the connection was lost');
      say(`Closed: ${why}`, 'closed');
    });
    rfb.addEventListener('securityfailure', (e) => {
      closeReason = `the desktop refused the connection (${e.detail.reason || e.detail.status})`;
    });
  }

  controlButton.addEventListener('click', () => {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    ws.send(JSON.stringify({ control: !control }));
    say(control ? 'Giving back control…' : 'Asking for control…');
  });
  reconnectButton.addEventListener('click', () => {
    if (rfb) rfb.disconnect();
    connect();
  });

  connect();
  return () => {
    const old = rfb;
    ws = null;
    rfb = null;
    if (old) old.disconnect();
  };
}
