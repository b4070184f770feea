"""edgespec.registry.optimize: the per-tensor type lines handed to llama-quantize, every
refusal (nothing to re-lay, no quantizer, a failing or wrong quantizer, no room, Ctrl-C:
each leaves no file and no entry), the registry round trip of a copy with its source's
digest, and a stale source. A fake quantizer (tests/quantize_fakes.py, gguf-py inside)
stands in for llama-quantize; tests/integration/test_optimize_real.py runs the real one."""
from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgespec import paths, registry
from edgespec.errors import ModelError
from edgespec.registry import optimize, user
from edgespec.runtime.gguf_header import TensorInfo, read_gguf_header
from quantize_fakes import F32, Q4_K, Q6_K, Q8_0, fake_quantizer, write_model


def _t(name: str, shape: tuple[int, ...], ggml_type: int) -> TensorInfo:
    return TensorInfo(name=name, shape=shape, ggml_type=ggml_type, offset=0, nbytes=0)


def test_relayout_names_every_matrix_and_moves_only_q6_k():
    tensors = [_t("output.weight", (1536, 151936), Q6_K), _t("token_embd.weight", (1536, 151936), Q4_K),
               _t("blk.0.attn_v.weight", (1536, 256), Q6_K), _t("blk.0.attn_v.bias", (256,), F32),
               _t("blk.0.attn_norm.weight", (1536,), F32), _t("blk.1.ffn_down.weight", (8960, 1536), Q4_K),
               _t("blk.1.ffn_gate_inp.weight", (1536, 8), F32)]
    lines = optimize.relayout_types(tensors)
    assert lines == [r"^output\.weight$=q8_0", r"^token_embd\.weight$=q4_k",
                     r"^blk\.0\.attn_v\.weight$=q8_0", r"^blk\.1\.ffn_down\.weight$=q4_k",
                     r"^blk\.1\.ffn_gate_inp\.weight$=f32"]  # a 2-D F32 stays F32, named
    # anchored: layer 1's pattern does not also match layer 11 or 21
    assert not re.search(lines[3].split("=")[0], "blk.11.ffn_down.weight")
    with pytest.raises(ModelError, match="type 99 has no name"):
        optimize.relayout_types([_t("x.weight", (32, 32), 99)])


def test_default_names():
    assert optimize.default_name("qwen-1.5b") == "qwen-1.5b-q8"
    assert optimize.default_name("/m/Qwen2.5-Coder 1.5B.Q4_K_M.gguf") == \
        "qwen2.5-coder-1.5b.q4_k_m-q8"


@pytest.fixture
def fake_quantize(tmp_path):
    return fake_quantizer(tmp_path)


@pytest.fixture
def source(world, tmp_path):
    """A Q6_K-holding model registered in the user registry as "tiny-q6"."""
    path = write_model(tmp_path / "tiny-q6.gguf")
    user.add("tiny-q6", path, progress=lambda m: None)
    return path


def _left(home: Path) -> list[str]:
    """What a run left in the models folder: files other than locks and stamps."""
    folder = home / "models"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith((".lock", ".verified"))
                  and p.is_file()) if folder.is_dir() else []


def test_a_copy_is_registered_with_its_own_digest_and_its_source(world, source, fake_quantize):
    made = optimize.optimize("tiny-q6", quantize=fake_quantize, threads=1, progress=lambda m: None)
    spec = registry.load_registry().get("tiny-q6-q8")
    assert made.spec == spec and made.changed == ("blk.0.m0.weight",) and not made.replaced
    assert spec.path == world.home / "models" / "tiny-q6-q8.gguf"
    assert spec.sha256 == registry.sha256_file(spec.path) != registry.load_registry().get("tiny-q6").sha256
    assert (spec.derived.source, spec.derived.change) == ("tiny-q6", "q6_k->q8_0")
    assert spec.derived.sha256 == registry.sha256_file(source)
    info = read_gguf_header(spec.path)
    assert {t.name: t.ggml_type for t in info.tensors} == {
        "blk.0.m0.weight": Q8_0, "blk.0.m1.weight": Q4_K, "blk.0.norm.weight": F32}
    assert made.size_after == info.file_size > made.size_before
    assert registry.verify("tiny-q6-q8", progress=lambda m: None).ok
    assert optimize.source_check(spec).stale is False
    assert optimize.copies_of("tiny-q6", spec.derived.sha256) == [spec]
    assert _left(world.home) == ["tiny-q6-q8.gguf"]
    # taken: refused without --force, remade with it
    with pytest.raises(ModelError, match="--force makes it again"):
        optimize.optimize("tiny-q6", quantize=fake_quantize, progress=lambda m: None)
    again = optimize.optimize("tiny-q6", quantize=fake_quantize, force=True, progress=lambda m: None)
    assert again.replaced and again.spec.sha256 == spec.sha256


def test_a_changed_source_makes_the_copy_stale(world, source, fake_quantize):
    optimize.optimize("tiny-q6", quantize=fake_quantize, progress=lambda m: None)
    copy = registry.load_registry().get("tiny-q6-q8")
    write_model(source, types=(Q6_K, Q6_K))  # the source file is replaced by another
    check = optimize.source_check(copy, progress=lambda m: None)
    assert check.stale and "optimize tiny-q6 --name tiny-q6-q8 --force" in check.message
    assert optimize.copies_of("tiny-q6", registry.sha256_file(source)) == []
    # a source re-pinned in the registry is stale without hashing
    user.remove("tiny-q6")
    user.add("tiny-q6", source, progress=lambda m: None)
    assert "now pinned to" in optimize.source_check(copy, hash_=False).message
    user.remove("tiny-q6")
    assert "no longer registered" in optimize.source_check(copy).message


def test_a_path_source_is_recorded_by_its_path(world, tmp_path, fake_quantize):
    src = write_model(tmp_path / "Mine.Q4_K_M.gguf")
    made = optimize.optimize(str(src), quantize=fake_quantize, progress=lambda m: None)
    assert made.spec.name == "mine.q4_k_m-q8" and made.spec.derived.source == str(src.resolve())
    assert optimize.source_check(made.spec).stale is False


@pytest.mark.parametrize("mode, says", [
    ("fail", r"(?s)fake-quantize failed \(exit 3\); nothing was kept.*disk full"),
    ("keep", r"blk\.0\.m0\.weight is Q6_K, expected Q8_0; nothing was kept"),
    ("drop", r"does not hold the source's tensors \(missing \['blk\.0\.m1\.weight'\]"),
])
def test_a_failing_or_wrong_quantizer_leaves_nothing(world, source, fake_quantize, monkeypatch,
                                                      mode, says):
    monkeypatch.setenv("FAKE_QUANTIZE", mode)
    with pytest.raises(ModelError, match=says):
        optimize.optimize("tiny-q6", quantize=fake_quantize, progress=lambda m: None)
    assert _left(world.home) == []
    assert "tiny-q6-q8" not in registry.load_registry().models


def test_ctrl_c_while_the_copy_is_hashed_leaves_nothing(world, source, fake_quantize, monkeypatch):
    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(optimize, "sha256_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        optimize.optimize("tiny-q6", quantize=fake_quantize, progress=lambda m: None)
    assert _left(world.home) == []
    assert "tiny-q6-q8" not in registry.load_registry().models


def test_refusals_before_anything_is_written(world, source, tmp_path, fake_quantize, monkeypatch):
    plain = write_model(tmp_path / "plain.gguf", types=(Q4_K,))
    with pytest.raises(ModelError, match="nothing to re-lay, it has no Q6_K tensors .*Q4_K"):
        optimize.optimize(str(plain), quantize=fake_quantize)
    with pytest.raises(ModelError, match="is a shipped model"):
        optimize.optimize("tiny-q6", name="tiny-whole", quantize=fake_quantize)
    with pytest.raises(ModelError, match="not as a copy `models optimize` made"):
        optimize.optimize("tiny-q6", name="tiny-q6", quantize=fake_quantize, force=True)
    with pytest.raises(ModelError, match="lowercase"):
        optimize.optimize("tiny-q6", name="Big", quantize=fake_quantize)
    with pytest.raises(ModelError, match="not an executable file"):
        optimize.optimize("tiny-q6", quantize=tmp_path / "absent")
    monkeypatch.setenv(paths.ANCHORS_ENV, str(tmp_path / "no-tools"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    with pytest.raises(ModelError, match="llama-quantize not found .*`make anchors` builds it"):
        optimize.optimize("tiny-q6")
    monkeypatch.setattr(optimize.shutil, "disk_usage", lambda p: SimpleNamespace(free=100))
    with pytest.raises(ModelError, match="needs about .* free some space"):
        optimize.optimize("tiny-q6", quantize=fake_quantize)
    assert _left(world.home) == []
    assert "tiny-q6-q8" not in registry.load_registry().models


def test_the_quantizer_is_found_beside_the_anchors(tmp_path, monkeypatch):
    tool = tmp_path / "llama-quantize"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.setenv(paths.ANCHORS_ENV, str(tmp_path))
    assert optimize.find_quantize() == tool
