// How statuses, times and answers read in the interface.

import { SessionStatus } from './reducers.js';

const ACTIVITY_MASK = (1 << 5) - 1;

/** 'input' | 'progress' | 'error' | 'idle' for an AHP status bitset. */
export function activityOf(status) {
  const activity = (status ?? SessionStatus.IDLE) & ACTIVITY_MASK;
  if ((activity & SessionStatus.INPUT_NEEDED) === SessionStatus.INPUT_NEEDED) return 'input';
  if (activity & SessionStatus.IN_PROGRESS) return 'progress';
  if (activity & SessionStatus.ERROR) return 'error';
  return 'idle';
}

export const ACTIVITY_LABEL = {
  input: 'Needs input',
  progress: 'In progress',
  error: 'Error',
  idle: 'Idle',
};

export function isRead(status) {
  return ((status ?? 0) & SessionStatus.IS_READ) !== 0;
}

const RELATIVE = new Intl.RelativeTimeFormat(undefined, { numeric: 'auto', style: 'short' });
const CLOCK = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' });
const DATE = new Intl.DateTimeFormat(undefined, { month: 'short', day: 'numeric' });

/** "just now", "5 min. ago", "14:02", "Jul 3" for an ISO time. */
export function relativeTime(iso, nowMs = Date.now()) {
  const ms = Date.parse(iso);
  if (Number.isNaN(ms)) return '';
  const seconds = Math.round((nowMs - ms) / 1000);
  if (seconds < 45) return 'just now';
  if (seconds < 3600) return RELATIVE.format(-Math.round(seconds / 60), 'minute');
  if (seconds < 12 * 3600) return CLOCK.format(ms);
  return DATE.format(ms);
}

export function clockTime(iso) {
  const ms = Date.parse(iso);
  return Number.isNaN(ms) ? '' : CLOCK.format(ms);
}

/** An answer value as a person reads it (option labels, Yes/No). */
export function answerText(question, answer) {
  if (!answer) return null;
  if (answer.state === 'skipped') return 'Skipped';
  const value = answer.value;
  if (!value) return null;
  const label = (id) => question.options?.find((option) => option.id === id)?.label ?? id;
  switch (value.kind) {
    case 'text':
      return value.value;
    case 'number':
      return String(value.value);
    case 'boolean':
      return value.value ? 'Yes' : 'No';
    case 'selected': {
      const free = value.freeformValues ?? [];
      return free.length ? free.join(', ') : label(value.value);
    }
    case 'selected-many':
      return [...value.value.map(label), ...(value.freeformValues ?? [])].join(', ') || 'None';
    default:
      return null;
  }
}

/**
 * The part of a rejection reason a field shows: "invalid-answer: the
 * submitted answer to question 'q' of input request 'r' is longer than 80
 * characters" reads "Is longer than 80 characters."
 */
export function fieldMessage(reason) {
  if (!reason) return '';
  const sentence = reason.replace(/^[a-z-]+:\s*/, '');
  const predicate = sentence.replace(
    /^the (?:draft|submitted|skipped) answer to question '.*?'(?: of input request '.*?')?\s+/,
    '',
  );
  const text = predicate === sentence ? sentence : predicate;
  return text.charAt(0).toUpperCase() + text.slice(1) + (/[.!?]$/.test(text) ? '' : '.');
}

/** The sentence of a rejection reason, without its code. */
export function reasonSentence(reason) {
  const sentence = String(reason ?? '').replace(/^[a-z-]+:\s*/, '');
  return sentence.charAt(0).toUpperCase() + sentence.slice(1);
}

/**
 * What a person is told when their decision came too late: their approval,
 * denial, result check or reply reached the server after the call or the
 * request stopped waiting (decided by someone else, skipped with its turn,
 * or closed by its deadline: the first decision wins, every later one is
 * rejected). Null for any other rejection. The card shows what happened.
 */
export function tooLateText(action, reason) {
  const code = /^([a-z-]+):/.exec(String(reason ?? ''))?.[1];
  const expired = code === 'expired'; // its deadline passed first (reducers/notes.py expired_wait)
  /** Why `thing` took no decision from this person, who sent `what`. */
  const late = (what, thing, they = 'it') =>
    expired
      ? `Your ${what} did not count: the ${thing}'s time ran out before ${they} arrived.`
      : `Your ${what} did not count: the ${thing} was no longer waiting when ${they} arrived.`;
  if ((code === 'tool-call-not-pending' || expired) && action.type === 'chat/toolCallConfirmed') {
    return late(action.approved ? 'approval' : 'denial', 'call');
  }
  if (code === 'tool-call-not-pending' && action.type === 'chat/toolCallResultConfirmed') {
    return late('check of the result', 'call');
  }
  if ((code === 'no-open-input-request' || expired) && action.type === 'chat/inputCompleted') {
    if (action.response === 'decline') return late('decline', 'request');
    if (action.response === 'cancel') return late('cancel', 'request');
    return action.answers ? late('answers', 'request', 'they') : late('reply', 'request');
  }
  return null;
}
