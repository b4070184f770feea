// A small Markdown renderer that keeps every character's place in the source.
//
// Why our own: the page colours each token of an answer by its origin, so the rendered
// text must still know which source offsets it shows. The parser returns blocks and
// inline nodes that carry [start, end) ranges into the source; the caller's text(parent,
// start, end) writes those characters (as token spans). Nothing here ever parses HTML:
// the DOM is built with createElement and text nodes only, so markup in a model's answer
// is shown as text and never executed.
//
// Supported: fenced code blocks (``` and ~~~, with a language tag), ATX headings (#),
// paragraphs (a newline is a line break, as in chat), bullet and ordered list items,
// block quotes, thematic breaks, inline code, **strong**, *emphasis*, and links to
// http(s) addresses (opened in a new tab only when clicked; nothing is fetched).
"use strict";

(function (global) {
  const FENCE = /^ {0,3}(`{3,}|~{3,})[ \t]*([^`\s]*)[^\n]*$/;
  const HEADING = /^ {0,3}(#{1,6})([ \t]+|$)/;
  const RULE = /^ {0,3}([-*_])([ \t]*\1){2,}[ \t]*$/;
  const ITEM = /^([ \t]*)([-*+]|\d{1,9}[.)])[ \t]+/;
  const QUOTE = /^ {0,3}>[ \t]?/;

  // The source's lines as [start, end) ranges (end excludes the newline).
  function lines(src, from) {
    const out = [];
    let at = from;
    while (at < src.length) {
      const nl = src.indexOf("\n", at);
      const end = nl < 0 ? src.length : nl;
      out.push([at, end]);
      at = end + 1;
    }
    return out;
  }

  // Blocks of src from offset `from` (a block boundary). Each block:
  //   {type: "code", start, end, lang, lines: [[s, e], ...], closed}
  //   {type: "heading", start, end, level, inline: [s, e]}
  //   {type: "para" | "quote", start, end, lines: [[s, e], ...]}
  //   {type: "item", start, end, ordered, number, indent, lines: [[s, e], ...]}
  //   {type: "rule", start, end}
  // `start` is where the block's first line starts; `end` the end of its last line.
  function parseBlocks(src, from) {
    const ls = lines(src, from || 0);
    const blocks = [];
    let i = 0;
    let open = null; // the paragraph, quote or item that following lines may continue
    while (i < ls.length) {
      const [s, e] = ls[i];
      const line = src.slice(s, e);
      let m;
      if ((m = FENCE.exec(line))) {
        open = null;
        const marker = m[1];
        const block = {type: "code", start: s, end: e, lang: m[2] || "", lines: [],
                       closed: false};
        i++;
        while (i < ls.length) {
          const [cs, ce] = ls[i];
          const text = src.slice(cs, ce).trim();
          if (text.length >= marker.length && text[0] === marker[0] &&
              /^(`+|~+)$/.test(text)) {
            block.closed = true;
            block.end = ce;
            i++;
            break;
          }
          block.lines.push([cs, ce]);
          block.end = ce;
          i++;
        }
        blocks.push(block);
        continue;
      }
      if (!line.trim()) {
        open = null;
        i++;
        continue;
      }
      if ((m = HEADING.exec(line))) {
        open = null;
        let ie = e;
        const trailing = /[ \t]+#+[ \t]*$/.exec(line);
        if (trailing && trailing.index >= m[0].length) ie = s + trailing.index;
        blocks.push({type: "heading", start: s, end: e, level: m[1].length,
                     inline: [s + m[0].length, ie]});
        i++;
        continue;
      }
      if (RULE.test(line)) {
        open = null;
        blocks.push({type: "rule", start: s, end: e});
        i++;
        continue;
      }
      if ((m = ITEM.exec(line))) {
        const marker = m[2];
        const ordered = /\d/.test(marker[0]);
        open = {type: "item", start: s, end: e, ordered: ordered,
                number: ordered ? parseInt(marker, 10) : null,
                indent: Math.min(3, Math.floor(m[1].replace(/\t/g, "    ").length / 2)),
                lines: [[s + m[0].length, e]]};
        blocks.push(open);
        i++;
        continue;
      }
      if ((m = QUOTE.exec(line))) {
        if (!open || open.type !== "quote") {
          open = {type: "quote", start: s, end: e, lines: []};
          blocks.push(open);
        }
        open.lines.push([s + m[0].length, e]);
        open.end = e;
        i++;
        continue;
      }
      if (open && (open.type === "para" || open.type === "item")) {
        open.lines.push([s + (line.length - line.trimStart().length), e]);
        open.end = e;
        i++;
        continue;
      }
      open = {type: "para", start: s, end: e, lines: [[s, e]]};
      blocks.push(open);
      i++;
    }
    return blocks;
  }

  // Inline nodes of src[start, end): {type: "text", start, end} | {type: "code", start,
  // end} | {type: "strong" | "em", children} | {type: "link", href, children}.
  function parseInline(src, start, end) {
    const out = [];
    let textFrom = start;
    let i = start;
    const flush = (to) => {
      if (to > textFrom) out.push({type: "text", start: textFrom, end: to});
    };
    while (i < end) {
      const c = src[i];
      if (c === "\\" && i + 1 < end && /[\\`*_[\]()#>~-]/.test(src[i + 1])) {
        flush(i);
        out.push({type: "text", start: i + 1, end: i + 2});
        i += 2;
        textFrom = i;
        continue;
      }
      if (c === "`") {
        let n = 1;
        while (i + n < end && src[i + n] === "`") n++;
        const fence = "`".repeat(n);
        const close = src.indexOf(fence, i + n);
        if (close >= 0 && close + n <= end && src[close + n] !== "`") {
          flush(i);
          out.push({type: "code", start: i + n, end: close});
          i = close + n;
          textFrom = i;
          continue;
        }
        i += n;
        continue;
      }
      if ((c === "*" || c === "_") && i + 1 < end) {
        const strong = src[i + 1] === c;
        const marker = strong ? c + c : c;
        const after = i + marker.length;
        // an opening marker is followed by a non-space; `_` only at a word's start
        const opens = after < end && !/\s/.test(src[after]) &&
          !(c === "_" && i > start && /\w/.test(src[i - 1]));
        if (opens) {
          let close = src.indexOf(marker, after + 1);
          while (close >= 0 && close < end && (/\s/.test(src[close - 1]) ||
                 (!strong && src[close + 1] === c) ||
                 (c === "_" && close + 1 < end && /\w/.test(src[close + 1])))) {
            close = src.indexOf(marker, close + 1);
          }
          if (close >= 0 && close + marker.length <= end) {
            flush(i);
            out.push({type: strong ? "strong" : "em",
                      children: parseInline(src, after, close)});
            i = close + marker.length;
            textFrom = i;
            continue;
          }
        }
        i += marker.length;
        continue;
      }
      if (c === "[") {
        const mid = src.indexOf("](", i + 1);
        const close = mid >= 0 ? src.indexOf(")", mid + 2) : -1;
        const nl = src.indexOf("\n", i);
        if (mid >= 0 && close >= 0 && close < end && (nl < 0 || nl > close)) {
          const href = src.slice(mid + 2, close).trim();
          if (/^https?:\/\/[^\s<>"']+$/i.test(href)) {
            flush(i);
            out.push({type: "link", href: href, children: parseInline(src, i + 1, mid)});
            i = close + 1;
            textFrom = i;
            continue;
          }
        }
      }
      i++;
    }
    flush(end);
    return out;
  }

  function renderInline(nodes, parent, text) {
    for (const n of nodes) {
      if (n.type === "text") {
        text(parent, n.start, n.end);
      } else if (n.type === "code") {
        const el = document.createElement("code");
        text(el, n.start, n.end);
        parent.appendChild(el);
      } else if (n.type === "link") {
        const a = document.createElement("a");
        a.href = n.href; // checked: http(s) only
        a.rel = "noopener noreferrer nofollow";
        a.target = "_blank";
        renderInline(n.children, a, text);
        parent.appendChild(a);
      } else {
        const el = document.createElement(n.type === "strong" ? "strong" : "em");
        renderInline(n.children, el, text);
        parent.appendChild(el);
      }
    }
  }

  // Lines of a paragraph-like block, each rendered inline, joined by <br>.
  function renderLines(src, block, parent, text) {
    block.lines.forEach(([s, e], k) => {
      if (k > 0) parent.appendChild(document.createElement("br"));
      renderInline(parseInline(src, s, e), parent, text);
    });
  }

  // The element for one code block's body (its <code>), lines from `fromLine` on appended
  // to `code` (so that a growing block is extended rather than rebuilt).
  function appendCodeLines(src, block, code, fromLine, text) {
    for (let k = fromLine; k < block.lines.length; k++) {
      const [s, e] = block.lines[k];
      text(code, s, e);
      // the newline belongs to the source too (a token may end with it)
      if (e < src.length) text(code, e, e + 1);
    }
  }

  // One block's element.
  function renderBlock(src, block, text) {
    let el;
    switch (block.type) {
      case "code": {
        el = document.createElement("pre");
        const code = document.createElement("code");
        if (block.lang) code.dataset.lang = block.lang;
        appendCodeLines(src, block, code, 0, text);
        el.appendChild(code);
        break;
      }
      case "heading":
        el = document.createElement("h" + Math.min(6, block.level + 2));
        renderInline(parseInline(src, block.inline[0], block.inline[1]), el, text);
        break;
      case "rule":
        el = document.createElement("hr");
        break;
      case "quote":
        el = document.createElement("blockquote");
        renderLines(src, block, el, text);
        break;
      case "item":
        el = document.createElement("li");
        if (block.indent) el.className = "indent-" + block.indent;
        renderLines(src, block, el, text);
        break;
      default:
        el = document.createElement("p");
        renderLines(src, block, el, text);
    }
    return el;
  }

  global.EdgespecMarkdown = {parseBlocks, parseInline, renderBlock, appendCodeLines};
})(window);
