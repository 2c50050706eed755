// The AHP 0.7 reducers of the root, session and chat channels, for the browser.
//
// A port of Huddle's Python reducers (reducers/root.py, session.py, chat.py),
// which are the reference: the same JSON fixtures (tests/fixtures/reducers/)
// run through both. The web client applies its own actions optimistically with
// these and replaces the result when the server's envelope arrives.
//
// The state and the actions are plain JSON objects exactly as they travel on
// the wire: camelCase names, `_meta`, optional fields left out when absent.
// Every reducer is pure: it never mutates its input (what changes is copied,
// what does not is shared), never reads a clock (`nowMs` comes from the caller
// and only stamps `modifiedAt`) and never throws on a well-formed action. An
// action that does not fit the state (wrong turn, unknown tool call, a
// transition the tool call's status does not allow) returns the state object
// itself, as in AHP; so does an action of an unknown type.
//
// An absent field is a missing key, never `undefined` or `null`: results
// deep-equal the fixtures once their `null`s are stripped.

/**
 * @typedef {Record<string, any>} Json  A JSON object as it travels on the wire.
 * @typedef {{type: string} & Json} Action  An AHP action; `type` is its AHP type string.
 * @typedef {'root' | 'session' | 'chat'} ChannelKind
 */

// ─── Status bits (protocol/status.py) ───────────────────────────────────────

/** Bit values of AHP's `SessionStatus`, shared by sessions and chats. */
export const SessionStatus = Object.freeze({
  IDLE: 1,
  ERROR: 1 << 1,
  IN_PROGRESS: 1 << 3,
  // InputNeeded is InProgress plus bit 4.
  INPUT_NEEDED: (1 << 3) | (1 << 4),
  IS_READ: 1 << 5,
  IS_ARCHIVED: 1 << 6,
});

/** Bits 0-4 hold exactly one activity; the flags above them are orthogonal. */
const ACTIVITY_MASK = (1 << 5) - 1;

/** @param {number} status @param {number} activity */
function withActivity(status, activity) {
  return (status & ~ACTIVITY_MASK) | activity;
}

/** @param {number} status @param {number} flag @param {boolean} on */
function withFlag(status, flag, on) {
  return on ? status | flag : status & ~flag;
}

// ─── Small pure helpers ─────────────────────────────────────────────────────

/**
 * A copy of `object` with `changes` applied. A `null` or `undefined` change
 * removes the key, because AHP leaves absent fields out.
 * @param {Json} object
 * @param {Json} changes
 * @returns {Json}
 */
function patch(object, changes) {
  const out = { ...object };
  for (const [key, value] of Object.entries(changes)) {
    if (value === undefined || value === null) delete out[key];
    else out[key] = value;
  }
  return out;
}

/**
 * A new object of `fields` without the absent ones.
 * @param {Json} fields
 * @returns {Json}
 */
function compact(fields) {
  return patch({}, fields);
}

/**
 * A copy of `items` with the first match replaced by `item`, or with `item`
 * appended when nothing matches.
 * @template T
 * @param {T[]} items
 * @param {T} item
 * @param {(existing: T) => boolean} matches
 * @returns {T[]}
 */
function upsert(items, item, matches) {
  const index = items.findIndex(matches);
  if (index < 0) return [...items, item];
  const updated = [...items];
  updated[index] = item;
  return updated;
}

/**
 * A copy of `items` with index `index` replaced by `item`.
 * @template T
 * @param {T[]} items
 * @param {number} index
 * @param {T} item
 * @returns {T[]}
 */
function replaceAt(items, index, item) {
  const updated = [...items];
  updated[index] = item;
  return updated;
}

/**
 * AHP `workingDirectorySet`: the list with `directory` added, or null when it
 * is already there (a no-op).
 * @param {string[] | undefined} directories
 * @param {string} directory
 * @returns {string[] | null}
 */
function directorySet(directories, directory) {
  const current = directories ?? [];
  return current.includes(directory) ? null : [...current, directory];
}

/**
 * AHP `workingDirectoryRemoved`: the list without (the first) `directory`, or
 * null when it is not there (a no-op).
 * @param {string[] | undefined} directories
 * @param {string} directory
 * @returns {string[] | null}
 */
function directoryRemoved(directories, directory) {
  const index = directories ? directories.indexOf(directory) : -1;
  if (!directories || index < 0) return null;
  return directories.filter((_, i) => i !== index);
}

/**
 * AHP `configChanged`: merge into the values, or replace them all. Like the
 * Python ConfigState, the result holds only `schema` and `values`.
 * @param {Json} config  the channel's `config` ({schema, values})
 * @param {Action} action
 * @returns {Json}
 */
function mergedConfig(config, action) {
  const values = action.replace ? { ...action.config } : { ...config.values, ...action.config };
  return { schema: config.schema, values };
}

/**
 * The `workingDirectorySet/Removed` reducer shared by sessions and chats.
 * @param {(dirs: string[] | undefined, dir: string) => string[] | null} change
 * @returns {(state: Json, action: Action) => Json}
 */
function directoriesChanged(change) {
  return (state, action) => {
    const directories = change(state.workingDirectories, action.directory);
    return directories === null ? state : { ...state, workingDirectories: directories };
  };
}

/**
 * A reducer that sets (or, when the action leaves it out, removes) one field
 * of the state from one field of the action.
 * @param {string} stateField
 * @param {string} [actionField]  defaults to `stateField`
 * @returns {(state: Json, action: Action) => Json}
 */
function setField(stateField, actionField = stateField) {
  return (state, action) => patch(state, { [stateField]: action[actionField] });
}

/**
 * The time `ms` since the epoch as ISO 8601 with milliseconds and `Z`, as AHP
 * writes `modifiedAt` (and as reducers/clock.py formats it).
 * @param {number} ms
 * @returns {string}
 */
export function isoTime(ms) {
  return new Date(ms).toISOString();
}

// ─── Root (reducers/root.py) ────────────────────────────────────────────────

/** @type {Record<string, (state: Json, action: Action) => Json>} */
const ROOT = {
  'root/agentsChanged': setField('agents'),
  'root/activeSessionsChanged': setField('activeSessions'),
  'root/terminalsChanged': setField('terminals'),
  'root/configChanged': (state, action) =>
    state.config == null ? state : { ...state, config: mergedConfig(state.config, action) },
};

/**
 * The root state (`ahp-root://`) after `action`.
 * @param {Json} state
 * @param {Action} action
 * @returns {Json}
 */
export function reduceRoot(state, action) {
  const reducer = Object.hasOwn(ROOT, action.type) ? ROOT[action.type] : null;
  return reducer ? reducer(state, action) : state;
}

// ─── Session (reducers/session.py) ──────────────────────────────────────────

/** The fields of a ChatSummary that `session/chatUpdated` may change. */
const SUMMARY_FIELDS = [
  'title',
  'status',
  'activity',
  'modifiedAt',
  'origin',
  'interactivity',
  'workingDirectories',
];

/**
 * AHP: a non-empty input queue makes the activity InputNeeded; emptying it
 * clears only the InputNeeded-specific bit, so a running session falls back to
 * InProgress and an idle one stays idle. IsRead and IsArchived are kept.
 * @param {number} status
 * @param {Json[]} queue
 * @returns {number}
 */
function inputNeededStatus(status, queue) {
  if (queue.length > 0) return withActivity(status, SessionStatus.INPUT_NEEDED);
  return status & ~(SessionStatus.INPUT_NEEDED & ~SessionStatus.IN_PROGRESS);
}

/**
 * `Partial<ChatSummary>`: a field the changes leave out is kept, a field they
 * send as `null` is cleared. `resource` names the chat and never changes.
 * @param {Json} state
 * @param {Action} action
 */
function chatUpdated(state, action) {
  const index = state.chats.findIndex((chat) => chat.resource === action.chat);
  if (index < 0) return state;
  const changes = action.changes ?? {};
  const present = SUMMARY_FIELDS.filter(
    (field) => Object.hasOwn(changes, field) && changes[field] !== undefined,
  );
  const picked = Object.fromEntries(present.map((field) => [field, changes[field]]));
  return { ...state, chats: replaceAt(state.chats, index, patch(state.chats[index], picked)) };
}

/** @param {Json} state @param {Action} action */
function chatRemoved(state, action) {
  const kept = state.chats.filter((chat) => chat.resource !== action.chat);
  if (kept.length === state.chats.length) return state;
  return patch(state, {
    chats: kept,
    defaultChat: state.defaultChat === action.chat ? null : state.defaultChat,
  });
}

/** @param {Json} state @param {Action} action */
function inputNeededSet(state, action) {
  const request = action.request;
  const queue = upsert(state.inputNeeded ?? [], request, (r) => r.id === request.id);
  return { ...state, inputNeeded: queue, status: inputNeededStatus(state.status, queue) };
}

/** @param {Json} state @param {Action} action */
function inputNeededRemoved(state, action) {
  const queue = state.inputNeeded;
  if (!queue || !queue.some((r) => r.id === action.id)) return state;
  const remaining = queue.filter((r) => r.id !== action.id);
  return patch(state, {
    inputNeeded: remaining.length > 0 ? remaining : null,
    status: inputNeededStatus(state.status, remaining),
  });
}

/** @param {Json[]} items @param {string} id */
function topIndex(items, id) {
  return items.findIndex((item) => item.id === id);
}

/**
 * A container's children: plugins and directories have them; an MCP server
 * at the top level never does.
 * @param {Json} container
 * @returns {Json[] | null}
 */
function childrenOf(container) {
  const children = container.children;
  if (container.type === 'mcpServer' || !Array.isArray(children)) return null;
  return children;
}

/**
 * Apply `update` to the customization list; it returns null for "unchanged".
 * Without a list there is nothing to change.
 * @param {Json} state
 * @param {(items: Json[]) => Json[] | null} update
 */
function withCustomizations(state, update) {
  if (state.customizations == null) return state;
  const updated = update(state.customizations);
  return updated === null ? state : { ...state, customizations: updated };
}

/**
 * AHP: toggle the top-level entry with the id, else the child in the first
 * container that has one.
 * @param {Json[]} items
 * @param {string} id
 * @param {boolean} enabled
 * @returns {Json[] | null}
 */
function toggled(items, id, enabled) {
  const top = topIndex(items, id);
  if (top >= 0) return replaceAt(items, top, { ...items[top], enabled });
  for (const [index, container] of items.entries()) {
    const children = childrenOf(container);
    const child = children === null ? -1 : topIndex(children, id);
    if (children !== null && child >= 0) {
      const newChildren = replaceAt(children, child, { ...children[child], enabled });
      return replaceAt(items, index, { ...container, children: newChildren });
    }
  }
  return null;
}

/**
 * Apply `change` to the child `id` of every container. `change` returns the
 * new child, null to remove it, or the child itself to leave it alone.
 * @param {Json[]} items
 * @param {string} id
 * @param {(child: Json) => Json | null} change
 * @returns {Json[] | null}  the new list, or null when nothing changed
 */
function inEveryContainer(items, id, change) {
  let changed = false;
  const updated = items.map((container) => {
    const children = childrenOf(container);
    const child = children === null ? -1 : topIndex(children, id);
    if (children === null || child < 0) return container;
    const next = change(children[child]);
    if (next === children[child]) return container;
    changed = true;
    const newChildren =
      next === null ? children.filter((_, i) => i !== child) : replaceAt(children, child, next);
    return { ...container, children: newChildren };
  });
  return changed ? updated : null;
}

/**
 * AHP: remove the top-level entry with the id, else that child of every
 * container.
 * @param {Json[]} items
 * @param {string} id
 */
function removed(items, id) {
  const top = topIndex(items, id);
  if (top >= 0) return items.filter((_, i) => i !== top);
  return inEveryContainer(items, id, () => null);
}

/**
 * Set an MCP server's state: the top-level entry with the id (unless it is
 * not an MCP server: then nothing changes), else every MCP server child with
 * the id. The channel is replaced, and dropped when none is given.
 * @param {Json[]} items
 * @param {string} id
 * @param {Json} serverState
 * @param {string | undefined} channel
 */
function mcpServerChanged(items, id, serverState, channel) {
  /** @param {Json} entry */
  const change = (entry) =>
    entry.type === 'mcpServer' ? patch(entry, { state: serverState, channel }) : entry;
  const top = topIndex(items, id);
  if (top < 0) return inEveryContainer(items, id, change);
  const next = change(items[top]);
  return next === items[top] ? null : replaceAt(items, top, next);
}

/**
 * @param {(action: Action) => Json} serverState
 * @returns {(state: Json, action: Action) => Json}
 */
function mcpServerReducer(serverState) {
  return (state, action) =>
    withCustomizations(state, (items) =>
      mcpServerChanged(items, action.id, serverState(action), action.channel),
    );
}

/** @type {Record<string, (state: Json, action: Action) => Json>} */
const SESSION = {
  // AHP: a lifecycle transition only; the status follows the chats.
  'session/ready': (state) => ({ ...state, lifecycle: 'ready' }),
  'session/creationFailed': (state, action) =>
    patch(state, { lifecycle: 'creationFailed', creationError: action.error }),
  'session/chatAdded': (state, action) => ({
    ...state,
    chats: upsert(state.chats, action.summary, (c) => c.resource === action.summary.resource),
  }),
  'session/chatRemoved': chatRemoved,
  'session/chatUpdated': chatUpdated,
  'session/defaultChatChanged': setField('defaultChat'),
  'session/titleChanged': setField('title'),
  'session/isReadChanged': (state, action) => ({
    ...state,
    status: withFlag(state.status, SessionStatus.IS_READ, action.isRead),
  }),
  'session/isArchivedChanged': (state, action) => ({
    ...state,
    status: withFlag(state.status, SessionStatus.IS_ARCHIVED, action.isArchived),
  }),
  'session/activityChanged': setField('activity'),
  'session/changesetsChanged': setField('changesets'),
  'session/configChanged': (state, action) =>
    state.config == null ? state : { ...state, config: mergedConfig(state.config, action) },
  'session/metaChanged': setField('_meta'),
  'session/serverToolsChanged': setField('serverTools', 'tools'),
  'session/activeClientSet': (state, action) => ({
    ...state,
    activeClients: upsert(
      state.activeClients,
      action.activeClient,
      (c) => c.clientId === action.activeClient.clientId,
    ),
  }),
  'session/activeClientRemoved': (state, action) => {
    const kept = state.activeClients.filter((c) => c.clientId !== action.clientId);
    return kept.length === state.activeClients.length ? state : { ...state, activeClients: kept };
  },
  'session/workingDirectorySet': directoriesChanged(directorySet),
  'session/workingDirectoryRemoved': directoriesChanged(directoryRemoved),
  'session/inputNeededSet': inputNeededSet,
  'session/inputNeededRemoved': inputNeededRemoved,
  'session/customizationsChanged': setField('customizations'),
  'session/customizationToggled': (state, action) =>
    withCustomizations(state, (items) => toggled(items, action.id, action.enabled)),
  'session/customizationUpdated': (state, action) => {
    // An entry without an id matches the first other entry without one, as
    // Python's `c.get("id") == new.get("id")` does.
    const id = action.customization.id ?? null;
    const matches = (/** @type {Json} */ c) => (c.id ?? null) === id;
    const items = upsert(state.customizations ?? [], action.customization, matches);
    return { ...state, customizations: items };
  },
  'session/customizationRemoved': (state, action) =>
    withCustomizations(state, (items) => removed(items, action.id)),
  'session/mcpServerStateChanged': mcpServerReducer((action) => action.state),
  'session/mcpServerStartRequested': mcpServerReducer(() => ({ kind: 'starting' })),
  'session/mcpServerStopRequested': mcpServerReducer(() => ({ kind: 'stopped' })),
};

/**
 * The session state (`ahp-session:/<id>`) after `action`.
 * @param {Json} state
 * @param {Action} action
 * @returns {Json}
 */
export function reduceSession(state, action) {
  const reducer = Object.hasOwn(SESSION, action.type) ? SESSION[action.type] : null;
  return reducer ? reducer(state, action) : state;
}

// ─── Chat selectors (reducers/chat.py) ──────────────────────────────────────

/** Tool-call statuses that wait on a person. */
const BLOCKING = new Set(['pending-confirmation', 'pending-result-confirmation', 'auth-required']);

/**
 * The unresolved input-request part with `requestId`, and its index.
 * @param {Json[]} parts  response parts
 * @param {string} requestId
 * @returns {{index: number, part: Json} | null}
 */
export function selectOpenInputPart(parts, requestId) {
  const index = parts.findIndex(
    (part) =>
      part.kind === 'inputRequest' && part.response == null && part.request.id === requestId,
  );
  return index < 0 ? null : { index, part: parts[index] };
}

/**
 * The tool call `toolCallId` of the active turn, if there is one.
 * @param {Json} chat
 * @param {string} toolCallId
 * @returns {Json | null}
 */
export function selectToolCall(chat, toolCallId) {
  const parts = chat.activeTurn?.responseParts ?? [];
  const part = parts.find((p) => p.kind === 'toolCall' && p.toolCall.toolCallId === toolCallId);
  return part ? part.toolCall : null;
}

/**
 * The activity bits the chat's live work implies (AHP's summary status):
 * InputNeeded while an input request is open or a tool call waits on a
 * person, InProgress while a turn runs, Idle otherwise.
 * @param {Json} chat
 * @returns {number}
 */
export function selectActivity(chat) {
  const turn = chat.activeTurn;
  if (turn == null) return SessionStatus.IDLE;
  const waits = turn.responseParts.some((part) =>
    part.kind === 'inputRequest'
      ? part.response == null
      : part.kind === 'toolCall' && BLOCKING.has(part.toolCall.status),
  );
  return waits ? SessionStatus.INPUT_NEEDED : SessionStatus.IN_PROGRESS;
}

/**
 * The chat with its activity derived again from its live work.
 * @param {Json} chat
 * @returns {Json}
 */
function refreshStatus(chat) {
  const status = withActivity(chat.status, selectActivity(chat));
  return status === chat.status ? chat : { ...chat, status };
}

/**
 * The active turn when it is `turnId`, else null (the action is a no-op).
 * @param {Json} chat
 * @param {string} turnId
 */
function activeTurnNamed(chat, turnId) {
  const active = chat.activeTurn;
  return active != null && active.id === turnId ? active : null;
}

/**
 * @param {Json} chat @param {Json} active @param {Json[]} parts
 * @returns {Json}
 */
function withParts(chat, active, parts) {
  return { ...chat, activeTurn: { ...active, responseParts: parts } };
}

// ─── Turn end ───────────────────────────────────────────────────────────────

/**
 * The fields every tool-call state shares; the action's `_meta` replaces the
 * call's when it carries one.
 * @param {Json} call
 * @param {Json} [meta]
 */
function baseOf(call, meta) {
  return {
    toolCallId: call.toolCallId,
    toolName: call.toolName,
    displayName: call.displayName,
    intention: call.intention,
    contributor: call.contributor,
    _meta: meta ?? call._meta,
  };
}

/**
 * A tool call still unfinished when its turn ends is cancelled as `skipped`.
 * A streaming call has no input yet (its partial input is dropped), and a
 * cancelled call needs an invocation message: '' when it had none.
 * @param {Json} part
 */
function skipUnfinished(part) {
  if (part.kind !== 'toolCall') return part;
  const call = part.toolCall;
  if (call.status === 'completed' || call.status === 'cancelled') return part;
  const streaming = call.status === 'streaming';
  const toolCall = compact({
    ...baseOf(call),
    status: 'cancelled',
    invocationMessage: streaming ? (call.invocationMessage ?? '') : call.invocationMessage,
    toolInput: streaming ? undefined : call.toolInput,
    reason: 'skipped',
  });
  return { kind: 'toolCall', toolCall };
}

/**
 * Move the active turn into `turns`: unfinished tool calls become cancelled
 * (`skipped`); unresolved input requests stay as they are.
 * @param {'complete' | 'cancelled' | 'error'} outcome
 * @returns {(chat: Json, action: Action, nowMs: number) => Json}
 */
function endTurn(outcome) {
  return (chat, action, nowMs) => {
    const active = activeTurnNamed(chat, action.turnId);
    if (active === null) return chat;
    const turn = compact({
      id: active.id,
      startedAt: active.startedAt,
      duration: Math.max(0, action.duration),
      message: active.message,
      responseParts: active.responseParts.map(skipUnfinished),
      usage: active.usage,
      state: outcome,
      error: outcome === 'error' ? action.error : undefined,
    });
    const activity = outcome === 'error' ? SessionStatus.ERROR : SessionStatus.IDLE;
    return patch(chat, {
      turns: [...chat.turns, turn],
      activeTurn: null,
      modifiedAt: isoTime(nowMs),
      status: withActivity(chat.status, activity),
    });
  };
}

// ─── Streaming into parts ───────────────────────────────────────────────────

/**
 * AHP `chat/delta` / `chat/reasoning`: append to the first part whose id is
 * `partId`, if that part is of `kind`. A tool call's id counts as a part id,
 * so a delta aimed at a tool call is a no-op rather than text for a later part.
 * @param {'markdown' | 'reasoning'} kind
 * @returns {(chat: Json, action: Action) => Json}
 */
function appendText(kind) {
  return (chat, action) => {
    const active = activeTurnNamed(chat, action.turnId);
    if (active === null) return chat;
    const parts = active.responseParts;
    const index = parts.findIndex((part) =>
      part.kind === 'toolCall'
        ? part.toolCall.toolCallId === action.partId
        : (part.kind === 'markdown' || part.kind === 'reasoning') && part.id === action.partId,
    );
    if (index < 0 || parts[index].kind !== kind) return chat;
    const part = parts[index];
    return withParts(
      chat,
      active,
      replaceAt(parts, index, { ...part, content: part.content + action.content }),
    );
  };
}

/** @param {Json} chat @param {Action} action */
function responsePart(chat, action) {
  const active = activeTurnNamed(chat, action.turnId);
  if (active === null) return chat;
  // AHP derives no status here, even when the part is an open input request.
  return withParts(chat, active, [...active.responseParts, action.part]);
}

/** @param {Json} chat @param {Action} action */
function usage(chat, action) {
  const active = activeTurnNamed(chat, action.turnId);
  if (active === null) return chat;
  return { ...chat, activeTurn: { ...active, usage: action.usage } };
}

// ─── Tool calls ─────────────────────────────────────────────────────────────

/** @param {Json} chat @param {Action} action */
function toolCallStart(chat, action) {
  const active = activeTurnNamed(chat, action.turnId);
  if (active === null) return chat;
  const toolCall = compact({
    status: 'streaming',
    toolCallId: action.toolCallId,
    toolName: action.toolName,
    displayName: action.displayName,
    intention: action.intention,
    contributor: action.contributor,
    _meta: action._meta,
  });
  return withParts(chat, active, [...active.responseParts, { kind: 'toolCall', toolCall }]);
}

/**
 * A tool-call transition: `update` returns the call it was given to decline.
 * Every part of the active turn holding the call is updated. With `refresh`
 * the status is derived again (AHP does so after every transition that can
 * enter or leave a waiting state; not after a delta or a content change).
 * @param {(call: Json, action: Action) => Json} update
 * @param {boolean} refresh
 * @returns {(chat: Json, action: Action) => Json}
 */
function toolCallTransition(update, refresh) {
  return (chat, action) => {
    const active = activeTurnNamed(chat, action.turnId);
    if (active === null) return chat;
    let changed = false;
    const parts = active.responseParts.map((part) => {
      if (part.kind !== 'toolCall' || part.toolCall.toolCallId !== action.toolCallId) return part;
      const next = update(part.toolCall, action);
      if (next === part.toolCall) return part;
      changed = true;
      return { kind: 'toolCall', toolCall: next };
    });
    if (!changed) return chat;
    const next = withParts(chat, active, parts);
    return refresh ? refreshStatus(next) : next;
  };
}

/**
 * The confirmation option `optionId` of `options`, if offered; an empty id
 * selects nothing.
 * @param {Json[] | undefined} options
 * @param {string | undefined} optionId
 */
function selectOption(options, optionId) {
  if (!optionId || !options) return undefined;
  return options.find((option) => option.id === optionId);
}

/** @param {Json} call @param {Action} action */
function toolDelta(call, action) {
  if (call.status !== 'streaming') return call;
  return patch(call, {
    _meta: action._meta ?? call._meta,
    partialInput: (call.partialInput ?? '') + action.content,
    invocationMessage: action.invocationMessage ?? call.invocationMessage,
  });
}

const READY_FROM = new Set(['streaming', 'running', 'pending-confirmation']);

/**
 * `chat/toolCallReady`: with `confirmed` the call runs; without, it waits for
 * confirmation. Re-confirmation of a running call keeps nothing of an old
 * prompt; an update of a pending prompt keeps what the action leaves out.
 * @param {Json} call
 * @param {Action} action
 */
function toolReady(call, action) {
  if (!READY_FROM.has(call.status)) return call;
  const base = baseOf(call, action._meta);
  if (action.confirmed != null) {
    return compact({
      ...base,
      status: 'running',
      invocationMessage: action.invocationMessage,
      toolInput: action.toolInput,
      confirmed: action.confirmed,
    });
  }
  const old = call.status === 'pending-confirmation' ? call : {};
  /** @param {string} field */
  const keep = (field) => action[field] ?? old[field];
  return compact({
    ...base,
    status: 'pending-confirmation',
    invocationMessage: action.invocationMessage,
    toolInput: keep('toolInput'),
    confirmationTitle: keep('confirmationTitle'),
    riskAssessment: keep('riskAssessment'),
    edits: keep('edits'),
    editable: keep('editable'),
    options: keep('options'),
  });
}

/** @param {Json} call @param {Action} action */
function toolConfirmed(call, action) {
  if (call.status !== 'pending-confirmation') return call;
  const base = baseOf(call, action._meta);
  const selectedOption = selectOption(call.options, action.selectedOptionId);
  if (action.approved) {
    // An approval without `confirmed` does not decode on the server.
    if (action.confirmed == null) return call;
    return compact({
      ...base,
      status: 'running',
      invocationMessage: call.invocationMessage,
      toolInput: action.editedToolInput ?? call.toolInput,
      confirmed: action.confirmed,
      selectedOption,
    });
  }
  return compact({
    ...base,
    status: 'cancelled',
    invocationMessage: call.invocationMessage,
    toolInput: call.toolInput,
    reason: action.reason,
    reasonMessage: action.reasonMessage,
    userSuggestion: action.userSuggestion,
    selectedOption,
  });
}

const COMPLETE_FROM = new Set(['running', 'pending-confirmation', 'auth-required']);

/** @param {Json} call @param {Action} action */
function toolComplete(call, action) {
  if (!COMPLETE_FROM.has(call.status)) return call;
  const result = action.result;
  // AHP: from auth-required only a failed result is allowed (the client gave
  // up on authenticating), and it always completes terminally.
  const isAuth = call.status === 'auth-required';
  if (isAuth && result.success) return call;
  // A call completed straight from its prompt never needed a confirmation.
  const pending = call.status === 'pending-confirmation';
  const waits = action.requiresResultConfirmation && !isAuth;
  return compact({
    ...baseOf(call, action._meta),
    status: waits ? 'pending-result-confirmation' : 'completed',
    invocationMessage: call.invocationMessage,
    toolInput: call.toolInput,
    confirmed: pending ? 'not-needed' : call.confirmed,
    selectedOption: pending ? undefined : call.selectedOption,
    success: result.success,
    pastTenseMessage: result.pastTenseMessage,
    // A failed auth keeps what the call showed before it paused; otherwise
    // the call shows only what the result carries.
    content: result.content ?? (isAuth ? call.content : undefined),
    structuredContent: result.structuredContent,
    error: result.error,
  });
}

/** @param {Json} call @param {Action} action */
function toolResultConfirmed(call, action) {
  if (call.status !== 'pending-result-confirmation') return call;
  const base = baseOf(call, action._meta);
  if (action.approved) {
    return compact({
      ...base,
      status: 'completed',
      invocationMessage: call.invocationMessage,
      toolInput: call.toolInput,
      confirmed: call.confirmed,
      selectedOption: call.selectedOption,
      success: call.success,
      pastTenseMessage: call.pastTenseMessage,
      content: call.content,
      structuredContent: call.structuredContent,
      error: call.error,
    });
  }
  return compact({
    ...base,
    status: 'cancelled',
    invocationMessage: call.invocationMessage,
    toolInput: call.toolInput,
    reason: 'result-denied',
    selectedOption: call.selectedOption,
  });
}

/** @param {Json} call @param {Action} action */
function toolContentChanged(call, action) {
  if (call.status !== 'running') return call;
  return patch(call, { _meta: action._meta ?? call._meta, content: action.content });
}

/** @param {Json} call @param {Action} action */
function toolAuthRequired(call, action) {
  // AHP: only a running call of an MCP server can wait for auth.
  if (call.status !== 'running' || call.contributor?.kind !== 'mcp') return call;
  return compact({
    ...baseOf(call, action._meta),
    status: 'auth-required',
    invocationMessage: call.invocationMessage,
    toolInput: call.toolInput,
    confirmed: call.confirmed,
    selectedOption: call.selectedOption,
    content: call.content,
    auth: action.auth,
  });
}

/** @param {Json} call @param {Action} action */
function toolAuthResolved(call, action) {
  if (call.status !== 'auth-required') return call;
  return compact({
    ...baseOf(call, action._meta),
    status: 'running',
    invocationMessage: call.invocationMessage,
    toolInput: call.toolInput,
    confirmed: call.confirmed,
    selectedOption: call.selectedOption,
    content: call.content,
  });
}

// ─── Turn start, truncation, history ────────────────────────────────────────

/** @param {Json} chat @param {Action} action @param {number} nowMs */
function turnStarted(chat, action, nowMs) {
  const activeTurn = {
    id: action.turnId,
    startedAt: action.startedAt,
    message: action.message,
    responseParts: [],
  };
  const status = withFlag(
    withActivity(chat.status, SessionStatus.IN_PROGRESS),
    SessionStatus.IS_READ,
    false,
  );
  // The turn takes the pending message it was started from.
  const taken = action.queuedMessageId;
  let steering = chat.steeringMessage;
  let queued = chat.queuedMessages;
  if (taken) {
    if (steering != null && steering.id === taken) steering = undefined;
    if (queued != null) {
      const rest = queued.filter((m) => m.id !== taken);
      queued = rest.length > 0 ? rest : undefined;
    }
  }
  return patch(chat, {
    activeTurn,
    status,
    modifiedAt: isoTime(nowMs),
    steeringMessage: steering,
    queuedMessages: queued,
  });
}

/**
 * Drop every turn after `turnId` (all turns, and the history cursor, when it
 * is absent) and the active turn; an unknown `turnId` is a no-op.
 * @param {Json} chat @param {Action} action @param {number} nowMs
 */
function truncated(chat, action, nowMs) {
  let turns = [];
  let cursor;
  if (action.turnId != null) {
    const index = chat.turns.findIndex((turn) => turn.id === action.turnId);
    if (index < 0) return chat;
    turns = chat.turns.slice(0, index + 1);
    cursor = chat.turnsNextCursor;
  }
  return patch(chat, {
    turns,
    turnsNextCursor: cursor,
    activeTurn: null,
    modifiedAt: isoTime(nowMs),
    status: withActivity(chat.status, SessionStatus.IDLE),
  });
}

/**
 * Older turns go before the known ones; a turn already known is skipped.
 * @param {Json} chat @param {Action} action
 */
function turnsLoaded(chat, action) {
  const known = new Set(chat.turns.map((turn) => turn.id));
  const older = action.turns.filter((turn) => !known.has(turn.id));
  return patch(chat, {
    turns: [...older, ...chat.turns],
    turnsNextCursor: action.turnsNextCursor,
  });
}

// ─── Input requests ─────────────────────────────────────────────────────────

/**
 * Insert the request at the end of the active turn, or replace the open one
 * with the same id in place, keeping its drafts unless answers are given.
 * @param {Json} chat @param {Action} action @param {number} nowMs
 */
function inputRequested(chat, action, nowMs) {
  const active = chat.activeTurn;
  if (active == null) return chat;
  let request = action.request;
  const parts = active.responseParts;
  const found = selectOpenInputPart(parts, request.id);
  let updated;
  if (found === null) {
    updated = [...parts, { kind: 'inputRequest', request }];
  } else {
    if (request.answers == null) request = patch(request, { answers: found.part.request.answers });
    updated = replaceAt(parts, found.index, { kind: 'inputRequest', request });
  }
  const next = withParts(chat, active, updated);
  const status = withFlag(
    withActivity(chat.status, selectActivity(next)),
    SessionStatus.IS_READ,
    false,
  );
  return { ...next, status, modifiedAt: isoTime(nowMs) };
}

/**
 * Replace the open request's answers by `change(answers)`; with `response`
 * also resolve the request in place (and derive the status again: a draft
 * never changes it).
 * @param {Json} chat
 * @param {string} requestId
 * @param {number} nowMs
 * @param {(answers: Json) => Json} change
 * @param {string} [response]
 */
function answersChanged(chat, requestId, nowMs, change, response) {
  const active = chat.activeTurn;
  if (active == null) return chat;
  const found = selectOpenInputPart(active.responseParts, requestId);
  if (found === null) return chat;
  const answers = change(found.part.request.answers ?? {});
  const request = patch(found.part.request, {
    answers: Object.keys(answers).length > 0 ? answers : null,
  });
  const part = compact({ kind: 'inputRequest', request, response });
  let next = withParts(chat, active, replaceAt(active.responseParts, found.index, part));
  if (response != null) next = refreshStatus(next);
  return { ...next, modifiedAt: isoTime(nowMs) };
}

/**
 * Set one question's answer; an absent answer clears it.
 * @param {Json} chat @param {Action} action @param {number} nowMs
 */
function inputAnswerChanged(chat, action, nowMs) {
  return answersChanged(chat, action.requestId, nowMs, (answers) => {
    if (action.answer != null) return { ...answers, [action.questionId]: action.answer };
    const rest = { ...answers };
    delete rest[action.questionId];
    return rest;
  });
}

/**
 * Resolve an open request; the action's answers overlay the synced ones.
 * @param {Json} chat @param {Action} action @param {number} nowMs
 */
function inputCompleted(chat, action, nowMs) {
  const overlay = (/** @type {Json} */ answers) => ({ ...answers, ...(action.answers ?? {}) });
  return answersChanged(chat, action.requestId, nowMs, overlay, action.response);
}

// ─── Pending messages ───────────────────────────────────────────────────────

/** @param {Json} chat @param {Action} action */
function pendingMessageSet(chat, action) {
  const entry = { id: action.id, message: action.message };
  if (action.kind === 'steering') return { ...chat, steeringMessage: entry };
  const queued = upsert(chat.queuedMessages ?? [], entry, (m) => m.id === action.id);
  return { ...chat, queuedMessages: queued };
}

/** @param {Json} chat @param {Action} action */
function pendingMessageRemoved(chat, action) {
  if (action.kind === 'steering') {
    if (chat.steeringMessage == null || chat.steeringMessage.id !== action.id) return chat;
    return patch(chat, { steeringMessage: null });
  }
  const queued = chat.queuedMessages;
  if (queued == null) return chat;
  const kept = queued.filter((m) => m.id !== action.id);
  if (kept.length === queued.length) return chat;
  return patch(chat, { queuedMessages: kept.length > 0 ? kept : null });
}

/**
 * Named messages first, in the order named (unknown and repeated ids are
 * ignored), then the rest in their old order.
 * @param {Json} chat @param {Action} action
 */
function queuedMessagesReordered(chat, action) {
  const queued = chat.queuedMessages;
  if (queued == null) return chat;
  // With two messages of one id the last one wins, as a Python dict does.
  const byId = new Map(queued.map((m) => [m.id, m]));
  const ordered = new Map();
  for (const id of action.order) {
    if (byId.has(id) && !ordered.has(id)) ordered.set(id, byId.get(id));
  }
  const rest = queued.filter((m) => !ordered.has(m.id));
  return { ...chat, queuedMessages: [...ordered.values(), ...rest] };
}

// ─── The chat reducer ───────────────────────────────────────────────────────

/** @type {Record<string, (chat: Json, action: Action, nowMs: number) => Json>} */
const CHAT = {
  'chat/turnStarted': turnStarted,
  'chat/delta': appendText('markdown'),
  'chat/responsePart': responsePart,
  'chat/reasoning': appendText('reasoning'),
  'chat/usage': usage,
  'chat/turnComplete': endTurn('complete'),
  'chat/turnCancelled': endTurn('cancelled'),
  'chat/error': endTurn('error'),
  'chat/activityChanged': setField('activity'),
  'chat/workingDirectorySet': directoriesChanged(directorySet),
  'chat/workingDirectoryRemoved': directoriesChanged(directoryRemoved),
  'chat/truncated': truncated,
  'chat/turnsLoaded': turnsLoaded,
  'chat/toolCallStart': toolCallStart,
  'chat/toolCallDelta': toolCallTransition(toolDelta, false),
  'chat/toolCallReady': toolCallTransition(toolReady, true),
  'chat/toolCallConfirmed': toolCallTransition(toolConfirmed, true),
  'chat/toolCallComplete': toolCallTransition(toolComplete, true),
  'chat/toolCallResultConfirmed': toolCallTransition(toolResultConfirmed, true),
  'chat/toolCallContentChanged': toolCallTransition(toolContentChanged, false),
  'chat/toolCallAuthRequired': toolCallTransition(toolAuthRequired, true),
  'chat/toolCallAuthResolved': toolCallTransition(toolAuthResolved, true),
  'chat/pendingMessageSet': pendingMessageSet,
  'chat/pendingMessageRemoved': pendingMessageRemoved,
  'chat/queuedMessagesReordered': queuedMessagesReordered,
  'chat/draftChanged': setField('draft'),
  'chat/inputRequested': inputRequested,
  'chat/inputAnswerChanged': inputAnswerChanged,
  'chat/inputCompleted': inputCompleted,
};

/**
 * The chat state (`ahp-chat:/<id>`) after `action`.
 * @param {Json} state
 * @param {Action} action
 * @param {number} nowMs  the caller's clock, in ms since the epoch; stamps `modifiedAt`
 * @returns {Json}
 */
export function reduceChat(state, action, nowMs) {
  const reducer = Object.hasOwn(CHAT, action.type) ? CHAT[action.type] : null;
  return reducer ? reducer(state, action, nowMs) : state;
}

// ─── Any channel ────────────────────────────────────────────────────────────

/** Every action type these reducers know, root, session and chat. */
export const ACTION_TYPES = Object.freeze([
  ...Object.keys(ROOT),
  ...Object.keys(SESSION),
  ...Object.keys(CHAT),
]);

/**
 * The state of a `kind` channel after `action`. An action of another
 * channel's family, or of an unknown type, is a no-op: the same state object
 * comes back.
 * @param {ChannelKind} kind
 * @param {Json} state
 * @param {Action} action
 * @param {number} nowMs  the caller's clock (only chat actions use it)
 * @returns {Json}
 */
export function reduce(kind, state, action, nowMs) {
  switch (kind) {
    case 'root':
      return reduceRoot(state, action);
    case 'session':
      return reduceSession(state, action);
    case 'chat':
      return reduceChat(state, action, nowMs);
    default:
      return state;
  }
}

/** AHP's client-dispatchable actions (protocol/actions.py CLIENT_DISPATCHABLE). */
const CLIENT_DISPATCHABLE = new Set([
  'root/configChanged',
  'session/titleChanged',
  'session/activeClientSet',
  'session/activeClientRemoved',
  'session/workingDirectorySet',
  'session/workingDirectoryRemoved',
  'session/customizationToggled',
  'session/mcpServerStartRequested',
  'session/mcpServerStopRequested',
  'session/isReadChanged',
  'session/isArchivedChanged',
  'session/configChanged',
  'chat/turnStarted',
  'chat/toolCallConfirmed',
  'chat/toolCallComplete',
  'chat/toolCallResultConfirmed',
  'chat/toolCallContentChanged',
  'chat/turnCancelled',
  'chat/workingDirectorySet',
  'chat/workingDirectoryRemoved',
  'chat/pendingMessageSet',
  'chat/pendingMessageRemoved',
  'chat/queuedMessagesReordered',
  'chat/draftChanged',
  'chat/inputAnswerChanged',
  'chat/inputCompleted',
  'chat/truncated',
]);

/**
 * Whether a client may originate an action of `type` (AHP); every other
 * action is server-only, and the server rejects it from a participant.
 * @param {string} type
 * @returns {boolean}
 */
export function isClientDispatchable(type) {
  return CLIENT_DISPATCHABLE.has(type);
}
