"""Export a qualified target–proposer pair's speculative configuration to a distributed
engine, for when one machine is not enough: vLLM's ``speculative_config``, SGLang's
``--speculative-*`` flags, llama-server's ``--spec-*`` flags.

    doc = export("vllm", "qwen-1.5b", "ngram")     # {"engine", "config"/"argv", "rests_on"}

The draft length comes from the pair's qualification on this machine
(:func:`edgespec.registry.qualification`): with acceptance rate a pooled over its slices,
draft position i is accepted with probability about a^i, and a position is kept while
that is at least ``KEEP`` (so a = 0.7 keeps 3, a = 0.9 keeps 13, capped at ``MAX_TOKENS``).
Every document names the digests and the qualification records it rests on. The option
names are those of the engines' documentation (docs/identity.md cites the versions);
tests/unit/lab/analysis/test_export.py keeps the table.
"""
from __future__ import annotations

import json
import math
import shlex
from typing import Mapping

from ...errors import InvalidInputError, UnsupportedError
from ... import registry
from ...proposers import REGISTRY

ENGINES = ("vllm", "sglang", "llama-server")
KEEP = 0.25  # keep draft positions accepted with at least this probability
MAX_TOKENS = 8


def draft_tokens(acceptance: float) -> int:
    """Draft positions worth verifying on an engine whose verify passes cost about one step."""
    if acceptance <= 0.0:
        return 1
    if acceptance >= 1.0:
        return MAX_TOKENS
    return max(1, min(MAX_TOKENS, int(math.floor(math.log(KEEP) / math.log(acceptance)))))


def pooled_acceptance(slices: Mapping[str, Mapping]) -> float | None:
    """Acceptance rate over the qualified slices, weighted by their request counts."""
    num = den = 0.0
    for rec in slices.values():
        a, n = rec.get("acceptance_rate"), rec.get("n") or 1
        if isinstance(a, (int, float)):
            num += a * n
            den += n
    return num / den if den else None


def export(engine: str, target: str | None = None, proposer: str | None = None, *,
           num_tokens: int | None = None) -> dict:
    """The speculative configuration of pair (target, proposer) for ``engine``; the
    registry's default pair when both are omitted."""
    if engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    reg = registry.load_registry()
    target = target or reg.default_target
    if proposer is None:
        proposer = reg.default_draft if reg.default_draft and target == reg.default_target \
            else None
        if proposer is None:
            pairs = reg.pairs_for(target)
            if not pairs:
                raise InvalidInputError(f"{target} has no registered pair; add one to models.toml")
            proposer = pairs[0].key
    # any model, registered or not: qualification records are kept by the files' digests
    pair = registry.qualification_pair(target, proposer, reg)
    slices = registry.qualification(pair.target, pair.key)
    acceptance = pooled_acceptance(slices)
    if num_tokens is None:
        if acceptance is None:
            stale = registry.stale_qualification(pair.target, pair.key)
            why = (" (its records were measured on other files: the model changed since)"
                   if stale else "")
            raise InvalidInputError(
                f"pair {pair.target} + {pair.key} has no qualification on this machine{why}; "
                f"run `edgespec qualify {pair.target} {pair.key}` first, or pass "
                "--num-speculative-tokens N to export without one")
        num_tokens = draft_tokens(acceptance)
    elif num_tokens < 1:
        raise InvalidInputError(f"--num-speculative-tokens must be >= 1 (got {num_tokens})")
    target_path, draft_path = _file(reg, pair.target), _file(reg, pair.draft)
    options = {k: o.default for k, o in REGISTRY[pair.proposer].options.items()}
    body = _BUILDERS[engine](pair.proposer, num_tokens, options, target_path, draft_path)
    rests_on = {
        "pair": {"target": pair.target, "proposer": pair.key},
        "target": {"name": pair.target, "sha256": registry.model_digest(pair.target, reg),
                   "gguf": target_path},
        "draft": ({"name": pair.draft, "sha256": registry.model_digest(pair.draft, reg),
                   "gguf": draft_path} if pair.draft else None),
        "qualification": slices,
        "pooled_acceptance": acceptance,
        "num_speculative_tokens": {"value": num_tokens,
                                   "from": "qualification" if acceptance is not None
                                   and num_tokens == draft_tokens(acceptance) else "user",
                                   "rule": f"positions accepted with probability >= {KEEP} "
                                           f"(acceptance^i), at most {MAX_TOKENS}"},
    }
    return {"engine": engine, **body, "rests_on": rests_on}


def _file(reg, model: str | None) -> str | None:
    """The file of a registry model (where it is pulled to) or of a path or reference."""
    if model is None:
        return None
    if model in reg.models:
        return str(registry.model_path(model))
    return str(registry.resolve(model, pull=False))


def _vllm(kind: str, k: int, opts: Mapping, target: str, draft: str | None) -> dict:
    if kind == "draft":
        cfg = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    elif kind == "ngram":
        cfg = {"method": "ngram", "num_speculative_tokens": k,
               "prompt_lookup_min": int(opts["min_n"]), "prompt_lookup_max": int(opts["max_n"])}
    else:
        cfg = {"method": "suffix", "num_speculative_tokens": k,
               "suffix_decoding_max_tree_depth": int(opts["max_depth"]),
               "suffix_decoding_max_spec_factor": float(opts["factor"]),
               "suffix_decoding_min_token_prob": float(opts["min_token_prob"])}
    argv = ["vllm", "serve", target, "--speculative-config", json.dumps(cfg, sort_keys=True)]
    return {"speculative_config": cfg, "argv": argv, "command": shlex.join(argv)}


def _sglang(kind: str, k: int, opts: Mapping, target: str, draft: str | None) -> dict:
    if kind == "suffix":
        raise UnsupportedError("SGLang has no suffix decoding; export the target's ngram pair "
                               "(its NGRAM algorithm) or use vLLM (method suffix)")
    if kind == "draft":
        flags = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", draft,
                 "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                 # a chain of k drafts verified with the pending token
                 "--speculative-num-draft-tokens", str(k + 1)]
    else:
        flags = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(k),
                 "--speculative-ngram-min-match-window-size", str(int(opts["min_n"])),
                 "--speculative-ngram-max-match-window-size", str(int(opts["max_n"]))]
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, *flags]
    return {"flags": flags, "argv": argv, "command": shlex.join(argv)}


def _llama_server(kind: str, k: int, opts: Mapping, target: str, draft: str | None) -> dict:
    if kind == "suffix":
        raise UnsupportedError("llama-server has no suffix decoding; export the target's ngram "
                               "pair (--spec-type ngram-simple) or use vLLM (method suffix)")
    if kind == "draft":
        flags = ["--spec-draft-model", draft, "--spec-draft-n-max", str(k)]
    else:
        flags = ["--spec-type", "ngram-simple",
                 "--spec-ngram-simple-size-n", str(int(opts["min_n"])),
                 "--spec-ngram-simple-size-m", str(k), "--spec-draft-n-max", str(k)]
    argv = ["llama-server", "-m", target, *flags]
    return {"flags": flags, "argv": argv, "command": shlex.join(argv)}


_BUILDERS = {"vllm": _vllm, "sglang": _sglang, "llama-server": _llama_server}

__all__ = ["ENGINES", "draft_tokens", "export", "pooled_acceptance"]
