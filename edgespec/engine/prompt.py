"""A request's prompt as tokens: plain text as it is, chat messages through the model's own
chat template."""
from __future__ import annotations

from typing import Any, Sequence

from ..api.params import GenerationParams
from ..chat import chat
from ..errors import InvalidInputError, UnsupportedError
from ..runtime.model import Model


def prompt_tokens(target: Model, template: str | None,
                  prompt: str | Sequence[dict[str, Any]] | tuple[int, ...],
                  params: GenerationParams) -> list[int]:
    """Tokenize a prompt (a string or a list of chat messages) the way a request will;
    ``template`` is the target's chat template (None: it has none)."""
    if isinstance(prompt, tuple):  # token ids (a completions prompt, a FIM prompt)
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < target.n_vocab]
        if bad or not prompt:
            raise InvalidInputError(f"a token-id prompt holds ids in 0..{target.n_vocab - 1} "
                                    f"(got {bad[0] if bad else 'none'})")
        return list(prompt)
    if isinstance(prompt, str):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInputError(f"the prompt is not valid UTF-8 text ({e.reason} at "
                                    f"character {e.start})") from None
        if not prompt.strip():
            raise InvalidInputError("the prompt is empty")
    if params.chat or not isinstance(prompt, str):
        if template is None:
            raise UnsupportedError(
                f"{target.path.name} has no chat template; use --raw to send the prompt as "
                "plain text")
        msgs = chat.normalise_messages(prompt, params.system)
        for m in msgs:
            try:
                m["content"].encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInputError("a chat message is not valid UTF-8 text") from None
        bos = target.detokenize([target.bos], special=True).decode("utf-8", "replace")
        eos = target.detokenize([target.eos], special=True).decode("utf-8", "replace")
        text = chat.render(template, msgs, bos_token=bos, eos_token=eos,
                           extra=params.template_vars, model=target.path.name)
        # The template writes BOS itself where the model wants one.
        return target.tokenize(text, add_special=False, parse_special=True)
    return target.tokenize(prompt, add_special=True, parse_special=False)
