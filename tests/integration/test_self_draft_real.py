"""Self-speculation on real models: the target drafts for itself with a subset of its own
layers (SmolLM2-135M: 30 layers, fast, batch-invariant at short context)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgespec.lab.analysis import parity as P
from edgespec.cli import cli
from edgespec.engine.engine import Engine
from edgespec.errors import InvalidInputError
from edgespec.api.params import SamplingParams

PROMPTS = [
    P.ParityPrompt("count", "test", "Count from one to twenty in words, separated by commas."),
    P.ParityPrompt("fox", "test", "Repeat three times: the quick brown fox jumps over the lazy dog."),
]
LAYERS = "0-9,20-29"  # the first and last ten blocks


@pytest.fixture(scope="module")
def engine(model_path, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGESPEC_HOME", str(tmp_path_factory.mktemp("selfhome")))
    eng = Engine.load(str(model_path("smollm2-135m")), proposer="self", adaptive=False,
                      max_draft=2, exact=True, n_ctx=1024, threads=2, pull=False,
                      proposer_options={"self": {"layers": LAYERS}})
    yield eng
    eng.close()
    mp.undo()


def test_the_self_draft_keeps_the_asked_layers_of_the_target(engine):
    prop = engine.proposers["self"]
    assert prop.layers.key == LAYERS.replace(",", ".")
    assert prop.model.n_layer == 20 and engine.target.n_layer == 30
    assert prop.model.n_vocab == engine.target.n_vocab


def test_self_speculation_is_lossless_under_greedy(engine):
    outs = list(P.greedy_parity(engine, PROMPTS, ["self"], max_tokens=32, tolerance=0.0))
    for o in outs:
        assert o.bitwise, o
        assert o.drafted > 0 and o.accepted > 0, o


def test_self_speculation_passes_sampling_parity(engine):
    report = P.ConfigReport("self", alpha=1e-3)
    report.sampling.extend(P.sampling_parity(engine, PROMPTS[1:], ["self"],
                                             SamplingParams(temperature=0.8), n_seeds=30,
                                             positions=3, chat=False))
    assert report.sampling_ok, report.to_json()


def test_generate_runs_self_speculation_from_the_cli(model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    args = ["generate", "--target", str(model_path("smollm2-135m")), "--proposer", "self",
            "--no-adaptive", "--max-draft", "2", "--max-tokens", "12", "--stats",
            "-O", "self.layers=first:12", "Count from one to ten:"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "proposer self" in r.output and "building the self-draft" in r.output
    assert list((tmp_path / "self-drafts").glob("*-0-11.gguf"))


def test_a_layer_set_out_of_range_is_refused_before_anything_is_built(model_path, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    with pytest.raises(InvalidInputError, match="layer 40 is out of range; the target has "
                                                "layers 0..29"):
        Engine.load(str(model_path("smollm2-135m")), proposer="self", adaptive=False,
                    pull=False, proposer_options={"self": {"layers": "0-3,40"}})
    assert not (tmp_path / "self-drafts").exists() or not list((tmp_path / "self-drafts").iterdir())
    r = CliRunner().invoke(cli, ["generate", "--target", "x.gguf", "-O", "self.depth=3", "hi"])
    assert r.exit_code == 2 and "unknown self option 'depth'" in r.output
