// Answers typed while the page could not reach the server, and the ones
// other people gave meanwhile. Co-editing an answer is last writer wins, by
// arrival: an edit this page queued offline and sent once it is back would
// replace a newer answer someone else gave while it was away, and take the
// credit for it. Such an edit is overtaken: the page drops it instead of
// sending it, and says so (with what was typed, so that nothing is lost).
// So is a submit that carries such an answer, and one queued after such an
// edit (made with the answer that is not sent, it would complete the request
// with the other person's, never seen). Pure: the Replica marks its pending
// actions, the client drops them, the page tells.

import { answerText } from './format.js';

const ANSWER = 'chat/inputAnswerChanged';
const COMPLETED = 'chat/inputCompleted';

/** The answers `action` sets, by "request\nquestion" (an edit sets one, a
 * completion those it carries; other actions none). */
function answersOf(action) {
  if (action?.type === ANSWER) return new Map([[`${action.requestId}\n${action.questionId}`, action.answer ?? null]]);
  if (action?.type === COMPLETED) {
    return new Map(Object.entries(action.answers ?? {}).map(([q, a]) => [`${action.requestId}\n${q}`, a]));
  }
  return new Map();
}

/** Whether someone else's `other`, applied while `mine` waited, changed an answer `mine` sets. */
export function overtakes(other, mine) {
  const mineSets = answersOf(mine);
  return [...answersOf(other).keys()].some((key) => mineSets.has(key));
}

/** Whether `later`, pending after the overtaken `dropped`, rests on it: the
 * completion of the same request. Dropped too, and told. */
export function restsOn(later, dropped) {
  return later.type === COMPLETED && dropped.requestId === later.requestId;
}

/** The open request `requestId` in `state` (a chat's), if any. */
function requestIn(state, requestId) {
  const part = (state?.activeTurn?.responseParts ?? []).find(
    (p) => p.kind === 'inputRequest' && p.request.id === requestId,
  );
  return part?.request ?? null;
}

/** The answer `key` names as `state` has it, as JSON. */
function answerIn(state, key) {
  const [requestId, questionId] = key.split('\n');
  return JSON.stringify(requestIn(state, requestId)?.answers?.[questionId] ?? null);
}

/**
 * Whether `mine` (pending) is overtaken once the channel starts over from a
 * snapshot (`after`, where it held `before`): an answer it sets changed, and
 * not to what one of this page's own pending actions says (one that landed
 * before the connection dropped). `marked`: it was overtaken already.
 */
export function overtakenBySnapshot(before, after, mine, marked, pending) {
  const sets = answersOf(mine);
  if (sets.size === 0 || before == null) return false; // a first snapshot: nothing was typed on it
  return [...sets.keys()].some((key) => {
    const now = answerIn(after, key);
    const ours = pending.some((entry) => {
      const theirs = answersOf(entry.action);
      return theirs.has(key) && JSON.stringify(theirs.get(key)) === now;
    });
    return !ours && (marked || now !== answerIn(before, key));
  });
}

/**
 * What the page says of the `actions` it dropped (`state`: the chat now):
 * for each answer, once, what this page had typed last and that the other
 * answer stays; then, for a completion, that it was not sent either.
 */
export function overtakenTexts(state, actions) {
  const typed = new Map();
  for (const action of actions) for (const [key, answer] of answersOf(action)) typed.set(key, answer);
  const texts = [];
  for (const [key, answer] of typed) {
    const [requestId, questionId] = key.split('\n');
    const question = requestIn(state, requestId)?.questions?.find((q) => q.id === questionId);
    const name = question?.title || question?.message || 'a question';
    const text = answer ? typedAnswer(state, { requestId, questionId, answer }) : null;
    const had = text ? ` You had answered: “${text}”.` : '';
    texts.push(`Your answer to “${name}” was not sent: someone changed it while you were offline, and theirs stays.${had}`);
  }
  for (const action of actions) {
    if (action.type !== COMPLETED) continue;
    const what = action.response === 'accept' ? 'submit' : action.response === 'decline' ? 'decline' : 'cancel';
    texts.push(`Your ${what} was not sent either: an answer changed while you were offline. Check the answers, then ${what} again.`);
  }
  return texts;
}

/** The text of the answer `action` (an answer edit) gives, as the question
 * in `state` (a chat's: its active turn, or its last) reads it; null when
 * there is none to show. */
export function typedAnswer(state, action) {
  const turns = [state?.activeTurn, ...(state?.turns ?? []).slice(-1)];
  for (const turn of turns) {
    const part = (turn?.responseParts ?? []).find((p) => p.kind === 'inputRequest' && p.request.id === action.requestId);
    const question = part?.request.questions?.find((q) => q.id === action.questionId);
    if (question) return action.answer ? answerText(question, action.answer) : null;
  }
  return null;
}

/** The answers `actions` set that a field must show the shared value of
 * again ("request\nquestion"): what the person typed was not sent. */
export function discardedAnswers(actions) {
  return new Set(actions.flatMap((action) => [...answersOf(action).keys()]));
}
