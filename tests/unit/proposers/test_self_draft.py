"""Self-speculation's layer sets and its cached draft files (edgespec.proposers.self_draft_layers,
.self_draft) on a real small model."""
from __future__ import annotations

import json

import pytest

from edgespec.errors import InvalidInputError
from edgespec.proposers.self_draft_layers import LayerSet, block_count, spread, subset_layers, write_subset
from edgespec.proposers.self_draft import cache_paths, ensure_self_draft, stale_reason


def test_layer_sets_parse_in_three_forms():
    assert LayerSet.parse("first:3", 8).layers == (0, 1, 2)
    assert LayerSet.parse("skip:2-5", 8).layers == (0, 1, 6, 7)
    s = LayerSet.parse("0-1, 6-7", 8)
    assert s.layers == (0, 1, 6, 7) and s.key == "0-1.6-7" and s.fraction == 0.5
    assert LayerSet.parse("0,2,4", 8).key == "0.2.4"


@pytest.mark.parametrize("text, msg", [
    ("first:9", "layer 8 is out of range; the target has layers 0..7"),
    ("skip:6-9", "layer 8 is out of range"),
    ("0-3,12", "layer 12 is out of range"),
    ("first:8", "keeps all 8 layers"),
    ("skip:0-7", "keeps no layer"),
    ("5-2", "runs backwards"),
    ("every:2", "unknown form 'every'"),
    ("first:x", "not a layer count"),
    ("", "an empty layer set"),
])
def test_bad_layer_sets_say_what_is_wrong(text, msg):
    with pytest.raises(InvalidInputError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        LayerSet.parse(text, 8)


def test_spread_keeps_the_ends():
    assert list(spread(8, 4)) == [0, 1, 6, 7]
    assert list(spread(9, 3)) == [0, 1, 8]


@pytest.fixture(scope="module")
def small(model_path):
    return model_path("smollm2-135m")


def test_a_subset_file_loads_with_the_kept_layers_and_the_targets_vocabulary(small, tmp_path):
    from edgespec.runtime.model import load_model
    n = block_count(small)
    layers = LayerSet.parse(f"0-3,{n - 4}-{n - 1}", n)
    out = write_subset(small, tmp_path / "d.gguf", layers)
    assert subset_layers(out) == layers.key and block_count(out) == 8
    assert not list(tmp_path.glob("*.part"))
    t, d = load_model(small), load_model(out)
    try:
        assert d.n_layer == 8 and d.n_vocab == t.n_vocab
        assert [d.token_text(i) for i in range(100, 110)] == [t.token_text(i) for i in range(100, 110)]
        ctx = d.new_context(n_ctx=64)
        row = ctx.decode(d.tokenize("The capital of France is"), 0, logits="last")[0]
        assert row.shape == (t.n_vocab,) and row.std() > 0  # a working model, not zeros
        ctx.close()
    finally:
        t.close()
        d.close()


def test_the_cache_is_reused_and_rebuilt_when_corrupt_or_stale(small, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    n = block_count(small)
    layers, said = LayerSet.parse("first:4", n), []
    sha = "ab" * 32
    path = ensure_self_draft(small, sha, layers, said.append)
    assert path == cache_paths(sha, layers)[0] and said[-1].startswith("building")
    mtime = path.stat().st_mtime_ns
    assert ensure_self_draft(small, sha, layers, said.append) == path
    assert path.stat().st_mtime_ns == mtime and len(said) == 1  # reused, silently
    with open(path, "r+b") as f:  # truncated, as by a full disk
        f.truncate(path.stat().st_size // 2)
    assert "bytes" in stale_reason(path, cache_paths(sha, layers)[1], sha, layers)
    ensure_self_draft(small, sha, layers, said.append)
    assert said[-1].startswith("rebuilding") and "bytes" in said[-1]
    assert subset_layers(path) == layers.key
    record = cache_paths(sha, layers)[1]
    record.write_text("{not json")
    ensure_self_draft(small, sha, layers, said.append)
    assert "missing or corrupt" in said[-1] and json.loads(record.read_text())["layers"] == "0-3"
    # another target's digest never reuses this file
    assert "another target" in stale_reason(path, record, "cd" * 32, layers)


def test_auto_never_weighs_self_speculation_but_it_can_be_asked_for():
    from edgespec.planner.search import _kinds
    assert "self" not in [k for k, _ in _kinds("auto", has_draft=True)]
    assert ("self", False) in _kinds("self", has_draft=False)
    assert ("self", True) in _kinds("self", has_draft=True)  # its derived model described
