// The node's serial console in xterm.js, over the native console
// WebSocket (GET /v1/nodes/{name}/console). Binary messages from the
// server are console output; keystrokes are sent as binary messages.
import { Terminal } from './vendor/xterm/xterm.mjs';
import { FitAddon } from './vendor/addon-fit/addon-fit.mjs';
import { protocolToken } from './client.js';

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

  const q = new URLSearchParams();
  if (replay) q.set('replay', '1');
  if (readOnly) q.set('ro', '1');
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const url = `${scheme}://${location.host}/v1/nodes/${encodeURIComponent(node)}/console${q.size ? '?' + q : ''}`;
  status(`connecting to ${node}…`);
  const ws = new WebSocket(url, ['obmesh.console.v1', protocolToken(token)]);
  ws.binaryType = 'arraybuffer';
  let closedByUs = false;
  const enc = new TextEncoder();

  ws.addEventListener('open', () => {
    status(`connected to ${node}${readOnly ? ' (read-only)' : ''}`);
    container.dataset.state = 'open';
    term.focus();
  });
  ws.addEventListener('message', (ev) => {
    term.write(typeof ev.data === 'string' ? ev.data : new Uint8Array(ev.data));
  });
  ws.addEventListener('close', (ev) => {
    container.dataset.state = 'closed';
    if (closedByUs) return;
    const why = ev.reason || (ev.code === 1006 ? 'the connection failed or was refused (wrong token, unknown node, no agent?)' : `code ${ev.code}`);
    status(`console ended: ${why}`);
    term.write(`\r\n\x1b[33m[console ended: ${why}]\x1b[0m\r\n`);
  });
  const input = term.onData((d) => {
    if (!readOnly && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
  });

  return () => {
    closedByUs = true;
    input.dispose();
    window.removeEventListener('resize', onResize);
    if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) ws.close(1000, 'viewer closed');
    term.dispose();
    container.replaceChildren();
    delete container.dataset.state;
  };
}
