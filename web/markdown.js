// A small, safe Markdown renderer: it builds DOM nodes, never HTML.
//
// Supported: paragraphs (single newlines become line breaks), headings,
// bullet and numbered lists, block quotes, fenced code blocks, inline code,
// **strong**, *emphasis*, [links](https://...) and bare http(s) URLs. Links
// open in a new tab with rel="noopener noreferrer"; a link to anything but
// http: or https: is shown as its text only. Raw HTML in the source is shown
// as the text it is.

import { append, h } from './dom.js';

/** The URL if it is an absolute http(s) URL, else null. */
export function safeHref(href) {
  try {
    const url = new URL(href);
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  } catch {
    return null;
  }
}

const FENCE = /^\s{0,3}(```|~~~)\s*([\w-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^\s{0,3}[-*+]\s+(.*)$/;
const NUMBERED = /^\s{0,3}(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s{0,3}>\s?(.*)$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;

/** Render `source` into a DocumentFragment. */
export function renderMarkdown(source) {
  const fragment = document.createDocumentFragment();
  const lines = String(source ?? '').replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) {
        body.push(lines[i]);
        i += 1;
      }
      i += 1; // the closing fence (or the end of a block still streaming in)
      const code = h('code', null, body.join('\n'));
      if (fence[2]) code.dataset.lang = fence[2];
      fragment.append(h('pre', null, code));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      const level = Math.min(6, heading[1].length + 2);
      fragment.append(inline(h(`h${level}`, { class: 'md-heading' }), heading[2]));
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      fragment.append(h('hr'));
      i += 1;
      continue;
    }
    if (BULLET.test(line) || NUMBERED.test(line)) {
      const numbered = !BULLET.test(line);
      const pattern = numbered ? NUMBERED : BULLET;
      const list = h(numbered ? 'ol' : 'ul');
      const first = NUMBERED.exec(line);
      if (numbered && first[1] !== '1') list.start = Number(first[1]);
      const items = [];
      while (i < lines.length && lines[i].trim()) {
        const match = pattern.exec(lines[i]);
        if (match) items.push([numbered ? match[2] : match[1]]);
        else if (items.length && /^\s+/.test(lines[i])) items[items.length - 1].push(lines[i].trim());
        else break;
        i += 1;
      }
      for (const item of items) list.append(inlineLines(h('li'), item));
      fragment.append(list);
      continue;
    }
    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && QUOTE.test(lines[i])) {
        body.push(QUOTE.exec(lines[i])[1]);
        i += 1;
      }
      fragment.append(h('blockquote', null, renderMarkdown(body.join('\n'))));
      continue;
    }
    const paragraph = [];
    while (
      i < lines.length &&
      lines[i].trim() &&
      !FENCE.test(lines[i]) &&
      !HEADING.test(lines[i]) &&
      !BULLET.test(lines[i]) &&
      !NUMBERED.test(lines[i]) &&
      !QUOTE.test(lines[i])
    ) {
      paragraph.push(lines[i].trim());
      i += 1;
    }
    fragment.append(inlineLines(h('p'), paragraph));
  }
  return fragment;
}

function inlineLines(el, lines) {
  lines.forEach((text, index) => {
    if (index > 0) el.append(h('br'));
    inline(el, text);
  });
  return el;
}

// One alternation for the inline syntax; the first match at a position wins.
const INLINE = new RegExp(
  [
    /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)/.source, // 1,2: code
    /\*\*(?=\S)([\s\S]*?\S)\*\*/.source, // 3: strong
    /__(?=\S)([\s\S]*?\S)__/.source, // 4: strong
    /\*(?=[^\s*])([\s\S]*?[^\s*])\*/.source, // 5: emphasis
    /(?<![\w])_(?=[^\s_])([\s\S]*?[^\s_])_(?![\w])/.source, // 6: emphasis
    /\[([^\]\n]+)\]\(\s*<?([^\s<>()]+)>?\s*\)/.source, // 7,8: link
    /(https?:\/\/[^\s<>"']+[^\s<>"'.,:;!?)\]])/.source, // 9: bare URL
  ].join('|'),
  'g',
);

/** Append the inline Markdown of `text` to `el`. */
export function inline(el, text) {
  INLINE.lastIndex = 0;
  let last = 0;
  const source = String(text);
  for (const match of source.matchAll(INLINE)) {
    if (match.index > last) append(el, [source.slice(last, match.index)]);
    last = match.index + match[0].length;
    if (match[2] !== undefined) el.append(h('code', null, match[2]));
    else if (match[3] !== undefined || match[4] !== undefined) {
      el.append(inline(h('strong'), match[3] ?? match[4]));
    } else if (match[5] !== undefined || match[6] !== undefined) {
      el.append(inline(h('em'), match[5] ?? match[6]));
    } else if (match[7] !== undefined) {
      el.append(link(match[8], match[7]));
    } else if (match[9] !== undefined) {
      el.append(link(match[9], match[9]));
    }
  }
  if (last < source.length) append(el, [source.slice(last)]);
  return el;
}

function link(href, label) {
  const safe = safeHref(href);
  if (safe === null) return append(document.createDocumentFragment(), [label]);
  return h('a', { href: safe, target: '_blank', rel: 'noopener noreferrer nofollow' }, label);
}
