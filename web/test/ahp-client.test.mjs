// How the web client tells a refusal from a lost connection (web/ahp-client.js):
// a refusal is final, anything else is retried.
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { accessRefusal, accessUrlOf, initializeRefusal, RpcError } from '../ahp-client.js';

test('the access check asks for the root snapshot beside the socket, over the same scheme', () => {
  const root = '?channel=ahp-root%3A%2F%2F';
  assert.equal(accessUrlOf('ws://127.0.0.1:8765/ahp'), `http://127.0.0.1:8765/api/snapshot${root}`);
  assert.equal(accessUrlOf('wss://huddle.example/ahp'), `https://huddle.example/api/snapshot${root}`);
  assert.equal(accessUrlOf('wss://example.org/huddle/ahp'), `https://example.org/huddle/api/snapshot${root}`);
});

const ANSWERS = [
  // [what the server answered, its JSON body, the refusal or null (retried)]
  ['a missing, forged or expired token', 401, { error: 'the token has expired' }, 'the token has expired'],
  ['a foreign origin', 403, { error: 'origin evil.example is not allowed' }, 'origin evil.example is not allowed'],
  ['a refusal without a reason', 401, null, 'the server answered 401'],
  ['a refusal whose reason is blank', 403, { error: '  ' }, 'the server answered 403'],
  ['the token accepted', 200, { resource: 'ahp-root://' }, null],
  ['a proxy whose server is restarting', 502, null, null],
  ['a store out of reach', 503, { error: 'the store is unavailable' }, null],
  ['a bug of the server', 500, null, null],
  ['a page not found', 404, null, null],
];

for (const [what, status, body, reason] of ANSWERS) {
  test(`an HTTP ${status} (${what}) is ${reason ? 'a refusal' : 'retried'}`, () => {
    const refusal = accessRefusal(status, body);
    if (reason === null) assert.equal(refusal, null);
    else assert.deepEqual(refusal, { kind: 'access', status, reason });
  });
}

const INITIALIZE_ERRORS = [
  // [what went wrong, the error, refused]
  ['no protocol version in common', new RpcError({ code: -32005, message: 'no protocol version in common' }), true],
  ['a client id held by another token', new RpcError({ code: -32009, message: 'belongs to another token' }), true],
  ['params the server cannot take', new RpcError({ code: -32602, message: 'Expected `str`' }), true],
  ['a store out of reach', new RpcError({ code: -32603, message: 'the store is unavailable' }), false],
  ['too many new client ids lately', new RpcError({ code: -32011, message: 'this token started 30 client ids lately' }), false],
  ['the socket lost before the answer', new Error('the connection was lost'), false],
];

for (const [what, error, refused] of INITIALIZE_ERRORS) {
  test(`an initialize that fails with ${what} is ${refused ? 'a refusal' : 'retried'}`, () => {
    const refusal = initializeRefusal(error);
    if (!refused) assert.equal(refusal, null);
    else assert.deepEqual(refusal, { kind: 'initialize', code: error.code, reason: error.message });
  });
}
