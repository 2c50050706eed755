// The sessions list: each session with its status (needs input, in
// progress, error, idle), an unread marker and when it last changed; and
// the form that creates a session.

import { h, syncKeyed, uid } from './dom.js';
import { ACTIVITY_LABEL, activityOf, relativeTime } from './format.js';

class SessionItem {
  constructor(item) {
    this.link = h('a', { class: 'session-link' });
    this.el = h('li', { class: 'session' }, this.link);
    this.update(item);
  }

  update({ summary, current, unread, href, now }) {
    const key = JSON.stringify([summary, current, unread, relativeTime(summary.modifiedAt, now)]);
    if (key === this.key) return;
    this.key = key;
    const activity = activityOf(summary.status);
    this.link.href = href;
    if (current) this.link.setAttribute('aria-current', 'page');
    else this.link.removeAttribute('aria-current');
    this.el.classList.toggle('unread', unread);
    this.el.dataset.activity = activity;
    this.link.replaceChildren(
      h('span', { class: `dot ${activity}`, 'aria-hidden': 'true' }),
      h(
        'span',
        { class: 'session-main' },
        h('span', { class: 'session-title', dir: 'auto' }, summary.title || 'Untitled session'),
        h(
          'span',
          { class: 'session-meta' },
          h('span', { class: `session-status ${activity}` }, ACTIVITY_LABEL[activity]),
          summary.activity ? h('span', { class: 'session-activity' }, ` · ${summary.activity}`) : null,
        ),
      ),
      h(
        'span',
        { class: 'session-side' },
        h('time', { datetime: summary.modifiedAt }, relativeTime(summary.modifiedAt, now)),
        unread ? h('span', { class: 'unread-dot' }, h('span', { class: 'visually-hidden' }, 'unread')) : null,
      ),
    );
  }
}

export class SessionsView {
  /** @param {{create(title: string): Promise<void>}} ctx */
  constructor(ctx) {
    this.ctx = ctx;
    this.items = new Map();
    this.list = h('ul', { class: 'session-list', 'aria-label': 'Sessions' });
    this.empty = h('p', { class: 'muted empty-list', hidden: true }, 'No sessions yet. Create one to start.');
    const titleId = uid('new-session-title');
    this.titleInput = h('input', { id: titleId, type: 'text', maxlength: 200, placeholder: 'e.g. Login failures', autocomplete: 'off' });
    this.createError = h('p', { class: 'form-error', role: 'alert', hidden: true });
    this.createButton = h('button', { type: 'submit', class: 'primary' }, 'Create');
    this.form = h(
      'form',
      { class: 'new-session', hidden: true, onsubmit: (event) => { event.preventDefault(); this.create(); } },
      h('label', { for: titleId }, 'Title of the new session'),
      this.titleInput,
      this.createError,
      h(
        'div',
        { class: 'actions' },
        this.createButton,
        h('button', { type: 'button', class: 'ghost', onclick: () => this.toggleForm(false) }, 'Cancel'),
      ),
    );
    this.newButton = h(
      'button',
      { type: 'button', class: 'primary small', 'aria-expanded': 'false', onclick: () => this.toggleForm(this.form.hidden) },
      '+ New session',
    );
    this.el = h(
      'div',
      { class: 'sessions' },
      h('div', { class: 'sessions-head' }, h('h2', null, 'Sessions'), this.newButton),
      this.form,
      this.list,
      this.empty,
    );
  }

  toggleForm(open) {
    this.form.hidden = !open;
    this.newButton.setAttribute('aria-expanded', String(open));
    if (open) this.titleInput.focus();
    else this.newButton.focus();
  }

  async create() {
    const title = this.titleInput.value.trim() || 'New session';
    this.createButton.disabled = true;
    this.createError.hidden = true;
    try {
      await this.ctx.create(title);
      this.titleInput.value = '';
      this.form.hidden = true;
      this.newButton.setAttribute('aria-expanded', 'false');
    } catch (error) {
      this.createError.textContent = `Could not create the session: ${error.message}`;
      this.createError.hidden = false;
    } finally {
      this.createButton.disabled = false;
    }
  }

  /** `entries`: [{summary, current, unread, href}], most recent first;
   * `watching`: this page only watches (no new sessions). */
  update(entries, { loaded, watching = false }) {
    this.newButton.hidden = watching;
    if (watching) this.form.hidden = true;
    const now = Date.now();
    syncKeyed(
      this.list,
      this.items,
      entries.map((entry) => ({ ...entry, now })),
      (entry) => entry.summary.resource,
      (entry) => new SessionItem(entry),
    );
    this.empty.hidden = !loaded || entries.length > 0;
  }
}
