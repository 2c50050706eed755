// How the web client starts a new chat and tells a full chat (web/chats.js):
// plain AHP `createChat`, the server's roles, the server's rejection codes.
//
//   node --test web/test/

import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  createChatParams,
  fullChatText,
  isChatFull,
  listsChat,
  madeBefore,
  mayCreateChats,
  newChatUri,
  reasonCode,
  watchesOnly,
} from '../chats.js';
import { RpcError } from '../ahp-client.js';

const SESSION = 'ahp-session:/s1';
const FULL =
  'chat-full: the chat holds about 300,512 bytes; the limit is 262,144: start a new chat';

const ROLES = [
  // [who the server takes the page for, may it create chats]
  ['an agent', { name: 'bot', role: 'agent', token: 't-a' }, true],
  ['a participant', { name: 'Lee', role: 'participant', token: 't-l' }, true],
  ["a shared link's holder", { name: 'Dana', role: 'participant', token: 't-s', declared: true }, true],
  ['an observer', { name: 'Olga', role: 'observer', token: 't-o' }, false],
  ['nobody known yet', null, false],
];

for (const [what, identity, may] of ROLES) {
  test(`${what} ${may ? 'may' : 'may not'} create chats`, () => {
    assert.equal(mayCreateChats(identity), may);
  });
}

test('only an observer only watches (nobody known yet may still write: the server decides)', () => {
  const watching = ROLES.filter(([, identity]) => watchesOnly(identity)).map(([what]) => what);
  assert.deepEqual(watching, ['an observer']);
});

test('createChat carries the session as its channel and the new chat, in AHP form only', () => {
  const chat = newChatUri('0a1b2c3d4e5f6789');
  assert.equal(chat, 'ahp-chat:/0a1b2c3d4e5f6789');
  assert.deepEqual(createChatParams(SESSION, chat), { channel: SESSION, chat });
});

test('a new chat has arrived once the session lists it', () => {
  const chat = 'ahp-chat:/new';
  const main = { resource: 'ahp-chat:/main', title: 'Main' };
  assert.ok(!listsChat(null, chat));
  assert.ok(!listsChat({ chats: [main] }, chat));
  assert.ok(listsChat({ chats: [main, { resource: chat, title: 'Chat 2' }] }, chat));
});

test('AlreadyExists means an earlier createChat with the same URI landed; other errors do not', () => {
  assert.ok(madeBefore(new RpcError({ code: -32010, message: 'chat ahp-chat:/x already exists' })));
  assert.ok(!madeBefore(new RpcError({ code: -32001, message: 'no session ahp-session:/s1' })));
  assert.ok(!madeBefore(new RpcError({ code: -32009, message: 'observers may not create chats' })));
  assert.ok(!madeBefore(new Error('the connection was lost')));
});

const REASONS = [
  // [a rejection reason, its code, is it a full chat]
  [FULL, 'chat-full', true],
  ['too-large: the message is 70,000 bytes; the limit is 65,536', 'too-large', false],
  ['turn-in-progress: a turn is already in progress', 'turn-in-progress', false],
  ['the chat is full', '', false],
  ['', '', false],
  [undefined, '', false],
];

for (const [reason, code, full] of REASONS) {
  test(`the reason ${JSON.stringify(reason)} has the code ${JSON.stringify(code)}`, () => {
    assert.equal(reasonCode(reason), code);
    assert.equal(isChatFull(reason), full);
  });
}

test("a full chat says the server's sentence and that the typed text is kept", () => {
  assert.equal(
    fullChatText(FULL),
    'Your message was not sent: the chat holds about 300,512 bytes; the limit is 262,144: start a new chat.' +
      ' What you typed stays in the box below and goes with you to the new chat.',
  );
  assert.match(fullChatText('chat-full: '), /^Your message was not sent\. What you typed/);
});
