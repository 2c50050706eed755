// The web client's reconciliation (web/replica.js) with the real chat
// reducer: confirmed state plus pending actions, own echoes, foreign
// actions, rejections, gaps and snapshots.
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { AhpClient } from '../ahp-client.js';
import { overtakenTexts, typedAnswer } from '../overtaken.js';
import { reduce } from '../reducers.js';
import { Replica } from '../replica.js';

const CHAT = 'ahp-chat:/c1';
const ME = 'web-me';
const NOW = 1_000;

function chatWithRequest() {
  return {
    resource: CHAT,
    title: 'Main',
    status: 24,
    modifiedAt: '1970-01-01T00:00:00.000Z',
    turns: [],
    activeTurn: {
      id: 't1',
      startedAt: '1970-01-01T00:00:00.000Z',
      message: { text: 'hi', origin: { kind: 'user' } },
      responseParts: [
        {
          kind: 'inputRequest',
          request: {
            id: 'r1',
            questions: [
              { kind: 'text', id: 'a', message: 'A?' },
              { kind: 'text', id: 'b', message: 'B?' },
            ],
          },
        },
      ],
    },
  };
}

function draft(questionId, text) {
  return {
    type: 'chat/inputAnswerChanged',
    requestId: 'r1',
    questionId,
    answer: { state: 'draft', value: { kind: 'text', value: text } },
  };
}

function replica(fromSeq = 5) {
  const r = new Replica(CHAT, (state, action, nowMs) => reduce('chat', state, action, nowMs));
  r.reset({ state: chatWithRequest(), fromSeq });
  return r;
}

const answers = (state) => state.activeTurn.responseParts[0].request.answers ?? {};
const text = (state, id) => answers(state)[id]?.value.value;

test('a pending action shows at once and its own echo confirms it', () => {
  const r = replica();
  r.addPending(1, draft('a', 'mine'), NOW);
  assert.equal(text(r.state, 'a'), 'mine');
  assert.equal(text(r.confirmed, 'a'), undefined);

  const outcome = r.applyEnvelope(
    { channel: CHAT, action: draft('a', 'mine'), serverSeq: 6, origin: { clientId: ME, clientSeq: 1 } },
    ME,
    NOW,
  );
  assert.deepEqual(outcome, { kind: 'applied', own: true });
  assert.equal(r.pending.length, 0);
  assert.equal(r.serverSeq, 6);
  assert.equal(text(r.state, 'a'), 'mine');
});

test('a foreign action is applied and the pending ones are rebased on it', () => {
  const r = replica();
  r.addPending(1, draft('a', 'mine'), NOW);
  const outcome = r.applyEnvelope(
    { channel: CHAT, action: draft('b', 'theirs'), serverSeq: 6, origin: { clientId: 'web-other', clientSeq: 9 } },
    ME,
    NOW,
  );
  assert.deepEqual(outcome, { kind: 'applied', own: false });
  assert.equal(r.pending.length, 1);
  assert.equal(text(r.state, 'a'), 'mine');
  assert.equal(text(r.state, 'b'), 'theirs');
  assert.equal(text(r.confirmed, 'a'), undefined);
});

test('a rejection drops the pending action and says why', () => {
  const r = replica();
  const before = r.state;
  r.addPending(1, draft('a', 'mine'), NOW);
  const outcome = r.applyEnvelope(
    {
      channel: CHAT,
      action: draft('a', 'mine'),
      serverSeq: 5,
      origin: { clientId: ME, clientSeq: 1 },
      rejectionReason: 'no-open-input-request: gone',
    },
    ME,
    NOW,
  );
  assert.equal(outcome.kind, 'rejected');
  assert.equal(outcome.reason, 'no-open-input-request: gone');
  assert.deepEqual(outcome.action, draft('a', 'mine'));
  assert.equal(r.pending.length, 0);
  assert.deepEqual(r.state, before);
  assert.equal(r.serverSeq, 5, 'a rejection uses no seq');
});

test('an envelope seen before is ignored and a missed one is reported as a gap', () => {
  const r = replica();
  const old = { channel: CHAT, action: draft('a', 'x'), serverSeq: 5 };
  assert.deepEqual(r.applyEnvelope(old, ME, NOW), { kind: 'duplicate' });
  const ahead = { channel: CHAT, action: draft('a', 'x'), serverSeq: 8 };
  assert.deepEqual(r.applyEnvelope(ahead, ME, NOW), { kind: 'gap', expected: 6 });
  assert.equal(text(r.state, 'a'), undefined);
});

test('a snapshot after a reconnect keeps the pending actions on top', () => {
  const r = replica();
  r.addPending(1, draft('a', 'typed offline'), NOW);
  const fresh = reduce('chat', chatWithRequest(), draft('b', 'from the server'), NOW);
  r.reset({ state: fresh, fromSeq: 40 });
  assert.equal(r.serverSeq, 40);
  assert.equal(text(r.state, 'a'), 'typed offline');
  assert.equal(text(r.state, 'b'), 'from the server');
});

test('the rendered state is recomputed only after a change', () => {
  const r = replica();
  r.addPending(1, draft('a', 'mine'), NOW);
  assert.equal(r.state, r.state);
  assert.ok(r.hasPending((action) => action.questionId === 'a'));
  assert.ok(!r.hasPending((action) => action.questionId === 'b'));
});

test('after a snapshot resume every pending action stays, to be sent again', () => {
  const client = new AhpClient({ url: 'ws://unused/ahp', clientId: ME });
  const r = replica();
  client.replicas.set(CHAT, r);
  const complete = { type: 'chat/inputCompleted', requestId: 'r1', response: 'decline' };
  r.addPending(1, draft('a', 'typed offline'), NOW);
  r.addPending(2, complete, NOW);
  r.pending.forEach((entry) => { entry.sentOn = 0; }); // the socket dropped
  // The snapshot shows the request completed: by us before the drop, or by someone else.
  const settled = reduce('chat', chatWithRequest(), complete, NOW);
  client.applyResume({ type: 'snapshot', channel: CHAT, snapshot: { resource: CHAT, state: settled, fromSeq: 9 } });
  assert.deepEqual(r.pending.map((entry) => entry.clientSeq), [1, 2]);
  assert.equal(r.state.activeTurn.responseParts[0].response, 'decline');
});

test("the server's answer to an action sent again confirms it without applying it twice", () => {
  const r = replica(5);
  const complete = { type: 'chat/inputCompleted', requestId: 'r1', response: 'decline' };
  // Landed as seq 6 before the drop; a snapshot at 9 holds it, and it is pending again.
  r.reset({ state: reduce('chat', chatWithRequest(), complete, NOW), fromSeq: 9 });
  r.addPending(4, complete, NOW);
  const first = { channel: CHAT, action: complete, serverSeq: 6, origin: { clientId: ME, clientSeq: 4 } };
  assert.deepEqual(r.applyEnvelope(first, ME, NOW), { kind: 'duplicate', own: true });
  assert.equal(r.pending.length, 0);
  assert.equal(r.serverSeq, 9);
  // Someone else's old envelope confirms nothing of ours.
  r.addPending(5, draft('a', 'x'), NOW);
  const foreign = { channel: CHAT, action: draft('a', 'x'), serverSeq: 7, origin: { clientId: 'web-other', clientSeq: 5 } };
  assert.deepEqual(r.applyEnvelope(foreign, ME, NOW), { kind: 'duplicate' });
  assert.equal(r.pending.length, 1);
});

// ─── Answers others changed while ours waited (web/overtaken.js) ────────────

/** A client holding `r`, on a socket that records what it sends. */
function clientOf(r) {
  const client = new AhpClient({ url: 'ws://unused/ahp', clientId: ME });
  client.replicas.set(CHAT, r);
  const sent = [];
  client.socket = { send: (text) => sent.push(JSON.parse(text).params.action) };
  const told = [];
  client.addEventListener('overtaken', ({ detail }) => told.push(...detail.actions));
  return { client, sent, told };
}

test("an answer someone else changed while ours waited offline is dropped and told, not sent", () => {
  const r = replica(5);
  const { client, sent, told } = clientOf(r);
  r.addPending(1, draft('a', 'mine, typed offline'), NOW);
  r.addPending(2, draft('b', 'nobody else touched this'), NOW);
  const theirs = { channel: CHAT, action: draft('a', 'theirs'), serverSeq: 6, origin: { clientId: 'web-dana', clientSeq: 1 } };
  r.applyEnvelope(theirs, ME, NOW);
  client.flushPending(); // back online
  assert.deepEqual(told, [draft('a', 'mine, typed offline')]);
  assert.deepEqual(sent, [draft('b', 'nobody else touched this')]);
  assert.equal(answers(r.state).a.value.value, 'theirs');
});

test('an edit in flight when another arrives is still sent by a page that stays connected', () => {
  const r = replica(5);
  const { client, sent } = clientOf(r);
  r.addPending(1, draft('a', 'mine'), NOW);
  client.sendPending(r, r.pending[0]); // online: out at once; the server orders both
  r.applyEnvelope({ channel: CHAT, action: draft('a', 'theirs'), serverSeq: 6, origin: { clientId: 'web-dana', clientSeq: 1 } }, ME, NOW);
  client.flushPending();
  assert.deepEqual(sent, [draft('a', 'mine')]);
  r.applyEnvelope({ channel: CHAT, action: draft('a', 'mine'), serverSeq: 7, origin: { clientId: ME, clientSeq: 1 } }, ME, NOW);
  assert.equal(answers(r.state).a.value.value, 'mine');
});

test('after a snapshot, an answer changed to something not ours overtakes our edits of it', () => {
  const r = replica(5);
  const { client, sent, told } = clientOf(r);
  r.addPending(1, draft('a', 'SSO'), NOW);
  r.addPending(2, draft('a', 'SSO only'), NOW);
  r.addPending(3, draft('b', 'kept'), NOW);
  const changed = reduce('chat', chatWithRequest(), draft('a', 'SSO and VPN'), NOW);
  client.applyResume({ type: 'snapshot', channel: CHAT, snapshot: { resource: CHAT, state: changed, fromSeq: 9 } });
  client.flushPending();
  assert.deepEqual(told.map((a) => a.answer.value.value), ['SSO', 'SSO only']);
  assert.deepEqual(sent, [draft('b', 'kept')]);
});

test('after a snapshot, our own edit that landed before the drop overtakes nothing of ours', () => {
  const r = replica(5);
  const { client, sent, told } = clientOf(r);
  r.addPending(1, draft('a', 'SSO'), NOW); // landed before the drop; its echo was lost
  r.addPending(2, draft('a', 'SSO only'), NOW); // typed offline
  const landed = reduce('chat', chatWithRequest(), draft('a', 'SSO'), NOW);
  client.applyResume({ type: 'snapshot', channel: CHAT, snapshot: { resource: CHAT, state: landed, fromSeq: 6 } });
  client.flushPending();
  assert.deepEqual(told, []);
  assert.deepEqual(sent, [draft('a', 'SSO'), draft('a', 'SSO only')]);
});

test('what the page says of dropped edits: once per answer, its last text, and the submit', () => {
  const submit = { type: 'chat/inputCompleted', requestId: 'r1', response: 'accept', answers: {} };
  const texts = overtakenTexts(chatWithRequest(), [draft('a', 'SS'), draft('a', 'SSO only'), submit]);
  assert.deepEqual(texts, [
    'Your answer to “A?” was not sent: someone changed it while you were offline, and theirs stays. You had answered: “SSO only”.',
    'Your submit was not sent either: an answer changed while you were offline. Check the answers, then submit again.',
  ]);
  assert.match(overtakenTexts(null, [draft('a', 'x')])[0], /^Your answer to “a question” was not sent/);
});

test('a submit queued after an overtaken answer is dropped too, and told', () => {
  const r = replica(5);
  const { client, sent, told } = clientOf(r);
  const submit = { type: 'chat/inputCompleted', requestId: 'r1', response: 'accept', answers: {} };
  const other = { type: 'chat/inputCompleted', requestId: 'r2', response: 'accept', answers: {} };
  r.addPending(1, draft('a', 'mine'), NOW);
  r.addPending(2, submit, NOW);
  r.addPending(3, other, NOW); // another request's: it rests on nothing dropped
  r.applyEnvelope({ channel: CHAT, action: draft('a', 'theirs'), serverSeq: 6, origin: { clientId: 'web-dana', clientSeq: 1 } }, ME, NOW);
  client.flushPending();
  assert.deepEqual(told, [draft('a', 'mine'), submit]);
  assert.deepEqual(sent, [other]);
});

test('a submit that carries an answer someone else changed meanwhile is dropped, and the answer told', () => {
  const r = replica(5);
  const { client, sent, told } = clientOf(r);
  const enter = { type: 'chat/inputCompleted', requestId: 'r1', response: 'accept', answers: { a: draft('a', '5').answer } };
  r.addPending(1, enter, NOW); // Enter in a field, offline: the submit carries the answer
  r.applyEnvelope({ channel: CHAT, action: draft('a', '500'), serverSeq: 6, origin: { clientId: 'web-dana', clientSeq: 1 } }, ME, NOW);
  client.flushPending();
  assert.deepEqual(told, [enter]);
  assert.deepEqual(sent, []);
  assert.equal(overtakenTexts(r.state, told).length, 2); // the answer, and the submit
});

test('after a snapshot, a submit carrying an answer changed to something not ours is overtaken', () => {
  const r = replica(5);
  const { client, told } = clientOf(r);
  const enter = { type: 'chat/inputCompleted', requestId: 'r1', response: 'accept', answers: { a: draft('a', '5').answer } };
  r.addPending(1, enter, NOW);
  const changed = reduce('chat', chatWithRequest(), draft('a', '500'), NOW);
  client.applyResume({ type: 'snapshot', channel: CHAT, snapshot: { resource: CHAT, state: changed, fromSeq: 9 } });
  client.flushPending();
  assert.deepEqual(told, [enter]);
});

test('the text of a typed answer is found in the active turn, or the last one once it ended', () => {
  const state = chatWithRequest();
  assert.equal(typedAnswer(state, draft('b', 'typed')), 'typed');
  const ended = { ...state, turns: [state.activeTurn], activeTurn: undefined };
  assert.equal(typedAnswer(ended, draft('a', 'late')), 'late');
  assert.equal(typedAnswer(ended, { ...draft('a', 'x'), requestId: 'gone' }), null);
  assert.equal(typedAnswer(state, { type: 'chat/inputAnswerChanged', requestId: 'r1', questionId: 'a' }), null);
});
