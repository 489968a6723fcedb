// The node's serial console in xterm.js, over the native console
// WebSocket (GET /v1/nodes/{name}/console?meta=1, docs/api.md "Consoles"):
// binary messages from the server are console output, text messages are
// events (attach, gap, role, notice); keystrokes go out as binary
// messages. The console is shared with every other viewer of the node
// (the CLI's too); one viewer at a time has the keyboard.
//
// When the connection is lost without the console ending (1013: the
// coordinator carrying it lost its leader or the agent's stream; 1001: a
// member going away; 1006: the connection broke after it was open), the
// viewer reconnects to this origin (the page's CSP allows no other) with
// from=<offset after the last byte shown>&session=<id>, so it continues
// without repeating or losing output the history still holds; what it
// missed is reported. It retries with a growing delay (reconnect.js:
// 250 ms doubling to 5 s) for up to 2 minutes, also through failed
// handshakes (the group electing a leader answers 503, an agent not yet
// linked to the new leader 503 no_agent): after each, it asks
// GET /v1/nodes/{name} and gives up at once only on a definite refusal
// (401: the token, which logs the page out; 404: no such node). A
// console that was never attached retries for 30 s.
import { Terminal } from './vendor/xterm/xterm.mjs';
import { FitAddon } from './vendor/addon-fit/addon-fit.mjs';
import { api, protocolToken, UnauthorizedError } from './client.js';
import { attachWithin, closeKind, delay, giveUp, probeVerdict } from './reconnect.js';

const enc = new TextEncoder();

// openConsole connects and returns a function that closes the console.
// unauthorized, when given, is called when the token was refused.
export function openConsole({ node, token, container, status, replay, readOnly, unauthorized }) {
  container.replaceChildren();
  const term = new Terminal({
    convertEol: false, cursorBlink: !readOnly, disableStdin: readOnly, scrollback: 10000,
    fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace', fontSize: 14,
    theme: { background: '#10141a', foreground: '#d8dee9' },
  });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(container);
  fit.fit();
  const onResize = () => fit.fit();
  window.addEventListener('resize', onResize);

  let ws = null;
  let closed = false; // by the user
  let session = '';
  let offset = -1; // after the last byte shown; -1 before the first attach
  let writer = false;
  let attempt = 0; // retries since the last attach (or the first open)
  let since = 0; // when trying began (performance.now()); 0 while attached
  let retryTimer = 0;
  let attachTimer = 0;
  const note = (text) => term.write(`\r\n\x1b[33m[${text}]\x1b[0m\r\n`);
  const role = () => (readOnly ? 'read-only' : writer ? 'you have the keyboard' : 'read-only until the viewer typing leaves');
  const attached = () => offset >= 0;
  const count = () => (attempt > 0 ? ` (attempt ${attempt})` : '');

  function connect() {
    const q = new URLSearchParams({ meta: '1' });
    if (readOnly) q.set('ro', '1');
    if (attached()) {
      q.set('from', String(offset));
      if (session) q.set('session', session);
    } else if (replay) {
      q.set('replay', '1');
    }
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const url = `${scheme}://${location.host}/v1/nodes/${encodeURIComponent(node)}/console?${q}`;
    status(`${attached() ? 'reconnecting' : 'connecting'} to ${node}…${count()}`);
    const sock = new WebSocket(url, ['obmesh.console.v1', protocolToken(token)]);
    sock.binaryType = 'arraybuffer';
    ws = sock;
    let opened = false;
    let timedOut = false;
    // A handshake or an attach that hangs (a member waiting for a
    // leader) is abandoned, and counts as a failed attempt.
    clearTimeout(attachTimer);
    attachTimer = setTimeout(() => {
      timedOut = true;
      sock.close();
    }, attachWithin);

    sock.addEventListener('open', () => {
      opened = true;
      container.dataset.state = 'open';
      term.focus();
    });
    sock.addEventListener('message', (ev) => {
      if (sock !== ws) return;
      if (typeof ev.data === 'string') {
        event(ev.data);
        return;
      }
      const b = new Uint8Array(ev.data);
      if (offset >= 0) offset += b.length;
      term.write(b);
    });
    sock.addEventListener('close', async (ev) => {
      if (sock !== ws || closed) return;
      clearTimeout(attachTimer);
      container.dataset.state = 'closed';
      const kind = timedOut ? (opened ? 'lost' : 'refused') : closeKind(ev.code, opened);
      if (kind === 'ended') {
        end(ev.code === 1000 ? (ev.reason || 'the console ended') : ev.reason || `closed with code ${ev.code}`);
        return;
      }
      let why = timedOut ? 'no answer in time' : kind === 'lost' ? `connection lost (${ev.reason || ev.code})` : 'could not connect';
      if (kind === 'refused') {
        status(`${why}; checking the token and the node…`);
        const v = await probe();
        if (sock !== ws || closed) return;
        if (v.final) {
          end(`the console could not be opened: ${v.why}`);
          if (v.unauthorized && unauthorized) unauthorized();
          return;
        }
        why += ` (${v.why})`;
      }
      retry(why);
    });
  }

  // probe asks the API whether a failed handshake was a definite refusal.
  async function probe() {
    try {
      await api('GET', `/v1/nodes/${encodeURIComponent(node)}`, undefined, {}, token, { timeout: 5000 });
      return { final: false, why: 'the node is known' };
    } catch (e) {
      const st = e instanceof UnauthorizedError ? 401 : (e.status || 0);
      const v = probeVerdict(st);
      return { ...v, why: v.final || !e.code ? v.why : `${v.why} ${e.code}`, unauthorized: st === 401 };
    }
  }

  // retry schedules the next attempt, or gives up when trying lasted long
  // enough.
  function retry(why) {
    const now = performance.now();
    if (!since) since = now;
    if (giveUp(now - since, attached())) {
      end(`${attached() ? 'could not reconnect' : 'could not open it'} within ${Math.round((now - since) / 1000)} s; the last attempt: ${why}`);
      return;
    }
    attempt++;
    const d = delay(attempt);
    status(`${why}; ${attached() ? 'reconnecting' : 'connecting again'} in ${(d / 1000).toFixed(1)} s…${count()}`);
    retryTimer = setTimeout(connect, d);
  }

  function end(why) {
    status(`console ended: ${why}`);
    note(`console ended: ${why}`);
  }

  function event(text) {
    let ev;
    try {
      ev = JSON.parse(text);
    } catch {
      return;
    }
    switch (ev.type) {
      case 'attach':
        if (offset >= 0 && ev.session !== session) note('a new console session began');
        session = ev.session || '';
        offset = ev.offset ?? 0;
        writer = !!ev.writer;
        attempt = 0;
        since = 0;
        clearTimeout(attachTimer);
        container.dataset.session = session;
        status(`connected to ${node}: ${role()}`);
        break;
      case 'gap':
        note(ev.unknown ? 'output was missed here' : `${ev.missed} bytes of output were missed here`);
        offset = ev.offset ?? offset;
        break;
      case 'role':
        writer = !!ev.writer;
        status(`connected to ${node}: ${role()}`);
        break;
      case 'notice':
        if (ev.message) status(`${node}: ${ev.message}`);
        break;
    }
  }

  const input = term.onData((d) => {
    if (!readOnly && ws && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
  });
  connect();

  return () => {
    closed = true;
    clearTimeout(retryTimer);
    clearTimeout(attachTimer);
    input.dispose();
    window.removeEventListener('resize', onResize);
    if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) ws.close(1000, 'viewer closed');
    term.dispose();
    container.replaceChildren();
    delete container.dataset.state;
    delete container.dataset.session;
  };
}
