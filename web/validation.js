// The host's validation rules, for the browser: which well-formed actions the
// server rejects, and why.
//
// A port of reducers/validation.py, which is the reference (its module
// docstring has the table of rules). The web client checks an action with
// these before sending it, to show the same message next to the field that
// the server would echo back as `rejectionReason`.
//
// A reason reads "<code>: <sentence>"; the code is stable and the sentence is
// the server's, word for word. Sentences never quote an answer value or a
// tool input: form data can be sensitive.
//
// Left out on purpose, because they are server-side only: the check of an
// accepted request's answers against its frozen JSON Schema (`form-invalid`)
// and the check of an edited tool input against the tool's input schema (the
// schema part of `invalid-tool-input`). The server runs them with jsonschema
// and the browser never holds those schemas. What is here is pure, like the
// reducers: no clock, no I/O, and the inputs are never changed.

import { selectOpenInputPart, selectToolCall } from './reducers.js';

/** @typedef {Record<string, any>} Json  A JSON object as it travels on the wire. */

/**
 * @param {string} code
 * @param {string} sentence
 */
function reason(code, sentence) {
  return `${code}: ${sentence}`;
}

/**
 * Which channel `state` belongs to, by the fields only that kind has.
 * @param {Json} state
 * @returns {'chat' | 'session' | 'root' | null}
 */
function stateKind(state) {
  if (Array.isArray(state.turns)) return 'chat';
  if (Array.isArray(state.chats) && 'lifecycle' in state) return 'session';
  if (Array.isArray(state.agents)) return 'root';
  return null;
}

/**
 * Why the server must reject `action` on `state`, or null when it reduces it.
 *
 * `session` is the state of the session a chat belongs to (null: none is
 * known), which the working directory rule reads. An action of another
 * channel's family than `state`, or one no rule covers, is accepted here. The
 * server also refuses an accepted request whose answers break its JSON Schema
 * form, and an edited tool input that breaks the tool's schema; this client
 * cannot check those (see the top of the module).
 * @param {Json} state  the state of a root, session or chat channel
 * @param {Json} action
 * @param {Json | null} [session]  the state of the chat's session
 * @returns {string | null}
 */
export function rejectReason(state, action, session = null) {
  const kind = stateKind(state);
  if (kind === 'session' && action.type === 'session/defaultChatChanged') {
    return defaultChatReason(state, action);
  }
  if (kind !== 'chat' || !Object.hasOwn(CHAT_RULES, action.type)) return null;
  return CHAT_RULES[action.type](state, action, session);
}

/**
 * Why `answer` cannot be the answer to `question`, or null.
 *
 * The per-answer rules: a missing value, the value's kind, and for a
 * submitted answer the question's bounds, format and options. `requestId`
 * names the request in the sentence.
 * @param {Json} question  an input question as on the wire
 * @param {Json} answer  an input answer ({state, value?})
 * @param {string} [requestId]
 * @returns {string | null}
 */
export function answerProblem(question, answer, requestId) {
  const broken = brokenAnswerRule(question, answer);
  if (broken === null) return null;
  const [code, rule] = broken;
  let where = `question '${question.id}'`;
  if (requestId != null) where += ` of input request '${requestId}'`;
  return reason(code, `the ${answer.state} answer to ${where} ${rule}`);
}

// ─── Session, pending messages, upserts ─────────────────────────────────────

/** AHP: the default chat MUST be one of the session's chats. */
function defaultChatReason(/** @type {Json} */ state, /** @type {Json} */ action) {
  const chat = action.defaultChat;
  if (chat == null || state.chats.some((/** @type {Json} */ c) => c.resource === chat)) return null;
  return reason('unknown-chat', `the session has no chat ${chat}`);
}

/**
 * AHP: a chat's working directories are some of its session's; a host MUST
 * reject one the session does not have. A chat of no known session has none.
 * @param {Json} _chat @param {Json} action @param {Json | null} session
 */
function workingDirectorySetReason(_chat, action, session) {
  if ((session?.workingDirectories ?? []).includes(action.directory)) return null;
  return reason(
    'unknown-directory',
    `the session has no working directory ${action.directory}; add it to the session first`,
  );
}

/** AHP: servers SHOULD reject removing a pending message that is not there. */
function pendingRemovedReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const pending =
    action.kind === 'steering'
      ? chat.steeringMessage
        ? [chat.steeringMessage]
        : []
      : (chat.queuedMessages ?? []);
  if (pending.some((/** @type {Json} */ m) => m.id === action.id)) return null;
  return reason('no-pending-message', `there is no ${action.kind} message '${action.id}'`);
}

/**
 * Order strings by code point, as Python's `sorted` does (JavaScript's default
 * sort compares UTF-16 code units, which differs beyond the BMP).
 * @param {string} a
 * @param {string} b
 */
function byCodePoint(a, b) {
  const x = Array.from(a, (c) => /** @type {number} */ (c.codePointAt(0)));
  const y = Array.from(b, (c) => /** @type {number} */ (c.codePointAt(0)));
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    if (x[i] !== y[i]) return x[i] - y[i];
  }
  return x.length - y.length;
}

/**
 * An upsert without `answers` keeps the old drafts (the reducer does), so it
 * may not leave out a question that already has an answer.
 * @param {Json} chat @param {Json} action
 */
function inputRequestedReason(chat, action) {
  const request = action.request;
  if (request.answers != null) return null;
  const old = selectOpenRequest(chat, request.id);
  if (old === null || old.answers == null) return null;
  const asked = new Set((request.questions ?? []).map((/** @type {Json} */ q) => q.id));
  const dropped = Object.keys(old.answers)
    .filter((id) => !asked.has(id))
    .sort(byCodePoint);
  if (dropped.length === 0) return null;
  const names = dropped.map((id) => `'${id}'`).join(', ');
  return reason(
    'answered-question-dropped',
    `input request '${request.id}' would drop ${names}, which already have answers; ` +
      'send `answers` to say what to keep',
  );
}

// ─── Turns ──────────────────────────────────────────────────────────────────

function turnStartedReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const active = chat.activeTurn;
  if (active == null) {
    if (!chat.turns.some((/** @type {Json} */ turn) => turn.id === action.turnId)) return null;
    return reason(
      'turn-id-reused',
      `turn '${action.turnId}' already ran in this chat; a new turn needs a new id`,
    );
  }
  return reason(
    'turn-in-progress',
    `turn '${active.id}' is still active; turn '${action.turnId}' can start once it ends`,
  );
}

function turnCancelledReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const active = chat.activeTurn;
  if (active == null) {
    return reason(
      'no-active-turn',
      `turn '${action.turnId}' cannot be cancelled: no turn is active`,
    );
  }
  if (active.id !== action.turnId) {
    return reason(
      'no-active-turn',
      `turn '${action.turnId}' cannot be cancelled: the active turn is '${active.id}'`,
    );
  }
  return null;
}

// ─── Tool calls ─────────────────────────────────────────────────────────────

/**
 * The tool call of the active turn, if that turn is `turnId`.
 * @param {Json} chat @param {string} turnId @param {string} toolCallId
 */
function selectTurnToolCall(chat, turnId, toolCallId) {
  if (chat.activeTurn == null || chat.activeTurn.id !== turnId) return null;
  return selectToolCall(chat, toolCallId);
}

/**
 * @param {Json} chat @param {Json} action @param {Json | null} call
 * @param {string} wanted  the status the call should be in
 */
function notPendingReason(chat, action, call, wanted) {
  const { turnId, toolCallId } = action;
  let why;
  if (chat.activeTurn == null || chat.activeTurn.id !== turnId) {
    why = `turn '${turnId}' is not the active turn`;
  } else if (call === null) {
    why = `the active turn '${turnId}' has no tool call '${toolCallId}'`;
  } else {
    why = `tool call '${toolCallId}' is ${call.status}, not ${wanted}`;
  }
  return reason('tool-call-not-pending', why);
}

/** How deeply JSON may nest (the server's protocol.codec.MAX_DEPTH). */
const MAX_DEPTH = 64;

/**
 * Whether JSON text nests arrays and objects deeper than MAX_DEPTH
 * (brackets inside strings do not count), as the server decides it.
 * @param {string} text
 */
function nestedTooDeep(text) {
  let brackets = text.replace(/"(?:[^"\\]|\\.)*"/g, '').replace(/[^[\]{}]+/g, '');
  if (brackets.length <= MAX_DEPTH) return false;
  for (let i = 0; i < MAX_DEPTH; i += 1) {
    const shorter = brackets.replace(/\[\]|\{\}/g, '');
    if (shorter === brackets || shorter === '') return false;
    brackets = shorter;
  }
  return true;
}

/** A string or number token of valid JSON text (strings first, so none is read inside one). */
const JSON_TOKEN = /"(?:[^"\\]|\\.)*"|-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/g;
const LONE_SURROGATE = /\p{Cs}/u;

/**
 * `text` as JSON, read as strictly as the server's decoder (msgspec) reads
 * it. JSON.parse takes two things msgspec refuses: a number with a fraction
 * or an exponent beyond the range of a double (JSON.parse makes it
 * Infinity; an integer that long is fine, msgspec keeps it whole), and an
 * unpaired surrogate escape in a string or a member name.
 * @param {string} text
 * @returns {{ok: true, value: unknown} | {ok: false}}
 */
function parseJson(text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch {
    return { ok: false };
  }
  for (const [token] of text.matchAll(JSON_TOKEN)) {
    const refused = token.startsWith('"')
      ? LONE_SURROGATE.test(JSON.parse(token))
      : /[.eE]/.test(token) && !Number.isFinite(Number(token));
    if (refused) return { ok: false };
  }
  return { ok: true, value };
}

function toolCallConfirmedReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const call = selectTurnToolCall(chat, action.turnId, action.toolCallId);
  if (call === null || call.status !== 'pending-confirmation') {
    return notPendingReason(chat, action, call, 'pending-confirmation');
  }
  const name = `tool call '${call.toolCallId}'`;
  const optionId = action.selectedOptionId;
  const offered = (call.options ?? []).map((/** @type {Json} */ o) => o.id);
  if (optionId != null && !offered.includes(optionId)) {
    return reason('unknown-option', `${name} offers no option '${optionId}'`);
  }
  const edited = action.editedToolInput;
  if (edited == null) return null;
  if (call.editable !== true) return reason('not-editable', `the input of ${name} is not editable`);
  if (nestedTooDeep(edited)) {
    return reason(
      'invalid-tool-input',
      `the edited input of ${name} nests deeper than ${MAX_DEPTH} levels`,
    );
  }
  const parsed = parseJson(edited);
  if (!parsed.ok) {
    return reason('invalid-tool-input', `the edited input of ${name} is not valid JSON`);
  }
  const value = parsed.value;
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return reason('invalid-tool-input', `the edited input of ${name} is not a JSON object`);
  }
  // The check against the tool's input schema is the server's (see the top).
  return null;
}

/**
 * Why confirmation `options` cannot be offered: an empty or repeated id (the
 * reducers read an empty `selectedOptionId` as no selection).
 * @param {string} toolCallId @param {Json[] | undefined} options
 */
function optionsReason(toolCallId, options) {
  const name = `tool call '${toolCallId}'`;
  const seen = new Set();
  for (const option of options ?? []) {
    if (!option.id) {
      return reason(
        'invalid-options',
        `${name} offers an option with an empty id, which no confirmation can select`,
      );
    }
    if (seen.has(option.id)) {
      return reason('invalid-options', `${name} offers option '${option.id}' more than once`);
    }
    seen.add(option.id);
  }
  return null;
}

function toolCallReadyReason(/** @type {Json} */ _chat, /** @type {Json} */ action) {
  return optionsReason(action.toolCallId, action.options);
}

function responsePartReason(/** @type {Json} */ _chat, /** @type {Json} */ action) {
  const part = action.part;
  if (part.kind !== 'toolCall' || part.toolCall.status !== 'pending-confirmation') return null;
  return optionsReason(part.toolCall.toolCallId, part.toolCall.options);
}

function toolCallResultConfirmedReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const call = selectTurnToolCall(chat, action.turnId, action.toolCallId);
  if (call !== null && call.status === 'pending-result-confirmation') return null;
  return notPendingReason(chat, action, call, 'pending-result-confirmation');
}

// ─── Input requests ─────────────────────────────────────────────────────────

/**
 * The open input request `requestId` of the active turn, or null.
 * @param {Json} chat @param {string} requestId
 * @returns {Json | null}
 */
function selectOpenRequest(chat, requestId) {
  if (chat.activeTurn == null) return null;
  const found = selectOpenInputPart(chat.activeTurn.responseParts, requestId);
  return found === null ? null : found.part.request;
}

/** @param {Json} chat @param {string} requestId */
function notOpenReason(chat, requestId) {
  const name = `input request '${requestId}'`;
  const active = chat.activeTurn;
  let why;
  if (active == null) {
    why = `${name} is not open: no turn is active`;
  } else if (
    active.responseParts.some(
      (/** @type {Json} */ p) => p.kind === 'inputRequest' && p.request.id === requestId,
    )
  ) {
    why = `${name} is already completed; only the first completion counts`;
  } else {
    why = `the active turn '${active.id}' has no ${name}`;
  }
  return reason('no-open-input-request', why);
}

/**
 * Why an answer to `questionId` of `request` is refused; an absent answer
 * (clearing it) only needs a known question.
 * @param {Json} request @param {string} questionId @param {Json | undefined} answer
 */
function answerReason(request, questionId, answer) {
  const question = (request.questions ?? []).find((/** @type {Json} */ q) => q.id === questionId);
  if (question === undefined) {
    return reason(
      'unknown-question',
      `input request '${request.id}' has no question '${questionId}'`,
    );
  }
  return answer == null ? null : answerProblem(question, answer, request.id);
}

function inputAnswerChangedReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const request = selectOpenRequest(chat, action.requestId);
  if (request === null) return notOpenReason(chat, action.requestId);
  return answerReason(request, action.questionId, action.answer);
}

function inputCompletedReason(/** @type {Json} */ chat, /** @type {Json} */ action) {
  const request = selectOpenRequest(chat, action.requestId);
  if (request === null) return notOpenReason(chat, action.requestId);
  // Answers carried by a decline or cancel are checked too: the reducer
  // records them.
  const carried = action.answers ?? {};
  for (const [questionId, answer] of Object.entries(carried)) {
    const problem = answerReason(request, questionId, answer);
    if (problem !== null) return problem;
  }
  if (action.response !== 'accept') return null;
  // AHP: reject an accept while required questions lack answers; Huddle:
  // drafts (and skipped answers) do not count.
  const answers = { ...(request.answers ?? {}), ...carried };
  const unanswered = (request.questions ?? [])
    .filter(
      (/** @type {Json} */ q) =>
        q.required && (!Object.hasOwn(answers, q.id) || answers[q.id]?.state !== 'submitted'),
    )
    .map((/** @type {Json} */ q) => q.id);
  if (unanswered.length === 0) return null; // the form check is the server's
  const listed = unanswered.map((id) => `'${id}'`).join(', ');
  const questions =
    unanswered.length === 1 ? `question ${listed} has` : `questions ${listed} have`;
  return reason(
    'required-unanswered',
    `input request '${request.id}' cannot be accepted: required ${questions} no submitted answer`,
  );
}

/** @type {Record<string, (chat: Json, action: Json, session: Json | null) => string | null>} */
const CHAT_RULES = {
  'chat/turnStarted': turnStartedReason,
  'chat/turnCancelled': turnCancelledReason,
  'chat/toolCallConfirmed': toolCallConfirmedReason,
  'chat/toolCallResultConfirmed': toolCallResultConfirmedReason,
  'chat/toolCallReady': toolCallReadyReason,
  'chat/responsePart': responsePartReason,
  'chat/inputAnswerChanged': inputAnswerChangedReason,
  'chat/inputCompleted': inputCompletedReason,
  'chat/pendingMessageRemoved': pendingRemovedReason,
  'chat/inputRequested': inputRequestedReason,
  'chat/workingDirectorySet': workingDirectorySetReason,
};

// ─── Answers ────────────────────────────────────────────────────────────────

/** The kind of value that answers each kind of question. */
const VALUE_KIND = new Map([
  ['text', 'text'],
  ['number', 'number'],
  ['integer', 'number'],
  ['boolean', 'boolean'],
  ['single-select', 'selected'],
  ['multi-select', 'selected-many'],
]);

/**
 * The broken rule as [code, predicate of the sentence], or null.
 * @param {Json} question @param {Json} answer
 * @returns {[string, string] | null}
 */
function brokenAnswerRule(question, answer) {
  if (answer.state === 'skipped') return null;
  const value = answer.value;
  if (value == null) return ['answer-missing-value', 'has no value'];
  const kind = VALUE_KIND.get(question.kind);
  // A question kind from a newer peer has no rule here (the server would not
  // have decoded it).
  if (kind === undefined) return null;
  if (value.kind !== kind) {
    return [
      'answer-kind-mismatch',
      `is a '${value.kind}' value; ${question.kind} questions take '${kind}'`,
    ];
  }
  // A half-typed draft is normal: drafts are checked for kind only.
  if (answer.state === 'draft') return null;
  const rule = submittedValueProblem(question, value);
  return rule === null ? null : ['invalid-answer', rule];
}

/**
 * The rule a submitted value of the right kind breaks, as a predicate.
 * @param {Json} question @param {Json} value
 */
function submittedValueProblem(question, value) {
  switch (question.kind) {
    case 'text':
      return textProblem(question, value.value);
    case 'number':
    case 'integer':
      return numberProblem(question, value.value);
    case 'single-select':
      return selectionProblem(question, [value.value], value.freeformValues);
    case 'multi-select':
      return selectionProblem(question, value.value, value.freeformValues);
    default:
      return null;
  }
}

/** @param {number} n @param {string} noun */
function count(n, noun) {
  return n === 1 ? `${n} ${noun}` : `${n} ${noun}s`;
}

/** @param {Json} question @param {string} text */
function textProblem(question, text) {
  // JSON Schema counts minLength/maxLength in code points, as Python's len()
  // does; `text.length` would count UTF-16 code units.
  const length = [...text].length;
  if (question.min != null && length < question.min) {
    return `is shorter than ${count(question.min, 'character')}`;
  }
  if (question.max != null && length > question.max) {
    return `is longer than ${count(question.max, 'character')}`;
  }
  const format = FORMATS.get(question.format ?? '');
  if (format !== undefined && !format.test(text)) return `is not ${format.needs}`;
  return null;
}

/**
 * `n` as Python's str() writes it, as the server's sentences do: below 1e-4
 * in scientific notation with a two-digit exponent (1e-05), otherwise as
 * JavaScript writes it. A whole number is written as an integer: JSON.parse
 * cannot tell `1.0` from `1`, so a bound the server read as the float 1.0
 * (and writes "1.0") reads as 1 here.
 * @param {number} n
 */
function pythonNumber(n) {
  if (Number.isInteger(n) || Math.abs(n) >= 1e-4) return String(n);
  return n.toExponential().replace(/e([+-])([0-9])$/, 'e$10$2');
}

/** @param {Json} question @param {number} number */
function numberProblem(question, number) {
  if (typeof number !== 'number' || !Number.isFinite(number)) return 'is not a finite number';
  if (question.min != null && number < question.min) {
    return `is below the minimum ${pythonNumber(question.min)}`;
  }
  if (question.max != null && number > question.max) {
    return `is above the maximum ${pythonNumber(question.max)}`;
  }
  // 3.0 is a whole number.
  if (question.kind === 'integer' && !Number.isInteger(number)) return 'is not a whole number';
  return null;
}

/**
 * @param {Json} question  a single- or multi-select question
 * @param {string[]} optionIds
 * @param {string[] | undefined} freeform
 */
function selectionProblem(question, optionIds, freeform) {
  const freeformAllowed = question.allowFreeformInput === true;
  // An empty free-form list carries nothing and is not "given".
  if (freeform != null && freeform.length > 0 && !freeformAllowed) {
    return 'has free-form values, but the question allows no free-form input';
  }
  const offered = new Set(question.options.map((/** @type {Json} */ o) => o.id));
  if (!freeformAllowed && !optionIds.every((id) => offered.has(id))) {
    return 'names an option the question does not offer';
  }
  if (new Set(optionIds).size !== optionIds.length) return 'names an option more than once';
  if (question.kind === 'single-select') return null;
  const items = optionIds.length + (freeform ?? []).length;
  if (question.min != null && items < question.min) {
    return `has fewer than ${count(question.min, 'item')}`;
  }
  if (question.max != null && items > question.max) {
    return `has more than ${count(question.max, 'item')}`;
  }
  return null;
}

// ─── Text formats (simple, strict, ASCII-only patterns) ─────────────────────

// Python's `\s` (str.isspace) and JavaScript's `\s` differ: Python counts
// U+0085 and not U+FEFF. The class is spelled out so both refuse the same.
const NOT_EMAIL_CHAR =
  '@\\x00-\\x20\\x7f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const EMAIL = new RegExp(
  `^[^${NOT_EMAIL_CHAR}]+@[^.${NOT_EMAIL_CHAR}]+(?:\\.[^.${NOT_EMAIL_CHAR}]+)+$`,
  'u',
);
const URI = /^[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~:/?#[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+$/u;
const DATE = /^([0-9]{4})-([0-9]{2})-([0-9]{2})$/u;
const TIME = /^([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|[+-]([0-9]{2}):([0-9]{2}))$/u;

/** RFC 3339 `full-date`: `YYYY-MM-DD` naming a day of the calendar. */
function isDate(/** @type {string} */ text) {
  const match = DATE.exec(text);
  if (match === null) return false;
  const [year, month, day] = match.slice(1).map(Number);
  if (month < 1 || month > 12) return false;
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0);
  const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1];
  return day >= 1 && day <= days;
}

/** RFC 3339 `date-time`: full-date, `T`, time with seconds, offset. */
function isDateTime(/** @type {string} */ text) {
  // Split by code point, as Python slices.
  const chars = [...text];
  const date = chars.slice(0, 10).join('');
  const separator = chars.slice(10, 11).join('');
  const match = TIME.exec(chars.slice(11).join(''));
  if ((separator !== 'T' && separator !== 't') || match === null || !isDate(date)) return false;
  const [hour, minute, second, offsetHour, offsetMinute] = match
    .slice(1)
    .map((group) => Number(group ?? 0));
  // RFC 3339 allows a leap second (60).
  return hour <= 23 && minute <= 59 && second <= 60 && offsetHour <= 23 && offsetMinute <= 59;
}

/**
 * The text formats Huddle checks, with what the sentence says they need;
 * other formats are hints and pass.
 * @type {Map<string, {test: (text: string) => boolean, needs: string}>}
 */
const FORMATS = new Map([
  ['email', { test: (text) => EMAIL.test(text), needs: 'a valid email address' }],
  ['uri', { test: (text) => URI.test(text), needs: 'a valid absolute URI' }],
  ['date', { test: isDate, needs: 'a date (YYYY-MM-DD)' }],
  ['date-time', { test: isDateTime, needs: 'an RFC 3339 date-time' }],
]);
