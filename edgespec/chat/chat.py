"""Render a conversation with the model's own GGUF chat template (Jinja2, sandboxed).

llama.cpp's built-in `llama_chat_apply_template` only knows a fixed list of
templates and drops template details such as Qwen's default system prompt; the
GGUF template itself is what the model was trained with.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError
from datetime import datetime

Message = Mapping[str, Any]

#: message keys a template may read beyond role and content: an assistant message's calls, a
#: tool result's call id and function name
_TOOL_KEYS = ("tool_calls", "tool_call_id", "name")


def normalise_messages(prompt: str | Sequence[Message], system: str | None = None) -> list[dict]:
    if isinstance(prompt, str):
        msgs = [{"role": "user", "content": prompt}]
    else:
        msgs = []
        for i, m in enumerate(prompt):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise InvalidInputError(f"message {i} must be a mapping with 'role' and 'content'")
            if m["role"] not in ("system", "user", "assistant", "tool"):
                raise InvalidInputError(f"message {i} has unknown role {m['role']!r}")
            msg = {"role": m["role"], "content": "" if m["content"] is None else str(m["content"])}
            # what tool-calling templates read (edgespec.agents.turn builds these keys)
            msg.update({k: m[k] for k in _TOOL_KEYS if m.get(k) is not None})
            msgs.append(msg)
        if not msgs:
            raise InvalidInputError("the conversation is empty")
    if system is not None and (not msgs or msgs[0]["role"] != "system"):
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


def render(template: str, messages: Sequence[Message], bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True, tools: Sequence[Mapping] | None = None,
           extra: Mapping[str, Any] | None = None) -> str:
    """``tools`` (OpenAI-shaped declarations) and ``extra`` (a request's
    ``chat_template_kwargs``, e.g. ``enable_thinking``) are template variables, as Hugging
    Face's ``apply_chat_template`` passes them; a template that never reads them ignores them."""
    # deferred: jinja2 loads only when a chat template is rendered
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise InvalidInputError(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = _strftime_now
    # Hugging Face's tojson: plain JSON, not Jinja's HTML-escaped form (templates print tool
    # schemas and call arguments with it, and the model was trained on the plain text)
    env.filters["tojson"] = _tojson
    variables = dict(extra or {})
    if tools:
        variables["tools"] = list(tools)
    try:
        tmpl = env.from_string(template)
        return tmpl.render(**variables, messages=list(messages), bos_token=bos_token,
                           eos_token=eos_token, add_generation_prompt=add_generation_prompt)
    except TemplateError as e:
        raise InvalidInputError(f"the model's chat template failed to render: {e}") from None


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    """Today's date for templates that print it (Llama 3.x), as Hugging Face provides it."""
    return datetime.now().strftime(fmt)
