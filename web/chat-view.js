// A chat: its header, the turn transcript (streaming text, tool calls and
// input requests in the place of the response where they were asked) and
// the composer that starts a turn or stops the active one.
//
// "New chat" starts another chat in the session (not for observers, who may
// create nothing); a chat the server refused a turn in as full says so by
// the composer and offers the same, taking what was typed along.
//
// The transcript is kept in step with the state by key (turn id, part id),
// so an update touches only what changed and never rebuilds a form that
// someone is typing in. The header says who is here now (the session's
// active clients) and offers the session's audit; the cards credit people
// from the session's notes (people.js).

import { fullChatText } from './chats.js';
import { h, replaceChildren, syncKeyed, uid, visibleControls } from './dom.js';
import { ACTIVITY_LABEL, activityOf, clockTime } from './format.js';
import { InputRequestView } from './input-request.js';
import { renderMarkdown } from './markdown.js';
import { peopleOf, presentPeople, turnStampOf } from './people.js';
import { ToolCallView } from './tool-call.js';

const NEAR_BOTTOM_PX = 96;

function partKey(part) {
  switch (part.kind) {
    case 'markdown':
      return `md:${part.id}`;
    case 'reasoning':
      return `rs:${part.id}`;
    case 'toolCall':
      return `tc:${part.toolCall.toolCallId}`;
    case 'inputRequest':
      return `ir:${part.request.id}`;
    default:
      return part.kind;
  }
}

/** Unique keys for the parts of one turn (ids may repeat: a resolved request and its successor). */
function keyed(parts, turn, people) {
  const counts = new Map();
  return parts.map((part) => {
    const base = partKey(part);
    const n = counts.get(base) ?? 0;
    counts.set(base, n + 1);
    return { key: n ? `${base}#${n}` : base, part, turn, people };
  });
}

class MarkdownView {
  constructor(item) {
    this.el = h('div', { class: 'md', dir: 'auto' });
    this.update(item);
  }

  update({ part }) {
    if (part.content === this.content) return;
    this.content = part.content;
    this.el.replaceChildren(renderMarkdown(part.content));
  }
}

class ReasoningView {
  constructor(item) {
    this.body = h('div', { class: 'md', dir: 'auto' });
    this.el = h('details', { class: 'reasoning' }, h('summary', null, 'Reasoning'), this.body);
    this.update(item);
  }

  update({ part }) {
    if (part.content === this.content) return;
    this.content = part.content;
    this.body.replaceChildren(renderMarkdown(part.content));
  }
}

class NoticeView {
  constructor(item) {
    this.el = h('p', { class: 'notice', dir: 'auto' });
    this.update(item);
  }

  update({ part }) {
    const content = part.content ?? part.uri ?? `(${part.kind})`;
    const text = typeof content === 'string' ? content : content.markdown ?? '';
    if (text !== this.text) {
      this.text = text;
      replaceChildren(this.el, typeof content === 'string' ? text : renderMarkdown(text));
    }
  }
}

function createPartView(item, ctx) {
  switch (item.part.kind) {
    case 'markdown':
      return new MarkdownView(item);
    case 'reasoning':
      return new ReasoningView(item);
    case 'toolCall':
      return new ToolCallView(item.part, item.turn, ctx, item.people);
    case 'inputRequest':
      return new InputRequestView(item.part, item.turn, ctx, item.people);
    default:
      return new NoticeView(item);
  }
}

class TurnView {
  constructor(item, ctx) {
    this.ctx = ctx;
    this.parts = new Map();
    const turn = item.turn;
    const time = clockTime(turn.startedAt);
    this.response = h('div', { class: 'response' });
    this.foot = h('div', { class: 'turn-foot' });
    this.el = h(
      'article',
      { class: 'turn', 'aria-label': time ? `Turn started at ${time}` : 'Turn' },
      h(
        'div',
        { class: `message ${turn.message?.origin?.kind === 'agent' ? 'from-agent' : 'from-user'}` },
        h('p', { class: 'bubble', dir: 'auto' }, turn.message?.text ?? ''),
        time ? h('time', { datetime: turn.startedAt, class: 'meta' }, time) : null,
      ),
      this.response,
      this.foot,
    );
    this.update(item);
  }

  update({ turn, active, people }) {
    const descriptor = { id: turn.id, active, stamp: turnStampOf(turn) };
    // A finished turn that did not change needs nothing, unless the notes
    // did (who answered arrives just after the answer); the active one may
    // change without a new object (a pending action was confirmed).
    const same = people?.notes === this.people?.notes && people?.me === this.people?.me;
    if (turn === this.turn && active === this.active && !active && same) return;
    this.turn = turn;
    this.active = active;
    this.people = people;
    syncKeyed(this.response, this.parts, keyed(turn.responseParts ?? [], descriptor, people), (i) => i.key, (i) =>
      createPartView(i, this.ctx),
    );
    this.el.classList.toggle('active', active);
    this.foot.replaceChildren(...this.footer(turn, active));
  }

  footer(turn, active) {
    if (active) {
      const waiting = (turn.responseParts ?? []).some(
        (p) =>
          (p.kind === 'inputRequest' && p.response == null) ||
          (p.kind === 'toolCall' && ['pending-confirmation', 'pending-result-confirmation'].includes(p.toolCall.status)),
      );
      if (waiting) return [h('span', { class: 'waiting' }, this.ctx.watching?.() ? 'Waiting for a participant' : 'Waiting for you')];
      return [h('span', { class: 'working' }, h('span', { class: 'dots', 'aria-hidden': 'true' }, h('i'), h('i'), h('i')), 'Working')];
    }
    if (turn.state === 'cancelled') return [h('span', { class: 'badge muted' }, 'Stopped')];
    if (turn.state === 'error') {
      return [h('span', { class: 'badge error' }, 'Error'), ' ', h('span', { class: 'turn-error' }, turn.error?.message ?? 'The turn failed.')];
    }
    return [];
  }
}

export class ChatView {
  /**
   * @param {object} ctx dispatch(action), check(action), isSending(id),
   *   takeError(id), startTurn(text), cancelTurn(), loadOlder(), announce(text),
   *   downloadAudit(), newChat(draft) (resolves true once the new chat is
   *   open, false when not (a toast said why, or the page left the
   *   session); `draft`: the text to take along)
   */
  constructor(ctx, { suggestions = [] } = {}) {
    this.ctx = ctx;
    this.turns = new Map();
    this.titleId = uid('chat-title');
    this.title = h('h2', { id: this.titleId, class: 'chat-title', dir: 'auto' });
    this.status = h('span', { class: 'status-chip' });
    const presenceId = uid('presence');
    this.presenceList = h('ul', { class: 'presence-list', 'aria-labelledby': presenceId });
    this.presence = h(
      'div',
      { class: 'presence', hidden: true },
      h('span', { class: 'presence-label', id: presenceId }, 'Here now'),
      this.presenceList,
    );
    this.auditButton = h(
      'button',
      { type: 'button', class: 'ghost small audit', onclick: () => this.downloadAudit() },
      'Download audit',
    );
    this.newChatButton = h(
      'button',
      { type: 'button', class: 'ghost small new-chat', hidden: true, onclick: () => this.newChat(this.newChatButton) },
      h('span', { 'aria-hidden': 'true' }, '+ '),
      'New chat',
    );
    this.tabs = h('nav', { class: 'chat-tabs', 'aria-label': 'Chats in this session', hidden: true });
    this.older = h('button', { type: 'button', class: 'ghost load-older', hidden: true, onclick: () => ctx.loadOlder() }, 'Load earlier turns');
    this.list = h('div', { class: 'turns' });
    this.suggestions = suggestions.length
      ? h(
          'div',
          { class: 'suggestions' },
          suggestions.map((text) =>
            h('button', { type: 'button', class: 'suggestion', onclick: () => this.suggest(text) }, text),
          ),
        )
      : null;
    this.emptyHint = h('p', { class: 'muted' });
    this.empty = h(
      'div',
      { class: 'empty-chat', hidden: true },
      h('p', { class: 'empty-title' }, 'Nothing here yet'),
      this.emptyHint,
      this.suggestions,
    );
    this.transcript = h(
      'div',
      { class: 'transcript', tabindex: '-1', role: 'region', 'aria-label': 'Conversation' },
      this.older,
      this.list,
      this.empty,
    );
    this.input = h('textarea', {
      id: uid('composer'),
      rows: 1,
      placeholder: 'Message the agent…',
      'aria-describedby': 'composer-help',
      oninput: () => this.grow(),
      onkeydown: (event) => {
        if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
          event.preventDefault();
          this.send();
        }
      },
    });
    this.sendButton = h('button', { type: 'submit', class: 'primary' }, 'Send');
    this.stopButton = h('button', { type: 'button', class: 'danger-outline', hidden: true, onclick: () => ctx.cancelTurn() }, 'Stop');
    this.help = h('p', { id: 'composer-help', class: 'composer-help' }, 'Enter sends, Shift+Enter adds a line.');
    this.fullText = h('p', { class: 'full-text' });
    this.fullButton = h(
      'button',
      { type: 'button', class: 'primary small', onclick: () => this.newChat(this.fullButton, this.input.value) },
      'Start a new chat',
    );
    this.fullNotice = h(
      'div',
      { class: 'composer-notice', role: 'alert', hidden: true },
      h('p', { class: 'full-title' }, 'This chat is full'),
      this.fullText,
      this.fullButton,
    );
    this.composer = h(
      'form',
      { class: 'composer', onsubmit: (event) => { event.preventDefault(); this.send(); } },
      this.fullNotice,
      h('label', { for: this.input.id, class: 'visually-hidden' }, 'Message to the agent'),
      this.input,
      h('div', { class: 'composer-buttons' }, this.sendButton, this.stopButton),
      this.help,
    );
    this.watchNote = h(
      'p',
      { class: 'watch-note', hidden: true },
      'You are watching this chat. You can read everything here, but only participants can write, answer or approve.',
    );
    this.back = h('a', { class: 'back button ghost', href: '#/' }, h('span', { 'aria-hidden': 'true' }, '← '), 'Sessions');
    this.el = h(
      'section',
      { class: 'chat-view', 'aria-labelledby': this.titleId },
      h(
        'header',
        { class: 'chat-head' },
        this.back,
        h('div', { class: 'chat-title-row' }, this.title, this.status),
        h(
          'div',
          { class: 'chat-head-side' },
          this.presence,
          h('div', { class: 'chat-actions' }, this.newChatButton, this.auditButton),
        ),
      ),
      this.tabs,
      this.transcript,
      this.composer,
      this.watchNote,
    );
    this.seen = null;
  }

  suggest(text) {
    this.input.value = text;
    this.grow();
    this.input.focus();
  }

  async downloadAudit() {
    this.auditButton.disabled = true;
    try {
      await this.ctx.downloadAudit();
    } finally {
      this.auditButton.disabled = false;
    }
  }

  /** Start a new chat from `button`, taking `draft` along (both buttons wait
   * meanwhile); the new chat opens, or a toast says why not. */
  async newChat(button, draft = '') {
    this.newChatButton.disabled = true;
    this.fullButton.disabled = true;
    let opened = false;
    try {
      opened = await this.ctx.newChat(draft);
    } finally {
      this.newChatButton.disabled = false;
      this.fullButton.disabled = false;
    }
    // Not opened: the keyboard goes on from the button (disabling it took the focus).
    if (!opened && document.activeElement === document.body && !button.hidden) button.focus();
  }

  /** Put the keyboard in the composer (a chat just opened to write in). */
  focusComposer() {
    this.input.focus();
  }

  grow() {
    this.input.style.height = 'auto';
    this.input.style.height = `${Math.min(this.input.scrollHeight, 200)}px`;
  }

  send() {
    const text = this.input.value.trim();
    if (!text) return;
    if (this.activeTurn) {
      this.help.textContent = 'The agent is still working. Wait for it, or press Stop.';
      return;
    }
    // Cleared first: a turn refused on the spot (the chat still loading)
    // puts the text back (restore), and must find the composer empty.
    this.input.value = '';
    this.grow();
    this.ctx.startTurn(text);
  }

  /** Put text back into the composer (a turn the server refused), unless something new is typed. */
  restore(text) {
    if (!this.input.value.trim()) {
      this.input.value = text;
      this.grow();
    }
  }

  /**
   * Show the chat. `view` = {uri, session, chat, chatHref(uri), missing,
   * me (who the server takes this page for), clientId, mayCreateChats,
   * watching (this page only watches: nothing to write or stop),
   * full (the reason the server refused a turn here as full, or null)}.
   */
  update(view) {
    const { session, chat } = view;
    const people = peopleOf(session, view.uri, view.me);
    if (view.uri !== this.uri) {
      this.uri = view.uri;
      this.seen = null;
      for (const turn of this.turns.values()) turn.el.remove();
      this.turns.clear();
      this.list.replaceChildren();
      this.stickToBottom = true;
    }
    this.title.textContent = session?.title != null ? visibleControls(session.title) : view.missing ? 'Not found' : 'Loading…';
    document.title = session?.title ? `${visibleControls(session.title)} · Huddle` : 'Huddle';
    const activity = chat ? activityOf(chat.status) : null;
    this.status.hidden = !activity;
    if (activity) {
      this.status.className = `status-chip ${activity}`;
      this.status.textContent = ACTIVITY_LABEL[activity];
    }
    this.updateTabs(view);
    this.updatePresence(session, view.clientId);
    this.auditButton.hidden = !session;
    this.newChatButton.hidden = !session || !view.mayCreateChats;
    this.updateFull(view);
    const before = this.transcript.scrollHeight - this.transcript.scrollTop - this.transcript.clientHeight;
    const atBottom = this.stickToBottom || before < NEAR_BOTTOM_PX;
    const items = [];
    for (const turn of chat?.turns ?? []) items.push({ turn, active: false, people });
    if (chat?.activeTurn) items.push({ turn: chat.activeTurn, active: true, people });
    this.activeTurn = chat?.activeTurn ?? null;
    syncKeyed(this.list, this.turns, items, (item) => item.turn.id, (item) => new TurnView(item, this.ctx));
    this.empty.hidden = !chat || items.length > 0;
    this.composer.hidden = Boolean(view.watching);
    this.watchNote.hidden = !view.watching;
    if (this.suggestions) this.suggestions.hidden = Boolean(view.watching);
    this.emptyHint.textContent = view.watching
      ? 'When the agent asks for answers or an approval, you will see it here, and who gives them.'
      : 'Tell the agent what you need. When it needs answers or an approval, it asks everyone in this chat.';
    this.older.hidden = !chat?.turnsNextCursor;
    this.sendButton.disabled = !chat;
    this.sendButton.hidden = Boolean(this.activeTurn);
    this.stopButton.hidden = !this.activeTurn;
    if (!this.activeTurn) this.help.textContent = 'Enter sends, Shift+Enter adds a line.';
    this.input.disabled = view.missing;
    const fresh = chat ? this.announceNew(items) : [];
    if (atBottom && chat) {
      this.transcript.scrollTop = this.transcript.scrollHeight;
      this.stickToBottom = false;
      this.revealTop(fresh[0]);
    }
  }

  /** By the composer: this chat is full, and a new one can be started. */
  updateFull({ full, mayCreateChats }) {
    this.fullNotice.hidden = !full;
    this.fullButton.hidden = !mayCreateChats;
    const text = full ? fullChatText(full) : '';
    if (this.fullText.textContent !== text) this.fullText.textContent = text;
  }

  /** Who is here now: the session's active clients, by the names the server gave them. */
  updatePresence(session, clientId) {
    const people = session ? presentPeople(session.activeClients, clientId) : [];
    const key = JSON.stringify(people);
    if (key === this.presenceKey) return;
    this.presenceKey = key;
    this.presence.hidden = people.length === 0;
    this.presenceList.replaceChildren(
      ...people.map((person) =>
        h(
          'li',
          { class: `person${person.me ? ' me' : ''}` },
          h('span', { class: 'avatar', 'aria-hidden': 'true' }, initial(person.name)),
          h('span', { class: 'person-name', dir: 'auto' }, person.name),
          person.count > 1 ? h('span', { class: 'muted' }, ` ×${person.count}`) : null,
          person.me ? h('span', { class: 'muted' }, ' (you)') : null,
        ),
      ),
    );
  }

  updateTabs(view) {
    const chats = view.session?.chats ?? [];
    this.tabs.hidden = chats.length < 2;
    if (chats.length < 2) return;
    this.tabs.replaceChildren(
      ...chats.map((summary) => {
        const activity = activityOf(summary.status);
        return h(
          'a',
          { href: view.chatHref(summary.resource), class: 'tab', 'aria-current': summary.resource === view.uri ? 'page' : null },
          h('bdi', null, summary.title),
          activity === 'input' ? h('span', { class: 'dot input', title: 'Needs input' }, h('span', { class: 'visually-hidden' }, ' (needs input)')) : null,
        );
      }),
    );
  }

  /** Tell screen-reader users once when the agent asks for something new. */
  announceNew(items) {
    const open = [];
    for (const { turn, active } of items) {
      if (!active) continue;
      for (const part of turn.responseParts ?? []) {
        if (part.kind === 'inputRequest' && part.response == null) open.push([`ir:${part.request.id}`, 'The agent asks for input.']);
        if (part.kind === 'toolCall' && part.toolCall.status === 'pending-confirmation') {
          open.push([`tc:${part.toolCall.toolCallId}`, `The agent asks to run ${part.toolCall.displayName || part.toolCall.toolName}.`]);
        }
      }
    }
    const first = this.seen === null;
    this.seen ??= new Set();
    const fresh = [];
    for (const [key, text] of open) {
      if (this.seen.has(key)) continue;
      this.seen.add(key);
      fresh.push(key);
      if (!first) this.ctx.announce(text);
    }
    return fresh;
  }

  /** Scrolled to the bottom, a new request taller than the view shows its top. */
  revealTop(key) {
    const turn = this.activeTurn ? this.turns.get(this.activeTurn.id) : null;
    const el = key ? turn?.parts.get(key)?.el : null;
    if (!el) return;
    const top = el.getBoundingClientRect().top - this.transcript.getBoundingClientRect().top;
    if (top < 0) this.transcript.scrollTop += top - 12;
  }
}

function initial(name) {
  return [...name.trim()][0]?.toUpperCase() ?? '?';
}
