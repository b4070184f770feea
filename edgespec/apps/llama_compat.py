"""``Llama``: llama-cpp-python's constructor over an edgespec engine, so an app moves over by
changing one line::

    from llama_cpp import Llama                      # before
    from edgespec.apps import Llama                  # after: same arguments, same dicts

    llm = Llama(model_path="./qwen2.5-0.5b-instruct-q4_k_m.gguf", n_ctx=2048, seed=1,
                verbose=False)
    llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])
    for chunk in llm("Q: Name the planets. A: ", max_tokens=32, stream=True): ...

The generation runs :meth:`edgespec.engine.Engine.stream` with speculation on (the
planner's choice unless ``proposer=`` says otherwise); ``llm.engine`` is the engine itself.

How each ``llama_cpp.Llama`` 0.3.36 keyword is taken (nothing is dropped without saying):

- honoured: ``model_path`` (a ``.gguf`` path, or an edgespec registry name), ``n_ctx``
  (0: the model's trained context), ``n_threads``, ``n_gpu_layers`` (-1: all), ``seed``
  (the seed of requests that give none; -1 or llama.cpp's default: a fresh one each
  request), ``last_n_tokens_size`` (the repeat-penalty window), ``flash_attn``,
  ``type_k``/``type_v`` and ``use_mmap`` (the kernel configuration; left out, edgespec's mode
  picks its own), ``verbose`` (a one-line load summary on stderr; llama.cpp's own log stays
  quiet), ``chat_format`` None or ``"chat_template.default"`` (the GGUF's own template,
  which is what edgespec renders), ``logits_all`` (logprobs come without it);
- accepted, decided by edgespec (speed and memory only, the output does not depend on them):
  ``n_batch``, ``n_ubatch``, ``n_threads_batch``, ``use_mlock``, ``offload_kqv``,
  ``op_offload``, ``swa_full``, ``no_perf``, ``numa``; ``draft_model`` a
  ``LlamaPromptLookupDecoding`` (edgespec's own n-gram and suffix proposers draft from the
  prompt; ``proposer=`` picks);
- refused unless left at llama-cpp-python's default, each with what to do instead: what
  changes the model (``kv_overrides``, ``rope_*``, ``yarn_*``, ``lora_*``, ``vocab_only``,
  ``pooling_type``, ``attention_type``), what edgespec does not serve (``embedding``,
  ``spm_infill``, ``chat_handler``, ``tokenizer``, another ``chat_format``, another
  ``draft_model``), multi-GPU placement (``split_mode``, ``main_gpu``, ``tensor_split``);
- refused: any keyword ``llama_cpp.Llama`` does not have (llama-cpp-python swallows them
  silently; a misspelt keyword should not be lost).

edgespec's own keywords: ``proposer`` ("auto", "none", "ngram+suffix", ...), ``draft`` (a
draft model, for ``proposer="draft"``), ``exact``, ``adaptive`` (see ``Engine.load``).
"""
from __future__ import annotations

import logging
import sys
from typing import Mapping, Sequence

from ..api.labels import AUTO
from ..runtime.kernel import KV_GGML_TYPE, KernelConfig
from ..errors import InvalidInputError, UnsupportedError
from . import completions
from .completions import RANDOM_SEEDS, Defaults
from .. import registry
from ..runtime.gguf_facts import read_facts

log = logging.getLogger("edgespec.apps")

#: llama.cpp's LLAMA_DEFAULT_SEED
LLAMA_DEFAULT_SEED = 0xFFFFFFFF

#: keywords whose only effect is speed or memory; edgespec's planner and kernel choice decide
PERFORMANCE_ONLY = frozenset({"n_batch", "n_ubatch", "n_threads_batch", "use_mlock",
                              "offload_kqv", "op_offload", "swa_full", "no_perf", "numa",
                              "logits_all"})

#: keyword -> (llama-cpp-python's default, why another value is refused and what to do)
_CHANGES_THE_MODEL = "edgespec runs the GGUF file as it is; bake the change into the GGUF"
REFUSED_UNLESS_DEFAULT: dict[str, tuple[object, str]] = {
    "vocab_only": (False, "edgespec loads the whole model; for tokenizing alone use "
                          "llama_cpp.Llama(vocab_only=True)"),
    "kv_overrides": (None, _CHANGES_THE_MODEL),
    "rope_scaling_type": (-1, _CHANGES_THE_MODEL),
    "rope_freq_base": (0.0, _CHANGES_THE_MODEL),
    "rope_freq_scale": (0.0, _CHANGES_THE_MODEL),
    "yarn_ext_factor": (-1.0, _CHANGES_THE_MODEL),
    "yarn_attn_factor": (1.0, _CHANGES_THE_MODEL),
    "yarn_beta_fast": (32.0, _CHANGES_THE_MODEL),
    "yarn_beta_slow": (1.0, _CHANGES_THE_MODEL),
    "yarn_orig_ctx": (0, _CHANGES_THE_MODEL),
    "pooling_type": (-1, "pooling is for embeddings, which edgespec does not compute"),
    "attention_type": (-1, "edgespec runs the model's own (causal) attention"),
    "embedding": (False, "edgespec generates text and does not compute embeddings; use "
                         "llama_cpp.Llama(embedding=True) for those"),
    "lora_base": (None, "LoRA adapters are not supported; merge the adapter into the GGUF"),
    "lora_path": (None, "LoRA adapters are not supported; merge the adapter into the GGUF"),
    "lora_scale": (1.0, "LoRA adapters are not supported; merge the adapter into the GGUF"),
    "chat_handler": (None, "edgespec renders the GGUF's own chat template; a custom handler "
                           "cannot run there (render the prompt yourself and call "
                           "create_completion)"),
    "tokenizer": (None, "edgespec tokenizes with the GGUF's own vocabulary"),
    "spm_infill": (False, "fill-in-the-middle is not supported"),
    "split_mode": (1, "edgespec places layers itself (n_gpu_layers; --rpc for other "
                      "machines); leave split_mode out"),
    "main_gpu": (0, "edgespec places layers itself (n_gpu_layers); leave main_gpu out"),
    "tensor_split": (None, "edgespec places layers itself (n_gpu_layers); leave tensor_split "
                           "out"),
}

#: chat_format values that name what edgespec renders anyway: the GGUF's own template
_OWN_TEMPLATE = (None, "chat_template.default")
#: type_k / type_v (enum ggml_type) -> edgespec's KV cache type
_KV_TYPE_OF = {v: k for k, v in KV_GGML_TYPE.items()}


class Llama:
    """``llama_cpp.Llama``'s constructor and generation methods, generating with edgespec.

    ``create_completion`` / ``__call__`` / ``create_chat_completion`` take llama-cpp-python's
    arguments and return its dicts and chunks (:mod:`edgespec.apps.completions`); ``engine``
    is the :class:`~edgespec.engine.Engine` underneath, for edgespec's own API (events,
    stats, :class:`~edgespec.apps.aio.AsyncEngine`).
    """

    def __init__(self, model_path: str, *, n_ctx: int = 512, n_threads: int | None = None,
                 n_gpu_layers: int = 0, seed: int = LLAMA_DEFAULT_SEED,
                 last_n_tokens_size: int = 64, flash_attn: bool | None = None,
                 type_k: int | None = None, type_v: int | None = None,
                 use_mmap: bool = True, chat_format: str | None = None, draft_model=None,
                 verbose: bool = True,
                 # edgespec's own
                 proposer: str = AUTO, draft: str | None = None, exact: bool = False,
                 adaptive: bool = True, **llama_kwargs) -> None:
        from ..engine.engine import Engine  # deferred: it loads llama.cpp

        _check_llama_kwargs(llama_kwargs)
        if chat_format not in _OWN_TEMPLATE:
            raise UnsupportedError(
                f"chat_format={chat_format!r}: edgespec renders the GGUF's own chat template "
                "(chat_format 'chat_template.default'); leave chat_format out")
        if draft_model is not None and type(draft_model).__name__ != "LlamaPromptLookupDecoding":
            raise UnsupportedError(
                f"draft_model={type(draft_model).__name__}: edgespec drafts with its own "
                "proposers; pass draft='a-draft.gguf' with proposer='draft' for a draft model")
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 0:
            raise InvalidInputError(f"n_ctx must be an int >= 0, 0 for the model's trained "
                                    f"context (got {n_ctx!r})")
        if last_n_tokens_size < 0:
            raise InvalidInputError(f"last_n_tokens_size must be >= 0 (got "
                                    f"{last_n_tokens_size})")
        kernel = _kernel(flash_attn, type_k, type_v, use_mmap)
        self.model_path = model_path
        self.verbose = verbose
        self.engine = Engine.load(
            str(model_path), draft=draft, proposer=proposer,
            n_ctx=n_ctx or _trained_context(str(model_path)), threads=n_threads,
            n_gpu_layers=n_gpu_layers, adaptive=adaptive, exact=exact, kernel=kernel)
        self._defaults = Defaults(model=str(model_path), repeat_last_n=last_n_tokens_size,
                                  seed=None if seed in RANDOM_SEEDS else seed)
        if verbose:
            e = self.engine
            print(f"edgespec: {e.target.path.name}, n_ctx {e.ctx.n_ctx}, proposer "
                  f"{e.default_proposer}{' (exact)' if e.exact else ''}", file=sys.stderr)

    # --- generation -------------------------------------------------------------------
    def create_completion(self, prompt: str, *args, **kwargs):
        """``Llama.create_completion``: the ``text_completion`` dict, or its chunks with
        ``stream=True``."""
        return completions.create_completion(self.engine, prompt, *args,
                                             defaults=self._defaults, **kwargs)

    def __call__(self, prompt: str, *args, **kwargs):
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages: Sequence[Mapping], *args, **kwargs):
        """``Llama.create_chat_completion``: the ``chat.completion`` dict, or its chunks with
        ``stream=True``."""
        return completions.create_chat_completion(self.engine, messages, *args,
                                                  defaults=self._defaults, **kwargs)

    # --- what apps read besides completions ------------------------------------------------
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.engine.target.tokenize(bytes(text).decode("utf-8"), add_special=add_bos,
                                           parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens=None, special: bool = False) -> bytes:
        return self.engine.target.detokenize(list(tokens), special=special)

    def n_ctx(self) -> int:
        return self.engine.ctx.n_ctx

    def n_vocab(self) -> int:
        return self.engine.target.n_vocab

    def token_bos(self) -> int:
        return self.engine.target.bos

    def token_eos(self) -> int:
        return self.engine.target.eos

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_llama_kwargs(kwargs: Mapping[str, object]) -> None:
    for name, value in kwargs.items():
        if name in PERFORMANCE_ONLY:
            log.debug("Llama(%s=%r): edgespec decides this itself (speed only)", name, value)
            continue
        if name in REFUSED_UNLESS_DEFAULT:
            default, why = REFUSED_UNLESS_DEFAULT[name]
            if value != default:
                raise UnsupportedError(f"Llama({name}={value!r}) is not supported: {why}")
            continue
        raise InvalidInputError(
            f"Llama() got an unexpected keyword argument {name!r}: it is not one of "
            "llama_cpp.Llama's (which would ignore it silently); check the spelling")


def _kernel(flash_attn, type_k, type_v, use_mmap) -> KernelConfig | None:
    """The kernel configuration the keywords ask for, or None (the mode's own choice)."""
    if flash_attn is None and type_k is None and type_v is None and use_mmap:
        return None
    if (type_k is None) != (type_v is None) or type_k != type_v:
        raise UnsupportedError(f"type_k={type_k} and type_v={type_v}: edgespec quantizes the K "
                               "and V caches alike; give both the same type")
    kv = "f16" if type_k is None else _KV_TYPE_OF.get(type_k)
    if kv is None:
        raise UnsupportedError(f"type_k=type_v={type_k}: the KV cache types are "
                               + ", ".join(f"{v} ({k})" for k, v in KV_GGML_TYPE.items()))
    # what is left out takes llama-cpp-python's default (F16 KV, no flash attention), so the
    # same keywords compute the same way in both
    return KernelConfig(use_mmap=bool(use_mmap), flash_attn=bool(flash_attn), kv_type=kv
                        ).validate()


def _trained_context(model: str) -> int:
    """``n_ctx=0``: the context the model was trained for, as llama-cpp-python reads it."""
    return read_facts(registry.resolve(model, pull=True)).n_ctx_train


__all__ = ["LLAMA_DEFAULT_SEED", "Llama", "PERFORMANCE_ONLY", "REFUSED_UNLESS_DEFAULT"]
