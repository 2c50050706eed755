// Telling people they are needed when the page is out of sight: the tab's
// title counts the sessions that need someone, and a session that comes to
// need someone while the tab is hidden shows a browser notification (once
// the person allowed them, asked on a click of theirs, never on load).
// What needs someone is the session's status, AHP's input-needed bit, as the
// sessions list shows it.

import { activityOf } from './format.js';

/** The sessions (summaries) that need someone now, by URI. */
export function needing(summaries) {
  const uris = new Set();
  for (const summary of summaries) {
    if (activityOf(summary.status) === 'input') uris.add(summary.resource);
  }
  return uris;
}

/** `title` with the count of sessions that need someone in front. */
export function countedTitle(title, count) {
  return count > 0 ? `(${count}) ${title}` : title;
}

/** The URIs in `now` that were not in `before`: sessions that just came to
 * need someone (none on the first look, `before` null: they needed someone
 * before the page knew). */
export function newlyNeeding(before, now) {
  if (before === null) return [];
  return [...now].filter((uri) => !before.has(uri));
}

/** Whether this browser can show notifications and has not been asked yet
 * (the button that asks is shown then). */
export function mayAsk(notification) {
  return Boolean(notification) && notification.permission === 'default';
}
