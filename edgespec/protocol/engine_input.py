"""A CoreRequest -> what the engine takes: the prompt (chat messages, text or token ids),
GenerationParams, and the chat turn that reads the output back (edgespec.agents).

Synchronous and model-bound (the template, the vocabulary): the server runs it on a worker
thread, edgespec.apps on the caller's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from ..agents import ToolError, ToolSupportError, Turn, prepare_turn
from ..api.params import GenerationParams
from ..chat import chat
from .errors import ProtocolError, bad_request
from .fim import fim_prompt
from .limits import MAX_STOPS
from .request import CoreRequest

#: a template that reads a message's ``name`` shows it; elsewhere it prefixes the content
_READS_NAME = re.compile(r"message(\.name\b|\[['\"]name['\"]\])")


@dataclass(frozen=True)
class EngineInput:
    prompt: str | list[dict[str, Any]] | tuple[int, ...]
    params: GenerationParams
    turn: Turn | None  # a chat turn (its output parser reads tools and reasoning back)
    prefix: str = ""  # text that starts every choice's answer (completions' echo)


def engine_input(engine: Any, req: CoreRequest, model_name: str, reasoning_format: str = "auto"
         ) -> EngineInput:
    """What ``engine`` runs for ``req``; ``model_name`` names the model in refusals,
    ``reasoning_format`` is the server's default split."""
    target = engine.target
    if req.messages is not None:
        return _chat(target, req, model_name, reasoning_format)
    params = replace(req.params, chat=False)
    if req.fim is not None:
        bos = target.bos if getattr(target, "add_bos", False) else None
        ids = tuple(fim_prompt(target, req.fim, model_name, bos=bos))
        return EngineInput(ids, params, None)
    prompt = req.prompt
    if isinstance(prompt, tuple):
        bad = [t for t in prompt if not 0 <= t < target.n_vocab]
        if bad:
            raise bad_request(f"token id {bad[0]} of the prompt is outside this model's "
                              f"vocabulary (0..{target.n_vocab - 1})", param=req.param_prompt)
        echo = target.detokenize(list(prompt)).decode("utf-8", "replace") if req.echo else ""
        return EngineInput(prompt, params, None, echo)
    assert prompt is not None
    return EngineInput(prompt, params, None, prompt if req.echo else "")


def _chat(target: Any, req: CoreRequest, model_name: str, reasoning_format: str) -> EngineInput:
    assert req.messages is not None
    if req.echo:
        raise bad_request("echo is for completions prompts, not chat messages", param="echo")
    template = target.chat_template()
    shows_names = template is not None and bool(_READS_NAME.search(template))
    messages, names = [], {}
    for i, m in enumerate(req.messages):
        m = dict(m)
        name = m.get("name")
        if name is not None and m.get("role") != "tool":
            # OpenAI's participant name: where the template has no place for it, the
            # model reads it at the start of the content (never a refusal)
            del m["name"]
            if shows_names:
                names[i] = name
            elif isinstance(m.get("content"), str):
                m["content"] = f"{name}: {m['content']}"
        messages.append(m)
    params = replace(req.params, chat=True)
    forced = req.tool_choice not in (None, "auto", "none")
    if forced and (params.json_schema is not None or params.json_mode):
        raise bad_request("tool_choice forces a call, whose grammar cannot be combined with "
                          "a response format; send one of them", param="response_format")
    try:
        turn = prepare_turn(template, model_name, messages,
                            reasoning_format=req.reasoning_format or reasoning_format,
                            **req.turn_args())
    except (ToolError, ToolSupportError) as e:
        kind = "unsupported" if isinstance(e, ToolSupportError) else "invalid_request"
        raise ProtocolError(400, str(e), kind=kind, param=e.param, code=e.code) from None
    for i, name in names.items():
        turn.messages[i]["name"] = name
    stop = params.stop + tuple(s for s in turn.stop if s not in params.stop)
    if len(stop) > MAX_STOPS:
        raise bad_request(f"{len(params.stop)} stop strings and parallel_tool_calls false, "
                          "which ends the output after the first call with a stop string of "
                          f"its own; send at most {MAX_STOPS - 1}", param="stop")
    params = replace(params, template_vars=turn.template_vars or None, stop=stop,
                     grammar=turn.grammar if turn.grammar is not None else params.grammar)
    return EngineInput(turn.messages, params, turn)


def apply_template(engine: Any, messages: list[dict[str, Any]], *,
                   tools: list[dict[str, Any]] | None = None,
                   add_generation_prompt: bool = True,
                   chat_template_kwargs: dict[str, Any] | None = None) -> str:
    """The prompt text the model's chat template makes of ``messages`` (llama-server's
    /apply-template)."""
    target = engine.target
    template = target.chat_template()
    if template is None:
        raise ProtocolError(400, f"{target.path.name} has no chat template",
                            kind="unsupported", param="messages", code="no_chat_template")
    bos = target.detokenize([target.bos], special=True).decode("utf-8", "replace")
    eos = target.detokenize([target.eos], special=True).decode("utf-8", "replace")
    return chat.render(template, chat.normalise_messages(messages), bos_token=bos,
                       eos_token=eos, add_generation_prompt=add_generation_prompt,
                       tools=tools, extra=chat_template_kwargs)
