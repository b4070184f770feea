"""A model's tool-call markup, parsed into OpenAI ``tool_calls``, incrementally.

Each chat template teaches its model one way to write a call; these are the ones the
templates in common use emit:

* ``hermes`` (Qwen2.5, Qwen3, Hermes, many fine-tunes)::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

  several calls one after another; text before them is the message's content. Qwen2.5-Coder
  often drops the tag and writes the object in a fenced ``json`` block, or bare as its whole
  answer; like llama-server's Hermes parser, such an object is a call too, but only when it
  has arguments and names a declared tool (anything else is an ordinary code block or
  JSON answer, and stays content).
* ``llama3`` (Llama 3.1-3.3 JSON tool calling): the whole answer is one JSON object
  ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``. A leading JSON
  object that does not name a declared tool is an ordinary answer, not a call.
* ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3 templates) or
  ``[TOOL_CALLS]name[ARGS]{...}`` (v11+). ``[TOOL_CALLS]`` is a control token in Mistral's
  vocabularies, so its text reaches this parser only where the caller renders special tokens.

Text is fed in arbitrary pieces (a speculative step emits several tokens; a tag can straddle
two steps). Content is released as soon as it cannot be the start of markup; a call is
released whole once its markup closes and its JSON parses, so a stream never shows a call
that the finished message would not have. A call whose markup is complete but whose body is
not a call (invalid JSON, no name, a name no tool has, arguments that are not an object) is
*malformed*: its markup is returned as content, unchanged, and :attr:`CallParser.malformed`
says so (the server reports ``finish_reason: "malformed_tool_call"``).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .reasoning import held_prefix

FORMATS = ("hermes", "llama3", "mistral")


@dataclass(frozen=True)
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Parsed:
    """What one piece of text settles: content, and calls completed in it."""

    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# --- formats ----------------------------------------------------------------------------
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_PYTHON_TAG = "<|python_tag|>"
_MISTRAL_OPEN, _MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"


def detect_format(template: str) -> str:
    """The call format a chat template teaches (hermes where the template names none of the
    others: it is what templates that describe calls in prose most often ask for)."""
    if _MISTRAL_OPEN in template:
        return "mistral"
    if _HERMES_OPEN in template:
        return "hermes"
    if _PYTHON_TAG in template or ("ipython" in template and '"parameters"' in template):
        return "llama3"
    return "hermes"


class CallParser:
    """Feed output text in pieces (:meth:`feed`), then :meth:`finish`.

    ``names``: the declared tools (a call naming another is malformed; None accepts any).
    ``parallel``: False recognises one call only; later markup stays content.
    """

    def __init__(self, fmt: str = "hermes", names: Iterable[str] | None = None,
                 parallel: bool = True, new_id: Callable[[], str] = new_call_id) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown tool-call format {fmt!r}; use one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.names = None if names is None else frozenset(names)
        self.parallel = parallel
        self.new_id = new_id
        self.calls: list[ToolCall] = []
        self.malformed = False
        self._buf = ""  # unsettled text (text mode) or the open call's body (call mode)
        self._kind: str | None = None  # the open call's markup (None: text mode)
        self._opener = ""  # the text that opened the current call (returned if not a call)
        self._lead = False  # drop whitespace at the start of the next content (after a call)
        self._seen_text = False  # content other than whitespace was emitted

    @property
    def in_call(self) -> bool:
        """A call's markup is open (its closing text has not arrived)."""
        return self._kind is not None

    # --- feeding --------------------------------------------------------------------------
    def feed(self, text: str) -> Parsed:
        self._buf += text
        out = Parsed()
        while self._step(out):
            pass
        return out

    def finish(self) -> Parsed:
        """Everything still held. An unclosed call whose body parses is a call (models often
        end with the end-of-turn token instead of the closing tag); otherwise its text is
        content, and malformed where the markup was unambiguous (a tag, [TOOL_CALLS])."""
        out = Parsed()
        if self._kind is not None:
            body = self._buf.strip()
            if self._kind == "mistral":
                done = self._mistral_body(body, out)
            else:
                done = self._accept(_loads(body), out, self._kind not in _STRICT)
            if not done:
                if self._kind in _STRICT:
                    self.malformed = True
                out.content += self._opener + self._buf
            self._kind = None
        elif not self._lead:
            out.content += self._buf
        self._buf = ""
        return out

    # --- text mode: finding where a call opens ---------------------------------------------
    def _step(self, out: Parsed) -> bool:
        """Settle what the buffer allows; True when another pass may settle more."""
        if self._kind is not None:
            return self._step_call(out)
        if self._lead:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            self._lead = False
        if not self.parallel and self.calls:
            out.content += self._buf  # one call only: the rest is the model's text
            self._buf = ""
            return False
        found, hold = self._scan()
        if found is not None and found[1] < hold:
            kind, start, body = found
            before = self._buf[:start]
            kept = before.rstrip()  # whitespace next to a call is layout, not content ...
            out.content += kept
            self._seen_text = self._seen_text or bool(kept.strip())
            # ... but returned with the markup when that is not a call after all
            self._kind, self._opener = kind, self._buf[len(kept):body]
            self._buf = self._buf[body:]
            return True
        # release what cannot begin markup; trailing whitespace waits (it is dropped if
        # markup follows it)
        settled = self._buf[:hold].rstrip()
        out.content += settled
        self._seen_text = self._seen_text or bool(settled.strip())
        self._buf = self._buf[len(settled):]
        return False

    def _scan(self) -> tuple[tuple[str, int, int] | None, int]:
        """The first call opener in the buffer as (kind, start, body start), and where text
        must be held from because what follows may still open one."""
        buf, hold, found = self._buf, len(self._buf), []
        tags = {"hermes": ((_HERMES_OPEN, "tag"),), "mistral": ((_MISTRAL_OPEN, "mistral"),),
                "llama3": () if self._seen_text else ((_PYTHON_TAG, "python"),)}[self.fmt]
        for marker, kind in tags:
            at = buf.find(marker)
            if at >= 0:
                found.append((kind, at, at + len(marker)))
            hold = min(hold, len(buf) - held_prefix(buf, marker))
        if self.fmt == "hermes":
            # Qwen2.5-Coder often writes its call as a fenced JSON block instead of the tag
            # (llama-server's Hermes parser takes it too): ```json\n{"name": ...}\n```
            at = buf.find("`")
            while at >= 0:
                state, _ = _match(buf, at, _FENCE)
                if state == "full":
                    found.append(("fence", at, buf.index("{", at)))
                    break
                if state == "partial":
                    hold = min(hold, at)
                    break
                at = buf.find("`", at + 1)
        if not self._seen_text and not self.calls and self.fmt in ("hermes", "llama3"):
            # the answer is a bare JSON object: llama3's call; for hermes models a call
            # written without its tag (only a declared tool's name makes it one)
            state, _ = _match(buf, 0, _BARE if self.fmt == "hermes" else _BARE_ANY)
            if state == "full":
                at = buf.index("{")
                found.append(("bare", at, at))
            elif state == "partial":
                hold = 0
        return (min(found, key=lambda f: f[1]) if found else None), hold

    # --- call mode: finding where it closes -----------------------------------------------
    def _step_call(self, out: Parsed) -> bool:
        kind = self._kind
        if kind in ("tag", "fence"):
            close = _HERMES_CLOSE if kind == "tag" else "```"
            at = self._buf.find(close)
            if at < 0:
                return False
            body, raw = self._buf[:at], self._buf[:at + len(close)]
            self._buf = self._buf[at + len(close):]
            self._kind = None
            if self._accept(_loads(body.strip()), out, kind == "fence"):
                self._lead = True
            else:
                self.malformed = self.malformed or kind == "tag"
                out.content += self._opener + raw  # a code block that is not a call: content
                self._seen_text = True
            return True
        body = self._buf.lstrip()
        if not body.rstrip().endswith(("}", "]")):
            return False  # a JSON value can only be complete at a closing bracket
        if kind == "mistral":
            return self._mistral_body(body, out, final=False)
        value, end = _raw_decode(body)
        if end < 0:
            return False
        self._kind = None
        if self._accept(value, out, lenient=True):
            self._lead = True
        else:
            out.content += self._opener + self._buf[:len(self._buf) - len(body) + end]
            self._seen_text = True  # a JSON answer, not a call
        self._buf = body[end:]
        return True

    def _mistral_body(self, body: str, out: Parsed, final: bool = True) -> bool:
        """``[{...}, ...]`` or ``name[ARGS]{...}`` after [TOOL_CALLS]; True once settled."""
        body = body.lstrip()
        if body.startswith("["):
            value, end = _raw_decode(body)
            if end < 0:
                return False
            items = value if isinstance(value, list) else [value]
            ok = bool(items) and all(self._acceptable(v) for v in items)
        else:
            at = body.find(_MISTRAL_ARGS)
            if at < 0:
                return False
            rest = body[at + len(_MISTRAL_ARGS):].lstrip()
            args, n = _raw_decode(rest)
            if n < 0:
                return False
            end = len(body) - len(rest) + n
            items = [{"name": body[:at].strip(), "arguments": args}]
            ok = self._acceptable(items[0])
        self._kind = None
        if ok:
            for v in items:
                self._accept(v, out)
        else:
            self.malformed = True
            out.content += self._opener + body[:end]
        self._buf = body[end:]
        self._lead = True
        return True

    # --- one call -------------------------------------------------------------------------
    def _acceptable(self, value) -> bool:
        return _call_parts(value, self.names) is not None

    def _accept(self, value, out: Parsed, lenient: bool = False) -> bool:
        """Record ``value`` as a call if it is one. ``lenient``: markup that may be an
        ordinary answer (a JSON object, a code block) is a call only with its arguments."""
        if lenient and not (isinstance(value, dict) and ("arguments" in value
                                                          or "parameters" in value)):
            return False
        parts = _call_parts(value, self.names)
        if parts is None:
            return False
        name, args = parts
        call = ToolCall(len(self.calls), self.new_id(), name,
                        json.dumps(args, ensure_ascii=False))
        self.calls.append(call)
        out.calls.append(call)
        return True


#: markup kinds whose text can only be a call: one that does not parse is malformed
_STRICT = frozenset({"tag", "mistral"})

#: openers matched piece by piece (see _match): a fenced call, a bare call object
_FENCE = (("lit", "```"), ("opt", "json"), ("ws", ""), ("lit", "{"), ("ws", ""),
          ("lit", '"name"'))
_BARE = (("ws", ""), ("lit", "{"), ("ws", ""), ("lit", '"name"'))
_BARE_ANY = (("ws", ""), ("lit", "{"))


def _match(text: str, i: int, parts) -> tuple[str, int]:
    """Match ``parts`` (literals, optional literals, runs of whitespace) at ``text[i:]``:
    ("full", end), ("partial", -1) when the text ends before it is decided, ("none", -1)."""
    for kind, lit in parts:
        if kind == "ws":
            while i < len(text) and text[i] in " \t\r\n":
                i += 1
            if i == len(text):
                return "partial", -1
            continue
        n = min(len(lit), len(text) - i)
        if text[i:i + n] == lit[:n]:
            if n < len(lit):
                return "partial", -1
            i += n
        elif kind == "lit":
            return "none", -1
    return "full", i


_NOT_JSON = object()


def _loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


def _raw_decode(text: str) -> tuple[object, int]:
    """(value, end) of the JSON value at the start of ``text``; end -1 when there is none
    yet (incomplete or invalid: only more text, or the end of the output, tells)."""
    try:
        return json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None, -1


def _call_parts(value, names) -> tuple[str, dict] | None:
    """(name, arguments) of a call object, or None when ``value`` is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _loads(args)
    if not isinstance(args, dict):
        return None
    if names is not None and value["name"] not in names:
        return None
    return value["name"], args
