"""Lookahead decoding on a real model (Qwen2.5-0.5B): greedy output is the plain path's
bit for bit, sampling passes the parity harness, the Jacobi rows of real passes reach the
pool, and the CLI builds it and refuses bad knobs. Correctness only: speed is the bench's."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgespec.lab.analysis import parity as P
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.cli import cli
from edgespec.engine.engine import Engine

PROMPTS = [
    P.ParityPrompt("count", "test", "Count from one to twenty in words, separated by commas."),
    P.ParityPrompt("fox", "test", "Repeat three times: the quick brown fox jumps over the lazy dog."),
    P.ParityPrompt("code", "test", "Write a Python function that returns the squares of 1 to 10."),
]


@pytest.fixture(scope="module")
def engine(model_path):
    eng = Engine.load(str(model_path("qwen-0.5b")), proposer="lookahead", adaptive=False,
                      max_draft=2, exact=True, n_ctx=1024, threads=2, pull=False,
                      proposer_options={"lookahead": {"n": 4, "window": 8}})
    yield eng
    eng.close()


def test_lookahead_is_lossless_under_greedy(engine):
    assert engine.proposers["lookahead"].window == 8
    outs = list(P.greedy_parity(engine, PROMPTS, ["lookahead"], max_tokens=32, tolerance=0.0))
    for o in outs:
        assert o.bitwise, o
    assert sum(o.drafted for o in outs) > 0 and sum(o.accepted for o in outs) > 0


def test_real_rows_feed_the_pool(engine):
    prop = engine.proposers["lookahead"]
    opened = []
    orig = prop.open
    prop.open = lambda toks, sp: opened.append(orig(toks, sp)) or opened[-1]
    try:
        engine.generate(PROMPTS[1].prompt, GenerationParams(max_tokens=24))
    finally:
        del prop.open
    assert opened and opened[0].jacobi_ngrams > 0


def test_lookahead_passes_sampling_parity(engine):
    report = P.ConfigReport("lookahead", alpha=1e-3)
    report.sampling.extend(P.sampling_parity(engine, PROMPTS[1:2], ["lookahead"],
                                             SamplingParams(temperature=0.8), n_seeds=30,
                                             positions=3, chat=False))
    assert report.sampling_ok, report.to_json()


def test_generate_runs_lookahead_from_the_cli_and_refuses_bad_knobs(model_path):
    target = str(model_path("qwen-0.5b"))
    r = CliRunner().invoke(cli, ["generate", "--target", target, "--proposer", "lookahead",
                                 "--no-adaptive", "--max-draft", "2", "--max-tokens", "12",
                                 "--stats", "-O", "lookahead.n=3", "Count from one to ten:"])
    assert r.exit_code == 0, r.output
    assert "proposer lookahead" in r.output
    r = CliRunner().invoke(cli, ["generate", "--target", target, "--proposer", "lookahead",
                                 "-O", "lookahead.window=0", "hi"])
    assert r.exit_code == 1 and "lookahead window=0 is out of range: it must be in [1, 64]" \
        in r.output, r.output
