"""Fill-in-the-middle prompts from the model's own FIM tokens (llama.cpp's ``/infill``,
OpenAI's completions ``suffix``, Ollama's ``suffix``).

The tokens come from the GGUF: ``tokenizer.ggml.fim_{pre,suf,mid}_token_id`` (and
``fim_rep``/``fim_sep`` for context files) where the file names them, else the vocabulary
entries llama.cpp itself recognises by text (``<|fim_prefix|>`` for Qwen2.5-Coder,
``<fim_prefix>`` for StarCoder, ``<PRE>`` for CodeLlama, ...), each a single special
token. A model with no prefix, suffix and middle tokens is refused, naming the model:
guessing a format would make the model continue the text instead of filling the gap.

The layout is llama-server's (``format_prompt_infill``): the context files first
(``<|repo_name|>`` then ``<|file_sep|>name\\ntext`` per file, where the model has those
tokens), then ``PRE prefix SUF suffix MID``; the model writes the middle.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from .errors import ProtocolError
from .request import Fim

#: the texts llama.cpp's vocabulary loader recognises per FIM role (src/llama-vocab.cpp)
_TEXTS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "▁<PRE>",
            "<｜fim▁begin｜>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "▁<SUF>",
            "<｜fim▁hole｜>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "▁<MID>",
            "<｜fim▁end｜>"),
    "rep": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>"),
}


class Vocab(Protocol):
    """What the builder reads of a model (edgespec.runtime.model.Model has it)."""

    n_vocab: int

    def meta(self, key: str) -> str | None: ...

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = True) -> list[int]: ...


@dataclass(frozen=True)
class FimTokens:
    pre: int
    suf: int
    mid: int
    rep: int | None = None  # the repository name's marker (context files)
    sep: int | None = None  # a context file's separator


def fim_tokens(model: Vocab) -> FimTokens | None:
    """The model's FIM tokens, or None when it has no prefix, suffix and middle token."""
    found = {role: _token(model, role) for role in _TEXTS}
    pre, suf, mid = found["pre"], found["suf"], found["mid"]
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, found["rep"], found["sep"])


def _token(model: Vocab, role: str) -> int | None:
    raw = model.meta(f"tokenizer.ggml.fim_{role}_token_id")
    if raw is not None and raw.strip().lstrip("-").isdigit():
        tok = int(raw)
        if 0 <= tok < model.n_vocab:
            return tok
    for text in _TEXTS[role]:
        try:
            toks = model.tokenize(text, add_special=False, parse_special=True)
        except Exception:  # a vocabulary that cannot spell the text has no such token
            continue
        if len(toks) == 1:
            return toks[0]
    return None


def fim_prompt(model: Vocab, fim: Fim, model_name: str, bos: int | None = None,
               repo: str = "myproject") -> list[int]:
    """The token ids of a FIM prompt; ``bos`` leads it where the model wants one.

    Raises a ProtocolError (400, code ``fim_unsupported``) naming ``model_name`` when the
    model has no FIM tokens, or when context files are sent to a model without file
    separators."""
    t = fim_tokens(model)
    if t is None:
        raise ProtocolError(
            400, f"the model {model_name!r} has no fill-in-the-middle tokens (prefix, suffix "
                 "and middle) in its vocabulary; serve a code model trained for FIM (e.g. "
                 "Qwen2.5-Coder, StarCoder, CodeLlama) or send the prompt without a suffix",
            kind="unsupported", param="suffix", code="fim_unsupported")
    out: list[int] = [bos] if bos is not None else []
    if fim.extra:
        if t.sep is None:
            raise ProtocolError(
                400, f"the model {model_name!r} has no file-separator token for context "
                     "files; send the request without extra files", kind="unsupported",
                param="input_extra", code="fim_unsupported")
        if t.rep is not None:
            out += [t.rep] + _text(model, repo + "\n")
        for name, text in fim.extra:
            out += [t.sep] + _text(model, f"{name}\n{text}")
        out += [t.sep] + _text(model, "filename\n")  # the file being completed
    out += [t.pre] + _text(model, fim.prefix) + [t.suf] + _text(model, fim.suffix) + [t.mid]
    return out


def _text(model: Vocab, text: str) -> list[int]:
    # user text: never parsed for special tokens (a prefix holding "<|fim_middle|>" is text)
    return model.tokenize(text, add_special=False, parse_special=False) if text else []


def has_fim(model: Vocab) -> bool:
    return fim_tokens(model) is not None


__all__: Sequence[str] = ("FimTokens", "fim_prompt", "fim_tokens", "has_fim")
