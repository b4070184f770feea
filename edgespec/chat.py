"""Render a conversation with the model's own GGUF chat template (Jinja2, sandboxed).

llama.cpp's built-in `llama_chat_apply_template` only knows a fixed list of
templates and drops template details such as Qwen's default system prompt; the
GGUF template itself is what the model was trained with.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from .errors import InvalidInputError

Message = Mapping[str, str]


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
            msgs.append({"role": m["role"], "content": str(m["content"])})
        if not msgs:
            raise InvalidInputError("the conversation is empty")
    if system is not None and (not msgs or msgs[0]["role"] != "system"):
        msgs.insert(0, {"role": "system", "content": system})
    return msgs


def render(template: str, messages: Sequence[Message], bos_token: str = "", eos_token: str = "",
           add_generation_prompt: bool = True) -> str:
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise InvalidInputError(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        tmpl = env.from_string(template)
        return tmpl.render(messages=list(messages), bos_token=bos_token, eos_token=eos_token,
                           add_generation_prompt=add_generation_prompt)
    except TemplateError as e:
        raise InvalidInputError(f"the model's chat template failed to render: {e}") from None
