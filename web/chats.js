// Starting a new chat in a session, in plain AHP: who may (server/policy.py:
// every token that may dispatch; observers may not), what `createChat`
// takes (AHP 0.7: the owning session as `channel`, the new chat's URI,
// chosen by the client), when the new chat has arrived (the session's
// `session/chatAdded`), and the refusal that sends people to a new chat
// (`chat-full`, reducers/limits.py). Pure: the page (app.js) sends and
// waits.

const CHAT = 'ahp-chat:/';

/** The rejection code of a chat that takes no new turn (protocol/rejections.py CHAT_FULL). */
export const CHAT_FULL = 'chat-full';

/** AHP's AlreadyExists (protocol/messages.py ErrorCode.ALREADY_EXISTS). */
export const ALREADY_EXISTS = -32010;

/** Whether the server lets `identity` (initialize's) create chats; not
 * while who this page is is still unknown. */
export function mayCreateChats(identity) {
  return identity != null && !watchesOnly(identity);
}

/** Whether `identity` only watches (an observer token: the server refuses
 * every action it sends), so the page offers it nothing to write, answer,
 * approve or stop. */
export function watchesOnly(identity) {
  return identity?.role === 'observer';
}

/** The URI of a new chat whose id is `id` (random: the client chooses it). */
export function newChatUri(id) {
  return CHAT + id;
}

/**
 * `createChat`'s params as AHP 0.7 has them, and nothing of Huddle's: no
 * `title` (the server names the chat, "Chat 2"), no initial message (what
 * someone typed is theirs to send).
 */
export function createChatParams(session, chat) {
  return { channel: session, chat };
}

/** Whether a session's state lists `chat` (its `session/chatAdded` arrived). */
export function listsChat(session, chat) {
  return Boolean(session?.chats?.some((summary) => summary.resource === chat));
}

/**
 * Whether `createChat` failed only because an earlier try made the chat:
 * the answer was lost with the connection, the client asked again with the
 * same URI (its own, random), and the server has that chat already.
 */
export function madeBefore(error) {
  return error?.code === ALREADY_EXISTS;
}

/** The code of a rejection reason: "chat-full: the chat holds ..." is 'chat-full'. */
export function reasonCode(reason) {
  return /^([a-z-]+):/.exec(String(reason ?? ''))?.[1] ?? '';
}

/** Whether a refused turn was refused because its chat is full. */
export function isChatFull(reason) {
  return reasonCode(reason) === CHAT_FULL;
}

/** What the page says under a full chat: why the message was not sent
 * (the server's sentence, which names the sizes), and that it is kept. */
export function fullChatText(reason) {
  const sentence = String(reason ?? '').replace(/^[a-z-]+:\s*/, '').replace(/[.\s]+$/, '');
  const why = sentence ? `: ${sentence}` : '';
  return `Your message was not sent${why}. What you typed stays in the box below and goes with you to the new chat.`;
}
