// One channel as a client holds it: AHP's reconciliation of a confirmed
// state and the client's own pending actions.
//
// - `confirmed` is the server's state at `serverSeq`: a snapshot plus every
//   envelope after it, in seq order.
// - `pending` are actions this client dispatched that the server has not yet
//   echoed, in clientSeq order.
// - `state` (what the UI renders) is `confirmed` with `pending` applied on
//   top. It is recomputed from `confirmed` after every change, so a foreign
//   action is applied first and the pending ones are rebased on it.
// - The client's own echo confirms its pending action (removes it; the
//   server's copy is what gets applied); a rejection removes it and reports
//   why. Pure apart from the reducer it is given: no I/O, no clock.
// - A pending action someone else's overtook while it waited (overtaken.js:
//   an answer they changed meanwhile) is marked `overtaken`: the client
//   drops it instead of sending it again after a reconnect.

import { overtakenBySnapshot, overtakes } from './overtaken.js';

export class Replica {
  /**
   * @param {string} uri the channel
   * @param {(state: any, action: any, nowMs: number) => any} reduce the channel's reducer
   */
  constructor(uri, reduce) {
    this.uri = uri;
    this.reduce = reduce;
    this.confirmed = null;
    this.serverSeq = -1;
    /** @type {{clientSeq: number, action: any, sentOn: number}[]} */
    this.pending = [];
    this.cached = null;
    this.ready = false;
    /** Envelopes that arrived before the first snapshot (the client applies them after it). */
    this.early = [];
  }

  /** The state to render: confirmed plus pending. */
  get state() {
    if (this.cached === null && this.confirmed !== null) {
      let state = this.confirmed;
      for (const entry of this.pending) state = this.reduce(state, entry.action, entry.nowMs);
      this.cached = state;
    }
    return this.cached;
  }

  /** Start over from a snapshot (`{state, fromSeq}`); pending actions stay and are rebased. */
  reset(snapshot) {
    const before = this.confirmed;
    for (const entry of this.pending) {
      entry.overtaken = overtakenBySnapshot(before, snapshot.state, entry.action, Boolean(entry.overtaken), this.pending);
    }
    this.confirmed = snapshot.state;
    this.serverSeq = snapshot.fromSeq;
    this.ready = true;
    this.cached = null;
  }

  /** Record an action this client is about to send. */
  addPending(clientSeq, action, nowMs) {
    this.pending.push({ clientSeq, action, nowMs, sentOn: 0 });
    this.cached = null;
  }

  /** Apply a change that only this client sees (e.g. older turns it fetched). */
  applyLocal(action, nowMs) {
    if (this.confirmed === null) return;
    this.confirmed = this.reduce(this.confirmed, action, nowMs);
    this.cached = null;
  }

  /**
   * Apply one envelope. Returns what it was:
   * `{kind: 'applied', own}` for an accepted action (own: it confirmed one of ours),
   * `{kind: 'rejected', action, reason}` for our action the server refused,
   * `{kind: 'duplicate', own}` for one already applied (own: the server's
   *   answer to one of ours sent again after a reconnect, which the confirmed
   *   state holds already: it confirms that pending action), or
   * `{kind: 'gap', expected}` when envelopes were missed (resync the channel).
   */
  applyEnvelope(envelope, clientId, nowMs) {
    const origin = envelope.origin;
    const own = origin != null && origin.clientId === clientId;
    if (envelope.rejectionReason != null) {
      if (!own) return { kind: 'duplicate' };
      const entry = this.dropPending(origin.clientSeq);
      return { kind: 'rejected', action: entry?.action ?? envelope.action, reason: envelope.rejectionReason };
    }
    if (envelope.serverSeq <= this.serverSeq) {
      // Huddle answers an action sent again with the same clientSeq with its
      // first envelope, which a snapshot taken since holds already.
      if (!own) return { kind: 'duplicate' };
      this.dropPending(origin.clientSeq);
      return { kind: 'duplicate', own: true };
    }
    if (envelope.serverSeq !== this.serverSeq + 1) return { kind: 'gap', expected: this.serverSeq + 1 };
    this.confirmed = this.reduce(this.confirmed, envelope.action, nowMs);
    this.serverSeq = envelope.serverSeq;
    if (own) this.dropPending(origin.clientSeq);
    else {
      for (const entry of this.pending) if (overtakes(envelope.action, entry.action)) entry.overtaken = true;
    }
    this.cached = null;
    return { kind: 'applied', own };
  }

  dropPending(clientSeq) {
    const index = this.pending.findIndex((entry) => entry.clientSeq === clientSeq);
    if (index < 0) return null;
    const [entry] = this.pending.splice(index, 1);
    this.cached = null;
    return entry;
  }

  /** Whether an action matching `predicate` is still waiting for the server. */
  hasPending(predicate) {
    return this.pending.some((entry) => predicate(entry.action));
  }
}
