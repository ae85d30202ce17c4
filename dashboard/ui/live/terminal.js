// The live terminal of an instance: xterm.js over /terminal/<id>?rows=&cols= (src/dashboard/
// relays.cpp), a shell as `instance enter` gives one. Binary frames carry the terminal's bytes both
// ways; the page sends {"resize": [rows, cols]} when its box changes size, the relay sends
// {"exit": code} when the shell ends. Loaded only when the Terminal tab opens.
import { FitAddon } from '../vendor/xterm/addon-fit.mjs';
import { Terminal } from '../vendor/xterm/xterm.mjs';
import { debounce, el } from '../dom.js';

// xterm's own style sheet, once per page (the CSP allows only our own sheets, as <link>).
function loadStyle() {
  const href = new URL('../vendor/xterm/xterm.css', import.meta.url).pathname;
  if (document.querySelector(`link[href="${href}"]`)) return;
  document.head.append(el('link', { rel: 'stylesheet', href }));
}

// Mounts a terminal of instance `id` in `box`; returns a function that closes it.
export function mountTerminal(box, id) {
  loadStyle();
  const status = el('span', { class: 'live-status', role: 'status', 'aria-live': 'polite' });
  const reconnectButton = el('button', { type: 'button', hidden: true }, 'Reconnect');
  const screen = el('div', { class: 'live-screen terminal-screen', 'aria-label': `Terminal of ${id}` });
  box.replaceChildren(el('div', { class: 'live-bar' }, status, reconnectButton), screen);

  const term = new Terminal({ cursorBlink: true, scrollback: 5000, fontSize: 14 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();
  const encoder = new TextEncoder();
  let ws = null;

  const say = (text, kind = '') => {
    status.textContent = text;
    status.className = `live-status ${kind}`;
  };
  const send = (data) => {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(data);
  };

  function connect() {
    reconnectButton.hidden = true;
    say('Connecting…');
    term.reset();
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const socket = new WebSocket(`${scheme}://${location.host}/terminal/${encodeURIComponent(id)}?rows=${term.rows}&cols=${term.cols}`);
    socket.binaryType = 'arraybuffer';
    ws = socket;
    let exit = null;
    socket.addEventListener('open', () => {
      say(`Live: a shell in ${id}`, 'ok');
      term.focus();
    });
    socket.addEventListener('message', (e) => {
      if (typeof e.data !== 'string') {
        term.write(new Uint8Array(e.data));
        return;
      }
      try {
        const message = JSON.parse(e.data);
        if (message.exit !== undefined) exit = message.exit;
      } catch {
        // not ours: ignored
      }
    });
    socket.addEventListener('close', (e) => {
      if (socket !== ws) return;
      reconnectButton.hidden = false;
      if (exit !== null) say(`The shell ended with exit code ${exit}`, 'closed');
      else say(`Closed: ${e.reason || (e.code === 1006 ? 'the connection was refused or lost' : `code ${e.code}`)}`, 'closed');
    });
  }

  const dataOff = term.onData((data) => send(encoder.encode(data)));
  const binaryOff = term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
  const resizeOff = term.onResize(({ rows, cols }) => send(JSON.stringify({ resize: [rows, cols] })));
  const refit = debounce(() => fit.fit(), 100);
  const observer = new ResizeObserver(() => refit());
  observer.observe(screen);
  reconnectButton.addEventListener('click', () => {
    const old = ws;
    ws = null;
    if (old) old.close();
    connect();
  });

  connect();
  return () => {
    observer.disconnect();
    refit.cancel();
    const old = ws;
    ws = null;
    if (old) old.close();
    dataOff.dispose();
    binaryOff.dispose();
    resizeOff.dispose();
    term.dispose();
  };
}
