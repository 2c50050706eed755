// Answers typed while the page could not reach the server, and the ones
// other people gave meanwhile. Co-editing an answer is last writer wins, by
// arrival: an edit this page queued offline and sent once it is back would
// replace a newer answer someone else gave while it was away, and take the
// credit for it. Such an edit is overtaken: the page drops it instead of
// sending it, and says so (with what was typed, so that nothing is lost).
// Pure: the Replica marks its pending actions, the client drops them.

import { answerText } from './format.js';

const ANSWER = 'chat/inputAnswerChanged';

/** The answer `action` edits ("request\nquestion"), or null for another action. */
function answerKey(action) {
  return action?.type === ANSWER ? `${action.requestId}\n${action.questionId}` : null;
}

/** Whether someone else's `other`, applied while `mine` waited, changed the answer `mine` edits. */
export function overtakes(other, mine) {
  const key = answerKey(mine);
  return key !== null && answerKey(other) === key;
}

/** Whether `later`, pending after the overtaken edit `dropped`, rests on it:
 * the submit of the same request (made with the answer that is not sent,
 * it would go out with the other person's instead). Dropped too, and told. */
export function restsOn(later, dropped) {
  return later.type === 'chat/inputCompleted' && later.requestId === dropped.requestId;
}

/** The open request `action` is about in `state` (a chat's), if any. */
function requestIn(state, action) {
  const part = (state?.activeTurn?.responseParts ?? []).find(
    (p) => p.kind === 'inputRequest' && p.request.id === action.requestId,
  );
  return part?.request ?? null;
}

/** The answer `action` edits as `state` has it, as JSON. */
function answerIn(state, action) {
  return JSON.stringify(requestIn(state, action)?.answers?.[action.questionId] ?? null);
}

/** What the page says of an overtaken edit (`state`: the chat now): whose
 * answer stays, and what this page had typed, so that it can be put back. */
export function overtakenText(state, action) {
  if (action.type === 'chat/inputCompleted') {
    const what = action.response === 'accept' ? 'submit' : action.response === 'decline' ? 'decline' : 'cancel';
    return `Your ${what} was not sent either: an answer changed while you were offline. Check the answers, then ${what} again.`;
  }
  const question = requestIn(state, action)?.questions?.find((q) => q.id === action.questionId);
  const name = question?.title || question?.message || 'a question';
  const typed = question && action.answer ? answerText(question, action.answer) : null;
  const had = typed ? ` You had answered: “${typed}”.` : '';
  return `Your answer to “${name}” was not sent: someone else changed it while you were offline, and theirs stays.${had}`;
}

/**
 * Whether `mine` (pending) is overtaken once the channel starts over from a
 * snapshot (`after`, where it held `before`): the answer changed, and not to
 * what one of this page's own pending edits of it says (one that landed
 * before the connection dropped). `marked`: it was overtaken already.
 */
export function overtakenBySnapshot(before, after, mine, marked, pending) {
  const key = answerKey(mine);
  if (key === null || before == null) return false; // a first snapshot: nothing was typed on it
  const now = answerIn(after, mine);
  const ours = pending.some((entry) => answerKey(entry.action) === key && JSON.stringify(entry.action.answer ?? null) === now);
  if (ours) return false;
  return marked || now !== answerIn(before, mine);
}
