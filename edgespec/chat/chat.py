"""Render a conversation with the model's own GGUF chat template (Jinja2, sandboxed).

llama.cpp's built-in `llama_chat_apply_template` only knows a fixed list of
templates and drops template details such as Qwen's default system prompt; the
GGUF template itself is what the model was trained with.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import InvalidInputError

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
           extra: Mapping[str, Any] | None = None, model: str | None = None) -> str:
    """``tools`` (OpenAI-shaped declarations) and ``extra`` (a request's
    ``chat_template_kwargs``, e.g. ``enable_thinking``) are template variables, as Hugging
    Face's ``apply_chat_template`` passes them; a template that never reads them ignores them.

    The template is code from a model file: it runs in edgespec.chat.sandbox, bounded in
    work, time and size. A template that refuses the conversation (raise_exception) is an
    InvalidInputError; one that fails or exceeds a bound is a ChatTemplateError naming
    ``model`` and --chat-template FILE."""
    # deferred: jinja2 loads only when a chat template is rendered
    from .sandbox import render_bounded

    variables = dict(extra or {})
    if tools:
        variables["tools"] = list(tools)
    variables.update(messages=list(messages), bos_token=bos_token, eos_token=eos_token,
                     add_generation_prompt=add_generation_prompt)
    return render_bounded(template, variables, model)


