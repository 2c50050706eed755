// The browser's copy of the host's validation rules against the shared cases
// of tests/fixtures/validation/*.json (the format and what is checked are in
// the README.md there), the same files tests/test_validation.py runs through
// reducers/validation.py. The sentence must be the server's, word for word.
// The server's JSON Schema checks have no cases here: the browser never holds
// those schemas.

import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { answerProblem, rejectReason } from '../validation.js';

const FIXTURES = fileURLToPath(new URL('../../tests/fixtures/validation/', import.meta.url));
/** No sentence may contain it; fixtures write it into values that must not leak. */
const SECRET = 'hunter2';
const VALUE_KINDS = new Set(['text', 'number', 'boolean', 'selected', 'selected-many']);

/** `value` with every `null` object member removed (null means absent). */
function stripNulls(value) {
  if (Array.isArray(value)) return value.map(stripNulls);
  if (value !== null && typeof value === 'object') {
    const entries = Object.entries(value).filter(([, v]) => v !== null);
    return Object.fromEntries(entries.map(([k, v]) => [k, stripNulls(v)]));
  }
  return value;
}

/** `value`, frozen all the way down: a rule that writes to it throws. */
function deepFreeze(value) {
  if (value !== null && typeof value === 'object') {
    Object.values(value).forEach(deepFreeze);
    Object.freeze(value);
  }
  return value;
}

/** Every fixture file, by name without `.json`. */
function loadFiles() {
  return readdirSync(FIXTURES)
    .filter((name) => name.endsWith('.json'))
    .sort()
    .map((name) => ({
      file: name.slice(0, -'.json'.length),
      data: JSON.parse(readFileSync(join(FIXTURES, name), 'utf8')),
    }));
}

/** The leaf of an answer value as texts: strings, and finite numbers as JSON writes them. */
function leafTexts(value) {
  if (typeof value === 'string') return [value];
  if (Array.isArray(value)) return value.filter((item) => typeof item === 'string');
  if (typeof value === 'number' && Number.isFinite(value)) return [JSON.stringify(value)];
  return [];
}

/**
 * Every answer value, free-form value, tool input and edited tool input in
 * `value` (wire JSON), as text; the same walk as the Python runner's.
 * @returns {string[]}
 */
function carriedValues(value) {
  if (Array.isArray(value)) return value.flatMap(carriedValues);
  if (value === null || typeof value !== 'object') return [];
  const found = [];
  if (VALUE_KINDS.has(value.kind) && 'value' in value) {
    found.push(...leafTexts(value.value), ...leafTexts(value.freeformValues));
  }
  for (const key of ['toolInput', 'editedToolInput']) {
    if (typeof value[key] === 'string') found.push(value[key]);
  }
  for (const member of Object.values(value)) found.push(...carriedValues(member));
  return found;
}

function assertLeaksNothing(sentence, ...carriers) {
  assert.ok(!sentence.includes(SECRET), sentence);
  for (const text of carriedValues(carriers)) {
    if (text.length >= 3) assert.ok(!sentence.includes(text), `the sentence quotes ${text}`);
  }
}

/**
 * Run one case on deep-frozen copies of its inputs (a rule that writes to
 * them throws) and check the inputs are as the file wrote them afterwards:
 * the host keeps this state when it rejects.
 * @returns {{got: string | null, carriers: object[]}}
 */
function runCase(raw, state, session) {
  if ('action' in raw) {
    const [frozenState, action, frozenSession] = [state, raw.action, session ?? null].map((v) =>
      deepFreeze(stripNulls(v)),
    );
    const got = rejectReason(frozenState, action, frozenSession);
    assert.deepEqual(frozenState, stripNulls(state));
    assert.deepEqual(action, stripNulls(raw.action));
    assert.deepEqual(frozenSession, stripNulls(session ?? null));
    return { got, carriers: [state, session ?? null, raw.action] };
  }
  const [question, answer] = [raw.question, raw.answer].map((v) => deepFreeze(stripNulls(v)));
  const got = answerProblem(question, answer, raw.requestId ?? undefined);
  assert.deepEqual(question, stripNulls(raw.question));
  assert.deepEqual(answer, stripNulls(raw.answer));
  return { got, carriers: [raw.answer] };
}

for (const { file, data } of loadFiles()) {
  describe(`${file}: ${data.description}`, () => {
    for (const raw of data.cases) {
      test(raw.id, () => {
        const { got, carriers } = runCase(
          raw,
          data.states?.[raw.state],
          raw.session === undefined ? null : data.sessions[raw.session],
        );
        const want = raw.expected;
        assert.equal(got, want === null ? null : `${want.code}: ${want.sentence}`);
        if (want !== null) assertLeaksNothing(want.sentence, ...carriers);
      });
    }
  });
}

describe('the fixtures', () => {
  test('every case has a unique id and a state of its file', () => {
    const ids = new Set();
    for (const { file, data } of loadFiles()) {
      for (const raw of data.cases) {
        assert.ok(!ids.has(raw.id), `${raw.id} appears twice`);
        ids.add(raw.id);
        if ('action' in raw) assert.ok(Object.hasOwn(data.states, raw.state), `${file}: ${raw.id}`);
        if ('session' in raw) {
          assert.ok(Object.hasOwn(data.sessions ?? {}, raw.session), `${file}: ${raw.id}`);
        }
      }
    }
  });
});
