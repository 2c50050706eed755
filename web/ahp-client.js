// The browser's AHP client: JSON-RPC 2.0 over one WebSocket at /ahp.
//
// It keeps a Replica per subscribed channel (confirmed state + pending
// actions, see replica.js), dispatches actions with an increasing clientSeq,
// and survives drops: while the socket is down, dispatches queue up as
// pending (the UI keeps rendering them); once a new socket is open it
// initializes with the same clientId, sends `reconnect` with one cursor per
// channel (Huddle's per-channel extension), applies each channel's replay or
// snapshot, and then sends every action still pending again, with its own
// clientSeq. No guessing which of them landed before the drop: Huddle
// applies an action with the same (clientId, clientSeq) once, and answers a
// copy with the first one's envelope (a replay has confirmed most of them
// already; after a snapshot the echo does, see replica.js).
//
// Who the server takes this client for comes back from `initialize`
// (`identity`: {name, role, token, declared?, display, shared}); a shared
// link's holder gives the name they go by (`name`, sent as the
// `huddle.identity` capability on every initialize; `rename` reconnects
// with a new one).
//
// A refusal is final: when the server refuses this page's token (HTTP 401
// or 403 before the socket opens, which a browser only sees as close code
// 1006, like a server that is down) or refuses its `initialize`, the client
// stops retrying and its status is 'refused' (`refusal` says why). To tell
// a refusal from a network loss, a socket that closed before it opened is
// followed by one HTTP request with the same cookie (`accessUrl`): 401 or
// 403 is a refusal; no answer, or any other, is retried as before.
//
// Events (an EventTarget): `status` {status, attempt} (status: 'connecting',
// 'open', 'reconnecting', 'renaming' or 'refused'), `change` {uri},
// `rejected` {uri, action, reason}, `notice` {method, params} for root
// notifications, `missing` {uri}, `identity` {identity} after every
// initialize, `resumed` {renaming} after every reconnect (renaming: one
// `rename` asked for, not a drop), `overtaken` {uri, actions} for the
// pending actions of a channel dropped instead of sent again (overtaken.js).

import { reduce } from './reducers.js';
import { restsOn } from './overtaken.js';
import { Replica } from './replica.js';

const PROTOCOL_VERSION = '0.7.0';
/** The Huddle extensions this client asks for: per-channel seqs and cursors,
 * tail windows, titles, identity, and re-sending what a drop left pending
 * under its first clientSeq (the server announces what it serves). */
const EXTENSIONS = [
  'huddle.channelSeqs',
  'huddle.turnWindows',
  'huddle.titles',
  'huddle.identity',
  'huddle.resend',
];
const IDENTITY = 'huddle.identity';
const ROOT = 'ahp-root://';
const PING_EVERY_MS = 20000;
const PING_TIMEOUT_MS = 10000;
const BACKOFF_MS = [250, 500, 1000, 2000, 3000, 5000];
const ACCESS_CHECK_TIMEOUT_MS = 10000;
/** The statuses by which the server refuses a request's credentials: 401
 * for a missing, forged or expired token, 403 for a foreign origin
 * (server/app.py `authenticate`, asked before a socket opens too). */
const REFUSED_STATUSES = new Set([401, 403]);
/** The JSON-RPC codes of an `initialize` the server could not answer now: its
 * store unreachable or a bug of its own (-32603), or the token over a budget
 * for now (-32011: it started too many client ids lately): tried again. Any
 * other error is the server's refusal of this client, and trying again
 * changes nothing. */
const TRY_AGAIN = new Set([-32603, -32011]);

/** The channel kind of a URI: 'root', 'session' or 'chat'. */
export function channelKind(uri) {
  if (uri === ROOT) return 'root';
  if (uri.startsWith('ahp-session:/')) return 'session';
  if (uri.startsWith('ahp-chat:/')) return 'chat';
  throw new Error(`not a channel URI: ${uri}`);
}

/** A random hex id (`bytes` bytes). */
export function randomId(bytes = 8) {
  const data = crypto.getRandomValues(new Uint8Array(bytes));
  return Array.from(data, (b) => b.toString(16).padStart(2, '0')).join('');
}

export class RpcError extends Error {
  constructor(error) {
    super(error.message);
    this.code = error.code;
    this.data = error.data;
  }
}

/**
 * Where to ask whether the server accepts this page's credentials: a cheap
 * request every token may make (the root channel's snapshot), beside the
 * socket's URL (`ws://host/ahp` -> `http://host/api/snapshot?...`).
 */
export function accessUrlOf(socketUrl) {
  const url = new URL(`api/snapshot?channel=${encodeURIComponent(ROOT)}`, socketUrl);
  url.protocol = url.protocol === 'wss:' ? 'https:' : 'http:';
  return url.href;
}

/**
 * The refusal an HTTP answer (its status and JSON body) says, or null when
 * it is not one: `{kind: 'access', status, reason}`, the reason the
 * server's (`{"error": ...}`).
 */
export function accessRefusal(status, body) {
  if (!REFUSED_STATUSES.has(status)) return null;
  const said = typeof body?.error === 'string' ? body.error.trim() : '';
  return { kind: 'access', status, reason: said || `the server answered ${status}` };
}

/**
 * The refusal an error of `initialize` is, or null when it is worth trying
 * again (the socket dropped, the server could not answer now):
 * `{kind: 'initialize', code, reason}`.
 */
export function initializeRefusal(error) {
  if (!(error instanceof RpcError) || TRY_AGAIN.has(error.code)) return null;
  return { kind: 'initialize', code: error.code, reason: error.message };
}

export class AhpClient extends EventTarget {
  /**
   * @param {{url: string, accessUrl?: string, clientId?: string, name?: string, now?: () => number}} options
   *   `name`: the name to go by where the token is a shared link's;
   *   `accessUrl`: where to ask whether the credentials are refused
   */
  constructor({ url, accessUrl = accessUrlOf(url), clientId = `web-${randomId()}`, name = '', now = Date.now }) {
    super();
    this.url = url;
    this.accessUrl = accessUrl;
    this.clientId = clientId;
    this.name = name;
    /** Who the server takes this client for (initialize's `_meta.huddle.identity`), once known. */
    this.identity = null;
    this.reopening = false;
    this.now = now;
    this.status = 'connecting';
    this.attempt = 0;
    this.everOpen = false;
    this.socket = null;
    this.nextId = 1;
    this.nextClientSeq = 1;
    /** @type {Map<number, {resolve: Function, reject: Function}>} */
    this.calls = new Map();
    /** @type {Map<string, Replica>} */
    this.replicas = new Map();
    this.pingTimer = null;
    this.retryTimer = null;
    this.stopped = false;
    /** Why the server refused this client, once it has: nothing is tried again. */
    this.refusal = null;
    globalThis.addEventListener?.('online', () => this.retryNow());
  }

  // ─── Connection ────────────────────────────────────────────────────────

  connect() {
    this.stopped = false;
    this.refusal = null;
    this.open();
  }

  close() {
    this.stopped = true;
    clearTimeout(this.retryTimer);
    this.socket?.close(1000);
  }

  get connected() {
    return this.status === 'open';
  }

  setStatus(status) {
    this.status = status;
    this.emit('status', { status, attempt: this.attempt });
  }

  open() {
    clearTimeout(this.retryTimer);
    const socket = new WebSocket(this.url, ['ahp']);
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.handshake(socket);
    };
    socket.onmessage = (event) => this.receive(socket, event.data);
    socket.onclose = () => this.lost(socket, opened);
    socket.onerror = () => {}; // a close event follows; that is where we act
  }

  /** The capabilities asked for at initialize: every extension, and the name to go by. */
  capabilities() {
    const capabilities = Object.fromEntries(EXTENSIONS.map((key) => [key, {}]));
    if (this.name) capabilities[IDENTITY] = { name: this.name };
    return capabilities;
  }

  async handshake(socket) {
    const resuming = this.everOpen;
    const renaming = this.status === 'renaming';
    let initialized = false;
    try {
      const initial = resuming ? [] : [...this.replicas.keys()];
      const result = await this.call(
        'initialize',
        {
          channel: ROOT,
          protocolVersions: [PROTOCOL_VERSION],
          clientId: this.clientId,
          clientInfo: { name: 'huddle-web', version: '0.1.0' },
          initialSubscriptions: initial,
          capabilities: this.capabilities(),
        },
        socket,
      );
      initialized = true;
      if (socket !== this.socket) return;
      this.identity = result._meta?.huddle?.identity ?? null;
      this.emit('identity', { identity: this.identity });
      if (resuming) {
        await this.resume(socket);
      } else {
        for (const snapshot of result.snapshots ?? []) {
          const replica = this.replicas.get(snapshot.resource);
          if (replica) this.reset(replica, snapshot);
        }
        for (const replica of this.replicas.values()) this.emit('change', { uri: replica.uri });
      }
    } catch (error) {
      if (socket === this.socket) {
        // Only initialize's answer says whether this client is let in.
        if (!initialized) this.refusal = initializeRefusal(error);
        socket.close(4000, 'handshake failed');
      }
      return;
    }
    if (socket !== this.socket) return;
    this.everOpen = true;
    this.attempt = 0;
    this.setStatus('open');
    this.flushPending();
    this.schedulePing(socket);
    if (resuming) this.emit('resumed', { renaming });
  }

  /** Catch every channel up after a drop, with one cursor per channel. */
  async resume(socket) {
    const cursors = [...this.replicas.values()]
      .filter((replica) => replica.ready)
      .map((replica) => ({ channel: replica.uri, lastSeenServerSeq: replica.serverSeq }));
    const fresh = [...this.replicas.values()].filter((replica) => !replica.ready);
    if (cursors.length) {
      const result = await this.call('reconnect', { channel: ROOT, clientId: this.clientId, cursors }, socket);
      for (const resume of result.channels) this.applyResume(resume);
    }
    for (const replica of fresh) {
      const result = await this.call('subscribe', { channel: replica.uri }, socket);
      if (result.snapshot) this.reset(replica, result.snapshot);
      this.emit('change', { uri: replica.uri });
    }
  }

  applyResume(resume) {
    const replica = this.replicas.get(resume.channel);
    if (!replica) return;
    if (resume.type === 'replay') {
      for (const envelope of resume.actions) this.applyEnvelope(replica, envelope);
    } else if (resume.type === 'snapshot') {
      // Pending actions stay: they are sent again, and the server's answer
      // to any that landed before the drop confirms it.
      this.reset(replica, resume.snapshot);
    } else if (resume.type === 'missing') {
      this.replicas.delete(resume.channel);
      this.emit('missing', { uri: resume.channel });
      return;
    }
    this.emit('change', { uri: replica.uri });
  }

  /** `socket` closed; `opened`: it had opened (a socket refused by the
   * server, or that never reached it, closes without opening). */
  lost(socket, opened) {
    if (socket !== this.socket) return;
    clearTimeout(this.pingTimer);
    this.socket = null;
    const error = new Error('the connection was lost');
    for (const call of this.calls.values()) call.reject(error);
    this.calls.clear();
    for (const replica of this.replicas.values()) {
      for (const entry of replica.pending) entry.sentOn = 0;
    }
    if (this.stopped) return;
    if (this.refusal) {
      this.setStatus('refused');
      return;
    }
    if (this.reopening) {
      // Closed on purpose to initialize again (a new name): no backoff.
      this.reopening = false;
      this.open();
      return;
    }
    this.attempt += 1;
    this.setStatus(this.everOpen ? 'reconnecting' : 'connecting');
    if (opened) this.retryLater();
    else this.checkAccess();
  }

  retryLater() {
    clearTimeout(this.retryTimer);
    const base = BACKOFF_MS[Math.min(this.attempt - 1, BACKOFF_MS.length - 1)];
    this.retryTimer = setTimeout(() => this.open(), base + Math.random() * base * 0.3);
  }

  /**
   * A socket closed before it opened: the server refused its credentials
   * (401/403), or it is out of reach. Ask over HTTP with the same cookie
   * which: a refusal is final; anything else (no answer, 5xx) is retried.
   */
  async checkAccess() {
    const refusal = await this.askAccess();
    // Closed, or opened again meanwhile (back online): that socket's end decides.
    if (this.stopped || this.socket || this.refusal) return;
    if (!refusal) {
      this.retryLater();
      return;
    }
    this.refusal = refusal;
    clearTimeout(this.retryTimer);
    this.setStatus('refused');
  }

  async askAccess() {
    let response;
    try {
      response = await fetch(this.accessUrl, {
        credentials: 'same-origin',
        cache: 'no-store',
        signal: AbortSignal.timeout(ACCESS_CHECK_TIMEOUT_MS),
      });
    } catch {
      return null; // no answer: the server is down or out of reach
    }
    if (!REFUSED_STATUSES.has(response.status)) return null;
    let body = null;
    try {
      body = await response.json();
    } catch {
      // not JSON: the status says enough
    }
    return accessRefusal(response.status, body);
  }

  retryNow() {
    if (this.stopped || this.socket || this.refusal) return;
    this.open();
  }

  /**
   * Go by `name` from now on (it counts only for a shared link's token):
   * the connection is opened again, since the server fixes who a
   * connection is at initialize. Nothing pending is lost (see above).
   */
  rename(name) {
    this.name = name;
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.reopening = true;
      this.setStatus('renaming'); // nothing more goes out under the old name
      this.socket.close(1000, 'a new name');
    }
  }

  schedulePing(socket) {
    clearTimeout(this.pingTimer);
    this.pingTimer = setTimeout(async () => {
      if (socket !== this.socket) return;
      const timeout = setTimeout(() => {
        // Given up now: on a network gone dead the browser holds the close
        // handshake (and the close event) for a minute or more.
        socket.close(4001, 'ping timeout');
        this.lost(socket, true);
      }, PING_TIMEOUT_MS);
      try {
        await this.call('ping', { channel: ROOT }, socket);
      } catch {
        return;
      } finally {
        clearTimeout(timeout);
      }
      this.schedulePing(socket);
    }, PING_EVERY_MS);
  }

  // ─── Frames ────────────────────────────────────────────────────────────

  send(socket, message) {
    socket.send(JSON.stringify({ jsonrpc: '2.0', ...message }));
  }

  /** A JSON-RPC request; rejects with RpcError, or an Error when the socket drops. */
  call(method, params, socket = this.socket) {
    if (!socket || socket.readyState !== WebSocket.OPEN) {
      return Promise.reject(new Error('not connected'));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.calls.set(id, { resolve, reject });
      this.send(socket, { id, method, params });
    });
  }

  /** A command once the connection is open (waits through reconnects). */
  async request(method, params) {
    for (;;) {
      if (this.connected) {
        try {
          return await this.call(method, params);
        } catch (error) {
          if (error instanceof RpcError) throw error;
        }
      }
      await this.until('status', () => this.connected);
    }
  }

  until(type, predicate) {
    return new Promise((resolve) => {
      const listener = () => {
        if (predicate()) {
          this.removeEventListener(type, listener);
          resolve();
        }
      };
      this.addEventListener(type, listener);
    });
  }

  receive(socket, text) {
    if (socket !== this.socket) return;
    let message;
    try {
      message = JSON.parse(text);
    } catch {
      return;
    }
    if (message.id !== undefined && message.id !== null && !message.method) {
      const call = this.calls.get(message.id);
      if (!call) return;
      this.calls.delete(message.id);
      if (message.error) call.reject(new RpcError(message.error));
      else call.resolve(message.result);
      return;
    }
    if (message.method === 'action') {
      const envelope = message.params;
      const replica = this.replicas.get(envelope.channel);
      if (!replica) return;
      if (!replica.ready) {
        // Sent between our subscribe and its answer: apply after the snapshot.
        replica.early.push(envelope);
        return;
      }
      this.applyEnvelope(replica, envelope);
      this.emit('change', { uri: replica.uri });
    } else if (message.method) {
      this.emit('notice', { method: message.method, params: message.params });
    }
  }

  /** Start a replica over from a snapshot, then apply what arrived early. */
  reset(replica, snapshot) {
    replica.reset(snapshot);
    const early = replica.early.splice(0);
    for (const envelope of early) this.applyEnvelope(replica, envelope);
  }

  applyEnvelope(replica, envelope) {
    const outcome = replica.applyEnvelope(envelope, this.clientId, this.now());
    if (outcome.kind === 'rejected') {
      this.emit('rejected', { uri: replica.uri, action: outcome.action, reason: outcome.reason });
    } else if (outcome.kind === 'gap') {
      this.resync(replica);
    }
  }

  /** Envelopes were missed on one channel: catch it up from its cursor. */
  async resync(replica) {
    if (replica.resyncing) return;
    replica.resyncing = true;
    try {
      const cursors = [{ channel: replica.uri, lastSeenServerSeq: replica.serverSeq }];
      const result = await this.call('reconnect', { channel: ROOT, clientId: this.clientId, cursors });
      for (const resume of result.channels) this.applyResume(resume);
    } catch {
      // The socket dropped: the reconnect after it covers this channel too.
    } finally {
      replica.resyncing = false;
    }
  }

  // ─── Channels and actions ──────────────────────────────────────────────

  /**
   * Subscribe (once per channel); resolves with the Replica when it has
   * state. `view.turns` asks for a chat's latest turns only.
   */
  async subscribe(uri, view = undefined) {
    let replica = this.replicas.get(uri);
    if (!replica) {
      const kind = channelKind(uri);
      replica = new Replica(uri, (state, action, nowMs) => reduce(kind, state, action, nowMs));
      this.replicas.set(uri, replica);
    }
    while (!replica.ready) {
      const result = await this.request('subscribe', view ? { channel: uri, view } : { channel: uri });
      if (this.replicas.get(uri) !== replica) return replica;
      if (!replica.ready && result.snapshot) this.reset(replica, result.snapshot);
      this.emit('change', { uri });
    }
    return replica;
  }

  unsubscribe(uri) {
    if (!this.replicas.delete(uri)) return;
    if (this.connected) this.send(this.socket, { method: 'unsubscribe', params: { channel: uri } });
  }

  /** Dispatch `action` on `uri`: applied at once (optimistically), sent when connected. */
  dispatch(uri, action) {
    const replica = this.replicas.get(uri);
    if (!replica) throw new Error(`not subscribed to ${uri}`);
    const clientSeq = this.nextClientSeq++;
    replica.addPending(clientSeq, action, this.now());
    this.emit('change', { uri });
    if (this.connected) this.sendPending(replica, replica.pending[replica.pending.length - 1]);
    return clientSeq;
  }

  sendPending(replica, entry) {
    entry.sentOn = 1;
    this.send(this.socket, {
      method: 'dispatchAction',
      params: { channel: replica.uri, clientSeq: entry.clientSeq, action: entry.action },
    });
  }

  /** Send every pending action not sent on this connection, in clientSeq order
   * (after a reconnect: all of them, the ones that landed before the drop too),
   * but those someone else's overtook meanwhile (replica.js), and those that
   * rest on them (a submit after an overtaken answer): dropped, and told
   * (`overtaken`). */
  flushPending() {
    const unsent = [];
    for (const replica of this.replicas.values()) {
      const dropped = [];
      for (const entry of replica.pending) {
        if (entry.sentOn) continue;
        if (entry.overtaken || dropped.some((d) => restsOn(entry.action, d.action))) dropped.push(entry);
      }
      for (const entry of dropped) replica.dropPending(entry.clientSeq);
      if (dropped.length) {
        this.emit('overtaken', { uri: replica.uri, actions: dropped.map((entry) => entry.action) });
        this.emit('change', { uri: replica.uri });
      }
      for (const entry of replica.pending) if (!entry.sentOn) unsent.push([replica, entry]);
    }
    unsent.sort((a, b) => a[1].clientSeq - b[1].clientSeq);
    for (const [replica, entry] of unsent) this.sendPending(replica, entry);
  }

  /** How many actions wait for the server, over every channel. */
  pendingCount() {
    let count = 0;
    for (const replica of this.replicas.values()) count += replica.pending.length;
    return count;
  }

  state(uri) {
    return this.replicas.get(uri)?.state ?? null;
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}
