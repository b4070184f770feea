"""One assistant turn with tools and reasoning: how it is rendered, constrained and read back.

    turn = prepare_turn(template, "qwen-1.5b", messages, tools=tools, tool_choice="auto")
    params = replace(params, template_vars=turn.template_vars, grammar=turn.grammar,
                     stop=params.stop + turn.stop)
    out = turn.output()
    for text in step_texts:
        for delta in out.feed(text): ...     # OpenAI stream deltas: content, reasoning_content,
    final = out.finish(stop_reason)          # tool_calls (each call whole, once it closed)
    out.message(), final.finish_reason       # the whole message, the OpenAI finish_reason

Nothing here runs a model: the server and the llama-cpp-python-shaped API share it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Mapping, Sequence

from ..chat import chat
from .calls import CallParser, ToolCall, detect_format, new_call_id
from .reasoning import ReasoningSplitter, prompt_opens_reasoning, splits
from .tools import Choice, Tool, ToolError, ToolSupportError, call_grammar, parse_choice, \
    parse_tools

#: variables the template gets from edgespec itself; chat_template_kwargs may not set them
RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token",
                                    "eos_token"})

#: finish_reason of a turn whose call markup was complete but not a call (docs/server.md)
MALFORMED = "malformed_tool_call"


@dataclass(frozen=True)
class Turn:
    messages: list[dict]  # for the template: call arguments as objects, tool names resolved
    template_vars: dict[str, Any]  # "tools" and chat_template_kwargs (GenerationParams field)
    grammar: str | None  # GBNF of a forced call (tool_choice required or named)
    stop: tuple[str, ...]  # stop strings the turn adds (one call only: the first call's end)
    tools: tuple[Tool, ...]
    choice: Choice
    call_format: str | None  # the markup parsed out of the output (None: no parsing)
    parallel: bool
    split_reasoning: bool
    reasoning_open: bool  # the prompt left a <think> block open

    def output(self, new_id=new_call_id) -> "TurnOutput":
        return TurnOutput(self, new_id)


def prepare_turn(template: str | None, model: str, messages: Sequence[Mapping], *,
                 tools: Sequence[Any] | None = None, tool_choice: Any = None,
                 parallel_tool_calls: bool | None = None, reasoning_format: str = "auto",
                 chat_template_kwargs: Mapping[str, Any] | None = None) -> Turn:
    """Validate the turn's tools and messages against ``model``'s chat ``template``.

    Raises ToolError (bad tools, tool_choice, tool messages or kwargs: ``param`` and
    ``code`` name the field) and ToolSupportError (tools for a template that has no place
    for them, naming ``model``)."""
    declared = parse_tools(tools)
    choice = parse_choice(tool_choice, declared)
    kwargs = _template_kwargs(chat_template_kwargs)
    msgs = template_messages(messages)
    uses_tools = bool(declared) or any(m.get("tool_calls") or m["role"] == "tool" for m in msgs)
    if uses_tools and (template is None or not supports_tools(template)):
        raise ToolSupportError(
            f"the model {model!r} has no tool support: its chat template renders no tool "
            "declarations or calls, so the model would never see them; send the conversation "
            "without tools and tool messages, or serve a model whose template supports tools "
            "(Qwen2.5 and Qwen3 do)")
    parallel = True if parallel_tool_calls is None else parallel_tool_calls
    fmt = detect_format(template) if template is not None and choice.mode != "none" \
        and declared else None
    grammar = call_grammar(declared, choice, fmt, parallel) if choice.forced else None
    variables = dict(kwargs)
    if declared and choice.mode != "none":  # "none": the model is not told of the tools
        variables["tools"] = [t.to_openai() for t in declared]
    # one call only, unconstrained: end the output where the first call ends (its markup
    # is restored by TurnOutput.finish), so a second call is never generated
    stop = ("</tool_call>",) if fmt == "hermes" and not parallel and not choice.forced else ()
    opened = False
    split = splits(reasoning_format)
    if split and template is not None:
        opened = prompt_opens_reasoning(chat.render(template, msgs, extra=variables,
                                                    model=model))
    return Turn(msgs, variables, grammar, stop, declared, choice, fmt, parallel, split, opened)


@lru_cache(maxsize=16)
def supports_tools(template: str) -> bool:
    """Whether the template renders a declared tool at all (a probe render: a template that
    never reads ``tools`` drops it without a word, which is what must be refused)."""
    probe = "edgespec_probe_tool_9f2c"
    try:
        text = chat.render(template, [{"role": "user", "content": "hi"}],
                           tools=[{"type": "function", "function": {
                               "name": probe, "description": "probe",
                               "parameters": {"type": "object", "properties": {}}}}])
    except Exception:
        return False
    return probe in text


def _template_kwargs(kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ToolError("chat_template_kwargs must be an object of template variables, e.g. "
                        "{\"enable_thinking\": false}", "chat_template_kwargs", "invalid_type")
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise ToolError(f"chat_template_kwargs key {key!r} is not a template variable name",
                            "chat_template_kwargs")
        if key in RESERVED_TEMPLATE_VARS:
            raise ToolError(f"chat_template_kwargs may not set {key!r}: edgespec sets it from the "
                            "request (use the request's own field)", f"chat_template_kwargs.{key}")
    return dict(kwargs)


def template_messages(messages: Sequence[Mapping]) -> list[dict]:
    """OpenAI chat messages as templates read them (Hugging Face's convention): an assistant
    message's ``tool_calls[].function.arguments`` as an object rather than JSON text, and a
    tool result carrying the ``name`` of the function whose call it answers."""
    out: list[dict] = []
    calls: dict[str, str] = {}  # call id -> function name, from earlier assistant messages
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        msg = {"role": m["role"], "content": m.get("content")}
        if m.get("tool_calls"):
            if m["role"] != "assistant":
                raise ToolError(f"{where}.tool_calls: only assistant messages carry tool calls",
                                f"{where}.tool_calls")
            msg["tool_calls"] = [_history_call(f"{where}.tool_calls.{j}", c)
                                 for j, c in enumerate(m["tool_calls"])]
            calls.update((c["id"], c["function"]["name"]) for c in msg["tool_calls"])
        if m["role"] == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ToolError(f"{where} (role tool) needs tool_call_id: the id of the call it "
                                "answers", f"{where}.tool_call_id")
            if call_id not in calls:
                raise ToolError(f"{where}.tool_call_id {call_id!r} answers no call of an earlier "
                                "assistant message; send the assistant message with its "
                                "tool_calls first", f"{where}.tool_call_id")
            msg["tool_call_id"] = call_id
            msg["name"] = m.get("name") or calls[call_id]
        if msg["content"] is None:
            if not msg.get("tool_calls"):
                raise ToolError(f"{where}.content is missing", f"{where}.content")
            msg["content"] = ""
        out.append(msg)
    return out


def _history_call(where: str, call: Any) -> dict:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
            or call.get("type", "function") != "function":
        raise ToolError(f"{where} must be {{\"id\": ..., \"type\": \"function\", \"function\": "
                        "{\"name\": ..., \"arguments\": \"<JSON object>\"}}", where, "invalid_type")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as e:
            raise ToolError(f"{where}.function.arguments is not JSON ({e}); send the arguments "
                            "the call was made with", f"{where}.function.arguments") from None
    if not isinstance(args, Mapping):
        raise ToolError(f"{where}.function.arguments must be a JSON object",
                        f"{where}.function.arguments")
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise ToolError(f"{where}.id is missing: tool results name the call they answer by it",
                        f"{where}.id")
    return {"id": call_id, "type": "function",
            "function": {"name": fn["name"], "arguments": dict(args)}}


# --- reading the output back -----------------------------------------------------------------
@dataclass
class Final:
    deltas: list[dict] = field(default_factory=list)
    finish_reason: str | None = None  # None: the engine's own (stop, length)


class TurnOutput:
    """The output of one turn, read incrementally: reasoning first, then content and calls."""

    def __init__(self, turn: Turn, new_id=new_call_id) -> None:
        self.turn = turn
        self.reasoning = (ReasoningSplitter(started=turn.reasoning_open)
                          if turn.split_reasoning else None)
        self.calls = (CallParser(turn.call_format, [t.name for t in turn.tools], turn.parallel,
                                 new_id) if turn.call_format is not None else None)
        self.content = ""
        self.reasoning_content = ""
        self.tool_calls: list[ToolCall] = []
        self.finish_reason: str | None = None

    def feed(self, text: str) -> list[dict]:
        """Stream deltas for this piece of output (maybe none)."""
        if self.reasoning is not None:
            split = self.reasoning.feed(text)
            return self._deltas(split.reasoning, split.content)
        return self._deltas("", text)

    def finish(self, stop_reason: str) -> Final:
        """The deltas still held, and the finish_reason (None: the engine's stop reason
        maps as for any chat answer)."""
        deltas = []
        if self.reasoning is not None:
            split = self.reasoning.finish()
            deltas += self._deltas(split.reasoning, split.content)
        if self.calls is not None:
            if stop_reason == "stop" and self.turn.stop and self.calls.in_call:
                # ended by the turn's own stop string: the first call's closing tag
                deltas += self._emit(self.calls.feed(self.turn.stop[0]))
            deltas += self._emit(self.calls.finish())
        reason = None
        if stop_reason in ("length", "context"):
            reason = None  # cut short: whatever the text holds, "length" says why
        elif self.calls is not None and self.calls.malformed:
            reason = MALFORMED
        elif self.tool_calls:
            reason = "tool_calls"
        self.finish_reason = reason
        return Final(deltas, reason)

    def message(self) -> dict:
        """The whole assistant message (OpenAI's shape; content None when only calls)."""
        msg: dict = {"role": "assistant",
                     "content": self.content if self.content or not self.tool_calls else None}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg

    # --- pieces ---------------------------------------------------------------------------
    def _deltas(self, reasoning: str, content: str) -> list[dict]:
        out = []
        if reasoning:
            self.reasoning_content += reasoning
            out.append({"reasoning_content": reasoning})
        if content:
            if self.calls is None:
                self.content += content
                out.append({"content": content})
            else:
                out += self._emit(self.calls.feed(content))
        return out

    def _emit(self, parsed) -> list[dict]:
        out = []
        if parsed.content:
            self.content += parsed.content
            out.append({"content": parsed.content})
        for c in parsed.calls:
            self.tool_calls.append(c)
            # OpenAI's stream order: the call's id and name first, its arguments after
            out.append({"tool_calls": [{"index": c.index, "id": c.id, "type": "function",
                                        "function": {"name": c.name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": c.index,
                                        "function": {"arguments": c.arguments}}]})
        return out
