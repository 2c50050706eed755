// A tool-call response part through its lifecycle: streaming, waiting for
// approval (tool, what it will do, its input, editable when the call allows
// it and checked as JSON before sending, the options the server gives, a
// reason on deny), running, result confirmation, completed, cancelled.
// Who approved or denied it, and how long it still waits, come from the
// session's notes (people.js).

import { h, plainText, replaceChildren, uid } from './dom.js';
import { reasonSentence } from './format.js';
import { renderMarkdown } from './markdown.js';
import { countdown, deadlineOf, displayOf, isExpired, toolCallNote } from './people.js';

/** StringOrMarkdown as DOM: markdown rendered safely, a string as text. */
function richText(value, tag = 'div') {
  if (value && typeof value === 'object' && typeof value.markdown === 'string') {
    return h(tag, { class: 'md' }, renderMarkdown(value.markdown));
  }
  return h(tag, null, plainText(value));
}

/** Pretty JSON if `text` parses, else the text as it is. */
export function prettyJson(text) {
  if (text == null) return '';
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return String(text);
  }
}

/** Why `text` is not an acceptable edited tool input (a JSON object), or null. */
export function toolInputProblem(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return `This is not valid JSON: ${error.message.replace(/^JSON\.parse: /, '')}`;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    return 'The input must be a JSON object, like {"key": "value"}.';
  }
  return null;
}

function contentText(content) {
  return (content ?? [])
    .map((item) => (item.type === 'text' ? item.text : item.type === 'terminal' ? item.result?.preview ?? item.title : `[${item.type}]`))
    .filter(Boolean)
    .join('\n');
}

const CANCEL_LABEL = { denied: 'Denied', skipped: 'Skipped', 'result-denied': 'Result rejected' };

export class ToolCallView {
  constructor(part, turn, ctx, people = null) {
    this.ctx = ctx;
    this.el = h('section', { class: 'card tool' });
    this.status = null;
    this.update({ part, turn, people });
  }

  update({ part, turn, people = null }) {
    const call = part.toolCall;
    const note = toolCallNote(people, call.toolCallId, turn.stamp);
    this.note = note;
    // While it waits only its deadline matters (a rebuild would drop a typed
    // reason); afterwards who decided, and whether it expired.
    const told = call.status === 'pending-confirmation' ? [note?.expiresAt, note?.onExpiry] : [note, isExpired(note)];
    const key = JSON.stringify([call.status, turn.active, this.ctx.isSending(call.toolCallId), told]);
    const changed = key !== this.key;
    this.call = call;
    this.turn = turn;
    if (changed || (call.status !== 'pending-confirmation' && call !== this.lastCall)) {
      this.key = key;
      this.build();
    }
    this.lastCall = call;
    const error = this.ctx.takeError(call.toolCallId);
    if (error !== undefined && this.errorEl) {
      this.errorEl.textContent = error ? reasonSentence(error) : '';
      this.errorEl.hidden = !error;
    }
  }

  build() {
    const call = this.call;
    this.titleId = uid('tool');
    this.el.setAttribute('aria-labelledby', this.titleId);
    this.errorEl = h('p', { class: 'form-error', role: 'alert', hidden: true });
    const open = this.turn.active;
    let children;
    switch (call.status) {
      case 'pending-confirmation':
        children = open ? this.buildApproval() : this.buildSummary('muted', 'Not confirmed');
        break;
      case 'pending-result-confirmation':
        children = open ? this.buildResultCheck() : this.buildSummary('muted', 'Result not confirmed');
        break;
      case 'streaming':
        children = this.buildProgress('Preparing', call.partialInput);
        break;
      case 'running':
        children = this.buildProgress('Running', contentText(call.content));
        break;
      case 'auth-required':
        children = this.buildSummary('need', 'Sign-in needed', call.auth?.description);
        break;
      case 'completed':
        children = this.buildDone();
        break;
      case 'cancelled':
        children = this.buildSummary('muted', CANCEL_LABEL[call.reason] ?? 'Cancelled', plainText(call.reasonMessage));
        break;
      default:
        children = this.buildSummary('muted', call.status);
    }
    this.el.className = `card tool ${call.status}`;
    replaceChildren(this.el, children, this.decision());
  }

  /** Who approved or denied the call (from the notes), or that it expired undecided. */
  decision() {
    const call = this.call;
    if (call.status === 'pending-confirmation' && this.turn.active) return null;
    const decided = this.note?.decided;
    if (decided?.by?.name) {
      return h('p', { class: 'credit' }, `${decided.approved ? 'Approved' : 'Denied'} by ${displayOf(decided.by)}`);
    }
    if (isExpired(this.note) && ['pending-confirmation', 'cancelled'].includes(call.status)) {
      return h('p', { class: 'credit' }, 'Expired');
    }
    return null;
  }

  name() {
    const call = this.call;
    return h(
      'span',
      { class: 'tool-name', id: this.titleId },
      call.displayName || call.toolName,
      call.displayName && call.displayName !== call.toolName ? h('code', { class: 'tool-id' }, call.toolName) : null,
    );
  }

  inputBlock(label = 'Input') {
    if (this.call.toolInput == null) return null;
    return h('details', { class: 'tool-input' }, h('summary', null, label), h('pre', null, prettyJson(this.call.toolInput)));
  }

  buildProgress(verb, detail) {
    return [
      h('div', { class: 'tool-row' }, h('span', { class: 'spinner', 'aria-hidden': 'true' }), h('span', null, `${verb} `), this.name()),
      detail ? h('pre', { class: 'tool-progress' }, detail) : null,
    ];
  }

  buildSummary(tone, label, detail) {
    return [
      h('div', { class: 'tool-row' }, h('span', { class: `badge ${tone}` }, label), this.name()),
      detail ? h('p', { class: 'muted' }, detail) : null,
      this.inputBlock(),
    ];
  }

  buildDone() {
    const call = this.call;
    const ok = call.success !== false;
    const output = contentText(call.content);
    return [
      h(
        'div',
        { class: 'tool-row' },
        h('span', { class: `badge ${ok ? 'ok' : 'error'}` }, ok ? 'Done' : 'Failed'),
        h('span', { class: 'tool-outcome' }, plainText(call.pastTenseMessage) || call.displayName),
      ),
      call.error?.message ? h('p', { class: 'warning' }, call.error.message) : null,
      this.inputBlock(),
      output ? h('details', { class: 'tool-input' }, h('summary', null, 'Result'), h('pre', null, prettyJson(output))) : null,
    ];
  }

  buildApproval() {
    const call = this.call;
    const sending = this.ctx.isSending(call.toolCallId);
    const watching = this.ctx.watching?.() ?? false; // an observer: what is asked, nothing to press
    const options = call.options?.length
      ? call.options
      : [{ id: null, label: 'Approve', kind: 'approve' }, { id: null, label: 'Deny', kind: 'deny' }];
    const original = call.toolInput ?? '';
    let editor = null;
    let inputError = null;
    if (call.editable && !watching) {
      const editorId = uid('tool-input');
      inputError = h('p', { class: 'q-error', id: `${editorId}-error`, hidden: true });
      editor = h('textarea', {
        id: editorId,
        class: 'code',
        rows: Math.min(14, prettyJson(original).split('\n').length + 1),
        spellcheck: 'false',
        'aria-describedby': `${editorId}-hint ${editorId}-error`,
        oninput: () => {
          this.draftInput = editor.value; // kept if the card is rebuilt
          const problem = toolInputProblem(editor.value);
          inputError.textContent = problem ?? '';
          inputError.hidden = !problem;
          editor.toggleAttribute('aria-invalid', Boolean(problem));
        },
      });
      editor.value = this.draftInput ?? prettyJson(original);
    }
    const denyForm = this.denyForm(options.find((o) => o.kind === 'deny'));
    const buttons = options.map((option) =>
      h(
        'button',
        {
          type: 'button',
          class: option.kind === 'approve' ? 'primary' : 'danger-outline',
          disabled: sending,
          onclick: () => (option.kind === 'approve' ? this.approve(option, editor, inputError) : this.askReason(option, denyForm)),
        },
        option.label,
      ),
    );
    const risk = call.riskAssessment;
    const deadline = deadlineOf(this.note);
    return [
      h(
        'div',
        { class: 'card-head' },
        h('span', { class: 'badge need' }, sending ? 'Sending…' : 'Approval needed'),
        deadline ? h('span', { class: 'deadline' }, countdown(deadline, 'toolCalls')) : null,
      ),
      h('div', { class: 'card-title' }, call.confirmationTitle ? richText(call.confirmationTitle) : h('p', null, `Allow ${call.displayName || call.toolName}?`)),
      h('dl', { class: 'tool-facts' },
        h('dt', null, 'Tool'), h('dd', null, this.name()),
        h('dt', null, 'Will do'), h('dd', null, richText(call.invocationMessage)),
        call.intention ? [h('dt', null, 'Why'), h('dd', null, call.intention)] : null,
        risk?.status === 'complete' ? [h('dt', null, 'Risk'), h('dd', null, richText(risk.reason))] : null,
      ),
      editor
        ? h('div', { class: 'field' },
            h('label', { for: editor.id }, 'Input (JSON, you may edit it)'),
            editor,
            h('p', { class: 'q-hint', id: `${editor.id}-hint` }, 'Checked as JSON before it is sent.'),
            inputError)
        : call.toolInput != null
          ? h('div', { class: 'field' }, h('p', { class: 'q-title' }, 'Input'), h('pre', null, prettyJson(original)))
          : null,
      this.errorEl,
      watching
        ? h('p', { class: 'watch-only' }, 'Waiting for a participant to approve or deny it.')
        : [h('div', { class: 'actions approval-actions' }, buttons), denyForm],
    ];
  }

  denyForm(option) {
    const reasonId = uid('deny-reason');
    const reason = h('textarea', { id: reasonId, rows: 2, placeholder: 'Tell the agent why (optional)' });
    const form = h(
      'form',
      {
        class: 'deny-form',
        hidden: true,
        onsubmit: (event) => {
          event.preventDefault();
          this.deny(option, reason.value.trim());
        },
      },
      h('label', { for: reasonId }, 'Reason for denying'),
      reason,
      h(
        'div',
        { class: 'actions' },
        h('button', { type: 'submit', class: 'danger' }, option?.label ? `${option.label} the call` : 'Deny the call'),
        h('button', { type: 'button', class: 'ghost', onclick: () => { form.hidden = true; } }, 'Back'),
      ),
    );
    form.reasonInput = reason;
    return form;
  }

  askReason(option, form) {
    form.hidden = false;
    form.reasonInput.focus();
  }

  approve(option, editor, inputError) {
    const call = this.call;
    const action = {
      type: 'chat/toolCallConfirmed',
      turnId: this.turn.id,
      toolCallId: call.toolCallId,
      approved: true,
      confirmed: 'user-action',
    };
    if (option.id) action.selectedOptionId = option.id;
    if (editor) {
      const problem = toolInputProblem(editor.value);
      if (problem) {
        inputError.textContent = problem;
        inputError.hidden = false;
        editor.focus();
        return;
      }
      const edited = JSON.stringify(JSON.parse(editor.value));
      let before = null;
      try {
        before = JSON.stringify(JSON.parse(call.toolInput ?? 'null'));
      } catch {
        before = null;
      }
      if (edited !== before) action.editedToolInput = edited;
    }
    this.send(action);
  }

  deny(option, reason) {
    const action = {
      type: 'chat/toolCallConfirmed',
      turnId: this.turn.id,
      toolCallId: this.call.toolCallId,
      approved: false,
      reason: 'denied',
    };
    if (option?.id) action.selectedOptionId = option.id;
    if (reason) action.reasonMessage = reason;
    this.send(action);
  }

  send(action) {
    const problem = this.ctx.check(action);
    if (problem) {
      this.errorEl.textContent = reasonSentence(problem);
      this.errorEl.hidden = false;
      return;
    }
    this.ctx.dispatch(action);
  }

  buildResultCheck() {
    const call = this.call;
    const output = contentText(call.content);
    const confirm = (approved) =>
      this.send({ type: 'chat/toolCallResultConfirmed', turnId: this.turn.id, toolCallId: call.toolCallId, approved });
    return [
      h('div', { class: 'card-head' }, h('span', { class: 'badge need' }, 'Check the result')),
      h('div', { class: 'tool-row' }, this.name()),
      h('p', null, plainText(call.pastTenseMessage)),
      call.error?.message ? h('p', { class: 'warning' }, call.error.message) : null,
      output ? h('pre', null, prettyJson(output)) : null,
      this.errorEl,
      this.ctx.watching?.()
        ? h('p', { class: 'watch-only' }, 'Waiting for a participant to check it.')
        : h(
            'div',
            { class: 'actions' },
            h('button', { type: 'button', class: 'primary', onclick: () => confirm(true) }, 'Accept result'),
            h('button', { type: 'button', class: 'danger-outline', onclick: () => confirm(false) }, 'Reject result'),
          ),
    ];
  }
}
