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
  (the start of llama-cpp-python's seed chain for requests that give none; -1 or
  llama.cpp's default: a fresh one each request), ``embedding`` (accepted: ``embed`` works
  either way), ``pooling_type`` (the pooling ``embed`` applies), ``last_n_tokens_size`` (the repeat-penalty window), ``flash_attn``,
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
  ``attention_type``), what edgespec does not serve (``spm_infill``, ``chat_handler``, ``tokenizer``, another ``chat_format``, another
  ``draft_model``), multi-GPU placement (``split_mode``, ``main_gpu``, ``tensor_split``);
- refused: any keyword ``llama_cpp.Llama`` does not have (llama-cpp-python swallows them
  silently; a misspelt keyword should not be lost).

edgespec's own keywords: ``proposer`` ("auto", "none", "ngram+suffix", ...), ``draft`` (a
draft model, for ``proposer="draft"``), ``exact``, ``adaptive`` (see ``Engine.load``).
"""
from __future__ import annotations

import fnmatch
import logging
import random
import re
import sys
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from ..api.labels import AUTO
from ..api.params import SamplingParams
from ..runtime.kernel import KV_GGML_TYPE, KernelConfig
from ..errors import InvalidInputError, UnsupportedError
from ..decoding.kvcache import common_prefix
from . import completions, lowlevel, state
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
    "attention_type": (-1, "edgespec runs the model's own (causal) attention"),
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

#: pooling_type (llama.cpp's enum llama_pooling_type) -> edgespec.runtime.embedding's names
_POOLING_OF = {-1: "model", 0: "none", 1: "mean", 2: "cls", 3: "last"}

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
                 embedding: bool = False, pooling_type: int = -1, verbose: bool = True,
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
        if pooling_type not in _POOLING_OF:
            raise UnsupportedError(f"pooling_type={pooling_type}: the embedding poolings are "
                                   + ", ".join(f"{k} ({v})" for k, v in _POOLING_OF.items()))
        kernel = _kernel(flash_attn, type_k, type_v, use_mmap)
        self.model_path = model_path
        self.embedding = bool(embedding)  # accepted: embed() works either way
        self._pooling = _POOLING_OF[pooling_type]
        self.verbose = verbose
        self.engine = Engine.load(
            str(model_path), draft=draft, proposer=proposer,
            n_ctx=n_ctx or _trained_context(str(model_path)), threads=n_threads,
            n_gpu_layers=n_gpu_layers, adaptive=adaptive, exact=exact, kernel=kernel)
        self._defaults = Defaults(model=str(model_path), repeat_last_n=last_n_tokens_size)
        #: llama-cpp-python's seed chain: a request without a seed takes the next seed of a
        #: random.Random seeded with the last one (None: fresh entropy per request)
        self._seed: int | None = None if seed in RANDOM_SEEDS else seed
        #: a prompt starting with what the context holds prefills only the rest, as
        #: llama-cpp-python's Llama does (exact mode keeps its guarantee: decoding.kvcache)
        self.engine.reuse = True
        self.cache = None  # set_cache: a llama-cpp-python prompt cache of saved states
        self._metadata: dict[str, str] | None = None
        self._rows = lowlevel.Rows()  # the last eval()'s logits, for sample()
        if verbose:
            e = self.engine
            print(f"edgespec: {e.target.path.name}, n_ctx {e.ctx.n_ctx}, proposer "
                  f"{e.default_proposer}{' (exact)' if e.exact else ''}", file=sys.stderr)

    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None, additional_files=None,
                        local_dir=None, local_dir_use_symlinks="auto", cache_dir=None,
                        **kwargs) -> "Llama":
        """``Llama.from_pretrained``: a GGUF of a Hugging Face repo, through edgespec's Hub
        pulls (edgespec.registry.hub: huggingface_hub's cache, every file pinned by sha256
        at its first pull). ``filename`` is a file of the repo or a glob matching exactly
        one (as llama-cpp-python's); a split set is fetched whole, so ``additional_files``
        naming its other parts need nothing more. The files live in the Hugging Face cache
        (``HF_HOME``/``HF_HUB_CACHE``): ``local_dir`` and ``cache_dir`` are refused."""
        if local_dir is not None or cache_dir is not None:
            raise UnsupportedError("from_pretrained: edgespec keeps Hub files in the Hugging "
                                   "Face cache (set HF_HOME or HF_HUB_CACHE); leave local_dir "
                                   "and cache_dir out")
        if not filename:
            raise InvalidInputError("from_pretrained needs a filename (or a glob) of the repo")
        from ..registry import hub  # deferred: huggingface_hub is slow to import

        name = _hub_file(repo_id, filename)
        for extra in additional_files or ():
            if not fnmatch.fnmatch(_split_base(name), _split_base(extra)):
                raise UnsupportedError(f"additional_files {extra!r}: edgespec fetches a split "
                                       "GGUF set whole; other extra files are not supported")
        path = hub.resolve(f"{hub.SCHEME}{repo_id}/{name}")
        return cls(model_path=str(path), **kwargs)

    # --- generation -------------------------------------------------------------------
    def create_completion(self, prompt: str | Sequence[int], *args, **kwargs):
        """``Llama.create_completion``: the ``text_completion`` dict, or its chunks with
        ``stream=True``. ``prompt`` is text or token ids (read as given: no BOS added)."""
        defaults = self._request_defaults(kwargs.get("seed"))
        if self.cache is None:
            return completions.create_completion(self.engine, prompt, *args,
                                                 defaults=defaults, **kwargs)
        return self._cached_completion(prompt, args, kwargs, defaults)

    def __call__(self, prompt: str, *args, **kwargs):
        return self.create_completion(prompt, *args, **kwargs)

    def create_chat_completion(self, messages: Sequence[Mapping], *args, **kwargs):
        """``Llama.create_chat_completion``: the ``chat.completion`` dict, or its chunks with
        ``stream=True``."""
        return completions.create_chat_completion(self.engine, messages, *args,
                                                  defaults=self._request_defaults(
                                                      kwargs.get("seed")), **kwargs)

    def set_seed(self, seed: int) -> None:
        """The seed the next request without one derives its own from (llama-cpp-python's
        chain; -1 or llama.cpp's default seed: fresh entropy per request)."""
        self._seed = None if seed in RANDOM_SEEDS else int(seed)

    def _request_defaults(self, seed) -> Defaults:
        # llama-cpp-python: a request's seed becomes the instance's; without one, the
        # instance's seed moves on to random.Random(seed).randint(0, 2**32)
        if seed is not None:
            self.set_seed(seed)
            return self._defaults
        if self._seed is None:
            return self._defaults
        self._seed = random.Random(self._seed).randint(0, 2 ** 32)
        return replace(self._defaults, seed=self._seed)

    def _cached_completion(self, prompt, args, kwargs, defaults: Defaults):
        """A completion through the prompt cache (:meth:`set_cache`): a saved state holding
        more of the prompt than the context does is loaded first (through ``load_state``),
        and the state after the answer is saved under prompt + answer tokens."""
        tokens = self._prompt_ids(prompt)
        try:
            item = self.cache[tokens]
        except KeyError:
            item = None
        if item is not None:
            ids = [int(t) for t in item.input_ids[:item.n_tokens]]
            if common_prefix(ids, tokens) > common_prefix(state.held(self.engine), tokens):
                self.load_state(item)
        out = completions.create_completion(self.engine, prompt, *args, defaults=defaults,
                                            **kwargs)
        if kwargs.get("stream"):
            return self._saving_chunks(out, tokens)
        self.cache[tokens + state.held(self.engine)[len(tokens):]] = self.save_state()
        return out

    def _saving_chunks(self, chunks, tokens: list[int]):
        yield from chunks
        self.cache[tokens + state.held(self.engine)[len(tokens):]] = self.save_state()

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.engine.target.tokenize(prompt, add_special=True, parse_special=False)
        return [int(t) for t in prompt]

    # --- the token-level API (edgespec.apps.lowlevel) -------------------------------------
    @property
    def n_tokens(self) -> int:
        """Tokens the context holds (``Llama.n_tokens``)."""
        return len(state.held(self.engine))

    @property
    def input_ids(self) -> np.ndarray:
        """The tokens the context holds (``Llama.input_ids[:n_tokens]``)."""
        return np.array(state.held(self.engine), dtype=np.intc)

    @property
    def _is_recurrent(self) -> bool:
        return self._kind()[0]

    @property
    def _is_hybrid(self) -> bool:
        return self._kind()[1]

    def _kind(self) -> tuple[bool, bool]:
        from ..runtime.embedding import model_kind  # deferred: it loads llama.cpp
        return model_kind(self.engine.target)

    def eval(self, tokens: Sequence[int]) -> None:
        """``Llama.eval``: decode ``tokens`` after what the context holds."""
        lowlevel.evaluate(self.engine, tokens, self._rows)

    def sample(self, top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
               typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0,
               frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
               tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_eta: float = 0.1,
               mirostat_tau: float = 5.0, penalize_nl: bool = True, logits_processor=None,
               grammar=None, idx: int | None = None) -> int:
        """``Llama.sample``: a token from the last ``eval``'s logits at position ``idx``
        (default: its last), with edgespec's sampler (grammar and mirostat refused)."""
        if grammar is not None or mirostat_mode:
            raise UnsupportedError("sample(): grammar and mirostat are not supported at the "
                                   "token level; use create_completion(grammar=...)")
        params = self._token_sampling(top_k, top_p, min_p, temp, repeat_penalty,
                                      frequency_penalty, presence_penalty)
        row = self._rows.row(idx)
        if logits_processor is not None:
            row = np.asarray(completions._processor(logits_processor)(self.input_ids,
                                                                      row.copy()))
        return lowlevel.choose(row, state.held(self.engine), params)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, typical_p: float = 1.0, temp: float = 0.80,
                 repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                 tfs_z: float = 1.0, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                 mirostat_eta: float = 0.1, penalize_nl: bool = True, logits_processor=None,
                 stopping_criteria=None, grammar=None):
        """``Llama.generate``: the tokens after ``tokens``, one at a time, until the consumer
        stops, as an engine request (drafted unless ``logits_processor`` is given; a prompt
        the context already holds is reused, not evaluated again)."""
        if grammar is not None or mirostat_mode or stopping_criteria is not None:
            raise UnsupportedError("generate(): grammar, mirostat and stopping_criteria are "
                                   "not supported at the token level; use create_completion")
        params = self._token_sampling(top_k, top_p, min_p, temp, repeat_penalty,
                                      frequency_penalty, presence_penalty)
        return lowlevel.generate(self.engine, tokens, params,
                                 completions._processor(logits_processor))

    def _token_sampling(self, top_k, top_p, min_p, temp, repeat_penalty, frequency_penalty,
                        presence_penalty):
        seed = self._request_defaults(None).seed
        return SamplingParams(
            temperature=max(0.0, float(temp)), top_p=float(top_p), top_k=max(0, int(top_k)),
            min_p=float(min_p), repeat_penalty=float(repeat_penalty),
            repeat_last_n=self._defaults.repeat_last_n,
            frequency_penalty=float(frequency_penalty),
            presence_penalty=float(presence_penalty), seed=seed).validate()

    # --- embeddings (a context of their own: generation is not disturbed) -------------------
    def embed(self, input: str | Sequence[str], normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """``Llama.embed``: one vector (a list of floats) for a string, a list of vectors for
        a list; with ``pooling_type`` none, a list of per-token vectors instead of each
        vector. Unlike llama-cpp-python, no ``embedding=True`` is needed: edgespec embeds
        through a second context of the loaded model (pooling: the constructor's
        ``pooling_type``, the GGUF's own by default, mean for a generative model)."""
        from ..engine.embedding import embedder  # deferred: builds a llama.cpp context

        one = isinstance(input, str)
        out = embedder(self.engine, self._pooling).embed([input] if one else list(input),
                                                         normalize=normalize, truncate=truncate)
        vectors = [v.tolist() for v in out.vectors]
        result = vectors[0] if one else vectors
        return (result, out.n_tokens) if return_count else result

    def create_embedding(self, input: str | Sequence[str], model: str | None = None) -> dict:
        """``Llama.create_embedding``: OpenAI's embedding list, ``usage`` counting the input
        tokens read."""
        vectors, n = self.embed(input if isinstance(input, list) else [input],
                                return_count=True)
        return {"object": "list",
                "data": [{"object": "embedding", "embedding": v, "index": i}
                         for i, v in enumerate(vectors)],
                "model": model if model is not None else self.model_path,
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    # --- state ---------------------------------------------------------------------------
    def save_state(self) -> "state.LlamaState":
        """``Llama.save_state``: the context's request sequence and the seed chain."""
        return state.save(self.engine, self._seed)

    def load_state(self, saved: "state.LlamaState") -> None:
        """``Llama.load_state``: what :meth:`save_state` returned, on this model."""
        state.load(self.engine, saved)
        self._seed = getattr(saved, "seed", self._seed)

    def reset(self) -> None:
        """``Llama.reset``: the next prompt is evaluated from scratch."""
        state.reset(self.engine)

    def set_cache(self, cache) -> None:
        """``Llama.set_cache``: a llama-cpp-python prompt cache (``LlamaRAMCache``,
        ``LlamaDiskCache``) or any mapping-like cache of token tuples to states, or None."""
        self.cache = cache

    # --- what apps read besides completions ------------------------------------------------
    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False) -> list[int]:
        return self.engine.target.tokenize(bytes(text).decode("utf-8"), add_special=add_bos,
                                           parse_special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens=None, special: bool = False) -> bytes:
        return self.engine.target.detokenize(list(tokens), special=special)

    def tokenizer(self) -> "LlamaTokenizer":
        """``Llama.tokenizer()``: tokenize/detokenize/encode/decode over the GGUF's vocabulary."""
        return LlamaTokenizer(self)

    @property
    def metadata(self) -> dict[str, str]:
        """The GGUF's metadata, every value as its string (``Llama.metadata``)."""
        if self._metadata is None:
            from ..runtime.embedding import model_metadata  # deferred: it loads llama.cpp
            self._metadata = model_metadata(self.engine.target)
        return self._metadata

    def n_ctx(self) -> int:
        return self.engine.ctx.n_ctx

    def n_embd(self) -> int:
        return self.engine.target.n_embd

    def token_nl(self) -> int:
        nl = self.engine.target.tokenize("\n", add_special=False, parse_special=False)
        return nl[0] if len(nl) == 1 else -1

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


class LlamaTokenizer:
    """``llama_cpp.LlamaTokenizer``: the model's own vocabulary."""

    def __init__(self, llama: Llama) -> None:
        self._llama = llama

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = True) -> list[int]:
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int], prev_tokens=None, special: bool = False) -> bytes:
        return self._llama.detokenize(tokens, special=special)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenize(text.encode("utf-8", errors="ignore"), add_bos=add_bos,
                             special=special)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens).decode("utf-8", errors="ignore")


def _hub_file(repo_id: str, filename: str) -> str:
    """The one file of ``repo_id`` that ``filename`` names (a glob: the one it matches, by
    path or by base name, as llama-cpp-python's ``fnmatch``)."""
    if not any(c in filename for c in "*?["):
        return filename
    # deferred: the Hub's listing (huggingface_hub, slow to import), as every pull reads it
    from ..registry.hub.env import _env
    from ..registry.hub.listing import _listing
    from ..registry.hub.ref import parse
    from ..registry.store import _say

    files = sorted(_listing(parse(repo_id), _env(), True, _say).files)
    found = [f for f in files if fnmatch.fnmatch(f, filename)
             or fnmatch.fnmatch(f.rsplit("/", 1)[-1], filename)]
    if len(found) != 1:
        what = "no file" if not found else f"{len(found)} files ({', '.join(found[:6])})"
        ggufs = [f for f in files if f.lower().endswith(".gguf")]
        raise InvalidInputError(f"from_pretrained: {what} of {repo_id} match {filename!r}; "
                                f"its GGUF files: {', '.join(ggufs[:12]) or 'none'}")
    return found[0]


def _split_base(name: str) -> str:
    """A split part's set name: NAME-00002-of-00003.gguf -> NAME-*-of-00003.gguf."""
    return re.sub(r"-\d{5}-of-(\d{5})\.gguf$", r"-*-of-\1.gguf", name)


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


__all__ = ["LLAMA_DEFAULT_SEED", "Llama", "LlamaTokenizer", "PERFORMANCE_ONLY",
           "REFUSED_UNLESS_DEFAULT"]
