// How the web client names people and deadlines (web/people.js): from the
// server's notes and active clients only.
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import { sameAnswer } from '../questions.js';
import {
  answerActivity,
  answerCredit,
  deadlineOf,
  displayOf,
  expiryOutcome,
  formatLeft,
  isExpired,
  isMe,
  peopleOf,
  presentPeople,
  requestNote,
  toolCallNote,
  turnStampOf,
  typedName,
} from '../people.js';

/** Typed names and what becomes of them, shared with tests/test_people.py. */
const NAMES = JSON.parse(readFileSync(new URL('../../tests/fixtures/names/typed-names.json', import.meta.url), 'utf8'));

const CHAT = 'ahp-chat:/c';
const DANA = { name: 'Dana', role: 'participant', token: 't-link', declared: true };
const LEE = { name: 'Lee', role: 'participant', token: 't-lee' };
const ME_LEE = { ...LEE, display: 'Lee', shared: false };

test('a name typed for a shared link is shown marked, as the server displays it', () => {
  assert.equal(displayOf(DANA), 'Dana · shared link');
  assert.equal(displayOf(LEE), 'Lee');
  assert.equal(displayOf(null), 'Someone');
});

test('a signed-in person is shown with the email their issuer vouches for', () => {
  const dana = { name: 'Dana Scully', email: 'dana@example.com', issuer: 'https://id.example' };
  assert.equal(displayOf(dana), 'Dana Scully (dana@example.com)');
  assert.equal(displayOf({ ...dana, name: 'dana@example.com' }), 'dana@example.com');
  // An email without an issuer is nobody's word: a link's holder shows their name.
  assert.equal(displayOf({ name: 'Lee', email: 'boss@example.com' }), 'Lee');
});

test('I am the holder of my token under my name: one shared link is many people', () => {
  assert.ok(isMe(LEE, ME_LEE));
  assert.ok(!isMe(DANA, ME_LEE));
  const sam = { name: 'Sam', role: 'participant', token: 't-link', declared: true };
  assert.ok(!isMe(sam, { ...DANA, display: 'Dana · shared link', shared: true }));
  assert.ok(!isMe(LEE, null));
});

test('notes are read for the chat at hand', () => {
  const session = {
    _meta: {
      huddle: {
        requests: { [CHAT]: { r1: { completed: { by: LEE, response: 'accept' } } } },
        toolCalls: { [CHAT]: { c1: { decided: { by: DANA, approved: false } } } },
      },
    },
  };
  const people = peopleOf(session, CHAT, ME_LEE);
  assert.equal(requestNote(people, 'r1').completed.by, LEE);
  assert.equal(toolCallNote(people, 'c1').decided.approved, false);
  assert.equal(requestNote(peopleOf(session, 'ahp-chat:/other', ME_LEE), 'r1'), null);
  assert.equal(requestNote(peopleOf(null, CHAT, null), 'r1'), null);
});

test("a note is of its turn's wait: another turn's is passed over, one naming none is any turn's", () => {
  const session = {
    _meta: {
      huddle: {
        requests: { [CHAT]: { r1: { turn: 'aaaaaaaa', expiresAt: 5000 }, r2: { expiresAt: 6000 } } },
        toolCalls: { [CHAT]: { c1: { turn: 'bbbbbbbb', decided: { by: DANA, approved: true } } } },
      },
    },
  };
  const people = peopleOf(session, CHAT, ME_LEE);
  const stampOf = (stamp) => turnStampOf({ message: { _meta: { huddle: { turn: stamp } } } });
  assert.equal(stampOf('aaaaaaaa'), 'aaaaaaaa');
  assert.equal(turnStampOf({ message: {} }), null);
  assert.equal(requestNote(people, 'r1', stampOf('aaaaaaaa')).expiresAt, 5000);
  assert.equal(requestNote(people, 'r1', stampOf('bbbbbbbb')), null);
  assert.equal(requestNote(people, 'r1'), null);
  assert.equal(requestNote(people, 'r2', 'bbbbbbbb').expiresAt, 6000);
  assert.equal(toolCallNote(people, 'c1', 'bbbbbbbb').decided.by, DANA);
  assert.equal(toolCallNote(people, 'c1', 'aaaaaaaa'), null);
});

test("someone else's draft is typing, their answer answered, mine says nothing", () => {
  const note = {
    answers: {
      a: { by: DANA, state: 'draft' },
      b: { by: DANA, state: 'submitted' },
      c: { by: DANA, state: 'skipped' },
      d: { by: LEE, state: 'draft' },
    },
  };
  assert.equal(answerActivity(note, 'a', ME_LEE), 'Dana · shared link is typing…');
  assert.equal(answerActivity(note, 'b', ME_LEE), 'answered by Dana · shared link');
  assert.equal(answerActivity(note, 'c', ME_LEE), 'skipped by Dana · shared link');
  assert.equal(answerActivity(note, 'd', ME_LEE), '');
  assert.equal(answerActivity(note, 'none', ME_LEE), '');
  assert.equal(answerCredit(note, 'd'), 'answered by Lee');
  assert.equal(answerCredit(note, 'c'), 'skipped by Dana · shared link');
  assert.equal(answerCredit(null, 'a'), '');
});

test('who is here: one entry per name, mine first and marked, never a client id', () => {
  const clients = [
    { clientId: 'web-2', displayName: 'Lee', tools: [] },
    { clientId: 'web-1', displayName: 'Dana · shared link', tools: [] },
    { clientId: 'web-3', displayName: 'Lee', tools: [] },
    { clientId: 'py-agent', tools: [] },
  ];
  assert.deepEqual(presentPeople(clients, 'web-3'), [
    { name: 'Lee', count: 2, me: true },
    { name: 'Dana · shared link', count: 1, me: false },
    { name: 'Someone', count: 1, me: false },
  ]);
  assert.deepEqual(presentPeople(undefined, 'web-3'), []);
});

test('a deadline reads as the time left and what happens then', () => {
  assert.equal(formatLeft(65_000), '1:05');
  assert.equal(formatLeft(64_001), '1:05', 'rounded up to the second');
  assert.equal(formatLeft(3_723_000), '1:02:03');
  assert.equal(formatLeft(2 * 86_400_000 + 3 * 3_600_000), '2 d 3 h');
  assert.equal(formatLeft(-5), '0:00');
  assert.equal(expiryOutcome('decline'), 'it is declined');
  assert.equal(expiryOutcome('decline', 'toolCalls'), 'it is denied');
  assert.equal(expiryOutcome('fail', 'toolCalls'), 'the turn fails');
  assert.equal(expiryOutcome(undefined), 'it is cancelled');
  assert.deepEqual(deadlineOf({ expiresAt: 5000 }), { expiresAt: 5000, onExpiry: 'cancel' });
  assert.equal(deadlineOf({ answers: {} }), null);
  assert.ok(isExpired({ expiresAt: 5000 }, 5000));
  assert.ok(!isExpired({ expiresAt: 5000 }, 4999));
  assert.ok(!isExpired(null, 4999));
});

test('answers are the same whatever the order of their keys', () => {
  const a = { state: 'submitted', value: { kind: 'selected', value: 'x', freeformValues: ['y'] } };
  const b = { value: { freeformValues: ['y'], value: 'x', kind: 'selected' }, state: 'submitted' };
  assert.ok(sameAnswer(a, b));
  assert.ok(!sameAnswer(a, { ...b, state: 'draft' }));
  assert.ok(!sameAnswer(a, null));
  assert.ok(sameAnswer(null, undefined));
  assert.ok(sameAnswer({ state: 'skipped' }, { state: 'skipped' }));
});

for (const { id, typed, name } of NAMES.accepted) {
  test(`a typed name is taken as the server shows it: ${id}`, () => {
    assert.deepEqual(typedName(typed), { name });
  });
}

for (const { id, typed, reason } of NAMES.refused) {
  test(`a typed name is refused in the server's words: ${id}`, () => {
    assert.deepEqual(typedName(typed), { problem: reason });
  });
}
