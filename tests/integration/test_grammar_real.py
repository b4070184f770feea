"""Structured output on a real model (smollm2-135m): constrained greedy output of every free
proposer, exact mode and the lossless default, is the plain path's constrained output, valid
under the schema; seeded sampling with point-mass drafts emits the plain path's tokens."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from edgespec.api.params import GenerationParams, SamplingParams

DATA = Path(__file__).resolve().parents[2] / "edgespec/lab/bench/data/structured/extraction.jsonl"


def _own_prompts(n: int = 2):
    recs = [json.loads(line) for line in open(DATA, encoding="utf-8")]
    return [(r["prompt"], r["schema"]) for r in recs if "prompt" in r][:n]


@pytest.fixture(scope="module")
def engine(engine_factory):
    return engine_factory("smollm2-135m", proposer="ngram+suffix", n_ctx=1024)


@pytest.fixture(scope="module")
def exact_engine(engine_factory):
    """Exact mode runs its own batch-invariant kernel configuration."""
    return engine_factory("smollm2-135m", proposer="ngram+suffix", n_ctx=1024, exact=True)


@pytest.mark.parametrize("exact", [True, False])
def test_greedy_constrained_output_equals_the_plain_path(engine, exact_engine, exact):
    engine = exact_engine if exact else engine
    for prompt, schema in _own_prompts():
        p = GenerationParams(max_tokens=96, json_schema=schema)
        plain = engine.generate(prompt, p, proposer="none")
        for label in ("ngram", "suffix", "ngram+suffix"):
            spec = engine.generate(prompt, p, proposer=label, exact=exact)
            assert spec.tokens == plain.tokens, (label, exact, plain.text, spec.text)
        if plain.stop_reason == "eos":
            jsonschema.validate(json.loads(plain.text), schema)


def test_a_schema_output_validates_and_forced_literals_are_drafted(engine):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                               "age": {"type": "integer"},
                                               "city": {"type": "string", "maxLength": 30}},
              "required": ["name", "age", "city"], "additionalProperties": False}
    r = engine.generate("Extract name, age and city as JSON: Maria Lopez, 34, lives in Madrid.",
                        GenerationParams(max_tokens=60, json_schema=schema))
    assert r.stop_reason == "eos"
    jsonschema.validate(json.loads(r.text), schema)
    assert r.stats.proposer_tokens["grammar"] > 0  # keys after their first token are forced


def test_seeded_sampling_under_a_grammar_matches_the_plain_path(exact_engine):
    engine = exact_engine
    prompt, schema = _own_prompts(1)[0]
    for seed in (1, 2):
        p = GenerationParams(max_tokens=48, json_schema=schema,
                             sampling=SamplingParams(temperature=0.8, top_p=0.95, seed=seed))
        plain = engine.generate(prompt, p, proposer="none")
        spec = engine.generate(prompt, p, proposer="ngram+suffix", exact=True)
        assert spec.tokens == plain.tokens


def test_json_mode_and_a_gbnf_grammar(engine):
    r = engine.generate("Give a JSON object describing a cat.",
                        GenerationParams(max_tokens=64, json_mode=True))
    if r.stop_reason == "eos":
        assert isinstance(json.loads(r.text), dict)
    r = engine.generate("Count from 1 to 5, comma separated.",
                        GenerationParams(max_tokens=20, grammar='root ::= [1-5] ("," " "? [1-5])*'))
    assert r.stop_reason in ("eos", "length")
    assert set(r.text.replace(",", "").replace(" ", "")) <= set("12345")
