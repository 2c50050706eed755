// The browser's copy of the host's validation rules, against the cases of
// tests/test_validation.py: a table of accepted actions and a table of
// rejected ones, each rejection checked for its stable code and for leaking no
// answer value or tool input. The JSON Schema checks are the server's and have
// no cases here.

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { reduceChat } from '../reducers.js';
import { answerProblem, rejectReason } from '../validation.js';

// ─── Builders (plain wire JSON) ─────────────────────────────────────────────

const MESSAGE = { text: 'hi', origin: { kind: 'user' } };
const options = (...ids) => ids.map((id) => ({ id, label: id.toUpperCase() }));

const QUESTIONS = [
  { kind: 'text', id: 'name', message: 'Name?', required: true, min: 2, max: 20 },
  { kind: 'text', id: 'email', message: 'E-mail?', format: 'email' },
  { kind: 'text', id: 'site', message: 'Site?', format: 'uri' },
  { kind: 'text', id: 'born', message: 'Born?', format: 'date' },
  { kind: 'text', id: 'at', message: 'When?', format: 'date-time' },
  { kind: 'text', id: 'colour', message: 'Colour?', format: 'color' },
  { kind: 'number', id: 'ratio', message: 'Ratio?', min: 0, max: 1 },
  { kind: 'integer', id: 'age', message: 'Age?', min: 18, max: 120 },
  { kind: 'boolean', id: 'agree', message: 'Agree?', required: true },
  { kind: 'single-select', id: 'runtime', message: 'Runtime?', options: options('node', 'deno') },
  {
    kind: 'single-select',
    id: 'editor',
    message: 'Editor?',
    options: options('vim', 'emacs'),
    allowFreeformInput: true,
  },
  {
    kind: 'multi-select',
    id: 'langs',
    message: 'Languages?',
    options: options('py', 'js', 'go'),
    min: 1,
    max: 2,
  },
  {
    kind: 'multi-select',
    id: 'tags',
    message: 'Tags?',
    options: options('red', 'blue'),
    allowFreeformInput: true,
    max: 3,
  },
];

function inputPart(answers, response, requestId = 'form') {
  const request = { id: requestId, message: 'Tell us', questions: QUESTIONS };
  if (answers) request.answers = answers;
  return response ? { kind: 'inputRequest', request, response } : { kind: 'inputRequest', request };
}

function chat(parts = [], turnId = 'turn-1') {
  const state = {
    resource: 'ahp-chat:/c',
    title: 't',
    status: 8,
    modifiedAt: '1970-01-01T00:00:01.000Z',
    turns: [],
  };
  if (turnId !== null) {
    state.activeTurn = {
      id: turnId,
      startedAt: '1970-01-01T00:00:01.000Z',
      message: MESSAGE,
      responseParts: parts,
    };
  }
  return state;
}

const IDLE = chat([], null);
const OPEN = chat([inputPart()]);

const text = (value) => ({ kind: 'text', value });
const number = (value) => ({ kind: 'number', value });
const boolean = (value) => ({ kind: 'boolean', value });
const selected = (value, freeformValues) =>
  freeformValues ? { kind: 'selected', value, freeformValues } : { kind: 'selected', value };
const selectedMany = (values, freeformValues) =>
  freeformValues
    ? { kind: 'selected-many', value: values, freeformValues }
    : { kind: 'selected-many', value: values };
const submitted = (value) => ({ state: 'submitted', value });
const draft = (value) => ({ state: 'draft', value });
const SKIPPED = { state: 'skipped' };
const REQUIRED_SUBMITTED = {
  name: submitted(text('Ada Lovelace')),
  agree: submitted(boolean(true)),
};

function changed(questionId, answer, requestId = 'form') {
  const action = { type: 'chat/inputAnswerChanged', requestId, questionId };
  return answer ? { ...action, answer } : action;
}
const answered = (questionId, state, value) => changed(questionId, { state, value });

function completed(response = 'accept', answers, requestId = 'form') {
  const action = { type: 'chat/inputCompleted', requestId, response };
  return answers ? { ...action, answers } : action;
}

function pending(editable, optionIds = ['allow', 'deny']) {
  const toolCall = {
    status: 'pending-confirmation',
    toolCallId: 'call-1',
    toolName: 'write_file',
    displayName: 'Write file',
    invocationMessage: 'Write a file',
    toolInput: '{"path": "a.txt"}',
  };
  if (editable !== undefined) toolCall.editable = editable;
  if (optionIds.length > 0) {
    toolCall.options = optionIds.map((id) => ({
      id,
      label: id,
      kind: id === 'deny' ? 'deny' : 'approve',
    }));
  }
  return { kind: 'toolCall', toolCall };
}

const RUNNING = {
  kind: 'toolCall',
  toolCall: {
    status: 'running',
    toolCallId: 'call-1',
    toolName: 'write_file',
    displayName: 'Write file',
    invocationMessage: 'Writing a file',
    confirmed: 'user-action',
  },
};
const PENDING_RESULT = {
  kind: 'toolCall',
  toolCall: {
    status: 'pending-result-confirmation',
    toolCallId: 'call-1',
    toolName: 'write_file',
    displayName: 'Write file',
    invocationMessage: 'Wrote a file',
    confirmed: 'user-action',
    success: true,
    pastTenseMessage: 'Wrote a file',
  },
};

function approve({ edited, option, turnId = 'turn-1' } = {}) {
  const action = {
    type: 'chat/toolCallConfirmed',
    turnId,
    toolCallId: 'call-1',
    approved: true,
    confirmed: 'user-action',
  };
  if (edited !== undefined) action.editedToolInput = edited;
  if (option !== undefined) action.selectedOptionId = option;
  return action;
}

const DENY = {
  type: 'chat/toolCallConfirmed',
  turnId: 'turn-1',
  toolCallId: 'call-1',
  approved: false,
  reason: 'denied',
  selectedOptionId: 'deny',
};
const resultConfirmed = (turnId = 'turn-1') => ({
  type: 'chat/toolCallResultConfirmed',
  turnId,
  toolCallId: 'call-1',
  approved: true,
});
const turnStarted = (turnId = 'turn-2') => ({
  type: 'chat/turnStarted',
  turnId,
  startedAt: '1970-01-01T00:00:02.000Z',
  message: MESSAGE,
});
const turnCancelled = (turnId = 'turn-1') => ({ type: 'chat/turnCancelled', turnId, duration: 5 });

// ─── Accepted ───────────────────────────────────────────────────────────────

const ACCEPTED = [
  ['turn-starts-when-none-is-active', IDLE, turnStarted()],
  ['active-turn-is-cancelled', OPEN, turnCancelled()],
  ['pending-call-is-approved', chat([pending()]), approve()],
  ['pending-call-is-denied-with-an-offered-option', chat([pending()]), DENY],
  ['offered-option-is-selected', chat([pending()]), approve({ option: 'allow' })],
  ['edited-input-is-an-object', chat([pending(true)]), approve({ edited: '{"path": "b.txt"}' })],
  ['result-is-confirmed', chat([PENDING_RESULT]), resultConfirmed()],
  ['draft-is-checked-for-kind-only', OPEN, answered('name', 'draft', text('A'))],
  ['draft-number-may-break-the-bounds', OPEN, answered('age', 'draft', number(3.5))],
  ['skipped-answer-needs-no-value', OPEN, changed('name', SKIPPED)],
  ['answer-is-cleared', OPEN, changed('name', undefined)],
  ['text-within-its-length', OPEN, answered('name', 'submitted', text('Ada'))],
  ['text-length-counts-code-points', OPEN, answered('name', 'submitted', text('😀'.repeat(20)))],
  ['email', OPEN, answered('email', 'submitted', text('ada@example.org'))],
  ['absolute-uri', OPEN, answered('site', 'submitted', text('https://example.org/a%20b?q=1#top'))],
  ['leap-day', OPEN, answered('born', 'submitted', text('2000-02-29'))],
  [
    'date-time-with-leap-second-and-offset',
    OPEN,
    answered('at', 'submitted', text('2024-06-30T23:59:60.5+05:30')),
  ],
  ['date-time-lower', OPEN, answered('at', 'submitted', text('2024-01-01t00:00:00z'))],
  ['unknown-format-passes', OPEN, answered('colour', 'submitted', text('teal-ish'))],
  ['number-in-range', OPEN, answered('ratio', 'submitted', number(0.5))],
  ['integer-question-takes-30.0', OPEN, answered('age', 'submitted', number(30.0))],
  ['integer', OPEN, answered('age', 'submitted', number(42))],
  ['boolean', OPEN, answered('agree', 'submitted', boolean(false))],
  ['offered-option', OPEN, answered('runtime', 'submitted', selected('deno'))],
  [
    'freeform-single-select-takes-free-text',
    OPEN,
    answered('editor', 'submitted', selected('', ['nano'])),
  ],
  [
    'empty-freeform-list-carries-nothing',
    OPEN,
    answered('runtime', 'submitted', selected('node', [])),
  ],
  ['multi-in-count', OPEN, answered('langs', 'submitted', selectedMany(['py', 'go']))],
  [
    'freeform-multi-select-takes-any-item',
    OPEN,
    answered('tags', 'submitted', selectedMany(['red', 'mauve'], ['plum'])),
  ],
  ['accept-with-required-submitted', chat([inputPart(REQUIRED_SUBMITTED)]), completed()],
  ['accept-with-required-in-the-overlay', OPEN, completed('accept', REQUIRED_SUBMITTED)],
  [
    'overlay-turns-a-draft-into-a-submitted-answer',
    chat([inputPart({ name: draft(text('Ada')) })]),
    completed('accept', { name: submitted(text('Ada')), agree: submitted(boolean(true)) }),
  ],
  ['decline-needs-no-answers', OPEN, completed('decline')],
  ['cancel-needs-no-answers', OPEN, completed('cancel')],
  [
    'request-re-asked-under-a-resolved-id-is-open',
    chat([inputPart(undefined, 'accept', 'old'), inputPart(REQUIRED_SUBMITTED, undefined, 'old')]),
    completed('accept', undefined, 'old'),
  ],
  [
    'url-request-is-accepted',
    chat([{ kind: 'inputRequest', request: { id: 'visit', url: 'https://example.org/approve' } }]),
    completed('accept', undefined, 'visit'),
  ],
  ['action-no-rule', OPEN, { type: 'chat/delta', turnId: 'x', partId: 'p', content: 'c' }],
  ['action-of-another-family', OPEN, { type: 'session/titleChanged', title: 't' }],
  [
    'chat-action-on-a-session',
    { provider: 'p', title: 't', status: 1, lifecycle: 'ready', activeClients: [], chats: [] },
    turnCancelled(),
  ],
];

describe('the host accepts', () => {
  for (const [name, state, action] of ACCEPTED) {
    test(name, () => assert.equal(rejectReason(state, action), null));
  }
});

// ─── Rejected ───────────────────────────────────────────────────────────────

const SECRET = 'hunter2-secret';

const REJECTED = [
  ['turn-starts-while-one-is-active', OPEN, turnStarted(), 'turn-in-progress'],
  ['cancel-without-active-turn', IDLE, turnCancelled(), 'no-active-turn'],
  ['cancel-of-another-turn', OPEN, turnCancelled('turn-0'), 'no-active-turn'],
  ['confirm-without-active-turn', IDLE, approve(), 'tool-call-not-pending'],
  [
    'confirm-in-another-turn',
    chat([pending()]),
    approve({ turnId: 'turn-0' }),
    'tool-call-not-pending',
  ],
  [
    'confirm-unknown-call',
    chat([{ kind: 'markdown', id: 'm', content: 'x' }]),
    approve(),
    'tool-call-not-pending',
  ],
  ['confirm-running-call', chat([RUNNING]), approve(), 'tool-call-not-pending'],
  ['option-not-offered', chat([pending()]), approve({ option: 'always' }), 'unknown-option'],
  ['option-on-a-call-without-options', chat([pending(undefined, [])]), DENY, 'unknown-option'],
  [
    'edited-input-on-call-not-editable',
    chat([pending()]),
    approve({ edited: '{"path": "hunter2-secret"}' }),
    'not-editable',
  ],
  [
    'edited-input-on-call-marked-not-editable',
    chat([pending(false)]),
    approve({ edited: '{"path": "hunter2-secret"}' }),
    'not-editable',
  ],
  [
    'edited-input-not-json',
    chat([pending(true)]),
    approve({ edited: '{"path": hunter2-secret}' }),
    'invalid-tool-input',
  ],
  [
    'edited-input-is-javascript-not-json',
    chat([pending(true)]),
    approve({ edited: 'NaN' }),
    'invalid-tool-input',
  ],
  [
    'edited-input-not-an-object',
    chat([pending(true)]),
    approve({ edited: '["hunter2-secret"]' }),
    'invalid-tool-input',
  ],
  ['result-not-pending', chat([pending()]), resultConfirmed(), 'tool-call-not-pending'],
  ['result-without-active-turn', IDLE, resultConfirmed(), 'tool-call-not-pending'],
  [
    'answer-without-active-turn',
    IDLE,
    answered('name', 'draft', text(SECRET)),
    'no-open-input-request',
  ],
  [
    'answer-to-unknown-request',
    OPEN,
    changed('name', draft(text(SECRET)), 'other'),
    'no-open-input-request',
  ],
  [
    'answer-to-completed-request',
    chat([inputPart(REQUIRED_SUBMITTED, 'accept')]),
    answered('name', 'draft', text(SECRET)),
    'no-open-input-request',
  ],
  [
    'second-completion-is-rejected',
    chat([inputPart(REQUIRED_SUBMITTED, 'accept')]),
    completed('accept'),
    'no-open-input-request',
  ],
  [
    'accept-after-decline-is-rejected',
    chat([inputPart(undefined, 'decline')]),
    completed('accept', REQUIRED_SUBMITTED),
    'no-open-input-request',
  ],
  ['completion-without-active-turn', IDLE, completed('cancel'), 'no-open-input-request'],
  ['unknown-question', OPEN, answered('shoe', 'draft', text(SECRET)), 'unknown-question'],
  ['clearing-unknown-question', OPEN, changed('shoe', undefined), 'unknown-question'],
  [
    'unknown-question-that-is-an-object-member-name',
    OPEN,
    changed('constructor', undefined),
    'unknown-question',
  ],
  [
    'completion-answers-unknown-question',
    OPEN,
    completed('accept', { ...REQUIRED_SUBMITTED, shoe: submitted(text(SECRET)) }),
    'unknown-question',
  ],
  ['draft-without-value', OPEN, changed('name', { state: 'draft' }), 'answer-missing-value'],
  [
    'submitted-without-value-in-completion',
    OPEN,
    completed('accept', { name: { state: 'submitted' } }),
    'answer-missing-value',
  ],
  ['number-for-text-draft', OPEN, answered('name', 'draft', number(41)), 'answer-kind-mismatch'],
  ['text-for-integer', OPEN, answered('age', 'submitted', text(SECRET)), 'answer-kind-mismatch'],
  ['text-for-boolean', OPEN, answered('agree', 'submitted', text(SECRET)), 'answer-kind-mismatch'],
  [
    'selected-many-for-single-select',
    OPEN,
    answered('runtime', 'submitted', selectedMany([SECRET])),
    'answer-kind-mismatch',
  ],
  [
    'selected-for-multi-select',
    OPEN,
    answered('langs', 'draft', selected(SECRET)),
    'answer-kind-mismatch',
  ],
  [
    'decline-carrying-a-wrong-kind',
    OPEN,
    completed('decline', { ratio: submitted(boolean(true)) }),
    'answer-kind-mismatch',
  ],
  ['text-too-short', OPEN, answered('name', 'submitted', text('Q')), 'invalid-answer'],
  ['text-too-long', OPEN, answered('name', 'submitted', text(SECRET + SECRET)), 'invalid-answer'],
  ['email-no-at', OPEN, answered('email', 'submitted', text(SECRET)), 'invalid-answer'],
  [
    'email-undotted-domain',
    OPEN,
    answered('email', 'submitted', text('hunter2@secret')),
    'invalid-answer',
  ],
  [
    'email-with-space',
    OPEN,
    answered('email', 'submitted', text('hunter 2@secret.org')),
    'invalid-answer',
  ],
  [
    'email-with-next-line',
    OPEN,
    answered('email', 'submitted', text('hunter\u00852@secret.org')),
    'invalid-answer',
  ],
  ['relative-uri', OPEN, answered('site', 'submitted', text('/hunter2/secret')), 'invalid-answer'],
  [
    'uri-with-space',
    OPEN,
    answered('site', 'submitted', text('https://hunter2.org/a b')),
    'invalid-answer',
  ],
  [
    'uri-with-bad-percent-escape',
    OPEN,
    answered('site', 'submitted', text('https://hunter2.org/%zz')),
    'invalid-answer',
  ],
  [
    'date-not-in-calendar',
    OPEN,
    answered('born', 'submitted', text('1900-02-29')),
    'invalid-answer',
  ],
  ['date-month-13', OPEN, answered('born', 'submitted', text('2023-13-01')), 'invalid-answer'],
  ['date-april-31', OPEN, answered('born', 'submitted', text('2023-04-31')), 'invalid-answer'],
  ['date-without-dashes', OPEN, answered('born', 'submitted', text('20230401')), 'invalid-answer'],
  [
    'date-with-non-ascii-digits',
    OPEN,
    answered('born', 'submitted', text('\uff12\uff10\uff12\uff13-04-01')),
    'invalid-answer',
  ],
  [
    'date-time-with-space',
    OPEN,
    answered('at', 'submitted', text('2024-01-01 12:00:00Z')),
    'invalid-answer',
  ],
  [
    'date-time-without-offset',
    OPEN,
    answered('at', 'submitted', text('2024-01-01T12:00:00')),
    'invalid-answer',
  ],
  [
    'date-time-with-bad-date',
    OPEN,
    answered('at', 'submitted', text('2023-02-29T12:00:00Z')),
    'invalid-answer',
  ],
  [
    'date-time-hour-24',
    OPEN,
    answered('at', 'submitted', text('2024-01-01T24:00:00Z')),
    'invalid-answer',
  ],
  [
    'date-time-offset-minute-60',
    OPEN,
    answered('at', 'submitted', text('2024-01-01T12:00:00+05:60')),
    'invalid-answer',
  ],
  ['number-below-min', OPEN, answered('ratio', 'submitted', number(-0.25)), 'invalid-answer'],
  ['number-above-max', OPEN, answered('ratio', 'submitted', number(1.25)), 'invalid-answer'],
  ['number-not-finite', OPEN, answered('ratio', 'submitted', number(NaN)), 'invalid-answer'],
  ['integer-below-min', OPEN, answered('age', 'submitted', number(17)), 'invalid-answer'],
  ['integer-above-max', OPEN, answered('age', 'submitted', number(121)), 'invalid-answer'],
  ['integer-with-a-fraction', OPEN, answered('age', 'submitted', number(33.5)), 'invalid-answer'],
  [
    'option-not-offered',
    OPEN,
    answered('runtime', 'submitted', selected(SECRET)),
    'invalid-answer',
  ],
  [
    'freeform-when-not-allowed',
    OPEN,
    answered('runtime', 'submitted', selected('node', [SECRET])),
    'invalid-answer',
  ],
  [
    'multi-option-not-offered',
    OPEN,
    answered('langs', 'submitted', selectedMany(['py', SECRET])),
    'invalid-answer',
  ],
  [
    'multi-freeform-when-not-allowed',
    OPEN,
    answered('langs', 'submitted', selectedMany(['py'], [SECRET])),
    'invalid-answer',
  ],
  ['multi-too-few', OPEN, answered('langs', 'submitted', selectedMany([])), 'invalid-answer'],
  [
    'multi-too-many',
    OPEN,
    answered('langs', 'submitted', selectedMany(['py', 'js', 'go'])),
    'invalid-answer',
  ],
  [
    'multi-same-option-twice',
    OPEN,
    answered('langs', 'submitted', selectedMany(['py', 'py'])),
    'invalid-answer',
  ],
  [
    'multi-count-includes-freeform',
    OPEN,
    answered('tags', 'submitted', selectedMany(['red', 'blue'], [SECRET, 'plum'])),
    'invalid-answer',
  ],
  [
    'completion-carries-an-invalid-answer',
    OPEN,
    completed('accept', { ...REQUIRED_SUBMITTED, age: submitted(number(5)) }),
    'invalid-answer',
  ],
  ['accept-with-nothing-answered', OPEN, completed(), 'required-unanswered'],
  [
    'draft-does-not-count-on-accept',
    chat([inputPart({ name: draft(text(SECRET)), agree: submitted(boolean(true)) })]),
    completed(),
    'required-unanswered',
  ],
  [
    'skipped-does-not-count-on-accept',
    OPEN,
    completed('accept', { name: SKIPPED, agree: submitted(boolean(true)) }),
    'required-unanswered',
  ],
  [
    'overlay-draft-replaces-a-submitted-answer',
    chat([inputPart(REQUIRED_SUBMITTED)]),
    completed('accept', { name: draft(text(SECRET)) }),
    'required-unanswered',
  ],
];

/** Every answer value and tool input the action carries, as text. */
function leakedValues(action) {
  const answers = [];
  if (action.type === 'chat/inputAnswerChanged' && action.answer) answers.push(action.answer);
  if (action.type === 'chat/inputCompleted') answers.push(...Object.values(action.answers ?? {}));
  const values = [];
  for (const { value } of answers) {
    if (value == null) continue;
    values.push(...(Array.isArray(value.value) ? value.value : [String(value.value)]));
    values.push(...(value.freeformValues ?? []));
  }
  if (action.editedToolInput != null) values.push(action.editedToolInput);
  return values.filter((v) => v.length >= 3 && v !== 'true' && v !== 'false');
}

describe('the host rejects', () => {
  for (const [name, state, action, code] of REJECTED) {
    test(name, () => {
      const reason = rejectReason(state, action);
      assert.notEqual(reason, null);
      assert.equal(reason.split(':')[0], code);
      assert.ok(!reason.includes('hunter2'), reason);
      for (const value of leakedValues(action)) assert.ok(!reason.includes(value), reason);
    });
  }
});

// ─── Sentences, word for word the server's ──────────────────────────────────

describe('sentences', () => {
  test('a rejection names the request, the question and the rule', () => {
    assert.equal(
      rejectReason(OPEN, answered('name', 'submitted', text(SECRET + SECRET))),
      "invalid-answer: the submitted answer to question 'name' of input request 'form' " +
        'is longer than 20 characters',
    );
  });

  test('required-unanswered lists every missing question', () => {
    assert.equal(
      rejectReason(OPEN, completed()),
      "required-unanswered: input request 'form' cannot be accepted: required questions " +
        "'name', 'agree' have no submitted answer",
    );
  });

  test('answerProblem without a request names the question', () => {
    const question = { kind: 'integer', id: 'age', message: 'Age?', min: 18 };
    assert.equal(
      answerProblem(question, submitted(number(17))),
      "invalid-answer: the submitted answer to question 'age' is below the minimum 18",
    );
    assert.equal(answerProblem(question, submitted(number(18.0))), null);
  });

  test('answerProblem with a request names it', () => {
    const question = { kind: 'text', id: 'city', message: 'City?', max: 3 };
    assert.equal(
      answerProblem(question, submitted(text('Lisboa')), 'trip'),
      "invalid-answer: the submitted answer to question 'city' of input request 'trip' " +
        'is longer than 3 characters',
    );
  });

  test('answerProblem names the kinds of a mismatch', () => {
    const question = { kind: 'single-select', id: 'pick', message: 'Pick', options: options('a') };
    assert.equal(
      answerProblem(question, draft(text(SECRET))),
      "answer-kind-mismatch: the draft answer to question 'pick' is a 'text' value; " +
        "single-select questions take 'selected'",
    );
  });

  test('answerProblem: a skipped answer needs no value, a draft does', () => {
    const question = { kind: 'boolean', id: 'ok', message: 'OK?', required: true };
    assert.equal(answerProblem(question, SKIPPED), null);
    assert.equal(
      answerProblem(question, { state: 'draft' }),
      "answer-missing-value: the draft answer to question 'ok' has no value",
    );
  });

  test('answerProblem: each text format says what it needs', () => {
    const needs = {
      email: 'a valid email address',
      uri: 'a valid absolute URI',
      date: 'a date (YYYY-MM-DD)',
      'date-time': 'an RFC 3339 date-time',
    };
    for (const [format, need] of Object.entries(needs)) {
      const question = { kind: 'text', id: 'q', message: 'Q', format };
      assert.equal(
        answerProblem(question, submitted(text('no'))),
        `invalid-answer: the submitted answer to question 'q' is not ${need}`,
      );
    }
  });

  test('sentences count one in the singular', () => {
    const question = {
      kind: 'multi-select',
      id: 'pick',
      message: 'Pick',
      options: options('a'),
      min: 1,
    };
    assert.equal(
      answerProblem(question, submitted(selectedMany([]))),
      "invalid-answer: the submitted answer to question 'pick' has fewer than 1 item",
    );
    assert.equal(
      rejectReason(chat([inputPart({ name: submitted(text('Ada')) })]), completed()),
      "required-unanswered: input request 'form' cannot be accepted: required question " +
        "'agree' has no submitted answer",
    );
  });

  test('tool-call sentences name the call and its status', () => {
    assert.equal(
      rejectReason(chat([RUNNING]), approve()),
      "tool-call-not-pending: tool call 'call-1' is running, not pending-confirmation",
    );
    assert.equal(
      rejectReason(chat([pending()]), approve({ option: 'always' })),
      "unknown-option: tool call 'call-1' offers no option 'always'",
    );
  });
});

// ─── AHP's pending-message and default-chat rules, and upserts ──────────────

describe('AHP rules', () => {
  const queue = {
    ...chat([], null),
    steeringMessage: { id: 'steer', message: MESSAGE },
    queuedMessages: [{ id: 'next', message: MESSAGE }],
  };
  for (const [kind, id, code] of [
    ['steering', 'steer', null],
    ['queued', 'next', null],
    ['steering', 'next', 'no-pending-message'],
    ['queued', 'steer', 'no-pending-message'],
  ]) {
    test(`removing the ${kind} message '${id}' is ${code ?? 'accepted'}`, () => {
      const reason = rejectReason(queue, { type: 'chat/pendingMessageRemoved', kind, id });
      assert.equal(reason === null ? null : reason.split(':')[0], code);
    });
  }

  const session = {
    provider: 'huddle',
    title: 's',
    status: 1,
    lifecycle: 'ready',
    activeClients: [],
    chats: [
      {
        resource: 'ahp-chat:/main',
        title: 'Main',
        status: 1,
        modifiedAt: '1970-01-01T00:00:00.000Z',
      },
    ],
  };
  for (const [defaultChat, code] of [
    ['ahp-chat:/main', null],
    [undefined, null],
    ['ahp-chat:/elsewhere', 'unknown-chat'],
  ]) {
    test(`the default chat ${defaultChat ?? '(cleared)'} is ${code ?? 'accepted'}`, () => {
      const action = { type: 'session/defaultChatChanged' };
      if (defaultChat) action.defaultChat = defaultChat;
      const reason = rejectReason(session, action);
      assert.equal(reason === null ? null : reason.split(':')[0], code);
    });
  }

  test('an upsert may not silently drop an answered question', () => {
    const asked = {
      id: 'r',
      questions: [
        { kind: 'text', id: 'keep', message: 'Keep' },
        { kind: 'text', id: 'drop', message: 'Drop' },
      ],
    };
    let state = reduceChat(chat(), { type: 'chat/inputRequested', request: asked }, 0);
    state = reduceChat(state, changed('drop', draft(text('typed')), 'r'), 0);
    const narrower = { id: 'r', questions: [asked.questions[0]] };
    const reason = rejectReason(state, { type: 'chat/inputRequested', request: narrower });
    assert.equal(
      reason,
      "answered-question-dropped: input request 'r' would drop 'drop', which already have " +
        'answers; send `answers` to say what to keep',
    );
    const explicit = { ...narrower, answers: {} };
    assert.equal(rejectReason(state, { type: 'chat/inputRequested', request: explicit }), null);
    assert.equal(rejectReason(state, { type: 'chat/inputRequested', request: asked }), null);
  });
});
