"""llama-server's native endpoints on the wire (llama.cpp's tools/server/README.md):
``/completion`` and ``/infill`` bodies -> the neutral
:class:`~edgespec.protocol.request.CoreRequest`, core events -> llama-server's objects.

Pure functions, tested with literal bodies and events (tests/server/test_llamacpp_native.py);
the routes are in :mod:`.llamacpp`.

The request fields are llama-server's, with its defaults where a request names none
(temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, n_predict -1: up to the server's
--max-tokens-limit). Samplers edgespec does not implement (mirostat, typical_p, DRY, XTC,
dynamic temperature, top-n-sigma, ``n_indent``, ``ignore_eos``, LoRA) are refused by name
unless they hold their no-op value; fields about llama-server's own slots and caches
(``cache_prompt``, ``id_slot``, ``n_keep``, ``samplers``, ``timings_per_token``...) are
accepted and change nothing; other unknown fields are ignored, as llama-server does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from ...api.events import TokenLogprob
from ...api.params import GenerationParams
from ...protocol import limits
from ...protocol.errors import ProtocolError
from ...protocol.events import ChoiceDone
from ...protocol.request import CoreRequest, Fim
from .fields import check, get, invalid, unsupported

#: llama-server's sampling defaults (common/common.h) where a request names none
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
            "repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0,
            "frequency_penalty": 0.0}
#: samplers edgespec does not implement: refused unless at the value that turns them off
_NO_OP = {"mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0,
          "dynatemp_range": 0.0, "top_n_sigma": -1.0, "n_indent": 0, "ignore_eos": False,
          "post_sampling_probs": False, "n_cmpl": 1, "adaptive_target": -1.0}
#: llama-server's engine order, reported in generation_settings.samplers
SAMPLERS = ["penalties", "top_k", "top_p", "min_p", "temperature"]


@dataclass(frozen=True)
class Completion:
    """A parsed /completion or /infill request."""

    core: CoreRequest
    stream: bool = False
    return_tokens: bool = False
    n_probs: int = 0
    n_predict: int = -1  # as asked (-1: unlimited), for generation_settings
    response_fields: tuple[str, ...] = ()
    middle: str = ""  # /infill's prompt: text after the FIM middle token


# --- requests ------------------------------------------------------------------------------
def parse_completion(body: dict[str, Any], max_tokens_limit: int) -> Completion:
    prompt = _prompt(body.get("prompt"))
    return _completion(body, max_tokens_limit, prompt=prompt)


def parse_infill(body: dict[str, Any], max_tokens_limit: int) -> Completion:
    prefix = get(body, "input_prefix", str, required=True)
    suffix = get(body, "input_suffix", str, required=True)
    extra = get(body, "input_extra", list, default=[])
    files = []
    for i, chunk in enumerate(extra):
        where = f"input_extra.{i}"
        check(chunk, dict, where)
        text = get(chunk, "text", str, where, required=True)
        files.append((get(chunk, "filename", str, where, default="tmp"), text))
    middle = get(body, "prompt", str, default="")
    return _completion(body, max_tokens_limit, fim=Fim(prefix, suffix, tuple(files)),
                       middle=middle)


def _prompt(value: Any) -> str | tuple[int, ...]:
    """A string, or a list of token ids (one prompt: llama-server's list of several
    prompts, and prompts mixing text and ids, are refused)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], (str, list)):
            return _prompt(value[0])
        if value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            return tuple(value)
        if value and all(isinstance(p, (str, list)) for p in value):
            raise unsupported("several prompts in one request are not supported here; send "
                              "one request per prompt", "prompt")
        raise unsupported("a prompt mixing text and token ids is not supported; send text or "
                          "a list of token ids", "prompt")
    if value is None:
        raise invalid("prompt is required: the text (or token ids) to continue", "prompt",
                      "missing_required_parameter")
    raise invalid("prompt must be a string or a list of token ids", "prompt", "invalid_type")


def _completion(body: dict[str, Any], max_tokens_limit: int, *,
                prompt: str | tuple[int, ...] | None = None,
                fim: Fim | None = None, middle: str = "") -> Completion:
    for key, off in _NO_OP.items():
        value = body.get(key)
        if value is not None and value != off:
            raise unsupported(f"{key} {value!r} is not implemented here; leave it out (or at "
                              f"{off!r})", key)
    if body.get("lora"):
        raise unsupported("lora adapters are not supported; leave lora out", "lora")
    if body.get("multimodal_data"):
        raise unsupported("multimodal data needs a vision model; edgespec serves text models",
                          "multimodal_data")
    values: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        kind = int if key in ("top_k", "repeat_last_n") else float
        value = get(body, key, kind)
        values[key] = default if value is None else value
    if values["top_k"] < 0:
        values["top_k"] = 0  # llama-server: <= 0 is off
    if values["repeat_last_n"] == -1:
        values["repeat_last_n"] = 1 << 20  # the whole context
    seed = get(body, "seed", int)
    if seed is not None and seed < -1 and seed != 4294967295:
        raise invalid(f"seed is {seed}; send a non-negative seed (or -1: random)", "seed")
    n_predict = get(body, "n_predict", int, default=get(body, "max_tokens", int, default=-1))
    if n_predict == 0:
        raise unsupported("n_predict 0 (evaluate the prompt only) is not supported; ask for at "
                          "least one token", "n_predict")
    if n_predict < -1:
        raise invalid(f"n_predict is {n_predict}; send -1 (until the end) or a positive count",
                      "n_predict")
    n_probs = get(body, "n_probs", int, default=0)
    if n_probs < 0 or n_probs > 20:
        raise invalid(f"n_probs is {n_probs}; send 0..20", "n_probs")
    structured: dict[str, Any] = {}
    grammar = get(body, "grammar", str)
    if grammar:
        structured["grammar"] = grammar
    schema = get(body, "json_schema", dict)
    if schema is not None:
        if grammar:
            raise invalid("send grammar or json_schema, not both", "json_schema")
        structured["json_schema"] = schema
    sampling = limits.sampling(
        temperature=max(values["temperature"], 0.0), default_temperature=0.8,
        top_p=values["top_p"] if 0 < values["top_p"] <= 1 else 1.0,
        top_k=values["top_k"], min_p=min(max(values["min_p"], 0.0), 0.999999),
        repeat_penalty=values["repeat_penalty"] if values["repeat_penalty"] > 0 else 1.0,
        presence_penalty=values["presence_penalty"],
        frequency_penalty=values["frequency_penalty"],
        bias=_logit_bias(body.get("logit_bias")),
        seed=None if seed is None or seed in (-1, 4294967295) else seed,
        repeat_last_n=values["repeat_last_n"])
    params = GenerationParams(
        max_tokens=limits.max_tokens(None if n_predict == -1 else n_predict, max_tokens_limit,
                                     "n_predict"),
        stop=limits.stops(get(body, "stop", list), "stop"), chat=False,
        logprobs=n_probs or None, sampling=sampling, **structured)
    core = CoreRequest(model=get(body, "model", str), params=params, prompt=prompt, fim=fim,
                       param_prompt="prompt" if fim is None else "input_prefix")
    fields = tuple(get(body, "response_fields", list, default=[]))
    for i, f in enumerate(fields):
        check(f, str, f"response_fields.{i}")
    return Completion(core, get(body, "stream", bool, default=False),
                      get(body, "return_tokens", bool, default=False), n_probs, n_predict,
                      fields, middle)


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """``[[id, bias], ...]`` or ``{"id": bias}``; a bias of ``false`` bans the token. Text
    keys (llama-server biases every token of the text) are refused."""
    if value is None or value == [] or value == {}:
        return ()
    mapping: dict[str, float] = {}
    pairs = value.items() if isinstance(value, dict) else value if isinstance(value, list) \
        else None
    if pairs is None:
        raise invalid("logit_bias must be [[token_id, bias], ...] or {\"token_id\": bias}",
                      "logit_bias", "invalid_type")
    for item in pairs:
        if not isinstance(value, dict) and (not isinstance(item, list) or len(item) != 2):
            raise invalid("logit_bias entries are [token_id, bias] pairs", "logit_bias")
        key, bias = item
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        if not isinstance(key, str) or not key.isdigit():
            raise unsupported(f"logit_bias by text ({key!r}) is not supported; send token ids "
                              "(POST /tokenize finds them)", "logit_bias")
        mapping[key] = -100.0 if bias is False else bias
    return limits.logit_bias(mapping, 1 << 40)


def with_vocab(c: Completion, n_vocab: int) -> Completion:
    """The request's logit_bias checked against the model's vocabulary."""
    bad = [t for t, _ in c.core.params.sampling.logit_bias if t >= n_vocab]
    if bad:
        raise invalid(f"logit_bias token {bad[0]} is not a token id of this model "
                      f"(0..{n_vocab - 1})", "logit_bias")
    return c


def infill_tokens(fim_ids: list[int], middle_ids: list[int]) -> tuple[int, ...]:
    """/infill's prompt: the FIM prompt, then the request's ``prompt`` after the middle
    token (llama-server's layout)."""
    return tuple(fim_ids) + tuple(middle_ids)


def as_token_prompt(c: Completion, ids: tuple[int, ...]) -> Completion:
    return replace(c, core=replace(c.core, fim=None, prompt=ids))


# --- responses -----------------------------------------------------------------------------
def stop_type(done: ChoiceDone) -> str:
    """llama-server's ``stop_type``: eos, word (a stop string), limit (n_predict or the
    context), none (cancelled)."""
    return {"eos": "eos", "grammar": "eos", "stop": "word", "length": "limit",
            "context": "limit"}.get(done.stop_reason, "none")


#: what /props' default_generation_settings.params leaves out of generation_settings
#: (llama-server's task_params.to_json(only_metrics=true))
_NOT_METRICS = ("stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                "preserved_tokens", "dry_sequence_breakers")


def generation_settings(params: GenerationParams, c: Completion, *, metrics_only: bool = False
                        ) -> dict[str, Any]:
    """llama-server's ``generation_settings`` (its task_params.to_json keys, in its order)
    with the values this request ran with; samplers edgespec does not have report their
    no-op value. ``metrics_only``: the subset /props reports."""
    s = params.sampling
    out = {
        "seed": 4294967295 if s.seed is None else s.seed, "temperature": s.temperature,
        "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": s.top_k, "top_p": s.top_p,
        "min_p": s.min_p, "top_n_sigma": -1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
        "typical_p": 1.0, "repeat_last_n": s.repeat_last_n, "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": -1, "dry_sequence_breakers": [], "mirostat": 0,
        "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0,
        "adaptive_decay": 0.9, "stop": list(params.stop), "max_tokens": c.n_predict,
        "n_predict": c.n_predict, "n_keep": 0, "n_discard": 0, "ignore_eos": False,
        "stream": c.stream, "logit_bias": [[t, b] for t, b in s.logit_bias],
        "n_probs": c.n_probs, "min_keep": 0, "grammar": params.grammar or "",
        "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
        "chat_format": "Content-only", "reasoning_format": "none",
        "reasoning_in_content": False, "generation_prompt": "", "samplers": list(SAMPLERS),
        "speculative.types": "edgespec", "timings_per_token": False,
        "post_sampling_probs": False, "backend_sampling": False, "lora": []}
    if metrics_only:
        for key in _NOT_METRICS:
            del out[key]
    return out


@dataclass
class Shape:
    """One /completion (or /infill) answer's constant parts."""

    c: Completion
    model: str
    prompt_text: str
    settings: dict[str, Any]
    prompt_tokens: int = 0  # the prompt's length, for the streamed pieces
    piece: Any = None  # token id -> bytes, for completion_probabilities
    predicted: int = 0  # tokens streamed so far

    def chunk(self, text: str, n_tokens: int) -> dict[str, Any]:
        """A streamed piece (llama-server: content, tokens, stop false); the piece's token
        ids are not reported (``tokens`` stays empty; the final object has them with
        return_tokens)."""
        self.predicted += n_tokens
        return {"index": 0, "content": text, "tokens": [], "stop": False,
                "id_slot": -1, "tokens_predicted": self.predicted,
                "tokens_evaluated": self.prompt_tokens}

    def final(self, done: ChoiceDone, whole: bool) -> dict[str, Any]:
        text = done.text if whole else ""
        body = {
            "index": 0, "content": text,
            "tokens": list(done.tokens) if (whole and self.c.return_tokens) else [],
            "id_slot": -1, "stop": True, "model": self.model,
            "tokens_predicted": done.completion_tokens,
            "tokens_evaluated": done.prompt_tokens,
            "generation_settings": self.settings, "prompt": self.prompt_text,
            "has_new_line": "\n" in done.text, "truncated": False,
            "stop_type": stop_type(done), "stopping_word": self.stopping_word(done),
            "tokens_cached": done.prompt_tokens + done.completion_tokens,
            "timings": done.timings}
        if whole and self.c.n_probs and done.logprobs:
            body["completion_probabilities"] = probabilities(done.logprobs, self.piece)
        return project(body, self.c.response_fields)


    def stopping_word(self, done: ChoiceDone) -> str:
        """The stop string that ended the answer: known when the request sent one (the
        engine does not say which of several matched; then "")."""
        stops = self.c.core.params.stop
        return stops[0] if done.stop_reason == "stop" and len(stops) == 1 else ""


def probabilities(lps: Sequence[TokenLogprob], piece: Callable[[int], bytes] | None
                  ) -> list[dict[str, Any]]:
    """llama-server's ``completion_probabilities``: per token its id, logprob, text, bytes
    and the top alternatives."""
    def entry(tok: int, lp: float) -> dict[str, Any]:
        raw = bytes(piece(tok)) if piece is not None else b""
        return {"id": tok, "token": raw.decode("utf-8", "replace"), "bytes": list(raw),
                "logprob": lp}

    return [{**entry(lp.token, lp.logprob),
             "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps]


def project(body: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """llama-server's ``response_fields``: only those fields; ``a/b`` lifts ``b`` out of
    ``a`` under the name ``a/b``; missing fields are left out."""
    if not fields:
        return body
    out = {}
    for f in fields:
        node: Any = body
        for part in f.split("/"):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            out[f] = node
    return out


def token_pieces(tokens: list[int], piece: Callable[[int], bytes]) -> list[dict[str, Any]]:
    """/tokenize's ``with_pieces``: each id with its text, or its bytes where they are not
    valid UTF-8 on their own."""
    out = []
    for t in tokens:
        raw = bytes(piece(t))
        try:
            text: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = list(raw)
        out.append({"id": t, "piece": text})
    return out


def error_body(err: ProtocolError) -> dict[str, Any]:
    """llama-server's error shape (OpenAI's, with the status as ``code``)."""
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error"}
    if err.kind == "context_overflow":
        name = "exceed_context_size_error"
    else:
        name = kind.get(err.status, "server_error" if err.status >= 500 else
                        "invalid_request_error")
    return {"error": {"code": err.status, "message": err.message, "type": name}}
