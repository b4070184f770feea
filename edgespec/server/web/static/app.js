// The edgespec chat page: conversations in local storage, answers streamed from
// /v1/chat/completions with the `include_origins` extension, every token coloured by its
// origin, per-answer speculation stats, and a live view of the server.
//
// Safety: model output only ever reaches the DOM as text nodes (textContent, never
// innerHTML), so HTML or script in an answer is shown, not run; the server's
// Content-Security-Policy allows no inline script either.
"use strict";

(function () {
  const MD = window.EdgespecMarkdown;
  const STORE = "edgespec.web.conversations";
  const PREFS = "edgespec.web.settings";
  const KNOWN_ORIGINS = ["target", "ngram", "suffix", "draft", "bridge", "self", "lookahead",
                         "mtp", "eagle3"];
  const POLL_MS = 2000;

  const $ = (sel, root) => (root || document).querySelector(sel);
  const role = (name, root) => $(`[data-role="${name}"]`, root);
  const el = (tag, attrs, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c);
    return e;
  };

  // --- preferences and conversations (local storage) ---------------------------------
  const prefs = Object.assign({temperature: 0.7, maxTokens: 1024, apiKey: "", model: "",
                               current: null}, readJSON(PREFS, {}));
  let conversations = readJSON(STORE, []);
  if (!Array.isArray(conversations)) conversations = [];
  // an answer saved while it streamed (the tab closed mid-answer) ended there
  for (const c of conversations) {
    for (const m of c.messages || []) if (m.state === "streaming") m.state = "cancelled";
  }

  function readJSON(key, fallback) {
    try {
      const raw = localStorage.getItem(key);
      return raw ? JSON.parse(raw) : fallback;
    } catch (e) {
      return fallback;
    }
  }

  function savePrefs() {
    try { localStorage.setItem(PREFS, JSON.stringify(prefs)); } catch (e) { /* full */ }
  }

  // Conversations are saved whole; when storage is full the oldest answers lose their
  // token annotations (the text stays), then the save is tried again.
  function saveConversations() {
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        localStorage.setItem(STORE, JSON.stringify(conversations));
        return true;
      } catch (e) {
        const stripped = stripOldestTokens();
        if (!stripped) break;
      }
    }
    showBanner("Browser storage is full: older answers keep their text but lost their " +
               "token colours. Export and delete old conversations to free space.", false);
    return false;
  }

  function stripOldestTokens() {
    const byAge = [...conversations].sort((a, b) => a.updated - b.updated);
    for (const c of byAge) {
      let did = false;
      for (const m of c.messages) {
        if (m.tokens && m.tokens.length) { m.tokens = []; m.runs = []; m.rruns = []; did = true; }
      }
      if (did) return true;
    }
    return false;
  }

  function newConversation() {
    const c = {id: "c" + Date.now().toString(36) + Math.random().toString(36).slice(2, 6),
               title: "New chat", created: Date.now(), updated: Date.now(), system: "",
               model: prefs.model || "", messages: []};
    conversations.unshift(c);
    prefs.current = c.id;
    savePrefs();
    saveConversations();
    return c;
  }

  function current() {
    let c = conversations.find((x) => x.id === prefs.current);
    if (!c) c = conversations[0] || newConversation();
    prefs.current = c.id;
    return c;
  }

  // --- the server's routes -------------------------------------------------------------
  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    if (prefs.apiKey) h["Authorization"] = "Bearer " + prefs.apiKey;
    return h;
  }

  class ServerError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // The error body of any dialect's shape, as one line.
  async function errorOf(resp) {
    let message = `HTTP ${resp.status}`;
    let code = null;
    try {
      const body = await resp.json();
      const err = body && body.error;
      if (typeof err === "string") message = err;
      else if (err && err.message) { message = err.message; code = err.code || err.type; }
    } catch (e) { /* not JSON */ }
    return new ServerError(resp.status, message, code);
  }

  async function getJSON(path) {
    const resp = await fetch(path, {headers: headers(false), cache: "no-store"});
    if (!resp.ok) throw await errorOf(resp);
    return resp.json();
  }

  // The data lines of a server-sent event stream, one string per event.
  async function* sseData(resp) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += decoder.decode(value, {stream: true}).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) yield data;
      }
    }
  }

  // --- origins ---------------------------------------------------------------------------
  function originClass(origin) {
    if (KNOWN_ORIGINS.includes(origin)) return "o-" + origin;
    let h = 0;
    for (const ch of origin) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
    return "o-p" + (h % 6);
  }

  // Which token each character of the visible text came from. The stream's tokens carry
  // their text pieces; the visible text is those pieces in order, less what the server's
  // turn parsers removed (a <think> tag, tool-call markup). A character is matched to the
  // next token text that holds it within a short window; unmatched ones stay unknown (-1).
  class Aligner {
    constructor() {
      this.text = "";   // the tokens' pieces, concatenated
      this.owner = [];  // token index of each code unit of this.text
      this.cursor = 0;
    }

    addToken(index, piece) {
      this.text += piece;
      for (let i = 0; i < piece.length; i++) this.owner.push(index);
    }

    // The owner of each code unit of `chars`; null when the tokens have not caught up yet
    // and `final` is false (call again with the same characters later).
    map(chars, final) {
      const out = [];
      for (let i = 0; i < chars.length; i++) {
        const ahead = this.text.length - this.cursor;
        if (ahead <= 0) {
          if (!final) return out.length ? out : null;
          out.push(-1);
          continue;
        }
        const limit = Math.min(this.text.length, this.cursor + 64);
        let j = this.cursor;
        while (j < limit && this.text[j] !== chars[i]) j++;
        if (j < limit) {
          out.push(this.owner[j]);
          this.cursor = j + 1;
        } else if (ahead >= 64 || final) {
          out.push(-1);
        } else {
          return out.length ? out : null;
        }
      }
      return out;
    }
  }

  // Run-length form of a per-character owner list, for storage: [[count, token], ...].
  function toRuns(owners) {
    const runs = [];
    for (const k of owners) {
      const last = runs[runs.length - 1];
      if (last && last[1] === k) last[0]++;
      else runs.push([1, k]);
    }
    return runs;
  }

  function fromRuns(runs, length) {
    const out = [];
    for (const [n, k] of runs || []) for (let i = 0; i < n; i++) out.push(k);
    while (out.length < length) out.push(-1);
    return out;
  }

  function tokenInfo(tokens, k) {
    const t = tokens[k];
    if (!t) return "";
    const pass = tokens.filter((x) => x.s === t.s);
    const accepted = pass.filter((x) => x.o !== "target").length;
    const shown = JSON.stringify(t.t);
    if (t.o === "target") {
      if (!t.d) return `${shown} · the target's own token (a plain step: nothing drafted)`;
      const why = accepted >= t.d ? "bonus token after a fully accepted draft" :
        "correction at the first rejected draft token";
      return `${shown} · the target's own token (${why}; its pass verified ${t.d} drafted, ` +
             `accepted ${accepted})`;
    }
    const at = t.p === null || t.p === undefined ? "" : ` at draft position ${t.p + 1}`;
    return `${shown} · drafted by ${t.o}${at}, accepted (its pass verified ${t.d} drafted, ` +
           `accepted ${accepted})`;
  }

  // --- rendering an answer ---------------------------------------------------------------
  // Renders Markdown incrementally: blocks that a later block has closed are rendered once
  // and kept; only the last block is rebuilt per frame (a growing code block is extended
  // line by line), so a long answer stays cheap to stream.
  class AnswerView {
    constructor(root, msg) {
      this.root = root;
      this.msg = msg;
      this.reasoningEl = null;
      this.body = el("div", {class: "md"});
      root.append(this.body);
      this.reset();
    }

    reset() {
      this.body.replaceChildren();
      this.stableEnd = 0;   // offset where the blocks not yet final start
      this.live = [];       // elements of the non-final block, removed before each frame
      this.code = null;     // the growing code block: {start, pre, code, done, tail}
      this.reasoningDone = 0;
    }

    write(parent, src, owners, s, e) {
      const tokens = this.msg.tokens;
      let i = s;
      while (i < e) {
        const k = owners[i] === undefined ? -1 : owners[i];
        let j = i + 1;
        while (j < e && (owners[j] === undefined ? -1 : owners[j]) === k) j++;
        const piece = src.slice(i, j);
        const t = k >= 0 ? tokens[k] : null;
        if (!t) {
          parent.append(document.createTextNode(piece));
        } else {
          parent.append(el("span", {class: "tok " + originClass(t.o), "data-origin": t.o,
                                    "data-tok": String(k), text: piece}));
        }
        i = j;
      }
    }

    // Draw what changed since the last call; `final` once the answer is complete.
    render(content, owners, reasoning, rOwners, final) {
      if (reasoning) this.renderReasoning(reasoning, rOwners);
      const text = (parent, s, e) => this.write(parent, content, owners, s, e);
      for (const e of this.live) e.remove();
      this.live = [];
      const blocks = MD.parseBlocks(content, this.stableEnd);
      const complete = final ? blocks.length : Math.max(0, blocks.length - 1);
      for (let i = 0; i < blocks.length; i++) {
        const b = blocks[i];
        const done = i < complete;
        const node = b.type === "code" ? this.codeBlock(b, content, text, done)
          : MD.renderBlock(content, b, text);
        this.place(node, b, done);
        if (done) {
          this.stableEnd = i + 1 < blocks.length ? blocks[i + 1].start : content.length;
          if (b.type === "code") this.code = null;
        }
      }
    }

    place(node, block, done) {
      if (block.type === "item") {
        const tag = block.ordered ? "OL" : "UL";
        const last = this.body.lastElementChild;
        let list = last && last.tagName === tag && !last.dataset.closed ? last : null;
        if (!list) {
          list = el(tag.toLowerCase());
          if (block.ordered && block.number !== null && block.number !== 1) list.start = block.number;
          this.body.append(list);
          if (!done) this.live.push(list);
        }
        list.append(node);
        if (!done) this.live.push(node);
        return;
      }
      const last = this.body.lastElementChild;
      if (done && last && (last.tagName === "UL" || last.tagName === "OL")) last.dataset.closed = "1";
      if (node.parentNode !== this.body) this.body.append(node);
      if (!done) this.live.push(node);
    }

    codeBlock(b, src, text, done) {
      let c = this.code;
      if (!c || c.start !== b.start) {
        const code = el("code", {"data-lang": b.lang || undefined});
        const pre = el("pre", {}, code);
        const copy = el("button", {type: "button", class: "copy", text: "copy",
                                   title: "Copy the code"});
        copy.addEventListener("click", () => {
          navigator.clipboard && navigator.clipboard.writeText(code.textContent);
        });
        pre.append(copy);
        c = this.code = {start: b.start, pre: pre, code: code, done: 0, tail: null};
      }
      if (c.tail) { c.tail.remove(); c.tail = null; }
      // lines followed by a newline are final; the last line may still grow
      let whole = 0;
      while (whole < b.lines.length && b.lines[whole][1] < src.length) whole++;
      if (done) whole = b.lines.length;
      for (; c.done < whole; c.done++) {
        const [s, e] = b.lines[c.done];
        text(c.code, s, e);
        if (e < src.length) text(c.code, e, e + 1);
      }
      if (whole < b.lines.length) {
        c.tail = el("span");
        for (let k = whole; k < b.lines.length; k++) text(c.tail, b.lines[k][0], b.lines[k][1]);
        c.code.append(c.tail);
      }
      return c.pre;
    }

    renderReasoning(reasoning, rOwners) {
      if (!this.reasoningEl) {
        const body = el("div", {class: "reasoning-body"});
        this.reasoningEl = el("details", {class: "reasoning", "data-role": "reasoning"},
                              el("summary", {text: "Reasoning"}), body);
        this.root.insertBefore(this.reasoningEl, this.body);
      }
      const body = this.reasoningEl.lastElementChild;
      if (reasoning.length > this.reasoningDone) {
        this.write(body, reasoning, rOwners, this.reasoningDone, reasoning.length);
        this.reasoningDone = reasoning.length;
      }
    }
  }

  // --- stats -----------------------------------------------------------------------------
  function pct(x) { return (100 * x).toFixed(0) + "%"; }

  // One line for an answer: acceptance, mean accepted length, proposer share, tokens/s, the
  // speedup against the plain path's calibrated rate on this machine, TTFT.
  function statsLine(msg, live) {
    const parts = msg.state === "cancelled" ? ["stopped"] : [];
    const tokens = msg.tokens || [];
    const s = msg.stats || {};
    const drafted = s.drafted !== undefined ? s.drafted : live.drafted;
    const accepted = s.accepted !== undefined ? s.accepted : live.accepted;
    if (drafted > 0) parts.push(`acceptance ${pct(accepted / drafted)} (${accepted}/${drafted})`);
    else parts.push("acceptance – (nothing drafted)");
    if (s.mean_accepted_length) parts.push(`mean accepted length ${s.mean_accepted_length.toFixed(2)}`);
    if (tokens.length) {
      const by = {};
      for (const t of tokens) by[t.o] = (by[t.o] || 0) + 1;
      const share = Object.entries(by).filter(([o]) => o !== "target")
        .sort((a, b) => b[1] - a[1]).map(([o, n]) => `${o} ${pct(n / tokens.length)}`);
      parts.push(share.length ? "drafted share " + share.join(", ") : "all target tokens");
    }
    const rate = s.decode_tokens_per_second ||
      (msg.timings && msg.timings.predicted_per_second) || live.rate;
    if (rate) {
      parts.push(`${rate.toFixed(1)} tok/s`);
      const plain = msg.plain;
      if (plain && plain.tokens_per_second) {
        const basis = plain.source === "measured" ? "calibrated" : plain.source + " estimate";
        parts.push(`${(rate / plain.tokens_per_second).toFixed(2)}× plain ` +
                   `(${plain.tokens_per_second.toFixed(1)} tok/s ${basis})`);
      } else {
        parts.push("plain rate unknown");
      }
    }
    const ttft = s.ttft_seconds !== undefined ? s.ttft_seconds : live.ttft;
    if (ttft !== null && ttft !== undefined) parts.push(`TTFT ${(1000 * ttft).toFixed(0)} ms`);
    const n = msg.usage ? msg.usage.completion_tokens : tokens.length;
    if (n) parts.push(`${n} tokens`);
    if (s.proposer) parts.push(`proposer ${s.proposer}`);
    if (msg.model) parts.push(msg.model);
    return parts.join(" · ");
  }

  // --- the page ------------------------------------------------------------------------
  const ui = {
    messages: role("messages"), prompt: role("prompt"), send: role("send"),
    stop: role("stop"), composer: role("composer"), model: role("model"),
    proposer: role("proposer"), exact: role("exact"), legend: role("legend"),
    list: role("conversations"), banner: role("banner"), bannerText: role("banner-text"),
    bannerRetry: role("banner-retry"), system: role("system"),
    temperature: role("temperature"), maxTokens: role("max-tokens"), apiKey: role("api-key"),
    settings: role("settings"), settingsToggle: role("settings-toggle"),
    connection: role("connection"), tokenInfo: role("token-info"),
  };
  let status = null;   // the last /v1/edgespec/status
  let models = [];     // the last /v1/models data
  let running = null;  // {controller, msg, conv}
  let bannerAction = null;

  function showBanner(text, retry, action) {
    ui.bannerText.textContent = text;
    ui.bannerRetry.hidden = !retry;
    bannerAction = action || null;
    ui.banner.hidden = false;
  }

  function hideBanner() { ui.banner.hidden = true; }

  function modelInfo(id) {
    return status && status.models ? status.models.find((m) => m.id === id ||
      (m.aliases || []).includes(id)) : null;
  }

  function selectedModel() {
    return ui.model.value || (status && status.default_model) || "";
  }

  // Conversations list -----------------------------------------------------------------
  function renderList() {
    ui.list.replaceChildren();
    const cur = current();
    for (const c of conversations) {
      const title = el("button", {type: "button", class: "title", text: c.title,
                                  title: c.title});
      title.addEventListener("click", () => switchTo(c.id));
      const rename = el("button", {type: "button", class: "icon", text: "✎", title: "Rename",
                                   "data-action": "rename"});
      rename.addEventListener("click", () => startRename(li, c));
      const exp = el("button", {type: "button", class: "icon", text: "⤓",
                                title: "Export as JSON", "data-action": "export"});
      exp.addEventListener("click", () => download(`${slug(c.title)}.json`, c));
      const del = el("button", {type: "button", class: "icon", text: "×", title: "Delete",
                                "data-action": "delete"});
      del.addEventListener("click", () => {
        if (del.dataset.confirm !== "1") {
          del.dataset.confirm = "1";
          del.textContent = "delete?";
          setTimeout(() => { del.dataset.confirm = ""; del.textContent = "×"; }, 3000);
          return;
        }
        deleteConversation(c.id);
      });
      const li = el("li", {"data-role": "conversation", "data-id": c.id,
                           class: c.id === cur.id ? "current" : ""},
                    title, el("span", {class: "actions"}, rename, exp, del));
      ui.list.append(li);
    }
  }

  function startRename(li, c) {
    const input = el("input", {type: "text", value: c.title, "data-role": "rename-input"});
    const title = $(".title", li);
    title.replaceWith(input);
    input.focus();
    input.select();
    let done = false;
    const finish = (keep) => {
      if (done) return;
      done = true;
      const v = input.value.trim();
      if (keep && v) { c.title = v.slice(0, 200); c.updated = Date.now(); saveConversations(); }
      renderList();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") { e.preventDefault(); finish(true); }
      if (e.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
  }

  function deleteConversation(id) {
    if (running && running.conv.id === id) stopRunning();
    conversations = conversations.filter((c) => c.id !== id);
    if (prefs.current === id) prefs.current = conversations[0] ? conversations[0].id : null;
    saveConversations();
    savePrefs();
    renderAll();
  }

  function switchTo(id) {
    prefs.current = id;
    savePrefs();
    renderAll();
  }

  function slug(s) { return (s || "conversation").replace(/[^\w.-]+/g, "-").slice(0, 60); }

  function download(name, data) {
    const blob = new Blob([JSON.stringify(data, null, 2)], {type: "application/json"});
    const url = URL.createObjectURL(blob);
    const a = el("a", {href: url, download: name});
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  // Messages ---------------------------------------------------------------------------
  const views = new Map(); // message object -> {node, view, stats, error}

  function renderMessages() {
    ui.messages.replaceChildren();
    views.clear();
    const c = current();
    c.messages.forEach((m) => ui.messages.append(messageNode(c, m)));
    ui.system.value = c.system || "";
    renderLegend();
    scrollDown(true);
  }

  function messageNode(conv, m) {
    const del = el("button", {type: "button", class: "icon", text: "×",
                              title: "Delete this message", "data-role": "delete-message"});
    del.addEventListener("click", () => {
      if (running && running.msg === m) return;
      conv.messages = conv.messages.filter((x) => x !== m);
      conv.updated = Date.now();
      saveConversations();
      renderMessages();
    });
    if (m.role === "user") {
      return el("article", {class: "msg user", "data-role": "message",
                            "data-message-role": "user"},
                el("div", {class: "who", text: "you"}, del),
                el("div", {class: "user-text", "data-role": "user-text", text: m.content}));
    }
    const answer = el("div", {class: "answer", "data-role": "answer"});
    const stats = el("div", {class: "stats", "data-role": "stats"});
    const error = el("div", {class: "error", "data-role": "error", hidden: true});
    const regen = el("button", {type: "button", class: "icon", text: "↻",
                                title: "Regenerate this answer", "data-role": "regenerate"});
    regen.addEventListener("click", () => regenerate(conv, m));
    const node = el("article", {class: "msg assistant", "data-role": "message",
                                "data-message-role": "assistant",
                                "data-state": m.state || "done"},
                    el("div", {class: "who", text: m.model || "assistant"}, regen, del),
                    answer, error, stats);
    const view = new AnswerView(answer, m);
    const entry = {node, view, stats, error};
    views.set(m, entry);
    drawMessage(m, m.state !== "streaming");
    return node;
  }

  // Redraw a message from its stored state (text, owners, stats, error).
  function drawMessage(m, final) {
    const v = views.get(m);
    if (!v) return;
    const owners = m.owners || fromRuns(m.runs, (m.content || "").length);
    const rOwners = m.rOwners || fromRuns(m.rruns, (m.reasoning || "").length);
    v.view.render(m.content || "", owners, m.reasoning || "", rOwners, final);
    v.node.dataset.state = m.state || "done";
    v.stats.textContent = statsLine(m, m.live || {});
    if (m.error) {
      v.error.hidden = false;
      v.error.replaceChildren(el("span", {text: m.error}));
      const retry = el("button", {type: "button", text: "Retry", "data-role": "retry"});
      retry.addEventListener("click", () => regenerate(current(), m));
      v.error.append(" ", retry);
    } else {
      v.error.hidden = true;
    }
  }

  function scrollDown(force) {
    const box = ui.messages;
    const near = box.scrollHeight - box.scrollTop - box.clientHeight < 80;
    if (force || near) box.scrollTop = box.scrollHeight;
  }

  function renderLegend() {
    const seen = new Set(["target"]);
    const info = modelInfo(selectedModel());
    for (const p of (info && info.proposers) || []) if (p !== "none") seen.add(p);
    for (const m of current().messages) for (const t of m.tokens || []) seen.add(t.o);
    // rebuilt only when the set changes: the 2-second refresh calls this too
    const key = [...seen].join(",");
    if (ui.legend.dataset.origins === key) return;
    ui.legend.dataset.origins = key;
    ui.legend.replaceChildren(el("span", {class: "muted", text: "token origin:"}));
    for (const o of seen) {
      ui.legend.append(el("span", {class: "legend-item"},
                          el("span", {class: "tok swatch " + originClass(o), "data-origin": o,
                                      text: o === "target" ? "target" : o})));
    }
  }

  // Sending ----------------------------------------------------------------------------
  function requestMessages(conv, upTo) {
    const out = [];
    const system = (conv.system || "").trim();
    if (system) out.push({role: "system", content: system});
    for (const m of conv.messages) {
      if (m === upTo) break;
      if (m.role === "user") out.push({role: "user", content: m.content});
      else if (m.content) out.push({role: "assistant", content: m.content});
    }
    return out;
  }

  function numberOr(input, fallback) {
    const v = parseFloat(input.value);
    return Number.isFinite(v) ? v : fallback;
  }

  async function send(conv, msg) {
    const model = selectedModel();
    const info = modelInfo(model);
    const body = {
      model: model,
      messages: requestMessages(conv, msg),
      stream: true,
      stream_options: {include_usage: true, include_origins: true},
      temperature: numberOr(ui.temperature, 0.7),
      max_tokens: Math.max(1, Math.round(numberOr(ui.maxTokens, 1024))),
    };
    const choices = status && status.choices ? status.choices : {};
    if (choices.proposer && ui.proposer.value) body.proposer = ui.proposer.value;
    Object.assign(msg, {content: "", reasoning: "", tokens: [], owners: [], rOwners: [],
                        runs: [], rruns: [], stats: null, timings: null, usage: null,
                        error: null, state: "streaming", model: model,
                        plain: info ? info.plain || null : null,
                        live: {drafted: 0, accepted: 0, rate: null, ttft: null}});
    const v = views.get(msg);
    if (v) { v.view.reset(); $(".who", v.node).firstChild.textContent = model; }
    const controller = new AbortController();
    running = {controller, msg, conv};
    setBusy(true);
    const aligner = new Aligner();
    let pendingContent = "";   // visible text not yet matched to tokens
    let pendingReasoning = "";
    let steps = 0;
    const started = performance.now();
    let firstAt = null;
    let finished = false;
    let frame = 0;
    const schedule = () => {
      if (frame) return;
      frame = requestAnimationFrame(() => { frame = 0; drawMessage(msg, false); scrollDown(false); });
    };
    const flushAlign = (final) => {
      for (const [key, ownersKey] of [["reasoning", "rOwners"], ["content", "owners"]]) {
        const pending = key === "content" ? pendingContent : pendingReasoning;
        if (!pending) continue;
        const mapped = aligner.map(pending, final) || [];
        msg[ownersKey].push(...mapped);
        if (key === "content") pendingContent = pending.slice(mapped.length);
        else pendingReasoning = pending.slice(mapped.length);
      }
    };
    try {
      let resp;
      try {
        resp = await fetch("/v1/chat/completions", {method: "POST", headers: headers(true),
                                                    body: JSON.stringify(body),
                                                    signal: controller.signal});
      } catch (e) {
        if (controller.signal.aborted) throw e;
        throw new ServerError(0, "Cannot reach the server: is `edgespec serve` still " +
                                 "running? The conversation is kept; retry once it is back.");
      }
      if (!resp.ok) throw await errorOf(resp);
      try {
        for await (const data of sseData(resp)) {
          if (data === "[DONE]") { finished = true; break; }
          let chunk;
          try { chunk = JSON.parse(data); } catch (e) { continue; }
          if (chunk.error) {
            const err = chunk.error;
            throw new ServerError(500, typeof err === "string" ? err : err.message, err.code);
          }
          const ext = chunk.edgespec || {};
          if (Array.isArray(ext.tokens) && ext.tokens.length) {
            const pass = steps++;
            for (const t of ext.tokens) {
              const tok = {t: String(t.text || ""), o: String(t.origin || "target"),
                           d: t.drafted || 0, p: t.position === undefined ? null : t.position,
                           s: pass};
              aligner.addToken(msg.tokens.length, tok.t);
              msg.tokens.push(tok);
              if (tok.o !== "target") msg.live.accepted++;
            }
            msg.live.drafted += ext.tokens[0].drafted || 0;
          }
          if (ext.acceptance_rate !== undefined || ext.drafted !== undefined) msg.stats = ext;
          if (chunk.timings) msg.timings = chunk.timings;
          if (chunk.usage) msg.usage = chunk.usage;
          for (const choice of chunk.choices || []) {
            const d = choice.delta || {};
            if (d.reasoning_content) { msg.reasoning += d.reasoning_content; pendingReasoning += d.reasoning_content; }
            if (d.content) { msg.content += d.content; pendingContent += d.content; }
            if (choice.finish_reason) msg.finish = choice.finish_reason;
          }
          if ((msg.content || msg.reasoning) && firstAt === null) {
            firstAt = performance.now();
            msg.live.ttft = (firstAt - started) / 1000;
          }
          if (firstAt !== null && msg.tokens.length > 1) {
            const secs = (performance.now() - firstAt) / 1000;
            if (secs > 0.2) msg.live.rate = (msg.tokens.length - 1) / secs;
          }
          flushAlign(false);
          schedule();
        }
      } catch (e) {
        if (controller.signal.aborted || e instanceof ServerError) throw e;
        throw new ServerError(0, "The connection to the server was lost mid-answer (stopped " +
                                 "or restarted?). The text so far is kept; retry to ask again.");
      }
      if (!finished) {
        throw new ServerError(0, "The server closed the stream before the answer ended " +
                                 "(stopped or restarted?). Retry to ask again.");
      }
      msg.state = "done";
      hideBanner();
    } catch (e) {
      if (controller.signal.aborted) {
        msg.state = "cancelled";
        msg.error = null;
      } else {
        msg.state = "error";
        msg.error = e.message || String(e);
        if (e.status === 0) showBanner(msg.error, true, () => regenerate(conv, msg));
        if (e.status === 401) {
          ui.settings.hidden = false;
          msg.error += " (set the API key in Settings)";
        }
      }
    } finally {
      if (frame) cancelAnimationFrame(frame);
      flushAlign(true);
      msg.runs = toRuns(msg.owners);
      msg.rruns = toRuns(msg.rOwners);
      if (running && running.msg === msg) running = null;
      setBusy(false);
      drawMessage(msg, true);
      delete msg.owners;
      delete msg.rOwners;
      conv.updated = Date.now();
      saveConversations();
      renderLegend();
      scrollDown(false);
      refreshServer();
    }
  }

  function setBusy(busy) {
    document.body.dataset.busy = busy ? "true" : "false";
    ui.send.hidden = busy;
    ui.stop.hidden = !busy;
  }

  function stopRunning() {
    if (running) running.controller.abort();
  }

  function submit() {
    const text = ui.prompt.value;
    if (!text.trim() || running) return;
    const conv = current();
    if (conv.title === "New chat" && !conv.messages.length) {
      conv.title = text.trim().split("\n")[0].slice(0, 48);
    }
    conv.model = selectedModel();
    const user = {role: "user", content: text};
    const answer = {role: "assistant", content: "", state: "streaming"};
    conv.messages.push(user, answer);
    conv.updated = Date.now();
    ui.prompt.value = "";
    ui.messages.append(messageNode(conv, user), messageNode(conv, answer));
    renderList();
    scrollDown(true);
    send(conv, answer);
  }

  function regenerate(conv, msg) {
    if (running) return;
    const i = conv.messages.indexOf(msg);
    if (i < 0) return;
    conv.messages = conv.messages.slice(0, i + 1); // later turns answered another text
    prefs.current = conv.id;
    hideBanner();
    renderMessages();
    send(conv, msg);
  }

  // The server view and the pickers ---------------------------------------------------
  // A select's options as [value, label] pairs; rebuilt only when they change, so that
  // the 2-second refresh never closes a list the user has open.
  function setOptions(select, pairs) {
    const same = select.options.length === pairs.length &&
      pairs.every(([v, t], i) => select.options[i].value === v && select.options[i].text === t);
    if (!same) select.replaceChildren(...pairs.map(([v, t]) => el("option", {value: v, text: t})));
  }

  function fillModels() {
    const want = current().model || ui.model.value || prefs.model ||
      (status && status.default_model) || "";
    const ids = models.map((m) => m.id);
    setOptions(ui.model, models.map((m) => {
      const state = (modelInfo(m.id) || {}).state || m.state || "";
      return [m.id, state && state !== "loaded" ? `${m.id} (${state})` : m.id];
    }));
    ui.model.value = ids.includes(want) ? want : (status && status.default_model) || ids[0] || "";
  }

  function fillProposers() {
    const info = modelInfo(selectedModel());
    const choices = status && status.choices ? status.choices : {};
    const keep = ui.proposer.value;
    const opts = [["", info && info.proposer ? `server's (${info.proposer})` : "server's"]];
    if (choices.proposer && info) for (const p of info.proposers || []) opts.push([p, p]);
    setOptions(ui.proposer, opts);
    ui.proposer.value = opts.some(([v]) => v === keep) ? keep : "";
    ui.proposer.disabled = !choices.proposer;
    ui.proposer.title = choices.proposer ? "Which proposer drafts this request" :
      "This server runs each model's own proposer (edgespec serve --proposer); it takes " +
      "no per-request choice";
    ui.exact.checked = !!(info && info.exact);
    ui.exact.disabled = !choices.exact;
    ui.exact.parentElement.title = choices.exact ?
      "--exact: greedy output bitwise the plain path's" :
      "The server's mode (edgespec serve --exact); it takes no per-request choice";
  }

  function setConnection(ok, text) {
    ui.connection.dataset.state = ok ? "up" : "down";
    ui.connection.textContent = text;
  }

  function dl(target, rows) {
    target.replaceChildren();
    for (const [k, v] of rows) target.append(el("dt", {text: k}), el("dd", {text: String(v)}));
  }

  // Prometheus text -> {name: total over label sets, "name{labels}": value}.
  function parseMetrics(text) {
    const out = {};
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const v = parseFloat(m[3]);
      if (!Number.isFinite(v)) continue;
      out[m[1]] = (out[m[1]] || 0) + v;
      if (m[2]) out[m[1] + m[2]] = v;
    }
    return out;
  }

  function renderServer(metrics) {
    const box = role("server-models");
    box.replaceChildren();
    for (const m of (status && status.models) || []) {
      const plain = m.plain ? `plain ${m.plain.tokens_per_second.toFixed(1)} tok/s` : "";
      const lines = [
        el("div", {class: "model-name", text: m.id}),
        el("div", {class: "muted", text: [m.state, m.proposer && `proposer ${m.proposer}`,
          m.exact ? "exact" : "", m.load ? `${m.load.running}/${m.load.slots} slots` : "",
          plain].filter(Boolean).join(" · ")}),
      ];
      if (m.last_error) lines.push(el("div", {class: "error", "data-role": "model-error",
                                              text: "last load failed: " + m.last_error}));
      box.append(el("div", {class: "server-model", "data-role": "server-model",
                            "data-model": m.id, "data-state": m.state}, ...lines));
    }
    if (status) {
      const l = status.load;
      dl(role("server-load"), [["slots in use", `${l.running} / ${l.slots}`],
                               ["queued", `${l.queued} / ${l.max_queue}`]]);
    }
    if (metrics) {
      const g = (k) => metrics[k] || 0;
      const drafted = g("edgespec_spec_decode_num_draft_tokens_total");
      const accepted = g("edgespec_spec_decode_num_accepted_tokens_total");
      dl(role("server-metrics"), [
        ["acceptance", drafted ? pct(accepted / drafted) : "–"],
        ["drafted / accepted", `${drafted} / ${accepted}`],
        ["generated tokens", g("edgespec_generation_tokens_total")],
        ["requests finished", g("edgespec_requests_finished_total")],
        ["cancelled", g('edgespec_requests_finished_total{stop_reason="cancelled"}')],
        ["rejected", g("edgespec_requests_rejected_total")],
        ["failed", g("edgespec_requests_failed_total")],
      ]);
    }
  }

  let refreshing = null;
  async function refreshServer() {
    if (refreshing) return refreshing;
    refreshing = (async () => {
      try {
        const [st, ml, mt] = await Promise.all([
          getJSON("/v1/edgespec/status"), getJSON("/v1/models"),
          fetch("/metrics", {headers: headers(false), cache: "no-store"})
            .then((r) => (r.ok ? r.text() : "")).catch(() => ""),
        ]);
        status = st;
        models = ml.data || [];
        role("version").textContent = st.version ? "v" + st.version : "";
        ui.maxTokens.max = st.max_tokens_limit || "";
        setConnection(true, "connected");
        if (!ui.banner.hidden && !running && bannerAction === null) hideBanner();
        fillModels();
        fillProposers();
        renderServer(mt ? parseMetrics(mt) : null);
        renderLegend();
      } catch (e) {
        if (e instanceof ServerError && e.status === 401) {
          setConnection(false, "API key needed");
          ui.settings.hidden = false;
        } else {
          setConnection(false, "unreachable");
        }
      } finally {
        refreshing = null;
      }
    })();
    return refreshing;
  }

  function renderAll() {
    renderList();
    renderMessages();
    fillModels();
    fillProposers();
  }

  // Wiring ------------------------------------------------------------------------------
  ui.composer.addEventListener("submit", (e) => { e.preventDefault(); submit(); });
  ui.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  ui.stop.addEventListener("click", stopRunning);
  role("new-conversation").addEventListener("click", () => {
    if (running) stopRunning();
    newConversation();
    renderAll();
    ui.prompt.focus();
  });
  role("export-all").addEventListener("click", () => download("edgespec-conversations.json",
                                                              conversations));
  ui.settingsToggle.addEventListener("click", () => {
    ui.settings.hidden = !ui.settings.hidden;
    ui.settingsToggle.setAttribute("aria-expanded", String(!ui.settings.hidden));
  });
  ui.model.addEventListener("change", () => {
    prefs.model = ui.model.value;
    current().model = ui.model.value;
    savePrefs();
    saveConversations();
    fillProposers();
    renderLegend();
  });
  ui.system.addEventListener("change", () => {
    current().system = ui.system.value;
    saveConversations();
  });
  ui.temperature.value = prefs.temperature;
  ui.maxTokens.value = prefs.maxTokens;
  ui.apiKey.value = prefs.apiKey;
  ui.temperature.addEventListener("change", () => { prefs.temperature = numberOr(ui.temperature, 0.7); savePrefs(); });
  ui.maxTokens.addEventListener("change", () => { prefs.maxTokens = numberOr(ui.maxTokens, 1024); savePrefs(); });
  ui.apiKey.addEventListener("change", () => { prefs.apiKey = ui.apiKey.value.trim(); savePrefs(); refreshServer(); });
  ui.bannerRetry.addEventListener("click", () => {
    const action = bannerAction;
    hideBanner();
    bannerAction = null;
    if (action) action(); else refreshServer();
  });
  ui.messages.addEventListener("mouseover", (e) => {
    const span = e.target.closest && e.target.closest(".tok[data-tok]");
    if (!span) return;
    const node = span.closest('[data-role="message"]');
    const msg = [...views.entries()].find(([, v]) => v.node === node);
    if (!msg) return;
    if (!span.title) span.title = tokenInfo(msg[0].tokens || [], parseInt(span.dataset.tok, 10));
    ui.tokenInfo.textContent = span.title;
  });
  window.addEventListener("beforeunload", () => saveConversations());

  renderAll();
  refreshServer();
  setInterval(() => { if (!document.hidden) refreshServer(); }, POLL_MS);
})();
