// The JavaScript reducers against Huddle's language-neutral reducer fixtures
// (tests/fixtures/reducers/), the same files the Python reducers pass, run the
// way reducers/fixtures.py runs them. Then purity and totality.
//
//   node --test web/test/
//
// HUDDLE_EXTRA_FIXTURES=<dir> also runs every fixture of another folder (for
// example AHP's own, types/test-cases/reducers) to check parity by hand.

import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
  ACTION_TYPES,
  isClientDispatchable,
  isoTime,
  reduce,
  SessionStatus,
  selectActivity,
} from '../reducers.js';
import { rejectReason } from '../validation.js';

/** AHP generated its fixtures with this clock; so do we. */
const AHP_FIXTURE_NOW_MS = 9999;
const FIXTURES = fileURLToPath(new URL('../../tests/fixtures/reducers/', import.meta.url));
const FIXTURE_KEYS = ['description', 'reducer', 'initial', 'actions', 'expected'];
const REDUCERS = new Set(['root', 'session', 'chat']);
const KNOWN_TYPES = new Set(ACTION_TYPES);

/** `value` with every `null` object member removed (null means absent). */
function stripNulls(value) {
  if (Array.isArray(value)) return value.map(stripNulls);
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value).filter(([, v]) => v !== null);
    return Object.fromEntries(entries.map(([k, v]) => [k, stripNulls(v)]));
  }
  return value;
}

/** `value`, frozen all the way down: a reducer that writes to it throws. */
function deepFreeze(value) {
  if (value !== null && typeof value === 'object') {
    Object.values(value).forEach(deepFreeze);
    Object.freeze(value);
  }
  return value;
}

/** The fixtures of `directory` that this runner can run, by file name. */
function loadFixtures(directory) {
  const fixtures = [];
  for (const name of readdirSync(directory).filter((n) => n.endsWith('.json')).sort()) {
    const data = JSON.parse(readFileSync(join(directory, name), 'utf8'));
    const shaped = data !== null && typeof data === 'object' && !Array.isArray(data);
    if (shaped && FIXTURE_KEYS.every((key) => key in data) && REDUCERS.has(data.reducer)) {
      fixtures.push({ name, data });
    }
  }
  return fixtures;
}

/**
 * Run one fixture as reducers/fixtures.py does, on deep-frozen inputs: an
 * action of unknown type is skipped; with `validate`, each action is checked
 * first, its rejection code (the part before the first colon) must be the
 * fixture's, and a rejected action is not reduced.
 * @returns {{state: object, initial: object, error: string | null}}
 */
function runFixture(data, nowMs = AHP_FIXTURE_NOW_MS) {
  const initial = deepFreeze(stripNulls(data.initial));
  const rejections = data.rejections ?? [];
  let state = initial;
  for (const [index, raw] of data.actions.entries()) {
    if (!KNOWN_TYPES.has(raw.type)) continue;
    const action = deepFreeze(stripNulls(raw));
    if (data.validate) {
      const reason = rejectReason(state, action);
      const code = reason === null ? null : reason.split(':')[0];
      const wanted = rejections[index] ?? null;
      if (code !== wanted) {
        const error = `action ${index}: expected rejection ${wanted}, got ${reason}`;
        return { state, initial, error };
      }
      if (reason !== null) continue;
    }
    state = reduce(data.reducer, state, action, nowMs);
  }
  return { state, initial, error: null };
}

/** Fixtures of one folder, one test each. */
function fixtureSuite(title, directory) {
  describe(title, () => {
    for (const { name, data } of loadFixtures(directory)) {
      test(`${name}: ${data.description}`, () => {
        const { state, error } = runFixture(data);
        assert.equal(error, null);
        assert.deepEqual(stripNulls(state), stripNulls(data.expected));
      });
    }
  });
}

fixtureSuite('Huddle reducer fixtures', FIXTURES);
const EXTRA = process.env.HUDDLE_EXTRA_FIXTURES;
if (EXTRA) fixtureSuite(`fixtures of ${EXTRA}`, EXTRA);

// ─── Purity and totality ────────────────────────────────────────────────────

const OURS = loadFixtures(FIXTURES);

describe('purity', () => {
  test('every fixture leaves its frozen initial state and actions as they were', () => {
    for (const { name, data } of OURS) {
      const before = structuredClone(data);
      // runFixture freezes copies; freezing the fixture itself too catches a
      // reducer that writes into an action it stored in the state.
      runFixture(deepFreeze(structuredClone(data)));
      assert.deepEqual(data, before, name);
    }
  });

  test('the same fixture reduces to the same state twice', () => {
    for (const { name, data } of OURS) {
      assert.deepEqual(runFixture(data).state, runFixture(data).state, name);
    }
  });

  test('a no-op action returns the very same state object', () => {
    for (const { name, data } of OURS.filter((f) => f.name.includes('-is-a-no-op'))) {
      const { state, initial } = runFixture(data);
      assert.equal(state, initial, name);
    }
  });

  test('the clock stamps modifiedAt and nothing else', () => {
    const name = 'chat-turnStarted-opens-the-active-turn-and-clears-isRead.json';
    const chat = OURS.find((f) => f.name === name);
    const early = runFixture(chat.data, 1000).state;
    const late = runFixture(chat.data, 2000).state;
    assert.equal(early.modifiedAt, '1970-01-01T00:00:01.000Z');
    assert.deepEqual({ ...late, modifiedAt: early.modifiedAt }, early);
  });
});

describe('totality', () => {
  // Every action of every fixture against every initial state of every kind:
  // each is well-formed, so no reducer and no rule may throw, whatever the
  // state; and an action of another family is a no-op.
  const states = OURS.map(({ data }) => [data.reducer, deepFreeze(stripNulls(data.initial))]);
  const actions = OURS.flatMap(({ data }) => data.actions)
    .filter((action) => KNOWN_TYPES.has(action.type))
    .map((action) => deepFreeze(stripNulls(action)));

  test('no reducer and no rule throws on a well-formed action', () => {
    for (const [kind, state] of states) {
      for (const action of actions) {
        const next = reduce(kind, state, action, AHP_FIXTURE_NOW_MS);
        assert.equal(typeof next, 'object');
        rejectReason(state, action);
        if (!action.type.startsWith(`${kind}/`)) assert.equal(next, state);
      }
    }
  });

  test('an unknown action type is a no-op', () => {
    for (const [kind, state] of states) {
      const action = { type: `${kind}/fromTheFuture`, turnId: 't' };
      assert.equal(reduce(kind, state, action, AHP_FIXTURE_NOW_MS), state);
      assert.equal(rejectReason(state, action), null);
    }
  });
});

// ─── Small exports ──────────────────────────────────────────────────────────

describe('exports', () => {
  test('isoTime writes milliseconds and Z, as AHP does', () => {
    assert.equal(isoTime(AHP_FIXTURE_NOW_MS), '1970-01-01T00:00:09.999Z');
    assert.equal(isoTime(0), '1970-01-01T00:00:00.000Z');
  });

  test('isClientDispatchable knows the client actions and only them', () => {
    assert.ok(isClientDispatchable('chat/inputAnswerChanged'));
    assert.ok(isClientDispatchable('chat/inputCompleted'));
    assert.ok(isClientDispatchable('root/configChanged'));
    assert.ok(!isClientDispatchable('chat/inputRequested'));
    assert.ok(!isClientDispatchable('session/inputNeededSet'));
    assert.ok(!isClientDispatchable('chat/fromTheFuture'));
    assert.ok(ACTION_TYPES.filter(isClientDispatchable).length === 27);
  });

  test('selectActivity follows what waits on a person', () => {
    const message = { text: 'hi', origin: { kind: 'user' } };
    const turn = (parts) => ({
      resource: 'ahp-chat:/c',
      title: 't',
      status: 1,
      modifiedAt: isoTime(0),
      turns: [],
      activeTurn: { id: 't', startedAt: isoTime(0), message, responseParts: parts },
    });
    const call = (status) => ({ kind: 'toolCall', toolCall: { status, toolCallId: 'c' } });
    const open = { kind: 'inputRequest', request: { id: 'r' } };
    assert.equal(selectActivity({ ...turn([]), activeTurn: undefined }), SessionStatus.IDLE);
    assert.equal(selectActivity(turn([])), SessionStatus.IN_PROGRESS);
    assert.equal(selectActivity(turn([open])), SessionStatus.INPUT_NEEDED);
    const resolved = { ...open, response: 'accept' };
    assert.equal(selectActivity(turn([resolved])), SessionStatus.IN_PROGRESS);
    assert.equal(selectActivity(turn([call('running')])), SessionStatus.IN_PROGRESS);
    assert.equal(selectActivity(turn([call('auth-required')])), SessionStatus.INPUT_NEEDED);
    assert.equal(selectActivity(turn([{ kind: 'somethingNew' }])), SessionStatus.IN_PROGRESS);
  });
});
