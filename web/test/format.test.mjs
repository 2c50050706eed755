// What the page says when a person's decision came too late (web/format.js):
// the server's rejection codes of a second decision (reducers/validation.py).
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { tooLateText } from '../format.js';

const NOT_PENDING = "tool-call-not-pending: tool call 'c1' is not pending confirmation";
const CLOSED = "no-open-input-request: the active turn has no open input request 'r1'";

test('a second decision on a tool call is told as too late, approval or denial', () => {
  const approve = { type: 'chat/toolCallConfirmed', turnId: 't', toolCallId: 'c1', approved: true };
  const deny = { ...approve, approved: false };
  assert.equal(tooLateText(approve, NOT_PENDING), 'Your approval did not count: the call was already decided when it arrived.');
  assert.equal(tooLateText(deny, NOT_PENDING), 'Your denial did not count: the call was already decided when it arrived.');
  const check = { type: 'chat/toolCallResultConfirmed', turnId: 't', toolCallId: 'c1', approved: true };
  assert.match(tooLateText(check, NOT_PENDING), /^Your check of the result did not count/);
});

test('a second reply to a request is told as too late, whatever it was', () => {
  const reply = (response) => ({ type: 'chat/inputCompleted', requestId: 'r1', response });
  assert.equal(tooLateText(reply('accept'), CLOSED), 'Your answers did not count: the request was already closed when they arrived.');
  assert.equal(tooLateText(reply('decline'), CLOSED), 'Your decline did not count: the request was already closed when it arrived.');
  assert.equal(tooLateText(reply('cancel'), CLOSED), 'Your cancel did not count: the request was already closed when it arrived.');
});

test('other rejections are not too late: they say their own reason', () => {
  const reply = { type: 'chat/inputCompleted', requestId: 'r1', response: 'accept' };
  assert.equal(tooLateText(reply, "required-unanswered: question 'q' is required"), null);
  assert.equal(tooLateText(reply, 'forbidden: observers may not dispatch'), null);
  const answer = { type: 'chat/inputAnswerChanged', requestId: 'r1', questionId: 'q' };
  assert.equal(tooLateText(answer, CLOSED), null);
  assert.equal(tooLateText({ type: 'chat/toolCallConfirmed', approved: true }, undefined), null);
});
