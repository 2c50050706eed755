// The Huddle web client: wires the AHP client to the sessions list and the
// chat view, routes by URL hash (#/s/<session>[/c/<chat>]), shows the
// connection state, and reports what the server refused. It also keeps the
// people's side: who this page is (asking a shared link's holder for the
// name they go by), its entry in the open session's active clients, and
// the session's audit download; and new chats (chats.js), the way on from
// a chat that is full.

import { AhpClient, randomId, RpcError } from './ahp-client.js';
import { createChatParams, isChatFull, listsChat, madeBefore, mayCreateChats, newChatUri, watchesOnly } from './chats.js';
import { ChatView } from './chat-view.js';
import { h, visibleControls } from './dom.js';
import { isRead, reasonSentence, tooLateText } from './format.js';
import { discardedAnswers, overtakenTexts, typedAnswer } from './overtaken.js';
import { countedTitle, mayAsk, needing, newlyNeeding } from './notify.js';
import { MAX_NAME, typedName } from './people.js';
import { isoTime } from './reducers.js';
import { SessionsView } from './sessions-view.js';
import { rejectReason } from './validation.js';

const ROOT = 'ahp-root://';
const SESSION = 'ahp-session:/';
const CHAT = 'ahp-chat:/';
const TURN_WINDOW = 50;
const SUGGESTIONS = ['Open a high-priority ticket: users cannot log in'];
const SEEN_KEY = 'huddle.seen';
const NAME_KEY = 'huddle.name';
const PRESENCE_TRIES = 3;

const client = new AhpClient({
  url: `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/ahp`,
  name: loadName(),
});

const app = {
  sessions: new Map(),
  loaded: false,
  sessionUri: null,
  chatUri: null,
  errors: new Map(),
  /** Answers whose field drops what was typed (overtaken.js), "request\nquestion". */
  discarded: new Set(),
  markedRead: new Set(),
  missing: new Set(),
  seen: loadSeen(),
  backOnlineUntil: 0,
  /** 'unasked' | 'asking' | 'done': a shared link's holder is asked for a name once. */
  naming: 'unasked',
  /** Active-client entries set per session on this connection (a bound on retries). */
  presenceTries: new Map(),
  /** Chats the server refused a turn in as full, with its reason. */
  fullChats: new Map(),
  /** A chat this page just started, {chat, draft}, until it opens. */
  started: null,
  /** The sessions that need someone, as last looked at (null: not yet). */
  needing: null,
  /** The title as the views set it, and as counted in front of it. */
  titleBase: 'Huddle',
  titled: 'Huddle',
};

function loadSeen() {
  try {
    return JSON.parse(localStorage.getItem(SEEN_KEY) ?? '{}') ?? {};
  } catch {
    return {};
  }
}

/** The name this browser went by, if the server takes it (one kept before
 * names were checked may hold what it refuses: then none, and it is asked). */
function loadName() {
  try {
    return typedName(localStorage.getItem(NAME_KEY) ?? '').name ?? '';
  } catch {
    return '';
  }
}

function saveName(name) {
  try {
    localStorage.setItem(NAME_KEY, name);
  } catch {
    // storage may be off; the name then lasts as long as the page
  }
}

function saveSeen() {
  try {
    localStorage.setItem(SEEN_KEY, JSON.stringify(app.seen));
  } catch {
    // storage may be off; unread markers then last as long as the page
  }
}

// ─── Routing ────────────────────────────────────────────────────────────

const sessionHref = (uri) => `#/s/${encodeURIComponent(uri.slice(SESSION.length))}`;
const chatHref = (sessionUri, chatUri) => `${sessionHref(sessionUri)}/c/${encodeURIComponent(chatUri.slice(CHAT.length))}`;

function parseRoute() {
  const match = /^#\/s\/([^/]+)(?:\/c\/([^/]+))?/.exec(location.hash);
  if (!match) return { session: null, chat: null };
  return {
    session: SESSION + decodeURIComponent(match[1]),
    chat: match[2] ? CHAT + decodeURIComponent(match[2]) : null,
  };
}

function navigate({ focus = false } = {}) {
  const route = parseRoute();
  if (route.session !== app.sessionUri) {
    if (app.chatUri) client.unsubscribe(app.chatUri);
    if (app.sessionUri) {
      leave(app.sessionUri);
      client.unsubscribe(app.sessionUri);
    }
    app.sessionUri = route.session;
    app.chatUri = null;
    if (route.session) app.presenceTries.delete(route.session);
    if (route.session) {
      client.subscribe(route.session).catch((error) => fail(route.session, error));
    }
  }
  openChat(route.chat);
  document.body.classList.toggle('in-session', Boolean(app.sessionUri));
  render();
  if (app.started && app.started.chat === app.chatUri) {
    // A chat started here is open: what was typed is in its composer, unsent.
    chatView.restore(app.started.draft);
    chatView.focusComposer();
    app.started = null;
  } else if (focus && app.sessionUri) {
    chatView.transcript.focus({ preventScroll: true });
  }
}

/** Open `wanted`, or the session's default chat once the session's state is known. */
function openChat(wanted) {
  const session = app.sessionUri ? client.state(app.sessionUri) : null;
  const chat = wanted ?? session?.defaultChat ?? session?.chats?.[0]?.resource ?? null;
  if (chat === app.chatUri) return;
  if (app.chatUri) client.unsubscribe(app.chatUri);
  app.chatUri = chat;
  if (chat) client.subscribe(chat, { turns: TURN_WINDOW }).catch((error) => fail(chat, error));
}

function fail(uri, error) {
  if (error instanceof RpcError) {
    app.missing.add(uri);
    toast(`Cannot open this ${uri.startsWith(CHAT) ? 'chat' : 'session'}: ${error.message}`, 'error');
    render();
  }
}

// ─── Rendering ──────────────────────────────────────────────────────────

let frame = 0;
function scheduleRender() {
  if (!frame) frame = requestAnimationFrame(render);
}

function render() {
  cancelAnimationFrame(frame);
  frame = 0;
  renderSessions();
  renderMain();
  renderNeeds();
  renderConnection();
  renderIdentity();
  enter();
}

function renderSessions() {
  const entries = [...app.sessions.values()]
    .sort((a, b) => (a.modifiedAt < b.modifiedAt ? 1 : a.modifiedAt > b.modifiedAt ? -1 : 0))
    .map((summary) => {
      const uri = summary.resource;
      const current = uri === app.sessionUri;
      if (current && summary.modifiedAt && app.seen[uri] !== summary.modifiedAt) {
        app.seen[uri] = summary.modifiedAt;
        saveSeen();
      }
      const seen = app.seen[uri];
      const unread = !current && (!isRead(summary.status) || (seen !== undefined && summary.modifiedAt > seen));
      return { summary, current, unread, href: sessionHref(uri) };
    });
  sessionsView.update(entries, { loaded: app.loaded, watching: watchesOnly(client.identity) });
}

function renderMain() {
  const main = document.getElementById('main');
  if (!app.sessionUri) {
    welcomeCreate.hidden = watchesOnly(client.identity);
    if (main.firstChild !== welcome) main.replaceChildren(welcome);
    document.title = 'Huddle';
    return;
  }
  if (main.firstChild !== chatView.el) main.replaceChildren(chatView.el);
  const session = client.state(app.sessionUri);
  if (session && !app.chatUri) openChat(null);
  markRead(session);
  chatView.update({
    uri: app.chatUri,
    session,
    chat: app.chatUri ? client.state(app.chatUri) : null,
    missing: app.missing.has(app.sessionUri) || app.missing.has(app.chatUri),
    chatHref: (uri) => chatHref(app.sessionUri, uri),
    me: client.identity,
    clientId: client.clientId,
    mayCreateChats: mayCreateChats(client.identity),
    watching: watchesOnly(client.identity),
    full: app.fullChats.get(app.chatUri) ?? null,
  });
}

/** AHP's shared read flag: opening a session marks it read for everyone
 * (but an observer, who may send nothing, only watches). */
function markRead(session) {
  const uri = app.sessionUri;
  if (!session || isRead(session.status) || app.markedRead.has(uri)) return;
  if (watchesOnly(client.identity)) return;
  app.markedRead.add(uri);
  client.dispatch(uri, { type: 'session/isReadChanged', isRead: true });
}

// ─── Who is here ────────────────────────────────────────────────────────

/**
 * Put this page in the open session's active clients (AHP's
 * `session/activeClientSet`; the server writes the name it knows this
 * token by into the entry) whenever it is not there: after opening the
 * session, and after every reconnect, since the server takes a closed
 * connection's entry out. A shared link's holder is first asked for a name.
 */
function enter() {
  const uri = app.sessionUri;
  if (!uri || !client.connected || app.naming === 'asking' || watchesOnly(client.identity)) return;
  const replica = client.replicas.get(uri);
  if (!replica?.ready || replica.state?.activeClients?.some((c) => c.clientId === client.clientId)) return;
  const tries = app.presenceTries.get(uri) ?? 0;
  if (tries >= PRESENCE_TRIES) return; // refused, or taken out again and again: stop asking
  app.presenceTries.set(uri, tries + 1);
  const entry = { clientId: client.clientId, tools: [] };
  if (client.identity?.display) entry.displayName = client.identity.display;
  client.dispatch(uri, { type: 'session/activeClientSet', activeClient: entry });
}

/** Take this page out of a session's active clients (it is being left). */
function leave(uri) {
  const state = client.state(uri);
  if (!client.connected || !state?.activeClients?.some((c) => c.clientId === client.clientId)) return;
  client.dispatch(uri, { type: 'session/activeClientRemoved', clientId: client.clientId });
}

// ─── Who I am ───────────────────────────────────────────────────────────

const nameInput = h('input', { id: 'display-name', type: 'text', maxlength: MAX_NAME, autocomplete: 'name' });
const nameError = h('p', { class: 'form-error', role: 'alert', hidden: true });
const nameDialog = h(
  'dialog',
  { class: 'name-dialog', 'aria-labelledby': 'name-dialog-title' },
  h(
    'form',
    {
      onsubmit: (event) => {
        event.preventDefault();
        chooseName();
      },
    },
    h('h2', { id: 'name-dialog-title' }, 'What should people call you?'),
    h(
      'p',
      { class: 'muted' },
      'You opened a shared link, so Huddle does not know who you are. The name you give is shown with your answers and approvals, marked “shared link”.',
    ),
    h('label', { for: 'display-name' }, 'Your name'),
    nameInput,
    nameError,
    h(
      'div',
      { class: 'actions' },
      h('button', { type: 'submit', class: 'primary' }, 'Continue'),
      h('button', { type: 'button', class: 'ghost', onclick: () => nameDialog.close() }, 'Not now'),
    ),
  ),
);
nameDialog.addEventListener('close', () => {
  if (app.naming === 'asking') app.naming = 'done'; // dismissed: go on unnamed, ask no more
  scheduleRender();
});
document.body.append(nameDialog);

function askName() {
  app.naming = 'asking';
  nameInput.value = client.identity?.declared ? client.identity.name : loadName();
  nameError.hidden = true;
  if (!nameDialog.open) nameDialog.showModal();
  nameInput.focus();
}

function chooseName() {
  const { name, problem } = typedName(nameInput.value);
  if (!name) {
    nameError.textContent = problem ? reasonSentence(problem) : 'Type the name people know you by.';
    nameError.hidden = false;
    nameInput.focus();
    return;
  }
  saveName(name);
  app.naming = 'done';
  nameDialog.close();
  if (name !== client.name || !client.identity?.declared) client.rename(name);
}

const identityBox = document.getElementById('identity');
const identityName = h('span', { class: 'identity-name' });
const renameButton = h('button', { type: 'button', class: 'link', onclick: () => askName() }, 'Change name');
// A person signed in through the organisation's provider signs out here
// (server/edge/signin.py); an auth proxy's person signs out at the proxy.
const signOut = h('a', { href: '/logout', class: 'link', hidden: true }, 'Sign out');
identityBox.append(h('span', { class: 'muted' }, 'You: '), identityName, ' ', renameButton, ' ', signOut);

function renderIdentity() {
  const identity = client.identity;
  identityBox.hidden = !identity;
  if (!identity) return;
  const text = visibleControls(identity.display ?? identity.name);
  if (identityName.textContent !== text) identityName.textContent = text;
  renameButton.hidden = !identity.shared || watchesOnly(identity);
  renameButton.textContent = identity.declared ? 'Change name' : 'Set your name';
  signOut.hidden = !identity.issuer || identity.issuer === 'auth-proxy';
}

// ─── Telling people they are needed ─────────────────────────────────────

const notifyButton = h(
  'button',
  { type: 'button', class: 'ghost small', hidden: true, onclick: () => askToNotify() },
  'Notify me',
);
document.querySelector('.topbar').append(notifyButton);

/** Asked on the person's click only (notify.js): browsers refuse, or
 * nag, a page that asks on load. */
function askToNotify() {
  window.Notification?.requestPermission().then(renderNeeds, renderNeeds);
}

/**
 * The count of sessions that need someone in front of the tab's title,
 * and a notification for each that came to need someone while the tab is
 * hidden. Also run straight from the sessions' notices: a hidden tab gets
 * no animation frames, so render() would wait until it is seen again.
 */
function renderNeeds() {
  const now = needing(app.sessions.values());
  if (app.loaded) {
    for (const uri of newlyNeeding(app.needing, now)) notify(app.sessions.get(uri));
    app.needing = now;
  }
  if (document.title !== app.titled) app.titleBase = document.title;
  app.titled = countedTitle(app.titleBase, now.size);
  document.title = app.titled;
  notifyButton.hidden = !mayAsk(window.Notification);
}

function notify(summary) {
  if (!document.hidden || window.Notification?.permission !== 'granted') return;
  const title = summary.title ? visibleControls(summary.title) : 'Untitled session';
  const body = summary.activity ? visibleControls(summary.activity) : 'A request waits for someone.';
  const shown = new window.Notification(`Needed in ${title}`, { body, tag: summary.resource });
  shown.onclick = () => {
    window.focus();
    location.hash = sessionHref(summary.resource);
    shown.close();
  };
}

// ─── Connection state ───────────────────────────────────────────────────

const banner = document.getElementById('connection');

function renderConnection() {
  const { status, attempt } = client;
  const pending = client.pendingCount();
  let text = '';
  let tone = 'info';
  if (status === 'connecting') {
    text = attempt >= 3
      ? 'Cannot reach Huddle. Retrying… If this page was opened without its link, open the link that huddle serve printed.'
      : 'Connecting…';
    tone = attempt >= 3 ? 'error' : 'info';
  } else if (status === 'renaming') {
    text = 'Joining under your name…';
  } else if (status === 'reconnecting') {
    text = 'Connection lost. Reconnecting…';
    if (pending) text += ` ${pending} change${pending === 1 ? '' : 's'} will be sent when it is back.`;
    else if (!watchesOnly(client.identity)) text += ' You can keep typing; nothing is lost.';
    tone = 'warning';
  } else if (status === 'refused') {
    text = refusedText(client.refusal, pending);
    tone = 'error';
  } else if (Date.now() < app.backOnlineUntil) {
    text = 'Back online: up to date.';
    tone = 'ok';
  }
  banner.hidden = !text;
  banner.dataset.tone = tone;
  banner.dataset.status = status;
  if (banner.textContent !== text) banner.textContent = text;
  document.body.dataset.connection = status;
}

/** What to tell someone the server no longer lets in (final: nothing is retried). */
function refusedText(refusal, pending) {
  let text;
  if (refusal.kind === 'access') {
    text = client.everOpen
      ? `This link no longer gives access: ${refusal.reason}. Ask for a new link.`
      : `This page has no access: ${refusal.reason}. Open the link you were given, or the one huddle serve printed.`;
  } else {
    text = `Huddle refused this page: ${refusal.reason}. Reload the page to try again.`;
  }
  // Sent or not, nothing confirms them now.
  if (pending) text += ` ${pending} change${pending === 1 ? '' : 's'} may not have been saved.`;
  return text;
}

// ─── Toasts and announcements ───────────────────────────────────────────

function toast(text, tone = 'info', { stay = false } = {}) {
  const box = document.getElementById('toasts');
  const item = h(
    'div',
    { class: `toast ${tone}`, role: tone === 'error' ? 'alert' : 'status' },
    h('span', null, text),
    h('button', { type: 'button', class: 'ghost small', 'aria-label': 'Dismiss', onclick: () => item.remove() }, '×'),
  );
  box.append(item);
  if (!stay) setTimeout(() => item.remove(), 8000);
}

function announce(text) {
  const region = document.getElementById('announcer');
  region.textContent = '';
  setTimeout(() => {
    region.textContent = text;
  }, 50);
}

// ─── What the chat view may do ──────────────────────────────────────────

function pendingFor(id) {
  const replica = app.chatUri ? client.replicas.get(app.chatUri) : null;
  return Boolean(
    replica?.hasPending(
      (action) =>
        (action.type === 'chat/inputCompleted' && action.requestId === id) ||
        ((action.type === 'chat/toolCallConfirmed' || action.type === 'chat/toolCallResultConfirmed') && action.toolCallId === id),
    ),
  );
}

const chatCtx = {
  dispatch(action) {
    if (app.chatUri) client.dispatch(app.chatUri, action);
  },
  check(action) {
    const state = app.chatUri ? client.state(app.chatUri) : null;
    const session = app.sessionUri ? client.state(app.sessionUri) : null;
    return state ? rejectReason(state, action, session) : 'not-ready: the chat is still loading';
  },
  isSending: pendingFor,
  /** Whether the field of `questionId` must drop what was typed in it and
   * show the shared answer (an overtaken edit: overtaken.js); asked once. */
  takeDiscarded(requestId, questionId) {
    return app.discarded.delete(`${requestId}\n${questionId}`);
  },
  /** Whether this page only watches (an observer): request and approval
   * cards show what is asked and who answers, with nothing to press. */
  watching: () => watchesOnly(client.identity),
  takeError(id) {
    if (!app.errors.has(id)) return undefined;
    const reason = app.errors.get(id);
    app.errors.delete(id);
    return reason;
  },
  startTurn(text) {
    const action = {
      type: 'chat/turnStarted',
      turnId: randomId(),
      startedAt: isoTime(Date.now()),
      message: { text, origin: { kind: 'user' } },
    };
    const problem = chatCtx.check(action);
    if (problem) {
      chatView.restore(text);
      toast(reasonSentence(problem), 'error');
      return;
    }
    chatCtx.dispatch(action);
  },
  cancelTurn() {
    const chat = app.chatUri ? client.state(app.chatUri) : null;
    const turn = chat?.activeTurn;
    if (!turn) return;
    const started = Date.parse(turn.startedAt);
    const duration = Number.isNaN(started) ? 0 : Math.max(0, Date.now() - started);
    chatCtx.dispatch({ type: 'chat/turnCancelled', turnId: turn.id, duration });
  },
  async loadOlder() {
    const uri = app.chatUri;
    const chat = uri ? client.state(uri) : null;
    if (!chat?.turnsNextCursor) return;
    try {
      const page = await client.request('fetchTurns', { channel: uri, cursor: chat.turnsNextCursor, limit: TURN_WINDOW });
      const action = { type: 'chat/turnsLoaded', turns: page.turns };
      if (page.turnsNextCursor) action.turnsNextCursor = page.turnsNextCursor;
      client.replicas.get(uri)?.applyLocal(action, Date.now());
      scheduleRender();
    } catch (error) {
      toast(`Could not load earlier turns: ${error.message}`, 'error');
    }
  },
  announce,
  downloadAudit,
  newChat,
};

// ─── New chats ──────────────────────────────────────────────────────────

/**
 * Start a new chat in the open session (AHP `createChat`), wait for the
 * session's `session/chatAdded`, and open the chat with `draft` in its
 * composer. True once it is open; false when it is not (the server's
 * refusal is said in a toast, or the page left the session meanwhile).
 */
async function newChat(draft = '') {
  const session = app.sessionUri;
  if (!session) return false;
  const chat = newChatUri(randomId());
  try {
    await client.request('createChat', createChatParams(session, chat));
  } catch (error) {
    if (!madeBefore(error)) {
      toast(`Could not start a new chat: ${error.message}`, 'error');
      return false;
    }
  }
  await listed(session, chat);
  if (app.sessionUri !== session || !listsChat(client.state(session), chat)) return false;
  app.started = { chat, draft };
  location.hash = chatHref(session, chat);
  return true;
}

/** Resolves once `session` lists `chat`, or the page is no longer in that session. */
function listed(session, chat) {
  const done = () => listsChat(client.state(session), chat) || app.sessionUri !== session || app.missing.has(session);
  return new Promise((resolve) => {
    const check = () => {
      if (!done()) return;
      client.removeEventListener('change', check);
      client.removeEventListener('missing', check);
      removeEventListener('hashchange', check);
      resolve();
    };
    client.addEventListener('change', check);
    client.addEventListener('missing', check);
    addEventListener('hashchange', check);
    check();
  });
}

// ─── The session's audit ────────────────────────────────────────────────

/** `audit-<session id>.jsonl`, safe as a file name. */
function auditFileName(uri) {
  const id = uri.slice(SESSION.length).replace(/[^A-Za-z0-9._-]+/g, '-').replace(/^[.-]+/, '') || 'session';
  return `audit-${id}.jsonl`;
}

/** GET /api/audit for the open session (the page's token goes as its cookie)
 * and save it (JSON Lines); say clearly why not when the server refuses. */
async function downloadAudit() {
  const uri = app.sessionUri;
  if (!uri) return;
  let response;
  try {
    response = await fetch(`/api/audit?session=${encodeURIComponent(uri)}`, {
      credentials: 'same-origin',
      headers: { Accept: 'application/x-ndjson' },
      cache: 'no-store',
    });
  } catch {
    toast('Could not reach Huddle to download the audit. Try again once the connection is back.', 'error');
    return;
  }
  if (!response.ok) {
    toast(await auditRefusal(response), 'error');
    return;
  }
  const blob = await response.blob();
  const name = auditFileName(uri);
  const link = h('a', { href: URL.createObjectURL(blob), download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
  toast(`The audit was saved as ${name}.`, 'ok');
}

async function auditRefusal(response) {
  let reason = '';
  try {
    const body = await response.json();
    if (typeof body?.error === 'string') reason = body.error;
  } catch {
    // not JSON: the status says enough
  }
  const said = reason ? ` (${reason})` : '';
  switch (response.status) {
    case 401:
      return `Your link is no longer valid, so the audit cannot be downloaded${said}. Open a new link.`;
    case 403:
      return `You may not download this session's audit${said}.`;
    case 404:
      return `There is no audit for this session${said}.`;
    default:
      return `Could not download the audit: the server answered ${response.status}${said}.`;
  }
}

// ─── Views ──────────────────────────────────────────────────────────────

const chatView = new ChatView(chatCtx, { suggestions: SUGGESTIONS });

const sessionsView = new SessionsView({
  async create(title) {
    const uri = SESSION + randomId();
    await client.request('createSession', { channel: uri, title });
    location.hash = sessionHref(uri);
  },
});
document.getElementById('sidebar').append(sessionsView.el);

const welcomeCreate = h('button', { type: 'button', class: 'primary', onclick: () => sessionsView.toggleForm(true) }, 'Create a session');
const welcome = h(
  'section',
  { class: 'welcome', 'aria-labelledby': 'welcome-title' },
  h('h2', { id: 'welcome-title' }, 'Work with your agents, together'),
  h(
    'p',
    null,
    'When an agent needs a person — answers to a few questions, a page to visit, or approval before it runs a tool — it asks here. Everyone in the chat sees the request at once, answers appear live as people type, and the agent continues as soon as someone submits.',
  ),
  h('p', null, 'Open a session from the list, or create a new one.'),
  welcomeCreate,
);

// ─── Client events ──────────────────────────────────────────────────────

async function loadSessions() {
  const items = [];
  let cursor;
  do {
    const page = await client.request('listSessions', cursor ? { channel: ROOT, cursor } : { channel: ROOT });
    items.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor);
  app.sessions = new Map(items.map((summary) => [summary.resource, summary]));
  app.loaded = true;
  renderNeeds();
  scheduleRender();
}

client.addEventListener('change', scheduleRender);

client.addEventListener('status', (event) => {
  if (event.detail.status === 'open') {
    app.presenceTries.clear(); // a new connection: the server took the old one's entries out
    if (!app.loaded) loadSessions().catch(() => {});
  }
  scheduleRender();
});

client.addEventListener('identity', ({ detail: { identity } }) => {
  // A shared link's holder who gave no name yet is asked once.
  // An observer is never shown to the others: nothing to name.
  if (identity?.shared && !identity.declared && !watchesOnly(identity) && app.naming === 'unasked') askName();
  scheduleRender();
});

client.addEventListener('resumed', ({ detail }) => {
  if (!detail?.renaming) {
    app.backOnlineUntil = Date.now() + 2500;
    setTimeout(scheduleRender, 2600);
  }
  loadSessions().catch(() => {});
});

client.addEventListener('notice', ({ detail: { method, params } }) => {
  if (method === 'root/sessionAdded') {
    app.sessions.set(params.summary.resource, params.summary);
  } else if (method === 'root/sessionRemoved') {
    app.sessions.delete(params.session);
  } else if (method === 'root/sessionSummaryChanged') {
    const summary = app.sessions.get(params.session);
    if (!summary) return;
    const next = { ...summary };
    for (const [key, value] of Object.entries(params.changes)) {
      if (value === null) delete next[key];
      else next[key] = value;
    }
    app.sessions.set(params.session, next);
  } else return;
  renderNeeds();
  scheduleRender();
});

client.addEventListener('missing', ({ detail: { uri } }) => {
  app.missing.add(uri);
  if (uri === app.sessionUri || uri === app.chatUri) toast('This session no longer exists.', 'error');
  scheduleRender();
});

client.addEventListener('overtaken', ({ detail: { uri, actions } }) => {
  // They stay until dismissed: what was typed lives on only in them.
  for (const text of overtakenTexts(client.state(uri), actions)) toast(text, 'info', { stay: true });
  for (const key of discardedAnswers(actions)) app.discarded.add(key);
  scheduleRender();
});

client.addEventListener('rejected', ({ detail: { uri, action, reason } }) => {
  const sentence = reasonSentence(reason);
  const late = tooLateText(action, reason);
  if (late) {
    // Someone else's decision came first: the card already shows theirs.
    toast(late, 'info');
    scheduleRender();
    return;
  }
  switch (action.type) {
    case 'chat/inputCompleted':
      app.errors.set(action.requestId, reason);
      break;
    case 'chat/toolCallConfirmed':
    case 'chat/toolCallResultConfirmed':
      app.errors.set(action.toolCallId, reason);
      break;
    case 'chat/turnStarted':
      chatView.restore(action.message?.text ?? '');
      // A full chat takes no new turn: the way on is a new chat (by the composer).
      if (isChatFull(reason)) app.fullChats.set(uri, reason);
      else toast(`The message was not sent: ${sentence}`, 'error');
      break;
    case 'chat/inputAnswerChanged': {
      // What was typed goes with the notice, which stays: the field no longer has it.
      const typed = typedAnswer(client.state(uri), action);
      const had = typed ? ` You had answered: “${typed}”.` : '';
      toast(`Your answer was not saved: ${sentence}${/[.!?]$/.test(sentence) ? '' : '.'}${had}`, 'error', { stay: Boolean(typed) });
      break;
    }
    case 'session/activeClientSet':
      // Not being listed as here is not worth an error; stop asking on this connection.
      app.presenceTries.set(uri, PRESENCE_TRIES);
      break;
    case 'session/activeClientRemoved':
      break;
    default:
      toast(`Not done: ${sentence}`, 'error');
  }
  scheduleRender();
});

addEventListener('hashchange', () => navigate({ focus: true }));
setInterval(scheduleRender, 30000); // relative times in the list

client.subscribe(ROOT).catch(() => {});
client.connect();
navigate();
