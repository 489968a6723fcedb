// The JSON API client of the web UI. The admin token lives in this tab's
// sessionStorage only (never in a URL, a cookie or lasting storage) and goes
// out as "Authorization: Bearer" on same-origin requests.
const key = 'obmesh.token';

export function token() {
  return sessionStorage.getItem(key) || '';
}

export function setToken(t) {
  if (t) sessionStorage.setItem(key, t);
  else sessionStorage.removeItem(key);
}

export class UnauthorizedError extends Error {}

// APIError is an error answer: its stable code, message and, for a failed
// operation, its receipt.
export class APIError extends Error {
  constructor(status, code, message, receipt) {
    super(message);
    this.status = status;
    this.code = code;
    this.receipt = receipt;
  }
}

// api calls the native API on this origin and returns the decoded JSON
// (null for 204). Errors throw UnauthorizedError (401) or APIError (status
// 0, code 'network' when no answer came). timeout (ms), when given, bounds
// the request.
export async function api(method, path, body, headers = {}, tok = token(), { timeout } = {}) {
  const h = { Accept: 'application/json', Authorization: `Bearer ${tok}`, ...headers };
  const init = { method, headers: h, credentials: 'omit', cache: 'no-store', redirect: 'error' };
  if (timeout) init.signal = AbortSignal.timeout(timeout);
  if (body !== undefined) {
    h['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (e) {
    throw new APIError(0, 'network', `cannot reach the coordinator: ${e.message}`);
  }
  if (resp.status === 401) throw new UnauthorizedError('unauthorized');
  if (resp.status === 204) return null;
  let data = null;
  try {
    data = await resp.json();
  } catch {
    throw new APIError(resp.status, 'bad_answer', `HTTP ${resp.status} without a JSON body`);
  }
  if (!resp.ok) {
    const e = data && data.error ? data.error : {};
    throw new APIError(resp.status, e.code || 'error', e.message || `HTTP ${resp.status}`, data ? data.receipt : undefined);
  }
  return data;
}

// protocolToken is the token as the console WebSocket's subprotocol
// (coordinator/api/wsauth.go): a browser cannot set headers on a
// WebSocket.
export function protocolToken(tok) {
  const bytes = new TextEncoder().encode(tok);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return 'obmesh.bearer.' + btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}
