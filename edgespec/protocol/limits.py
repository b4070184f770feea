"""The request limits and field checks every dialect applies, defined once.

Each function takes the dialect's already-typed values and returns what the engine takes,
or raises a :class:`~.errors.ProtocolError` naming the field (``param``) with what to send
instead. Dialects pass their own field names where they differ (Anthropic's
``stop_sequences``, Ollama's ``num_predict``).
"""
from __future__ import annotations

import math
from typing import Mapping

from ..api.params import SamplingParams
from .errors import bad_request

MAX_STOPS = 16
#: a logit_bias key longer than this is no token id of any vocabulary (2**64 has 20 digits)
_MAX_KEY_DIGITS = 12


def max_tokens(asked: int | None, limit: int, param: str = "max_tokens") -> int:
    """The tokens to generate: ``asked``, at most the server's ``limit`` (a request asking
    for more is refused, not cut); none asked: the limit."""
    if asked is None:
        return limit
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 1:
        raise bad_request(f"{param} must be a positive integer (got {asked!r})", param=param)
    if asked > limit:
        raise bad_request(f"{param} is {asked} but this server allows at most {limit} (its "
                          "--max-tokens-limit); ask for less", param=param)
    return asked


def stops(stop: str | list[str] | tuple[str, ...] | None, param: str = "stop"
          ) -> tuple[str, ...]:
    """Stop strings: one or a list, each non-empty, at most MAX_STOPS."""
    if stop is None:
        return ()
    found = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) for s in found):
        raise bad_request("stop strings must be strings", param=param, code="invalid_type")
    if len(found) > MAX_STOPS:
        raise bad_request(f"{len(found)} stop strings; at most {MAX_STOPS} are allowed",
                          param=param)
    if not all(found):
        raise bad_request("stop strings must be non-empty", param=param)
    return found


def logit_bias(mapping: Mapping[str, float] | None, n_vocab: int, param: str = "logit_bias",
               bound: float | None = 100.0) -> tuple[tuple[int, float], ...]:
    """Token id -> bias, strictly: keys of ASCII digits only (``"+5"``, ``"٣"`` and
    ``"007"``-sized junk are refused, not read as numbers), ids inside the vocabulary,
    biases in [-bound, bound]. ``bound`` None (llama-cpp-python's unbounded bias): any
    finite number, or -inf, which bans the token; +inf or NaN would leave no distribution
    to sample from."""
    if not mapping:
        return ()
    pairs = []
    for key, value in mapping.items():
        if not isinstance(key, str) or not key or len(key) > _MAX_KEY_DIGITS \
                or not key.isascii() or not key.isdigit() or int(key) >= n_vocab:
            raise bad_request(f"logit_bias key {str(key)[:40]!r} is not a token id of this "
                              f"model (0..{n_vocab - 1})", param=param)
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if bound is None:
            if not number or math.isnan(value) or value == math.inf:
                raise bad_request(f"logit_bias for token {key} must be a finite number or "
                                  f"-inf (got {value!r})", param=param)
        elif not number or not -bound <= value <= bound:
            raise bad_request(f"logit_bias for token {key} is {value!r}; biases are numbers "
                              f"in [-{bound:g}, {bound:g}]", param=param)
        pairs.append((int(key), float(value)))
    return tuple(sorted(pairs))


def sampling(*, temperature: float | None, default_temperature: float,
             top_p: float | None = None, top_k: int | None = None, min_p: float | None = None,
             repeat_penalty: float | None = None, presence_penalty: float | None = None,
             frequency_penalty: float | None = None,
             bias: tuple[tuple[int, float], ...] = (), seed: int | None = None,
             repeat_last_n: int | None = None) -> SamplingParams:
    """SamplingParams from a dialect's fields, None meaning "the default" for each."""
    params = SamplingParams(
        temperature=default_temperature if temperature is None else float(temperature),
        top_p=1.0 if top_p is None else float(top_p),
        top_k=top_k or 0,
        min_p=min_p or 0.0,
        repeat_penalty=1.0 if repeat_penalty is None else float(repeat_penalty),
        repeat_last_n=64 if repeat_last_n is None else repeat_last_n,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        logit_bias=bias, seed=seed)
    try:
        return params.validate()
    except Exception as e:  # InvalidInputError naming the field in its message
        raise bad_request(str(e)) from None
