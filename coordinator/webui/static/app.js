// obmesh web UI: a page over the native JSON API (/v1). It keeps the admin
// token in this tab's sessionStorage and sends it as a bearer token; all
// data is rendered with textContent (never as HTML).
import { api, setToken, token, UnauthorizedError } from './client.js';
import { openConsole } from './console.js';

const $ = (id) => document.getElementById(id);

// el builds an element: el('td', {class: 'x'}, 'text', child, ...).
function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

const dash = '—';

function ago(t) {
  if (!t) return dash;
  const d = new Date(t);
  if (Number.isNaN(d.getTime()) || d.getFullYear() < 2000) return dash;
  const s = Math.round((Date.now() - d.getTime()) / 1000);
  if (s < 2) return 'now';
  if (s < 120) return `${s}s ago`;
  if (s < 7200) return `${Math.round(s / 60)}m ago`;
  if (s < 172800) return `${Math.round(s / 3600)}h ago`;
  return d.toISOString().replace('T', ' ').slice(0, 19);
}

function clock(t) {
  const d = new Date(t);
  return Number.isNaN(d.getTime()) ? dash : d.toLocaleString();
}

function showError(msg) {
  const e = $('error');
  e.textContent = msg || '';
  e.hidden = !msg;
}

// ---- fields other releases may or may not have ----------------------------

// powerOf reads a node's power state: the power sync's observation
// (observed.power) or the leader's last operation reading (power.state),
// whichever is newer.
export function powerOf(n) {
  const o = n.observed && n.observed.power ? {
    state: n.observed.power,
    at: n.observed.last_read || n.observed.power_since,
    external: n.observed.power_cause === 'external',
    since: n.observed.power_since,
  } : null;
  const p = n.power && n.power.state ? { state: n.power.state, at: n.power.at } : null;
  if (o && p) return Date.parse(p.at) > Date.parse(o.at) ? p : o;
  return o || p;
}

// healthOf reads a node's BMC health from the power sync (observed.health:
// ok, degraded, unreachable) with the last failure.
export function healthOf(n) {
  const o = n.observed;
  if (!o || !o.health) return null;
  let detail = [o.error_class, o.error].filter(Boolean).join(': ');
  if (o.failures) detail += `${detail ? ' ' : ''}(${o.failures} failed contacts)`;
  return { status: o.health, detail, at: o.last_contact };
}

export function labelsOf(n) {
  const l = n.labels;
  if (!l || typeof l !== 'object') return [];
  return Object.keys(l).sort().map((k) => `${k}=${l[k]}`);
}

// matches: every whitespace-separated term of the filter is in the row.
export function matches(n, filter) {
  const terms = filter.toLowerCase().split(/\s+/).filter(Boolean);
  if (terms.length === 0) return true;
  const hay = [n.name, n.driver, n.site, n.address, powerOf(n)?.state, healthOf(n)?.status, ...labelsOf(n)]
    .filter(Boolean).join(' ').toLowerCase();
  return terms.every((t) => hay.includes(t));
}

// ---- views ----------------------------------------------------------------

const views = ['login', 'nodes', 'operations', 'agents', 'cluster', 'console'];
let nodes = [];
let current = '';
let refreshTimer = 0;
let closeConsole = null;

function show(view) {
  for (const v of views) $(v).hidden = v !== view;
  for (const a of document.querySelectorAll('#nav a')) {
    a.classList.toggle('active', a.dataset.view === view || (view === 'console' && a.dataset.view === 'nodes'));
  }
  $('nav').hidden = $('logout').hidden = view === 'login';
}

let routeGen = 0; // the latest route() call: an older one that was waiting stops

function decode(s) {
  try {
    return decodeURIComponent(s || '');
  } catch {
    return '';
  }
}

async function route() {
  const gen = ++routeGen;
  showError('');
  const [view, arg] = location.hash.slice(1).split('/', 2).map(decode);
  if (view !== 'console' && closeConsole) {
    closeConsole();
    closeConsole = null;
  }
  if (!token()) {
    current = 'login';
    show('login');
    $('token').focus();
    return;
  }
  current = views.includes(view) && view !== 'login' ? view : 'nodes';
  show(current);
  clearInterval(refreshTimer);
  if (current === 'console') {
    startConsole(arg);
    return;
  }
  await refresh();
  if (gen !== routeGen) return; // another view was opened meanwhile
  // The open view refreshes itself while the tab is visible.
  refreshTimer = setInterval(() => { if (!document.hidden) refresh(); }, 10000);
}

async function refresh() {
  try {
    switch (current) {
      case 'nodes': await loadNodes(); break;
      case 'operations': await loadOperations(); break;
      case 'agents': await loadAgents(); break;
      case 'cluster': await loadCluster(); break;
    }
    await loadMember();
  } catch (e) {
    failed(e);
  }
}

function failed(e) {
  if (e instanceof UnauthorizedError) {
    logout('The token was refused (401). Log in again.');
    return;
  }
  showError(e.message || String(e));
}

async function loadMember() {
  const st = await api('GET', '/v1/status');
  const role = st.is_leader ? 'leader' : `follower of ${st.leader || '(no leader)'}`;
  $('member').textContent = `${st.id} · ${role} · ${st.version || ''}`;
}

// ---- nodes ----------------------------------------------------------------

async function loadNodes() {
  nodes = await api('GET', '/v1/nodes');
  renderNodes();
}

function pill(text, kind, title) {
  return el('span', { class: `pill ${kind || ''}`, title }, text);
}

function powerCell(n) {
  const p = powerOf(n);
  if (!p) return el('td', { class: 'muted', dataset: { power: '' } }, dash);
  const kind = p.state === 'on' ? 'good' : p.state === 'off' ? 'off' : 'warn';
  const title = [p.at ? `read ${ago(p.at)}` : '', p.since ? `${p.state} since ${clock(p.since)}` : ''].filter(Boolean).join('; ');
  return el('td', { dataset: { power: p.state } }, pill(p.state, kind, title || undefined),
    p.external ? el('div', { class: 'detail' }, 'changed outside obmesh') : null);
}

function healthCell(n) {
  const h = healthOf(n);
  if (!h) return el('td', { class: 'muted' }, dash);
  const kind = h.status === 'ok' ? 'good' : h.status === 'degraded' ? 'warn' : 'bad';
  return el('td', { dataset: { health: h.status } }, pill(h.status, kind, h.at ? `last contact ${ago(h.at)}` : undefined),
    h.detail ? el('div', { class: 'detail' }, h.detail) : null);
}

function renderNodes() {
  const filter = $('filter').value;
  const body = $('nodes-body');
  const shown = nodes.filter((n) => matches(n, filter));
  body.replaceChildren(...shown.map((n) => el('tr', { dataset: { node: n.name } },
    el('td', { class: 'name' }, n.name),
    el('td', {}, n.driver),
    el('td', {}, n.site || dash),
    powerCell(n),
    healthCell(n),
    el('td', {}, labelsOf(n).map((l) => pill(l, 'label'))),
    el('td', { class: 'actions' },
      el('button', { type: 'button', dataset: { action: 'on' }, onclick: () => powerAction(n.name, 'on') }, 'On'),
      el('button', { type: 'button', dataset: { action: 'off' }, onclick: () => powerAction(n.name, 'off') }, 'Off'),
      el('button', { type: 'button', dataset: { action: 'cycle' }, onclick: () => powerAction(n.name, 'cycle') }, 'Cycle'),
      el('button', { type: 'button', dataset: { action: 'boot' }, onclick: () => bootAction(n.name) }, 'Boot…'),
      el('a', { class: 'button', href: `#console/${encodeURIComponent(n.name)}`, dataset: { action: 'console' } }, 'Console')))));
  if (shown.length === 0) {
    body.append(el('tr', {}, el('td', { colspan: 7, class: 'muted' }, nodes.length ? 'No node matches the filter.' : 'No nodes registered.')));
  }
  $('nodes-count').textContent = `${shown.length} of ${nodes.length}`;
}

// The open confirmation's answer: resolved by the button that submits the
// dialog's form (synchronously, so a quick second dialog cannot take the
// first one's answer) or false when it is dismissed (Escape).
let answer = null;

function answerDialog(ok) {
  if (answer) {
    const resolve = answer;
    answer = null;
    resolve(ok);
  }
}

// confirmDialog asks in a modal dialog; it resolves true on Confirm.
function confirmDialog(title, text, { boot = false, danger = true } = {}) {
  const d = $('confirm');
  answerDialog(false);
  $('confirm-title').textContent = title;
  $('confirm-text').textContent = text;
  $('boot-fields').hidden = !boot;
  $('confirm-ok').classList.toggle('danger', danger);
  const p = new Promise((resolve) => { answer = resolve; });
  d.showModal();
  $('confirm-ok').focus();
  return p;
}

const actionWords = { on: 'Power on', off: 'Power off (hard)', cycle: 'Power cycle (hard off, then on)' };

async function powerAction(node, action) {
  const ok = await confirmDialog(`${actionWords[action]} ${node}?`,
    action === 'on' ? `The BMC of ${node} will be told to power the machine on.`
      : `The machine ${node} loses power at once, without a clean shutdown.`, { danger: action !== 'on' });
  if (!ok) return;
  await runOperation(node, `power ${action}`, 'POST', `/v1/nodes/${encodeURIComponent(node)}/power`, { action });
}

async function bootAction(node) {
  const ok = await confirmDialog(`Set the boot device of ${node}?`, 'Takes effect at the next boot.', { boot: true, danger: false });
  if (!ok) return;
  const body = { device: $('boot-device').value, persistent: $('boot-persistent').checked, efi: $('boot-efi').checked };
  await runOperation(node, `boot ${body.device}`, 'PUT', `/v1/nodes/${encodeURIComponent(node)}/boot`, body);
}

async function runOperation(node, what, method, path, body) {
  const box = $('last-receipt');
  box.hidden = false;
  $('last-receipt-body').replaceChildren(el('p', { class: 'muted' }, `${what} on ${node}: running…`));
  let receipt = null;
  let error = null;
  try {
    // An idempotency key makes a retry of this request (a reload, a
    // failover) answer with the first attempt's receipt.
    receipt = await api(method, path, body, { 'Idempotency-Key': `webui-${crypto.randomUUID()}` });
  } catch (e) {
    if (e instanceof UnauthorizedError) return failed(e);
    error = e;
    receipt = e.receipt || null;
  }
  $('last-receipt-body').replaceChildren(receiptView(what, node, receipt, error));
  loadNodes().catch(failed);
}

function receiptView(what, node, r, err) {
  const rows = [];
  const add = (k, v) => { if (v !== undefined && v !== null && v !== '') rows.push(el('dt', {}, k), el('dd', {}, v)); };
  const outcome = r?.outcome || (err ? 'failed' : '');
  add('Operation', `${what} on ${node}`);
  add('Outcome', pill(outcome, outcome === 'ok' ? 'good' : outcome === 'unknown' ? 'warn' : 'bad'));
  if (r) {
    add('Receipt', el('code', {}, r.id));
    add('Power state', r.state);
    add('Boot', r.boot ? `${r.boot.device}${r.boot.persistent ? ', persistent' : ''}${r.boot.efi ? ', EFI' : ''}` : undefined);
    add('Detail', r.detail);
    add('Agent', r.agent && `${r.agent} (site ${r.site || dash})`);
    add('Timings', (r.timings || []).map((t) => `${t.hop} ${t.duration_ms.toFixed(1)} ms`).join(' · '));
    add('Observed', (r.observed || []).map((o) => `${o.state} at ${clock(o.at)}`).join(' → '));
    add('Error', r.error && `${r.error_class}: ${r.error}`);
    add('Started', r.started_at && clock(r.started_at));
  }
  if (err && !(r && r.error)) add('Error', `${err.code || ''} ${err.message}`.trim());
  return el('dl', { class: 'receipt', dataset: { outcome } }, rows);
}

// ---- operations, agents, group --------------------------------------------

async function loadOperations() {
  const ops = await api('GET', '/v1/operations?limit=100');
  ops.reverse(); // newest first
  const took = (r) => {
    const a = new Date(r.started_at), b = new Date(r.finished_at);
    return b > a ? `${((b - a) / 1000).toFixed(2)} s` : dash;
  };
  const body = $('ops-body');
  const show = (r) => {
    $('op-detail').hidden = false;
    $('op-detail-body').replaceChildren(receiptView(r.action, r.node, r, null));
  };
  body.replaceChildren(...ops.map((r) => el('tr', { class: 'clickable', title: 'Show the whole receipt', dataset: { receipt: r.id }, onclick: () => show(r) },
    el('td', {}, clock(r.started_at)),
    el('td', {}, el('code', {}, r.id)),
    el('td', {}, r.node),
    el('td', {}, r.action),
    el('td', {}, pill(r.outcome + (r.phase ? ` (${r.phase})` : ''), r.outcome === 'ok' ? 'good' : r.outcome === 'failed' ? 'bad' : 'warn')),
    el('td', {}, r.state || dash),
    el('td', {}, r.agent || dash),
    el('td', {}, took(r)),
    el('td', { class: 'detail' }, r.error ? `${r.error_class}: ${r.error}` : ''))));
  if (ops.length === 0) body.append(el('tr', {}, el('td', { colspan: 9, class: 'muted' }, 'No operations recorded yet.')));
}

async function loadAgents() {
  const agents = await api('GET', '/v1/agents');
  const body = $('agents-body');
  body.replaceChildren(...agents.map((a) => el('tr', { dataset: { agent: a.id } },
    el('td', { class: 'name' }, a.id),
    el('td', {}, pill(a.health, a.health === 'healthy' ? 'good' : a.health === 'lost' ? 'warn' : 'bad'),
      (a.plugin_warnings || []).map((w) => el('div', { class: 'detail' }, w))),
    el('td', {}, (a.sites || []).join(', ')),
    el('td', {}, (a.driver_health && a.driver_health.length
      ? a.driver_health.map((d) => pill(`${d.name} ${d.health}`, d.health === 'ok' ? 'good' : 'warn', d.detail || undefined))
      : (a.drivers || []).join(', '))),
    el('td', {}, a.version || dash),
    el('td', {}, ago(a.last_contact)),
    el('td', {}, a.coordinator || dash))));
  if (agents.length === 0) body.append(el('tr', {}, el('td', { colspan: 7, class: 'muted' }, 'No agent has connected yet.')));
}

async function loadCluster() {
  const [st, peers] = await Promise.all([api('GET', '/v1/status'), api('GET', '/v1/operator/raft/peers')]);
  const healthy = peers.filter((p) => p.healthy).length;
  const voters = peers.filter((p) => p.voter).length;
  $('status-card').replaceChildren(el('dl', { class: 'receipt' },
    el('dt', {}, 'Leader'), el('dd', {}, st.leader || 'none'),
    el('dt', {}, 'Answered by'), el('dd', {}, `${st.id}${st.is_leader ? ' (leader)' : ''}`),
    el('dt', {}, 'Health'), el('dd', {}, pill(`${healthy} of ${peers.length} healthy`, healthy === peers.length ? 'good' : healthy > voters / 2 ? 'warn' : 'bad'),
      ` · quorum needs ${Math.floor(voters / 2) + 1} of ${voters} voters`),
    el('dt', {}, 'Epoch'), el('dd', {}, String(st.epoch)),
    el('dt', {}, 'Version'), el('dd', {}, st.version || dash)));
  $('peers-body').replaceChildren(...peers.map((p) => el('tr', { dataset: { peer: p.id } },
    el('td', { class: 'name' }, p.id),
    el('td', {}, p.leader ? 'leader' : (p.state || 'follower').toLowerCase()),
    el('td', {}, pill(p.healthy ? 'healthy' : 'unhealthy', p.healthy ? 'good' : 'bad')),
    el('td', {}, p.voter ? 'yes' : 'no'),
    el('td', {}, p.address),
    el('td', {}, p.api_addr || dash),
    el('td', {}, p.term ? String(p.term) : dash),
    el('td', {}, p.applied_index ? String(p.applied_index) : dash),
    el('td', {}, p.leader ? dash : `${p.last_contact_ms} ms`),
    el('td', { class: 'detail' }, p.error || ''))));
}

// ---- console --------------------------------------------------------------

function startConsole(node) {
  if (closeConsole) closeConsole();
  if (!node) { location.hash = '#nodes'; return; }
  $('console-node').textContent = node;
  closeConsole = openConsole({
    node,
    token: token(),
    container: $('terminal'),
    status: (s) => { $('console-status').textContent = s; },
    replay: $('console-replay').checked,
    readOnly: $('console-ro').checked,
    unauthorized: () => failed(new UnauthorizedError('unauthorized')),
  });
}

// ---- login ----------------------------------------------------------------

function logout(msg) {
  setToken('');
  clearInterval(refreshTimer);
  if (closeConsole) { closeConsole(); closeConsole = null; }
  $('member').textContent = '';
  $('login-error').textContent = msg || '';
  location.hash = '';
  route();
}

async function login(ev) {
  ev.preventDefault();
  const t = $('token').value.trim();
  $('login-error').textContent = '';
  try {
    await api('GET', '/v1/status', undefined, {}, t);
  } catch (e) {
    $('login-error').textContent = e instanceof UnauthorizedError ? 'The coordinator refused this token.' : (e.message || String(e));
    return;
  }
  setToken(t);
  $('token').value = '';
  if (!location.hash || location.hash === '#login') location.hash = '#nodes';
  else route();
}

function init() {
  for (const d of ['pxe', 'disk', 'cdrom', 'bios', 'none']) $('boot-device').append(el('option', { value: d }, d));
  $('login-form').addEventListener('submit', login);
  $('confirm').querySelector('form').addEventListener('submit', (ev) => answerDialog(ev.submitter?.value === 'ok'));
  $('confirm').addEventListener('cancel', () => answerDialog(false));
  $('logout').addEventListener('click', () => logout(''));
  $('filter').addEventListener('input', renderNodes);
  $('nodes-refresh').addEventListener('click', () => refresh());
  $('ops-refresh').addEventListener('click', () => refresh());
  $('agents-refresh').addEventListener('click', () => refresh());
  $('cluster-refresh').addEventListener('click', () => refresh());
  $('console-close').addEventListener('click', () => { location.hash = '#nodes'; });
  $('console-reconnect').addEventListener('click', () => startConsole($('console-node').textContent));
  window.addEventListener('hashchange', route);
  route();
}

init();
