"""Draft trees on a real model (SmolLM2-135M): greedy output with tree passes equals the
plain path token for token, and the trees really ran (several branches, some accepted
paths off the first branch).

The engine serves three sequences and sets two aside for branches (Loop.tree_seqs);
its cost curve is replaced by a GPU-like flat one so that the sizing verifies trees
wherever the suffix trees offer a second continuation (on this CPU's own curve it
mostly keeps linear drafts, docs/trees.md)."""
from __future__ import annotations

import os

import pytest

from edgespec import GenerationParams
from edgespec.calibration.curve import Calibration
from edgespec.config import EngineConfig
from edgespec.engine.engine import Engine
from edgespec.runtime.kernel import KernelConfig

PROMPTS = [
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Rewrite this code with better names:\n\ndef f(a, b):\n    c = a + b\n    d = c * 2\n"
    "    return d\n\n"
    "def g(a, b):\n    c = a - b\n    d = c * 2\n    return d\n\ndef h(a, b):\n    c = a * b\n"
    "    d = c * 2\n    return d\n",
    "Summarize: The cat sat on the mat. The dog sat on the log. The cat and the dog sat on "
    "the mat and the log. The bird sat on the cat, the dog and the log.",
]


@pytest.fixture(scope="module")
def engine(model_path):
    eng = Engine.from_config(EngineConfig(
        target=str(model_path("smollm2-135m")), proposer="suffix", n_ctx=2048, parallel=3,
        threads=int(os.environ.get("EDGESPEC_TEST_THREADS", "2")),
        # the tree's KV bookkeeping is under test, not the kernel: Q8_0 KV with flash
        # attention keeps a pass's rows on the single-token path (docs/parity.md), where
        # the default mode's measured choice (F16 KV on some CPUs) drifts at near-ties
        kernel=KernelConfig(),
        proposer_options={"suffix": {"use_global": False}}))
    cal = eng.calibration()
    eng.upkeep.curve = Calibration.linear(0.02, step_seconds=cal.step_seconds)
    eng.loop.tree_seqs = (1, 2)
    yield eng
    eng.close()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tree_output_equals_plain(engine, prompt):
    params = GenerationParams(max_tokens=96)
    plain = engine.generate(prompt, params, proposer="none")
    tree = engine.generate(prompt, params, proposer="suffix")
    assert tree.tokens == plain.tokens
    assert tree.text == plain.text


def test_trees_ran_and_left_the_first_branch(engine):
    params = GenerationParams(max_tokens=128)
    passes = off = 0
    for prompt in PROMPTS:
        s = engine.generate(prompt, params, proposer="suffix").stats
        passes += s.tree_passes
        off += s.tree_off_first
        assert s.drafted >= s.accepted
    # how many passes the adaptive controller spends on trees depends on the pass times it
    # measures (1-3 in repeated runs); that trees run and a path leaves the first branch
    # does not
    assert passes >= 1
    assert off >= 1


def test_sampling_parity_passes_with_trees(engine, monkeypatch):
    """The parity harness (plain vs speculative samples, disjoint seeds) on a raw prompt
    whose context was continued two ways, so that the suffix tree offers both."""
    from edgespec.lab.analysis import parity as P
    from edgespec.loop import treepass
    from edgespec.api.params import SamplingParams

    passes = []
    real = treepass.complete

    def counting(loop, ps, rows, secs):
        passes.append(ps.tree.width)
        return real(loop, ps, rows, secs)

    monkeypatch.setattr(treepass, "complete", counting)
    # " red" comes first either way; the suffix tree then holds " and" and " or"
    prompt = P.ParityPrompt("branches", "test", "Q: the colour? A: red and blue. Q: the colour? "
                            "A: red or green. Q: the colour? A:")
    report = P.ConfigReport("suffix", alpha=1e-3)
    report.sampling.extend(P.sampling_parity(engine, [prompt], ["suffix"],
                                             SamplingParams(temperature=1.0), n_seeds=40,
                                             positions=5, chat=False))
    assert report.sampling_ok, report.to_json()
    assert passes and max(passes) >= 2  # tree passes with several branches ran
