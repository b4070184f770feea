"""A model's tool-call markup, parsed into OpenAI ``tool_calls``, incrementally.

Each chat template teaches its model one way to write a call; these are the ones the
templates in common use emit:

* ``hermes`` (Qwen2.5, Qwen3, Hermes, many fine-tunes)::

      <tool_call>
      {"name": "get_weather", "arguments": {"city": "Paris"}}
      </tool_call>

  several calls one after another; text before them is the message's content.
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
        self._in_call = False
        self._opener = ""  # the markup that opened the current call (returned if malformed)
        self._lead = False  # drop whitespace at the start of the next content (after a call)
        self._seen_text = False  # content other than whitespace was emitted (llama3: no call)

    # --- feeding --------------------------------------------------------------------------
    def feed(self, text: str) -> Parsed:
        self._buf += text
        out = Parsed()
        while self._step(out):
            pass
        return out

    def finish(self) -> Parsed:
        """Everything still held. An unclosed call whose body parses is a call (models often
        end with the end-of-turn token instead of the closing tag); otherwise its markup is
        content, and malformed unless it is llama3's (a JSON answer cut short)."""
        out = Parsed()
        if self._in_call:
            body = self._buf.strip()
            if self.fmt == "hermes" and self._accept(_loads(body), out):
                pass
            elif self.fmt == "mistral" and self._mistral_body(body, out, final=True):
                pass
            elif self.fmt == "llama3" and self._accept(_loads(body), out):
                pass
            else:
                if self.fmt != "llama3":
                    self.malformed = True
                out.content += self._opener + self._buf
            self._in_call = False
        elif not self._lead:
            out.content += self._buf
        self._buf = ""
        return out

    # --- the state machine ----------------------------------------------------------------
    def _step(self, out: Parsed) -> bool:
        """Settle what the buffer allows; True when another pass may settle more."""
        if self._in_call:
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
        opener, at = self._find_opener()
        if opener is not None:
            before = self._buf[:at]
            out.content += before.rstrip()  # whitespace next to markup is layout, not content
            self._seen_text = self._seen_text or bool(before.strip())
            self._opener = opener
            self._buf = self._buf[at + len(opener):]
            self._in_call = True
            return True
        # release what cannot begin markup; trailing whitespace waits (it is dropped if
        # markup follows it)
        keep = max((held_prefix(self._buf, m) for m in self._openers()), default=0)
        body = self._buf[:len(self._buf) - keep]
        settled = body.rstrip()
        out.content += settled
        self._seen_text = self._seen_text or bool(settled.strip())
        self._buf = self._buf[len(settled):]
        return False

    def _openers(self) -> tuple[str, ...]:
        if self.fmt == "hermes":
            return (_HERMES_OPEN,)
        if self.fmt == "mistral":
            return (_MISTRAL_OPEN,)
        return () if self._seen_text else (_PYTHON_TAG,)

    def _find_opener(self) -> tuple[str | None, int]:
        if self.fmt == "llama3":
            if self._seen_text:
                return None, -1
            head = self._buf.lstrip()
            skipped = len(self._buf) - len(head)
            if head.startswith(_PYTHON_TAG):
                return _PYTHON_TAG, skipped
            if head.startswith("{"):
                return "", skipped  # the JSON object itself is the call
            return None, -1
        marker = self._openers()[0]
        at = self._buf.find(marker)
        return (marker, at) if at >= 0 else (None, -1)

    def _step_call(self, out: Parsed) -> bool:
        if self.fmt == "hermes":
            at = self._buf.find(_HERMES_CLOSE)
            if at < 0:
                return False
            body, raw = self._buf[:at], self._buf[:at + len(_HERMES_CLOSE)]
            self._buf = self._buf[at + len(_HERMES_CLOSE):]
            self._in_call = False
            if not self._accept(_loads(body.strip()), out):
                self.malformed = True
                out.content += self._opener + raw
            self._lead = True
            return True
        body = self._buf.lstrip()
        if not body.rstrip().endswith(("}", "]")):
            return False  # a JSON value can only be complete at a closing bracket
        if self.fmt == "mistral":
            return self._mistral_body(body, out, final=False)
        value, end = _raw_decode(body)
        if end < 0:
            return False
        self._in_call = False
        if self._accept(value, out):
            self._lead = True
        else:
            out.content += self._opener + body[:end]  # a JSON answer, not a call
            self._seen_text = True
        self._buf = body[end:]
        return True

    def _mistral_body(self, body: str, out: Parsed, final: bool) -> bool:
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
            name = body[:at].strip()
            args, n = _raw_decode(body[at + len(_MISTRAL_ARGS):].lstrip())
            if n < 0:
                return False
            end = len(body) - len(body[at + len(_MISTRAL_ARGS):].lstrip()) + n
            items = [{"name": name, "arguments": args}]
            ok = self._acceptable(items[0])
        self._in_call = False
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

    def _accept(self, value, out: Parsed) -> bool:
        """Record ``value`` as a call if it is one."""
        parts = _call_parts(value, self.names)
        if parts is None:
            return False
        name, args = parts
        call = ToolCall(len(self.calls), self.new_id(), name,
                        json.dumps(args, ensure_ascii=False))
        self.calls.append(call)
        out.calls.append(call)
        return True


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
