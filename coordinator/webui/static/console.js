// The node's serial console in xterm.js, over the native console
// WebSocket (GET /v1/nodes/{name}/console?meta=1, docs/api.md "Consoles"):
// binary messages from the server are console output, text messages are
// events (attach, gap, role, notice); keystrokes go out as binary
// messages. The console is shared with every other viewer of the node
// (the CLI's too); one viewer at a time has the keyboard.
//
// When the connection is lost without the console ending (1013: the
// coordinator carrying it lost its leader; 1006: the connection broke
// after it was open), the viewer reconnects to this origin with
// from=<offset after the last byte shown>&session=<id>, so it continues
// without repeating or losing output the history still holds; what it
// missed is reported.
import { Terminal } from './vendor/xterm/xterm.mjs';
import { FitAddon } from './vendor/addon-fit/addon-fit.mjs';
import { protocolToken } from './client.js';

const retryLimit = 10; // reconnections in a row before giving up
const enc = new TextEncoder();

// openConsole connects and returns a function that closes the console.
export function openConsole({ node, token, container, status, replay, readOnly }) {
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
  let retries = 0;
  let retryTimer = 0;
  const note = (text) => term.write(`\r\n\x1b[33m[${text}]\x1b[0m\r\n`);
  const role = () => (readOnly ? 'read-only' : writer ? 'you have the keyboard' : 'read-only until the viewer typing leaves');

  function connect() {
    const q = new URLSearchParams({ meta: '1' });
    if (readOnly) q.set('ro', '1');
    if (offset >= 0) {
      q.set('from', String(offset));
      if (session) q.set('session', session);
    } else if (replay) {
      q.set('replay', '1');
    }
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const url = `${scheme}://${location.host}/v1/nodes/${encodeURIComponent(node)}/console?${q}`;
    status(offset >= 0 ? `reconnecting to ${node}…` : `connecting to ${node}…`);
    const sock = new WebSocket(url, ['obmesh.console.v1', protocolToken(token)]);
    sock.binaryType = 'arraybuffer';
    ws = sock;
    let opened = false;

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
    sock.addEventListener('close', (ev) => {
      if (sock !== ws || closed) return;
      container.dataset.state = 'closed';
      const lost = ev.code === 1013 || (ev.code === 1006 && opened);
      if (lost && offset >= 0 && retries < retryLimit) {
        retries++;
        status(`connection lost (${ev.reason || ev.code}); reconnecting…`);
        retryTimer = setTimeout(connect, Math.min(250 * 2 ** retries, 4000));
        return;
      }
      const why = ev.code === 1000 ? (ev.reason || 'the console ended')
        : ev.reason || (opened ? `connection lost (code ${ev.code})` : 'the console could not be opened (wrong token, unknown node, no agent?)');
      status(`console ended: ${why}`);
      note(`console ended: ${why}`);
    });
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
        retries = 0;
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
    input.dispose();
    window.removeEventListener('resize', onResize);
    if (ws && (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING)) ws.close(1000, 'viewer closed');
    term.dispose();
    container.replaceChildren();
    delete container.dataset.state;
    delete container.dataset.session;
  };
}
