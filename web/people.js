// The people of a session as the web client shows them: who is here now
// (the session's active clients), who wrote what (Huddle's notes in the
// session's `_meta.huddle`, reducers/notes.py) and how long a request or a
// tool call still waits (a note's `expiresAt`).
//
// Every name shown for an answer, a completion or a decision comes from the
// notes, which the server alone writes from the sender's token: never from
// a clientId, never from what a client said about itself.
//
// Time: `expiresAt` is the server's clock (ms since the epoch) and the
// countdown runs on this device's (`Date.now()`): a device clock that is N
// seconds off shows the deadline N seconds off. The server alone expires a
// wait, so "Expired" is only what this clock says: the request stays
// answerable until the server resolves it, and then shows as resolved.

import { h } from './dom.js';

/** A person as the server names them (server/auth.py Identity.display):
 * a name typed in for a shared link says so. */
export function displayOf(who) {
  if (!who || typeof who.name !== 'string') return 'Someone';
  if (who.declared) return `${who.name} · shared link`;
  // A signed-in person (their issuer vouches for the email) shows it too.
  if (who.issuer && typeof who.email === 'string' && who.email !== who.name) {
    return `${who.name} (${who.email})`;
  }
  return who.name;
}

// A name typed in for a shared link, as server/auth.py takes it (name_problem
// and typed_name; both run tests/fixtures/names/typed-names.json).
export const MAX_NAME = 60; // server/auth.py MAX_DECLARED_NAME
const MAX_MARKS = 3;
const INVISIBLE = new Set('\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0\u2800\u{1d159}');
const SPACE = /^[\t\n\v\f\r\p{Zs}\p{Zl}\p{Zp}]$/u;
const HIDDEN = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}]$/u; // not Cn: see server/auth.py HIDDEN
const MARK = /^\p{M}$/u;

/**
 * What a typed name becomes: `{name}` fit to show ('' when only spaces and
 * stray marks were typed: the token's own name is used), or `{problem}`, the
 * server's sentence for a name holding a character that shows as nothing or
 * reorders the text around it.
 */
export function typedName(typed) {
  const chars = Array.from(typed.normalize('NFC'));
  const bad = chars.find((c) => (HIDDEN.test(c) && !SPACE.test(c)) || INVISIBLE.has(c));
  if (bad !== undefined) {
    const point = bad.codePointAt(0).toString(16).toUpperCase().padStart(4, '0');
    return { problem: `a name cannot hold U+${point}: it shows as nothing or reorders the text around it` };
  }
  const kept = [];
  let marks = 0;
  for (const c of chars) {
    if (MARK.test(c)) {
      marks += 1;
      if (marks > MAX_MARKS || !kept.length || kept.at(-1) === ' ') continue;
    } else marks = 0;
    kept.push(SPACE.test(c) ? ' ' : c);
  }
  const words = kept.join('').split(' ').filter(Boolean).join(' ');
  return { name: Array.from(words).slice(0, MAX_NAME).join('').replace(/ +$/, '') };
}

/** Is `who` (a note's author) this page's person? The same token and name:
 * the holders of one shared link differ by the names they typed. */
export function isMe(who, me) {
  return Boolean(who && me && who.token === me.token && who.name === me.name);
}

/** What a chat view needs to credit people: the session's notes, the chat, who I am. */
export function peopleOf(session, chat, me) {
  return { notes: session?._meta?.huddle ?? null, chat, me: me ?? null };
}

/** The server's stamp on a turn (`_meta.huddle.turn` of its message), or null. */
export function turnStampOf(turn) {
  const stamp = turn?.message?._meta?.huddle?.turn;
  return typeof stamp === 'string' ? stamp : null;
}

/** The note on input request `id` of the chat's turn stamped `stamp`, or null. */
export function requestNote(people, id, stamp = null) {
  return noteOf(people, 'requests', id, stamp);
}

/** The note on tool call `id` of the chat's turn stamped `stamp`, or null. */
export function toolCallNote(people, id, stamp = null) {
  return noteOf(people, 'toolCalls', id, stamp);
}

// Ids are unique within a turn only: a note names the turn it is of (a
// turn truncated away and the next may use one id), and one that names
// none is any turn's (reducers/notes.py).
function noteOf(people, family, id, stamp) {
  const entry = people?.notes?.[family]?.[people.chat]?.[id];
  if (!entry || typeof entry !== 'object') return null;
  return entry.turn == null || entry.turn === stamp ? entry : null;
}

/** Under an open question: what someone else is doing with its answer ('' for none, or mine). */
export function answerActivity(note, questionId, me) {
  const entry = note?.answers?.[questionId];
  if (!entry?.by || isMe(entry.by, me)) return '';
  const name = displayOf(entry.by);
  if (entry.state === 'draft') return `${name} is typing…`;
  if (entry.state === 'skipped') return `skipped by ${name}`;
  return `answered by ${name}`;
}

/** Under a resolved question: who answered it ('' when the notes do not say). */
export function answerCredit(note, questionId) {
  const entry = note?.answers?.[questionId];
  if (!entry?.by) return '';
  return `${entry.state === 'skipped' ? 'skipped' : 'answered'} by ${displayOf(entry.by)}`;
}

/** The entries of "who is here now": one per display name, mine marked.
 * `activeClients` are AHP's; the server puts each person's name in their
 * entry (`displayName`). */
export function presentPeople(activeClients, clientId) {
  const byName = new Map();
  for (const client of activeClients ?? []) {
    const name = client.displayName || 'Someone';
    const entry = byName.get(name) ?? { name, count: 0, me: false };
    entry.count += 1;
    entry.me ||= client.clientId === clientId;
    byName.set(name, entry);
  }
  return [...byName.values()].sort((a, b) => Number(b.me) - Number(a.me) || a.name.localeCompare(b.name));
}

// ─── Deadlines ─────────────────────────────────────────────────────────

const THEN = {
  requests: { cancel: 'it is cancelled', decline: 'it is declined', fail: 'the turn fails' },
  toolCalls: { cancel: 'it is cancelled', decline: 'it is denied', fail: 'the turn fails' },
};

/** What happens when the wait ends (a note's `onExpiry`, "cancel" when absent). */
export function expiryOutcome(onExpiry, family = 'requests') {
  const table = THEN[family] ?? THEN.requests;
  return table[onExpiry] ?? table.cancel;
}

/** "4:05", "1:02:03", "2 d 3 h" for `ms` left (rounded up to the second). */
export function formatLeft(ms) {
  const total = Math.max(0, Math.ceil(ms / 1000));
  const days = Math.floor(total / 86400);
  const hours = Math.floor((total % 86400) / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const seconds = total % 60;
  const two = (n) => String(n).padStart(2, '0');
  if (days) return `${days} d ${hours} h`;
  if (hours) return `${hours}:${two(minutes)}:${two(seconds)}`;
  return `${minutes}:${two(seconds)}`;
}

/** The deadline of a note, or null: `{expiresAt, onExpiry}`. */
export function deadlineOf(note) {
  if (!note || typeof note.expiresAt !== 'number') return null;
  return { expiresAt: note.expiresAt, onExpiry: note.onExpiry ?? 'cancel' };
}

/** Has the wait of `note` passed, by this device's clock? */
export function isExpired(note, now = Date.now()) {
  const deadline = deadlineOf(note);
  return deadline !== null && now >= deadline.expiresAt;
}

const ticking = new Set();
let ticker = 0;

/**
 * A live countdown to `deadline` ("4:05 left · then it is declined", then
 * "Expired"); it updates itself every second while it is in the document.
 */
export function countdown(deadline, family = 'requests') {
  const el = h('span', { class: 'countdown', role: 'timer' });
  const item = { el, deadline, then: expiryOutcome(deadline.onExpiry, family), attached: false, ticks: 0 };
  tick(item, Date.now());
  ticking.add(item);
  if (!ticker) ticker = setInterval(tickAll, 1000);
  return el;
}

function tick(item, now) {
  const left = item.deadline.expiresAt - now;
  const text = left > 0 ? `${formatLeft(left)} left · then ${item.then}` : 'Expired';
  if (item.el.textContent !== text) item.el.textContent = text;
  item.el.classList.toggle('expired', left <= 0);
}

function tickAll() {
  const now = Date.now();
  for (const item of ticking) {
    item.ticks += 1;
    if (item.el.isConnected) item.attached = true;
    else if (item.attached || item.ticks > 5) {
      ticking.delete(item); // its card was rebuilt or removed (or never shown)
      continue;
    }
    tick(item, now);
  }
  if (!ticking.size) {
    clearInterval(ticker);
    ticker = 0;
  }
}
