"""A padded-vocabulary pair on real models: qwen-1.5b (151,936 tokens) drafted for by a copy
of qwen-0.5b padded to 152,064 tokens, as the Qwen2.5 7B+ files are (``padded_vocab``).

The copy's pad rows are adversarial: its raw argmax lands on pad ids at most positions, so
these tests also show that the engine never lets a draft propose an id the target lacks.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.lab.analysis import parity as P
from edgespec.cli import cli
from edgespec.engine.engine import Engine
from edgespec.api.params import SamplingParams

sys.path.insert(0, str(Path(__file__).parent))
from padded_vocab import pad_vocabulary  # noqa: E402

PADDED = 152_064
RENAMED = 1000  # a real token whose text the "other tokenizer" copy changes
PROMPTS = [
    P.ParityPrompt("mean", "code", "Write a Python function that returns the mean of a list, "
                                   "then call it on [1, 2, 3]."),
    P.ParityPrompt("fox", "test", "Repeat three times: the quick brown fox jumps over the lazy dog."),
]


@pytest.fixture(scope="module")
def drafts(model_path, tmp_path_factory):
    src = model_path("qwen-0.5b")
    d = tmp_path_factory.mktemp("padded")
    padded = pad_vocabulary(src, d / "qwen-0.5b-padded.gguf", PADDED)
    renamed = pad_vocabulary(src, d / "qwen-0.5b-renamed.gguf", PADDED, rename={RENAMED: "zzqx"})
    return padded, renamed


@pytest.fixture(scope="module")
def engine(model_path, drafts):
    eng = Engine.load(str(model_path("qwen-1.5b")), draft=str(drafts[0]), proposer="draft",
                      adaptive=False, max_draft=2, exact=True, n_ctx=1024, threads=2)
    yield eng
    eng.close()


def test_the_padded_copy_would_propose_ids_the_target_lacks(drafts):
    """What makes the pair a test: ranked over its whole vocabulary, the copy's best token is
    a pad id at most positions of an ordinary prompt."""
    from edgespec.runtime.model import load_model
    m = load_model(drafts[0])
    try:
        assert m.n_vocab == PADDED and m.token_text(PADDED - 1) == f"[PAD{PADDED - 1}]"
        ctx = m.new_context(n_ctx=256)
        toks = m.tokenize(PROMPTS[0].prompt, add_special=True)
        best = ctx.decode(toks, 0, logits="all").argmax(axis=1)
        ctx.close()
    finally:
        m.close()
    assert int(np.sum(best >= 151_936)) > len(best) // 2


def test_a_padded_draft_is_lossless_under_greedy(engine):
    assert engine.target.n_vocab == 151_936
    outs = list(P.greedy_parity(engine, PROMPTS, ["draft"], max_tokens=32, tolerance=0.0))
    assert len(outs) == len(PROMPTS)
    for o in outs:
        assert o.bitwise, o
        assert o.drafted > 0 and o.accepted > 0, o
    # most drafts are the same-family model's real guesses, not pad ids cut to nothing
    assert sum(o.accepted for o in outs) > 0.5 * sum(o.drafted for o in outs)


def test_a_padded_draft_passes_sampling_parity(engine):
    report = P.ConfigReport("draft", alpha=1e-3)
    report.sampling.extend(P.sampling_parity(engine, PROMPTS[1:], ["draft"],
                                             SamplingParams(temperature=0.8), n_seeds=30,
                                             positions=3, chat=False))
    assert report.n_tests == 4
    assert report.sampling_ok, report.to_json()


def test_a_pair_that_differs_at_one_real_token_is_refused_naming_it(model_path, drafts):
    r = CliRunner().invoke(cli, ["generate", "--target", str(model_path("qwen-1.5b")),
                                  "--draft", str(drafts[1]), "--proposer", "draft",
                                  "--max-tokens", "4", "hello"])
    assert r.exit_code != 0
    assert f"token {RENAMED}" in r.output and "'zzqx'" in r.output, r.output
