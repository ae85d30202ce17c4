// The dashboard's one way to call the JSON API (docs/api.md). Every call is same-origin (the
// browser sends our Origin, which the server checks on anything that changes something) and
// authenticated by the session cookie. A failure throws an ApiError whose message is the
// server's own "what was wrong; what to do" text, which showError puts in front of the person.

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// api('GET', '/api/instances', {query: {offset: 0}}); api('POST', '/api/instances', {body: {...}})
// A `body` that is a Blob/File is sent as it is (uploads); anything else as JSON.
export async function api(method, path, { query, body, signal } = {}) {
  let url = path;
  if (query) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== undefined && v !== null && v !== '') params.set(k, String(v));
    const q = params.toString();
    if (q) url += `?${q}`;
  }
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' }, signal };
  if (body instanceof Blob) {
    init.body = body;
    init.headers['Content-Type'] = 'application/octet-stream';
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, `The server did not answer (${err.message}); is ns-hpc still running?`);
  }
  if (response.status === 401) {
    // The session ended (a restart of the server logs browsers out): back to the login form.
    location.assign('/login');
    throw new ApiError(401, 'Your session ended; log in again.');
  }
  const type = response.headers.get('Content-Type') || '';
  const data = type.includes('application/json') ? await response.json().catch(() => null) : null;
  if (!response.ok) {
    const message = data && typeof data.error === 'string' ? data.error : `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message);
  }
  return data;
}

// Paths of the API with an instance id or a name in them, encoded.
export function instancePath(id, ...rest) {
  return ['/api/instances', encodeURIComponent(id), ...rest.map((r) => encodeURIComponent(r))].join('/');
}

let noticeTimer = null;

// Shows `err` (an ApiError, an Error or a string) in the notice bar at the top.
export function showError(err) {
  if (err && err.name === 'AbortError') return;
  const text = err instanceof Error ? err.message : String(err);
  showNotice(text, 'error');
}

export function showNotice(text, kind = 'info') {
  const bar = document.getElementById('notice');
  document.getElementById('notice-text').textContent = text;
  bar.className = `notice notice-${kind}`;
  bar.hidden = false;
  clearTimeout(noticeTimer);
  if (kind !== 'error') noticeTimer = setTimeout(() => { bar.hidden = true; }, 4000);
}

export function hideNotice() {
  document.getElementById('notice').hidden = true;
}
