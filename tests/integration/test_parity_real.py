"""The parity harness on a real model (SmolLM2-135M: fast, batch-invariant at short context).

A scripted point-mass proposer stands in for n-gram drafting: it proposes a fixed
continuation (the plain greedy answer, optionally with every fourth token wrong),
so drafts are accepted and rejected at known places on any tokenizer.
"""
from __future__ import annotations

import pytest

from edgespec.lab.analysis import parity as P
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.proposers.base import Draft

PROMPTS = [
    P.ParityPrompt("count", "test", "Count from one to twenty in words, separated by commas."),
    P.ParityPrompt("fox", "test", "Repeat three times: the quick brown fox jumps over the lazy dog."),
]
ALPHA = 1e-3


class ScriptProposer:
    """Proposes script[prompt][n_generated : n_generated + k] as a point mass."""

    name = "script"
    costly = False

    def __init__(self, scripts: dict[tuple[int, ...], list[int]]) -> None:
        self.scripts = scripts

    def open(self, prompt_tokens, sampling):
        return _Session(self.scripts.get(tuple(prompt_tokens), []))

    def close(self) -> None:
        pass


class _Session:
    def __init__(self, script: list[int]) -> None:
        self.script, self.n = script, 0

    def propose(self, k: int) -> Draft:
        return Draft(tokens=tuple(self.script[self.n: self.n + k]))

    def accept(self, tokens, n_drafted_accepted: int) -> None:
        self.n += len(tokens)

    def close(self, completed: bool) -> None:
        pass


@pytest.fixture(scope="module")
def engine(engine_factory):
    # a dedicated engine: the test attaches its own proposer
    return engine_factory("smollm2-135m", proposer="none", adaptive=False, max_draft=2, n_ctx=1024)


def _attach(engine, name: str, corrupt: bool, chat: bool = True, prompts=PROMPTS) -> str:
    engine.add_proposer(name, _script(engine, corrupt, chat, prompts))
    return name


def _script(engine, corrupt: bool, chat: bool, prompts) -> ScriptProposer:
    scripts = {}
    for pr in prompts:
        params = GenerationParams(max_tokens=24, chat=chat)
        res = engine.generate(pr.prompt, params, proposer="none")
        toks = list(res.tokens)
        if corrupt:  # every fourth token wrong; a period of 4 against 3-token passes moves the
            # wrong token across draft offsets, so steps accept 0, 1 and 2 drafts
            toks = [(t + 1) % engine.target.n_vocab if i % 4 == 2 else t for i, t in enumerate(toks)]
        scripts[tuple(engine.prompt_tokens(pr.prompt, params))] = toks
    return ScriptProposer(scripts)


def test_greedy_parity_is_identical_with_rejections(engine):
    name = _attach(engine, "script-greedy", corrupt=True)
    outs = list(P.greedy_parity(engine, PROMPTS, [name], max_tokens=20, tolerance=0.0))
    assert len(outs) == len(PROMPTS)
    for o in outs:
        assert o.drafted > 0 and 0 < o.accepted < o.drafted, o
        assert o.bitwise, o


def test_point_mass_sampling_reproduces_plain_tokens_for_the_same_seed(engine):
    """Sample-and-compare consumes one uniform per emitted token, exactly like plain sampling."""
    name = _attach(engine, "script-seed", corrupt=False)
    drafted = 0
    for seed in range(4):
        sp = SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        gp = GenerationParams(max_tokens=16, sampling=sp)
        plain = engine.generate(PROMPTS[0].prompt, gp, proposer="none")
        spec = engine.generate(PROMPTS[0].prompt, gp, proposer=name)
        assert spec.tokens == plain.tokens, seed
        drafted += spec.stats.drafted
    assert drafted > 0


def test_sampling_parity_passes(engine):
    # raw prompts (no chat template) keep the 60 prefills short
    name = _attach(engine, "script-sampling", corrupt=False, chat=False)
    report = P.ConfigReport(name, alpha=ALPHA)
    report.sampling.extend(P.sampling_parity(engine, PROMPTS[:1], [name], SamplingParams(temperature=0.8),
                                             n_seeds=30, positions=3, chat=False))
    assert report.n_tests == 4
    assert report.sampling_ok, report.to_json()


# SmolLM2 continues this raw text with " Berlin" (p 0.96 at temperature 1), then "." (p 0.76):
# the first verified position holds a drafted token with p near neither 0 nor 1, where a
# verifier without the residual correction shifts the law most ((1 - p) p of mass).
DETECT_PROMPT = P.ParityPrompt("germany", "test", "The capital of France is Paris. The capital of Germany is")


@pytest.mark.slow
def test_broken_acceptance_is_detected_on_a_real_model(engine):
    name = _attach(engine, "script-broken", corrupt=False, chat=False, prompts=[DETECT_PROMPT])
    sp = SamplingParams(temperature=1.0)
    good, bad = P.ConfigReport(name, alpha=ALPHA), P.ConfigReport("broken", alpha=ALPHA)
    good.sampling.extend(P.sampling_parity(engine, [DETECT_PROMPT], [name], sp, n_seeds=200, positions=3,
                                           chat=False))
    with P.broken_acceptance():
        bad.sampling.extend(P.sampling_parity(engine, [DETECT_PROMPT], [name], sp, n_seeds=200,
                                              positions=3, chat=False))
    assert good.sampling_ok, good.to_json()
    assert not bad.sampling_ok, bad.to_json()
