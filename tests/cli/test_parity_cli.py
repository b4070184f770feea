"""`edgespec parity`'s configurations: any registered proposer, asked-only ones included
(the real runs are in tests/integration/test_mtp_real.py)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from edgespec.cli import cli
from edgespec.cli.parity import _configs, _label
from edgespec.errors import InvalidInputError
from edgespec.proposers import REGISTRY


def test_an_unknown_proposer_is_refused_before_anything_loads():
    r = CliRunner().invoke(cli, ["parity", "--target", "/nonexistent.gguf", "--proposers",
                                 "ngram,warp"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "unknown: warp" in r.output and "lookahead" in r.output and "mtp" in r.output


@pytest.mark.parametrize("name", [n for n, s in REGISTRY.items() if "draft_model" not in s.needs])
def test_every_registered_proposer_without_a_draft_model_is_a_configuration(name):
    assert _configs(name, None) == [name]


def test_asked_only_proposers_join_the_engine_label_so_they_are_built():
    assert _label(["ngram", "self", "suffix", "mtp", "lookahead"]) == "ngram+self+mtp+lookahead"
    assert _label(["mtp"]) == "mtp" and _label(["ngram", "suffix"]) == "ngram"


def test_a_draft_model_configuration_needs_a_draft_and_duplicates_collapse():
    with pytest.raises(InvalidInputError, match="'draft' configuration needs --draft"):
        _configs("draft,ngram", None)
    assert _configs("draft, ngram,ngram", "qwen-0.5b") == ["draft", "ngram"]
    assert _configs(None, None) == ["ngram", "suffix"]
    with pytest.raises(InvalidInputError, match="comma-separated"):
        _configs(" , ", None)
