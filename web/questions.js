// One question of an input request as a form field, for every AHP question
// kind: text (format hints, length limits), number and integer (bounds),
// boolean, single-select (recommended option, free-form "Other") and
// multi-select (min/max, free-form entries).
//
// A field is co-edited: `sync(answer)` shows the answer in the shared state
// (someone else's draft appears live), except in a text box that has focus
// or unsent typing, which is never disturbed. Typing is sent as a draft
// after a pause (DEBOUNCE_MS, at most MAX_WAIT_MS while typing goes on),
// never per keystroke; a click on an option is sent at once.
//
// An answer is `submitted` once its author is done with it: when they
// leave the field, or choose an option, and it passes the question's rules
// (else it stays a draft). So others see "Dana is typing…" while she types
// and "answered by Dana" after, and the answer stays hers when someone
// else submits the request (which carries only the answers it changes).

import { h, uid, visibleControls } from './dom.js';
import { fieldMessage } from './format.js';
import { answerProblem } from './validation.js';

export const DEBOUNCE_MS = 300;
export const MAX_WAIT_MS = 1200;
const MANY_OPTIONS = 8;

const FORMAT_HINT = {
  email: 'An email address',
  uri: 'A full URL, like https://example.com',
  date: 'A date, YYYY-MM-DD',
  'date-time': 'A date and time, like 2026-07-28T14:30:00Z',
};

const INPUT_TYPE = { email: 'email', uri: 'url', date: 'date' };

/** Whether two answers say the same (state and value, whatever the key order). */
export function sameAnswer(a, b) {
  if (!a || !b) return !a && !b;
  return a.state === b.state && canonical(a.value) === canonical(b.value);
}

function canonical(value) {
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  if (value && typeof value === 'object') {
    const keys = Object.keys(value).filter((key) => value[key] !== undefined).sort();
    return `{${keys.map((key) => `${JSON.stringify(key)}:${canonical(value[key])}`).join(',')}}`;
  }
  return JSON.stringify(value ?? null);
}

function plural(n, noun) {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

function lengthHint(min, max) {
  if (min != null && max != null) return min === max ? plural(min, 'character') : `${min}–${max} characters`;
  if (min != null) return `At least ${plural(min, 'character')}`;
  if (max != null) return `At most ${plural(max, 'character')}`;
  return null;
}

function boundsHint(min, max, integer) {
  const what = integer ? 'A whole number' : 'A number';
  if (min != null && max != null) return `${what} from ${min} to ${max}`;
  if (min != null) return `${what}, at least ${min}`;
  if (max != null) return `${what}, at most ${max}`;
  return integer ? what : null;
}

function countHint(min, max) {
  if (min != null && max != null) return min === max ? `Choose ${min}` : `Choose ${min} to ${max}`;
  if (min != null) return `Choose at least ${min}`;
  if (max != null) return `Choose up to ${max}`;
  return 'Choose any that apply';
}

/**
 * A field for `question`. `ctx.send(questionId, answer|null)` dispatches an
 * answer change (a draft, a skip, or null to clear); `ctx.requestId` names
 * the request in validation messages.
 */
export function createField(question, ctx) {
  switch (question.kind) {
    case 'text':
      return new TextField(question, ctx);
    case 'number':
    case 'integer':
      return new NumberField(question, ctx);
    case 'boolean':
      return new BooleanField(question, ctx);
    case 'single-select':
      return question.options.length > MANY_OPTIONS && !question.allowFreeformInput
        ? new DropdownField(question, ctx)
        : new SingleSelectField(question, ctx);
    case 'multi-select':
      return new MultiSelectField(question, ctx);
    default:
      return new UnknownField(question, ctx);
  }
}

class Field {
  constructor(question, ctx) {
    this.question = question;
    this.ctx = ctx;
    this.id = uid('q');
    this.timer = null;
    this.firstChange = 0;
    this.touched = false;
    this.skipped = false;
    this.lastAnswer = undefined;
    /** A draft of mine is the field's answer, and I have not left the field since. */
    this.ownDraft = false;
    this.disabled = false;
    this.messageId = `${this.id}-message`;
    this.hintId = `${this.id}-hint`;
    this.errorId = `${this.id}-error`;
  }

  /** The label text and the description under it. */
  titleParts() {
    const { title, message } = this.question;
    return title ? [title, message] : [message, null];
  }

  labelContent() {
    const [title] = this.titleParts();
    return [
      h('span', { class: 'q-title' }, title),
      this.question.required
        ? h('span', { class: 'q-required' }, h('span', { 'aria-hidden': 'true' }, '*'), h('span', { class: 'visually-hidden' }, ' (required)'))
        : h('span', { class: 'q-optional' }, ' (optional)'),
    ];
  }

  describedBy() {
    return [this.titleParts()[1] ? this.messageId : null, this.hint ? this.hintId : null, this.errorId]
      .filter(Boolean)
      .join(' ');
  }

  /** Build the field's frame around `body` (the controls). */
  frame(labelEl, body, { group = false } = {}) {
    const [, description] = this.titleParts();
    this.error = h('p', { class: 'q-error', id: this.errorId, hidden: true });
    this.hintEl =
      this.hint || this.count
        ? h('p', { class: 'q-hint', id: this.hintId }, h('span', null, this.hint), this.count)
        : null;
    this.body = h('div', { class: 'q-body' }, body, this.hintEl);
    this.answerButton = h('button', { type: 'button', class: 'link', onclick: () => this.unskip() }, 'Answer it');
    this.skippedNote = h('p', { class: 'q-skipped', hidden: true }, 'Skipped. ', this.answerButton);
    const skip = this.question.required
      ? null
      : h('button', { type: 'button', class: 'link q-skip', onclick: () => this.skip() }, 'Skip');
    this.skipButton = skip;
    const header = h('div', { class: 'q-header' }, labelEl, skip);
    this.authorEl = h('p', { class: 'q-author', hidden: true });
    const content = [
      header,
      this.authorEl,
      description ? h('p', { class: 'q-message', id: this.messageId }, description) : null,
      this.body,
      this.skippedNote,
      this.error,
    ];
    this.el = group
      ? h('fieldset', { class: 'field', 'aria-describedby': this.describedBy() }, content)
      : h('div', { class: 'field' }, content);
    this.el.dataset.questionId = this.question.id;
    this.el.addEventListener('focusout', (event) => {
      if (this.el.contains(event.relatedTarget)) return;
      const sent = this.settle();
      if (this.touched) this.validate();
      // Show what others changed meanwhile (after our own send, the next render does).
      if (!sent && this.lastAnswer !== undefined) this.sync(this.lastAnswer);
    });
    return this.el;
  }

  // ─── Sending ─────────────────────────────────────────────────────────

  /** The controls changed: send the draft after a pause. */
  changed() {
    this.touched = true;
    this.clearError();
    const now = Date.now();
    if (this.timer === null) this.firstChange = now;
    clearTimeout(this.timer);
    const wait = Math.max(0, Math.min(DEBOUNCE_MS, this.firstChange + MAX_WAIT_MS - now));
    this.timer = setTimeout(() => this.flush(), wait);
  }

  /** A discrete choice changed: send it now, as the answer if it fits. */
  chosen() {
    this.touched = true;
    this.clearError();
    this.cancel();
    this.sendCurrent(true);
  }

  /** The person left the field: their draft becomes their answer
   * (submitted if it fits the question). True if something was sent. */
  settle() {
    if (this.timer === null && !this.ownDraft) return false;
    this.cancel();
    return this.sendCurrent(true);
  }

  /** Send the unsent draft, if any; true if something was sent. */
  flush() {
    if (this.timer === null) return false;
    this.cancel();
    return this.sendCurrent();
  }

  /** Send what the controls hold now as a draft, or as `final` the
   * submitted answer when it fits the question (or clear the answer). */
  sendCurrent(final = false) {
    const value = this.read();
    if (value === 'invalid') return false;
    if (value === null) {
      this.send(this.emptyAnswer());
      this.ownDraft = false;
      return true;
    }
    const fits = final && answerProblem(this.question, { state: 'submitted', value }, this.ctx.requestId) === null;
    const answer = { state: fits ? 'submitted' : 'draft', value };
    if (final && sameAnswer(answer, this.lastAnswer)) return false; // said already
    this.send(answer);
    return true;
  }

  send(answer) {
    this.lastAnswer = answer; // what the shared state will say once it arrives
    this.ownDraft = answer?.state === 'draft';
    this.ctx.send(this.question.id, answer);
  }

  /** Say what someone else is doing with this answer ('' for nothing). */
  showAuthor(text) {
    const shown = visibleControls(text);
    if (this.authorEl.textContent !== shown) this.authorEl.textContent = shown;
    this.authorEl.hidden = !text;
  }

  /** What clearing the field sends: null (no answer) by default. */
  emptyAnswer() {
    return null;
  }

  /** Drop what was typed here, even while the person is still in the
   * field, and show `answer` (the shared one): the edit was not sent
   * (overtaken.js), and leaving the field must not send it after all. */
  discard(answer) {
    this.cancel();
    this.ownDraft = false;
    this.lastAnswer = answer ?? null;
    this.write(answer?.value ?? null);
  }

  /** Drop unsent typing (the request is being completed). */
  cancel() {
    clearTimeout(this.timer);
    this.timer = null;
  }

  skip() {
    const hadFocus = document.activeElement === this.skipButton;
    this.cancel();
    this.touched = false;
    this.clearError();
    // Record the skip before hiding the focused button: hiding it moves the
    // focus out of the field, and leaving the field re-shows the last answer.
    this.send({ state: 'skipped' });
    this.setSkipped(true);
    if (hadFocus) this.answerButton.focus(); // keyboard users stay where they were
  }

  unskip() {
    this.setSkipped(false);
    this.send(null);
    this.focus();
  }

  setSkipped(skipped) {
    this.skipped = skipped;
    this.el.classList.toggle('is-skipped', skipped);
    this.body.hidden = skipped;
    this.skippedNote.hidden = !skipped;
    if (this.skipButton) this.skipButton.hidden = skipped;
  }

  // ─── Showing the shared state ────────────────────────────────────────

  /** Is someone typing here now (focus in a text box, or unsent typing)? */
  editing() {
    if (this.timer !== null) return true;
    const active = document.activeElement;
    return active !== null && this.el.contains(active) && this.isTextControl(active);
  }

  isTextControl(el) {
    return el.tagName === 'TEXTAREA' || (el.tagName === 'INPUT' && !['radio', 'checkbox'].includes(el.type));
  }

  /** Show `answer` (the shared state's), unless that would disturb typing. */
  sync(answer) {
    this.lastAnswer = answer ?? null;
    if (answer?.state === 'skipped') {
      if (!this.skipped) this.setSkipped(true);
      return;
    }
    if (this.skipped) this.setSkipped(false);
    if (this.editing()) return;
    this.ownDraft = false; // what the field shows now is the shared answer
    const before = this.read();
    this.write(answer?.value ?? null);
    const after = this.read();
    if (this.synced && JSON.stringify(before) !== JSON.stringify(after)) this.flash();
    this.synced = true;
  }

  flash() {
    this.el.classList.remove('remote-change');
    void this.el.offsetWidth; // restart the animation
    this.el.classList.add('remote-change');
  }

  /** The answer to submit: skipped, submitted with a value, or null (none). */
  current() {
    if (this.skipped) return { state: 'skipped' };
    const value = this.read();
    if (value === 'invalid') return 'invalid';
    return value === null ? null : { state: 'submitted', value };
  }

  /** Check the answer as the server will on submit; show and return the problem. */
  validate() {
    const answer = this.current();
    let problem = null;
    if (answer === 'invalid') problem = this.invalidMessage();
    else if (answer === null) problem = this.question.required ? 'This question is required.' : null;
    else {
      const reason = answerProblem(this.question, answer, this.ctx.requestId);
      problem = reason ? fieldMessage(reason) : null;
    }
    this.showError(problem);
    return problem;
  }

  invalidMessage() {
    return 'Enter a valid value.';
  }

  showError(text) {
    this.error.textContent = text ?? '';
    this.error.hidden = !text;
    this.el.classList.toggle('has-error', Boolean(text));
    for (const control of this.controls()) {
      if (text) control.setAttribute('aria-invalid', 'true');
      else control.removeAttribute('aria-invalid');
    }
  }

  clearError() {
    if (!this.error.hidden) this.showError(null);
  }

  setDisabled(disabled) {
    this.disabled = disabled;
    for (const control of this.el.querySelectorAll('input, textarea, select, button')) control.disabled = disabled;
  }

  controls() {
    return [...this.body.querySelectorAll('input, textarea, select')];
  }

  focus() {
    (this.controls().find((c) => c.checked) ?? this.controls()[0])?.focus();
  }

  destroy() {
    this.cancel();
  }
}

// ─── Text ────────────────────────────────────────────────────────────────

class TextField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    const { format, min, max } = question;
    this.hint = [FORMAT_HINT[format], lengthHint(min, max)].filter(Boolean).join(' · ') || null;
    const long = max == null || max > 120;
    const props = {
      id: this.id,
      name: question.id,
      'aria-describedby': this.describedBy(),
      'aria-required': question.required ? 'true' : null,
      autocomplete: 'off',
      spellcheck: format ? 'false' : null,
      oninput: () => {
        this.updateCount();
        this.changed();
      },
    };
    this.input = long && !format
      ? h('textarea', { ...props, rows: 3 })
      : h('input', { ...props, type: INPUT_TYPE[format] ?? 'text', inputmode: format === 'email' ? 'email' : null });
    this.count = max != null ? h('span', { class: 'q-count', 'aria-hidden': 'true' }) : null;
    this.frame(h('label', { for: this.id }, this.labelContent()), this.input);
    this.updateCount();
  }

  updateCount() {
    if (!this.count) return;
    const length = [...this.input.value].length;
    this.count.textContent = `${length}/${this.question.max}`;
    this.count.classList.toggle('over', length > this.question.max);
  }

  read() {
    return this.input.value === '' ? null : { kind: 'text', value: this.input.value };
  }

  emptyAnswer() {
    // With a default, an empty box is a deliberate answer; without one it is none.
    return this.question.defaultValue != null ? { state: 'draft', value: { kind: 'text', value: '' } } : null;
  }

  write(value) {
    const text = value?.kind === 'text' ? value.value : (this.question.defaultValue ?? '');
    if (this.input.value !== text) this.input.value = text;
    this.updateCount();
  }
}

// ─── Numbers ─────────────────────────────────────────────────────────────

class NumberField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    const integer = question.kind === 'integer';
    this.hint = boundsHint(question.min, question.max, integer);
    this.input = h('input', {
      id: this.id,
      name: question.id,
      type: 'number',
      step: integer ? '1' : 'any',
      min: question.min,
      max: question.max,
      inputmode: integer ? 'numeric' : 'decimal',
      'aria-describedby': this.describedBy(),
      'aria-required': question.required ? 'true' : null,
      oninput: () => this.changed(),
    });
    this.frame(h('label', { for: this.id }, this.labelContent()), this.input);
  }

  read() {
    if (this.input.validity.badInput) return 'invalid';
    if (this.input.value === '') return null;
    const number = Number(this.input.value);
    return Number.isFinite(number) ? { kind: 'number', value: number } : 'invalid';
  }

  invalidMessage() {
    return this.question.kind === 'integer' ? 'Enter a whole number.' : 'Enter a number.';
  }

  write(value) {
    const number = value?.kind === 'number' ? value.value : this.question.defaultValue;
    const text = number == null ? '' : String(number);
    if (this.input.value !== text || this.input.validity.badInput) this.input.value = text;
  }
}

// ─── Choices ─────────────────────────────────────────────────────────────

function optionLabel(option, inputEl, extra) {
  return h(
    'label',
    { class: 'option' },
    inputEl,
    h(
      'span',
      { class: 'option-text' },
      h('span', { class: 'option-label' }, option.label),
      option.recommended ? h('span', { class: 'badge recommended' }, 'Recommended') : null,
      option.description ? h('span', { class: 'option-description' }, option.description) : null,
    ),
    extra,
  );
}

class BooleanField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    const name = this.id;
    this.yes = h('input', { type: 'radio', name, value: 'true', onchange: () => this.chosen() });
    this.no = h('input', { type: 'radio', name, value: 'false', onchange: () => this.chosen() });
    this.frame(
      h('legend', null, this.labelContent()),
      h('div', { class: 'options inline' }, optionLabel({ label: 'Yes' }, this.yes), optionLabel({ label: 'No' }, this.no)),
      { group: true },
    );
  }

  read() {
    if (this.yes.checked) return { kind: 'boolean', value: true };
    if (this.no.checked) return { kind: 'boolean', value: false };
    return null;
  }

  write(value) {
    const chosen = value?.kind === 'boolean' ? value.value : this.question.defaultValue;
    this.yes.checked = chosen === true;
    this.no.checked = chosen === false;
  }
}

function recommendedIds(question) {
  return question.options.filter((option) => option.recommended).map((option) => option.id);
}

class SingleSelectField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    const name = this.id;
    this.radios = question.options.map((option) =>
      h('input', { type: 'radio', name, value: option.id, onchange: () => this.chosen() }),
    );
    const items = question.options.map((option, index) => optionLabel(option, this.radios[index]));
    if (question.allowFreeformInput) {
      this.otherRadio = h('input', {
        type: 'radio',
        name,
        value: '',
        'aria-label': 'Other',
        onchange: () => {
          this.chosen();
          this.otherText.focus();
        },
      });
      this.otherText = h('input', {
        type: 'text',
        class: 'other-text',
        'aria-label': `Other answer to ${this.titleParts()[0]}`,
        placeholder: 'Other…',
        oninput: () => {
          this.otherRadio.checked = this.otherText.value !== '' || this.otherRadio.checked;
          this.changed();
        },
      });
      items.push(h('div', { class: 'option other' }, this.otherRadio, this.otherText));
    }
    this.frame(h('legend', null, this.labelContent()), h('div', { class: 'options' }, items), { group: true });
  }

  read() {
    const checked = this.radios.find((radio) => radio.checked);
    if (checked) return { kind: 'selected', value: checked.value };
    if (this.otherRadio?.checked) {
      const text = this.otherText.value.trim();
      // Huddle reads a free-form single answer from freeformValues; `value`
      // carries it too for clients that read only `value`.
      return text ? { kind: 'selected', value: text, freeformValues: [text] } : null;
    }
    return null;
  }

  write(value) {
    let id = null;
    let other = '';
    if (value?.kind === 'selected') {
      if (value.freeformValues?.length) other = value.freeformValues[0];
      else if (this.question.options.some((option) => option.id === value.value)) id = value.value;
      else other = value.value;
    } else {
      id = recommendedIds(this.question)[0] ?? null;
    }
    for (const radio of this.radios) radio.checked = radio.value === id;
    if (this.otherRadio) {
      this.otherRadio.checked = id === null && other !== '';
      if (this.otherText.value !== other) this.otherText.value = other;
    }
  }
}

class DropdownField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    this.select = h(
      'select',
      {
        id: this.id,
        name: question.id,
        'aria-describedby': this.describedBy(),
        'aria-required': question.required ? 'true' : null,
        onchange: () => this.chosen(),
      },
      h('option', { value: '' }, 'Choose…'),
      question.options.map((option) =>
        h('option', { value: option.id }, option.recommended ? `${option.label} (recommended)` : option.label),
      ),
    );
    this.frame(h('label', { for: this.id }, this.labelContent()), this.select);
  }

  read() {
    return this.select.value ? { kind: 'selected', value: this.select.value } : null;
  }

  write(value) {
    const id = value?.kind === 'selected' ? value.value : (recommendedIds(this.question)[0] ?? '');
    if (this.select.value !== id) this.select.value = id;
  }
}

class MultiSelectField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    this.hint = countHint(question.min, question.max);
    this.boxes = question.options.map((option) =>
      h('input', { type: 'checkbox', value: option.id, onchange: () => this.chosen() }),
    );
    const items = question.options.map((option, index) => optionLabel(option, this.boxes[index]));
    this.freeform = [];
    if (question.allowFreeformInput) {
      this.chips = h('ul', { class: 'chips', 'aria-label': 'Your other answers' });
      this.otherText = h('input', {
        type: 'text',
        class: 'other-text',
        'aria-label': `Add another answer to ${this.titleParts()[0]}`,
        placeholder: 'Other…',
        onkeydown: (event) => {
          if (event.key === 'Enter') {
            event.preventDefault();
            this.addOther();
          }
        },
      });
      const add = h('button', { type: 'button', class: 'secondary small', onclick: () => this.addOther() }, 'Add');
      items.push(h('div', { class: 'option other' }, this.otherText, add), this.chips);
    }
    this.frame(h('legend', null, this.labelContent()), h('div', { class: 'options' }, items), { group: true });
  }

  addOther() {
    const text = this.otherText.value.trim();
    if (!text || this.freeform.includes(text)) return;
    this.freeform = [...this.freeform, text];
    this.otherText.value = '';
    this.renderChips();
    this.chosen();
  }

  removeOther(text) {
    this.freeform = this.freeform.filter((item) => item !== text);
    this.renderChips();
    this.chosen();
    this.otherText.focus();
  }

  renderChips() {
    if (!this.chips) return;
    this.chips.replaceChildren(
      ...this.freeform.map((text) =>
        h(
          'li',
          { class: 'chip' },
          h('span', null, text),
          h('button', {
            type: 'button',
            class: 'chip-remove',
            'aria-label': `Remove ${text}`,
            disabled: this.disabled,
            onclick: () => this.removeOther(text),
          }, '×'),
        ),
      ),
    );
  }

  read() {
    const ids = this.boxes.filter((box) => box.checked).map((box) => box.value);
    const value = { kind: 'selected-many', value: ids };
    if (this.freeform.length) value.freeformValues = [...this.freeform];
    return value;
  }

  current() {
    if (this.skipped) return { state: 'skipped' };
    const ids = this.boxes.filter((box) => box.checked).map((box) => box.value);
    if (!ids.length && !this.freeform.length && this.question.required && this.question.min == null) return null;
    const value = { kind: 'selected-many', value: ids };
    if (this.freeform.length) value.freeformValues = [...this.freeform];
    return { state: 'submitted', value };
  }

  write(value) {
    const ids = value?.kind === 'selected-many' ? value.value : recommendedIds(this.question);
    for (const box of this.boxes) box.checked = ids.includes(box.value);
    const free = value?.kind === 'selected-many' ? (value.freeformValues ?? []) : [];
    if (JSON.stringify(free) !== JSON.stringify(this.freeform)) {
      this.freeform = [...free];
      this.renderChips();
    }
  }
}

class UnknownField extends Field {
  constructor(question, ctx) {
    super(question, ctx);
    this.frame(h('p', null, this.labelContent()), h('p', { class: 'muted' }, 'This kind of question cannot be answered here.'));
  }

  read() {
    return null;
  }

  write() {}
}
