// The console's reconnection policy (used by console.js, kept apart so
// that it can be tested on its own): which closes of the console
// WebSocket are worth another attempt, how long to wait before each, and
// for how long to keep trying.
//
// A browser does not say why a WebSocket handshake failed: a wrong token
// (401), an unknown node (404), a group electing a leader (503
// no_leader), an agent not yet linked to the new leader (503 no_agent)
// and a member that cannot be reached all look alike (close code 1006
// before the open). So after a failed handshake the page asks an
// authenticated JSON endpoint (GET /v1/nodes/{name}) and gives up only
// when its answer is definite (probeVerdict).

export const firstDelay = 250; // ms before the first retry
export const maxDelay = 5000; // the longest wait between two attempts
export const reconnectFor = 120000; // ms: retrying a console that was attached
export const openFor = 30000; // ms: retrying a console never attached yet
export const attachWithin = 30000; // ms: an attempt not attached by then is abandoned

// delay is the wait before retry n (1, 2, …): 250 ms doubling up to 5 s,
// less up to 20% at random, so that the pages open on one console do not
// all reconnect in step after a leader's death.
export function delay(n, rand = Math.random) {
  const base = Math.min(firstDelay * 2 ** Math.max(0, n - 1), maxDelay);
  return Math.round(base * (1 - 0.2 * rand()));
}

// closeKind classifies a close of the console WebSocket:
//   'lost'    the connection was lost, not the console: 1013 (try again
//             later: the coordinator carrying it lost its leader, or the
//             stream from the agent was lost), 1001 (a member going
//             away), 1012 (a restart), or 1005/1006 after the open (the
//             connection broke): reconnect;
//   'refused' 1005/1006 before the open: the handshake failed, for a
//             reason the browser hides: ask the API (probeVerdict);
//   'ended'   anything else: 1000 (the console ended), 1011 (it failed,
//             e.g. its driver plugin died) and any other code the
//             server chose: final.
export function closeKind(code, opened) {
  if (code === 1013 || code === 1001 || code === 1012) return 'lost';
  if (code === 1006 || code === 1005) return opened ? 'lost' : 'refused';
  return 'ended';
}

// probeVerdict reads the HTTP status of GET /v1/nodes/{name} asked after
// a failed handshake (0: no answer): 401 (the token) and 404 (no such
// node) are definite refusals; anything else is transient (no answer, a
// 502/503 while the group elects a leader, even a 200: the node exists,
// and its agent may not have linked to the new leader yet).
export function probeVerdict(status) {
  if (status === 401) return { final: true, why: 'the token was refused (401)' };
  if (status === 404) return { final: true, why: 'no such node (404)' };
  return { final: false, why: status ? `HTTP ${status}` : 'no answer' };
}

// giveUp reports whether trying has lasted long enough: elapsed ms since
// the console was lost (or since its first attempt, when it was never
// attached).
export function giveUp(elapsed, attachedBefore) {
  return elapsed >= (attachedBefore ? reconnectFor : openFor);
}
