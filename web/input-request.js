// An input-request response part: the questions form while it is open, a URL
// to visit, or the resolved request with its response and final answers.
//
// `ctx` is the chat's: `dispatch(action)`, `check(action)` (the server's
// validation run locally: a reason or null), `isSending(requestId)` and
// `takeError(requestId)` (the reason the server gave for refusing the last
// completion, shown once). `people` (people.js) credits each answer and the
// completion to the person the server's notes name, and gives the deadline.

import { h, replaceChildren, uid } from './dom.js';
import { answerText, reasonSentence } from './format.js';
import { renderMarkdown, safeHref } from './markdown.js';
import {
  answerActivity,
  answerCredit,
  countdown,
  deadlineOf,
  displayOf,
  isExpired,
  requestNote,
} from './people.js';
import { createField, sameAnswer } from './questions.js';

const RESPONSE_LABEL = { accept: 'Submitted', decline: 'Declined', cancel: 'Cancelled' };
const URL_RESPONSE_LABEL = { accept: 'Done', decline: 'Declined', cancel: 'Cancelled' };

/** The parts of a URL for display, with the host separated out. */
export function urlParts(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch {
    return { ok: false, text: String(raw) };
  }
  const ok = url.protocol === 'http:' || url.protocol === 'https:';
  const credentials = url.username ? `${url.username}${url.password ? ':…' : ''}@` : '';
  return {
    ok,
    href: ok ? safeHref(url.href) : null,
    scheme: `${url.protocol}//`,
    credentials,
    host: url.host,
    rest: `${url.pathname}${url.search}${url.hash}`,
    protocol: url.protocol,
  };
}

/** The full URL with its host highlighted, as DOM. */
export function urlDisplay(raw) {
  const parts = urlParts(raw);
  if (!parts.host) return h('code', { class: 'url' }, parts.text ?? String(raw));
  return h(
    'code',
    { class: 'url' },
    h('span', { class: 'url-dim' }, parts.scheme),
    parts.credentials ? h('span', { class: 'url-credentials' }, parts.credentials) : null,
    h('strong', { class: 'url-host' }, parts.host),
    h('span', { class: 'url-dim' }, parts.rest),
  );
}

export class InputRequestView {
  constructor(part, turn, ctx, people = null) {
    this.ctx = ctx;
    this.el = h('section', { class: 'card request' });
    this.fields = new Map();
    this.mode = null;
    this.update({ part, turn, people });
  }

  update({ part, turn, people = null }) {
    const request = part.request;
    this.request = request;
    this.turn = turn;
    this.people = people;
    const note = requestNote(people, request.id, turn.stamp);
    const open = part.response == null && turn.active;
    const mode = open ? (request.url && !request.questions?.length ? 'url' : 'form') : 'resolved';
    const shape = JSON.stringify(request.questions ?? []);
    if (mode !== this.mode || (mode === 'form' && shape !== this.shape) || mode === 'resolved') {
      if (mode === 'resolved' && this.mode === 'resolved' && this.resolvedKey === this.keyOf(part, note)) return;
      this.mode = mode;
      this.shape = shape;
      this.build(part, note);
    }
    this.showDeadline(mode === 'resolved' ? null : deadlineOf(note));
    if (mode === 'form') {
      const me = people?.me ?? null;
      for (const question of request.questions ?? []) {
        const field = this.fields.get(question.id);
        const answer = request.answers?.[question.id];
        if (this.ctx.takeDiscarded?.(request.id, question.id)) field?.discard(answer);
        field?.sync(answer);
        field?.showAuthor(answerActivity(note, question.id, me));
      }
      this.showError(this.ctx.takeError(request.id));
    } else if (mode === 'url') {
      this.showError(this.ctx.takeError(request.id));
    }
  }

  keyOf(part, note) {
    return JSON.stringify([part.response, part.request.answers, this.ctx.isSending(part.request.id), note, isExpired(note)]);
  }

  /** The live countdown of an open request's deadline, if it has one. */
  showDeadline(deadline) {
    const key = deadline ? `${deadline.expiresAt} ${deadline.onExpiry}` : '';
    if (key === this.deadlineKey) return;
    this.deadlineKey = key;
    this.deadlineSlot.replaceChildren(deadline ? countdown(deadline, 'requests') : '');
    this.deadlineSlot.hidden = !deadline;
  }

  build(part, note) {
    for (const field of this.fields.values()) field.destroy();
    this.fields.clear();
    const request = part.request;
    this.titleId = uid('request');
    this.el.className = `card request ${this.mode}`;
    this.el.setAttribute('aria-labelledby', this.titleId);
    this.formError = h('p', { class: 'form-error', role: 'alert', hidden: true });
    this.deadlineSlot = h('span', { class: 'deadline', hidden: true });
    this.deadlineKey = '';
    if (this.mode === 'form') replaceChildren(this.el, this.buildForm(request));
    else if (this.mode === 'url') replaceChildren(this.el, this.buildUrl(request));
    else {
      this.resolvedKey = this.keyOf(part, note);
      replaceChildren(this.el, this.buildResolved(part, note));
    }
  }

  title(request, fallback) {
    const title = h('div', { class: 'card-title', id: this.titleId });
    title.append(request.message ? renderMarkdown(request.message) : h('p', null, fallback));
    return title;
  }

  buildForm(request) {
    const ctx = {
      requestId: request.id,
      send: (questionId, answer) => {
        const action = { type: 'chat/inputAnswerChanged', requestId: request.id, questionId };
        if (answer) action.answer = answer;
        this.ctx.dispatch(action);
      },
    };
    const fields = (request.questions ?? []).map((question) => {
      const field = createField(question, ctx);
      this.fields.set(question.id, field);
      return field.el;
    });
    // An observer sees the answers as people type them, with nothing to change or press.
    const watching = this.ctx.watching?.() ?? false;
    const form = h(
      'form',
      { novalidate: true, onsubmit: (event) => { event.preventDefault(); this.complete('accept'); } },
      watching ? h('fieldset', { class: 'answers', disabled: true }, fields) : fields,
      this.formError,
      watching
        ? h('p', { class: 'watch-only' }, 'Waiting for a participant to answer.')
        : h(
            'div',
            { class: 'actions' },
            h('button', { type: 'submit', class: 'primary' }, 'Submit'),
            h('button', { type: 'button', class: 'secondary', onclick: () => this.complete('decline') }, 'Decline'),
            h('button', { type: 'button', class: 'ghost', onclick: () => this.complete('cancel') }, 'Cancel request'),
          ),
    );
    return [
      h('div', { class: 'card-head' }, h('span', { class: 'badge need' }, 'Input needed'), this.deadlineSlot, shared()),
      this.title(request, 'The agent needs some answers.'),
      form,
    ];
  }

  buildUrl(request) {
    const parts = urlParts(request.url);
    const done = h('button', { type: 'button', class: 'secondary', onclick: () => this.complete('accept') }, 'Done');
    const open = parts.ok
      ? h(
          'a',
          {
            class: 'button primary',
            href: parts.href,
            target: '_blank',
            rel: 'noopener noreferrer',
            onclick: () => {
              done.className = 'primary';
            },
          },
          `Open ${parts.host}`,
          h('span', { class: 'visually-hidden' }, ' (opens in a new tab)'),
          h('span', { 'aria-hidden': 'true' }, ' ↗'),
        )
      : null;
    const warning = parts.ok
      ? h('p', { class: 'muted' }, 'Check the address before you open it. It opens in a new tab; come back and press Done when you have finished there.')
      : h('p', { class: 'warning' }, 'This is not an http or https link, so Huddle will not open it.');
    if (this.ctx.watching?.()) {
      return [
        h('div', { class: 'card-head' }, h('span', { class: 'badge need' }, 'Link to visit'), this.deadlineSlot, shared()),
        this.title(request, 'The agent asks someone to visit a page.'),
        h('div', { class: 'url-box' }, h('span', { class: 'url-label' }, 'Address'), urlDisplay(request.url)),
        h('p', { class: 'watch-only' }, 'Waiting for a participant to visit it.'),
      ];
    }
    return [
      h('div', { class: 'card-head' }, h('span', { class: 'badge need' }, 'Link to visit'), this.deadlineSlot, shared()),
      this.title(request, 'The agent asks you to visit a page.'),
      h('div', { class: 'url-box' }, h('span', { class: 'url-label' }, 'Address'), urlDisplay(request.url)),
      warning,
      this.formError,
      h(
        'div',
        { class: 'actions' },
        open,
        parts.ok ? done : null,
        h('button', { type: 'button', class: 'secondary', onclick: () => this.complete('decline') }, 'Decline'),
        h('button', { type: 'button', class: 'ghost', onclick: () => this.complete('cancel') }, 'Cancel request'),
      ),
    ];
  }

  buildResolved(part, note) {
    const request = part.request;
    const url = Boolean(request.url && !request.questions?.length);
    const sending = this.ctx.isSending(request.id);
    const by = note?.completed?.by;
    let badge;
    let credit = null;
    if (sending) badge = h('span', { class: 'badge pending' }, 'Sending…');
    else if (part.response) {
      const label = (url ? URL_RESPONSE_LABEL : RESPONSE_LABEL)[part.response] ?? part.response;
      badge = h('span', { class: `badge ${part.response === 'accept' ? 'ok' : 'muted'}` }, label);
      // No person completed it and its time is up: it expired.
      if (by?.name) credit = h('span', { class: 'credit' }, 'by ', h('bdi', null, displayOf(by)));
      else if (isExpired(note)) credit = h('span', { class: 'badge muted expired' }, 'Expired');
    } else badge = h('span', { class: 'badge muted' }, 'Not answered');
    const answers = (request.questions ?? []).map((question) => {
      const text = answerText(question, request.answers?.[question.id]);
      const who = text === null ? '' : answerCredit(note, question.id);
      return [
        h('dt', null, question.title || question.message),
        h(
          'dd',
          { class: text === null ? 'muted' : null },
          h('span', { class: 'answer-text' }, text ?? 'No answer'),
          who ? h('span', { class: 'credit' }, ` — ${who}`) : null,
        ),
      ];
    });
    return [
      h('div', { class: 'card-head' }, h('span', { class: 'outcome' }, badge, credit ? ' ' : null, credit)),
      this.title(request, url ? 'A page to visit.' : 'Questions from the agent.'),
      url ? h('div', { class: 'url-box' }, h('span', { class: 'url-label' }, 'Address'), urlDisplay(request.url)) : null,
      answers.length ? h('dl', { class: 'answers' }, answers) : null,
    ];
  }

  complete(response) {
    const request = this.request;
    const action = { type: 'chat/inputCompleted', requestId: request.id, response };
    if (response === 'accept' && this.mode === 'form') {
      let firstBad = null;
      for (const field of this.fields.values()) {
        field.flush();
        if (field.validate() && !firstBad) firstBad = field;
      }
      if (firstBad) {
        this.showError('Some answers need attention.');
        firstBad.focus();
        return;
      }
      // Only what this completion changes: an answer already in the shared
      // state as it is stays its author's (the server credits the sender
      // with every answer the completion carries).
      const answers = {};
      for (const [id, field] of this.fields) {
        const answer = field.current();
        if (answer && answer !== 'invalid' && !sameAnswer(answer, field.lastAnswer)) answers[id] = answer;
      }
      action.answers = answers;
    }
    const problem = this.ctx.check(action);
    if (problem) {
      this.showError(reasonSentence(problem));
      return;
    }
    for (const field of this.fields.values()) field.cancel();
    this.ctx.dispatch(action);
  }

  showError(reason) {
    if (reason === undefined) return;
    this.formError.textContent = reason ? reasonSentence(reason) : '';
    this.formError.hidden = !reason;
  }

  destroy() {
    for (const field of this.fields.values()) field.destroy();
  }
}

function shared() {
  return h('span', { class: 'card-note' }, 'Everyone in this chat sees answers as they are typed');
}
