// The page's one live connection: an EventSource on /api/events (server-sent events: instances,
// activity, jobs). Views subscribe with on(); nothing in the page polls. The browser reconnects a
// dropped stream by itself; when it gives up (the stream was refused or the server went away) we
// open a new one after a growing pause, and tell subscribers to reload what they show, since
// events may have been missed meanwhile.

const handlers = new Map(); // event type → Set of functions
let source = null;
let retryMs = 1000;
let retryTimer = null;

export function on(type, fn) {
  if (!handlers.has(type)) handlers.set(type, new Set());
  handlers.get(type).add(fn);
  return () => handlers.get(type).delete(fn);
}

function emit(type, data) {
  for (const fn of handlers.get(type) ?? []) {
    try {
      fn(data);
    } catch (err) {
      console.warn(`dashboard: a ${type} handler failed`, err);
    }
  }
}

function setStatus(state) {
  const live = document.getElementById('live');
  if (!live) return;
  live.dataset.state = state;
  live.textContent = state === 'open' ? 'live' : state === 'connecting' ? 'connecting…' : 'reconnecting…';
}

export function connect() {
  clearTimeout(retryTimer);
  if (source) source.close();
  setStatus('connecting');
  let everOpened = false;
  source = new EventSource('/api/events');
  source.addEventListener('open', () => {
    if (everOpened || retryMs > 1000) emit('reconnected', {});
    everOpened = true;
    retryMs = 1000;
    setStatus('open');
  });
  for (const type of ['instances', 'activity', 'jobs']) {
    source.addEventListener(type, (event) => {
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        return; // not ours to show
      }
      emit(type, data);
    });
  }
  source.addEventListener('error', () => {
    if (source.readyState === EventSource.CLOSED) {
      setStatus('closed');
      retryTimer = setTimeout(connect, retryMs);
      retryMs = Math.min(retryMs * 2, 30000);
    } else {
      setStatus('connecting');
    }
  });
}

export function disconnect() {
  clearTimeout(retryTimer);
  if (source) source.close();
  source = null;
}
