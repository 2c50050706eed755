// DOM building without HTML strings. Every text goes in as a text node or
// through textContent: nothing that comes from the wire is ever parsed as
// markup (DESIGN: "Schema and question text are data"). Nor does any text
// reorder or hide what is around it: its bidi controls and zero-width
// characters are shown (visibleControls), whoever wrote it (a title, a
// message, an answer, a name), and the text itself is kept as sent.

const PROPERTIES = new Set([
  'value', 'checked', 'disabled', 'hidden', 'selected', 'readOnly', 'indeterminate', 'required',
]);

/** Create an element: `h('button', {class: 'primary', onclick: f}, 'Send')`. */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key.startsWith('on') && typeof value === 'function') {
        el.addEventListener(key.slice(2), value);
      } else if (PROPERTIES.has(key)) el[key] = value;
      else el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

/** Append children: strings become text nodes (controls shown:
 * visibleControls); null, false and undefined are skipped. */
export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(visibleControls(child)));
  }
  return el;
}

// What reorders text or shows as nothing: the bidi controls (embeddings,
// overrides, isolates, the marks U+200E/F and U+061C) and the zero-width
// characters (spaces, word joiner, invisible operators, U+FEFF, U+180E). A
// zero-width joiner or non-joiner between two letters, marks or emoji is
// writing (Persian words, an emoji family) and stays as it is.
const CONTROLS =
  /[\u061c\u180e\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]|(?<![\p{L}\p{M}\p{Extended_Pictographic}\p{Emoji_Modifier}])[\u200c\u200d]|[\u200c\u200d](?![\p{L}\p{M}\p{Extended_Pictographic}\p{Emoji_Modifier}])/gu;

/** Text as sent with each control shown as its code point (⟨U+202E⟩):
 * "Invoice \u202efdp.exe" reads as sent, never as "Invoice exe.pdf". Every
 * text `append` puts in is shown so; text set another way (textContent,
 * document.title) goes through this by hand. */
export function visibleControls(text) {
  return String(text ?? '').replace(CONTROLS, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}⟩`);
}

/** Replace every child of `el`. */
export function replaceChildren(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let counter = 0;
/** A document-unique id with a readable prefix. */
export function uid(prefix) {
  counter += 1;
  return `${prefix}-${counter}`;
}

/**
 * Keep `container`'s children in step with `items` by key: existing views are
 * updated in place (so focus, selection and scroll inside them survive), new
 * ones created, gone ones removed, and order fixed with the fewest moves.
 * A view is `{el, update(item)}`; `views` is the Map that remembers them.
 */
export function syncKeyed(container, views, items, keyOf, create) {
  const seen = new Set();
  let cursor = container.firstChild;
  for (const item of items) {
    const key = keyOf(item);
    seen.add(key);
    let view = views.get(key);
    if (view === undefined) {
      view = create(item);
      views.set(key, view);
    } else {
      view.update(item);
    }
    if (view.el !== cursor) container.insertBefore(view.el, cursor);
    else cursor = cursor.nextSibling;
  }
  for (const [key, view] of views) {
    if (!seen.has(key)) {
      view.destroy?.();
      view.el.remove();
      views.delete(key);
    }
  }
}

/** Text of AHP's StringOrMarkdown (a string, or `{markdown}`). */
export function plainText(value) {
  if (value === undefined || value === null) return '';
  if (typeof value === 'string') return value;
  if (typeof value.markdown === 'string') return value.markdown;
  return '';
}
