// What the web client tells people who are not looking (web/notify.js).
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { countedTitle, mayAsk, needing, newlyNeeding } from '../notify.js';
import { SessionStatus } from '../reducers.js';

const session = (resource, status) => ({ resource, status });

test('the sessions that need someone are those whose status asks for input', () => {
  const summaries = [
    session('ahp-session:/a', SessionStatus.INPUT_NEEDED),
    session('ahp-session:/b', SessionStatus.IN_PROGRESS),
    session('ahp-session:/c', SessionStatus.INPUT_NEEDED | SessionStatus.IS_READ),
    session('ahp-session:/d', SessionStatus.IDLE),
  ];
  assert.deepEqual([...needing(summaries)], ['ahp-session:/a', 'ahp-session:/c']);
});

test('the title counts them in front, and is left alone when none needs anyone', () => {
  assert.equal(countedTitle('Login failures · Huddle', 2), '(2) Login failures · Huddle');
  assert.equal(countedTitle('Huddle', 0), 'Huddle');
});

test('only a session that came to need someone is new; none on the first look', () => {
  const now = new Set(['ahp-session:/a', 'ahp-session:/b']);
  assert.deepEqual(newlyNeeding(null, now), []);
  assert.deepEqual(newlyNeeding(new Set(['ahp-session:/a']), now), ['ahp-session:/b']);
  assert.deepEqual(newlyNeeding(now, new Set(['ahp-session:/a'])), []);
});

test('the button that asks is there only while the browser has not been asked', () => {
  assert.equal(mayAsk(undefined), false);
  assert.equal(mayAsk({ permission: 'default' }), true);
  assert.equal(mayAsk({ permission: 'granted' }), false);
  assert.equal(mayAsk({ permission: 'denied' }), false);
});
