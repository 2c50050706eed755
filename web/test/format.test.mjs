// What the page says when a person's decision came too late (web/format.js):
// the server's rejection codes of a late decision (reducers/validation.py,
// reducers/notes.py expired_wait).
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { visibleControls } from '../dom.js';
import { tooLateText } from '../format.js';

const NOT_PENDING = "tool-call-not-pending: tool call 'c1' is not pending confirmation";
const CLOSED = "no-open-input-request: the active turn has no open input request 'r1'";
const EXPIRED = "expired: the tool call 'c1' expired at 2026-12-03T10:00:00.000Z and takes no answer any more";

test('a late decision on a tool call is told as late, approval or denial, decided or expired', () => {
  const approve = { type: 'chat/toolCallConfirmed', turnId: 't', toolCallId: 'c1', approved: true };
  const deny = { ...approve, approved: false };
  assert.equal(tooLateText(approve, NOT_PENDING), 'Your approval did not count: the call was no longer waiting when it arrived.');
  assert.equal(tooLateText(deny, NOT_PENDING), 'Your denial did not count: the call was no longer waiting when it arrived.');
  assert.equal(tooLateText(deny, EXPIRED), "Your denial did not count: the call's time ran out before it arrived.");
  const check = { type: 'chat/toolCallResultConfirmed', turnId: 't', toolCallId: 'c1', approved: true };
  assert.match(tooLateText(check, NOT_PENDING), /^Your check of the result did not count/);
});

test('a late reply to a request is told as late, whatever it was', () => {
  const reply = (response, extra = {}) => ({ type: 'chat/inputCompleted', requestId: 'r1', response, ...extra });
  assert.equal(tooLateText(reply('accept', { answers: {} }), CLOSED), 'Your answers did not count: the request was no longer waiting when they arrived.');
  assert.equal(tooLateText(reply('accept'), CLOSED), 'Your reply did not count: the request was no longer waiting when it arrived.'); // a link's Done
  assert.equal(tooLateText(reply('decline'), CLOSED), 'Your decline did not count: the request was no longer waiting when it arrived.');
  assert.equal(tooLateText(reply('cancel'), EXPIRED), "Your cancel did not count: the request's time ran out before it arrived.");
});

test('other rejections are not late: they say their own reason', () => {
  const reply = { type: 'chat/inputCompleted', requestId: 'r1', response: 'accept' };
  assert.equal(tooLateText(reply, "required-unanswered: question 'q' is required"), null);
  assert.equal(tooLateText(reply, 'forbidden: observers may not dispatch'), null);
  const answer = { type: 'chat/inputAnswerChanged', requestId: 'r1', questionId: 'q' };
  assert.equal(tooLateText(answer, CLOSED), null);
  assert.equal(tooLateText({ type: 'chat/toolCallConfirmed', approved: true }, undefined), null);
});

test('bidi controls and zero-width characters are shown, not obeyed', () => {
  assert.equal(visibleControls('Invoice \u202efdp.exe'), 'Invoice ⟨U+202E⟩fdp.exe');
  assert.equal(visibleControls('\u2066a\u2069\u200fb\u061c'), '⟨U+2066⟩a⟨U+2069⟩⟨U+200F⟩b⟨U+061C⟩');
  assert.equal(visibleControls('pay\u200bpal\u2060\ufeff'), 'pay⟨U+200B⟩pal⟨U+2060⟩⟨U+FEFF⟩');
  assert.equal(visibleControls('\u200dlone\u200c'), '⟨U+200D⟩lone⟨U+200C⟩');
  assert.equal(visibleControls('Plain title'), 'Plain title');
  assert.equal(visibleControls(undefined), '');
});

test('a joiner between letters or emoji is writing, not hidden text', () => {
  for (const text of ['\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645', '👨\u200d👩\u200d👧', '👩🏽\u200d💻', '🏳️\u200d🌈']) {
    assert.equal(visibleControls(text), text);
  }
});
