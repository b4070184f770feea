"""GGUF headers that lie are refused before anything is sized by them: repeated keys or
tensor names, tokenizer arrays of the wrong type or length, a vocabulary that does not match
the embedding matrix, absurd context lengths or block counts. Each is one ModelError line from
the header reader, `models add` (nothing written), `plan`'s facts and the model loader (llama.cpp
never called)."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gguf_rewrite import gguf_string, kv_u32, rewrite

from edgespec.errors import ModelError
from edgespec.runtime.gguf_facts import read_facts
from edgespec.runtime.gguf_header import read_gguf_header


def write_model(path: Path, vocab: int = 8, embd_rows: int | None = None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_context_length(256)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab)])
    w.add_array("tokenizer.ggml.scores", [0.0] * vocab)
    w.add_array("tokenizer.ggml.token_type", [1] * vocab)
    w.add_tensor("token_embd.weight", np.zeros((embd_rows or vocab, 32), np.float32))
    w.add_tensor("blk.0.attn_k.weight", np.zeros((32, 32), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _array(key: str, etype: int, values: bytes, count: int) -> bytes:
    return gguf_string(key) + struct.pack("<IIQ", 9, etype, count) + values


def _u64(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<IQ", 10, value)


def _duplicate_tensor(path: Path) -> Path:
    """A hand-made header: no metadata, two tensors of the same name."""
    def info(offset: int) -> bytes:  # name, 1 dim of 32, type F32, offset
        return gguf_string("w") + struct.pack("<IQIQ", 1, 32, 0, offset)
    head = b"GGUF" + struct.pack("<IQQ", 3, 2, 0) + info(0) + info(128)
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + b"\0" * 256)
    return path


def _cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = write_model(tmp_path / "good.gguf")
    def variant(name, **kw):
        return rewrite(good, tmp_path / f"{name}.gguf", **kw)
    return {
        "repeated key": (variant("dup", extra=[kv_u32("llama.context_length", 512)]),
                         "'llama.context_length' appears twice"),
        "repeated tensor": (_duplicate_tensor(tmp_path / "duptensor.gguf"),
                            "tensor 'w' appears twice"),
        "tokens not strings": (variant("tok", replace={"tokenizer.ggml.tokens": _array(
            "tokenizer.ggml.tokens", 4, struct.pack("<8I", *range(8)), 8)}),
            "tokenizer.ggml.tokens must be an array of strings"),
        "scores too short": (variant("scores", replace={"tokenizer.ggml.scores": _array(
            "tokenizer.ggml.scores", 6, struct.pack("<3f", 0, 0, 0), 3)}),
            "tokenizer.ggml.scores has 3 entries for 8 tokens"),
        "vocabulary vs embedding": (write_model(tmp_path / "embd.gguf", vocab=8, embd_rows=16),
                                    "the vocabulary has 8 tokens but token_embd.weight has 16"),
        "absurd context": (variant("ctx", replace={"llama.context_length": _u64(
            "llama.context_length", 1 << 40)}), "llama.context_length is 1099511627776"),
        "absurd block count": (variant("blocks", replace={"llama.block_count": kv_u32(
            "llama.block_count", 1_000_000)}), "llama.block_count is 1000000"),
    }


def test_the_good_file_passes(tmp_path):
    info = read_gguf_header(write_model(tmp_path / "good.gguf"))
    assert info.vocab_size == 8 and info.context_length == 256


def test_each_lie_is_refused_by_the_header_reader_and_plans_facts(tmp_path):
    for name, (path, message) in _cases(tmp_path).items():
        with pytest.raises(ModelError) as e:
            read_gguf_header(path)
        assert message in str(e.value), (name, str(e.value))
        assert "\n" not in str(e.value)
        with pytest.raises(ModelError, match="GGUF|appears|must be|entries|vocabulary|outside"):
            read_facts(path)  # what `edgespec plan` reads


def test_models_add_refuses_each_lie_writing_nothing(tmp_path, monkeypatch):
    from edgespec.cli import cli

    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    for i, (name, (path, message)) in enumerate(_cases(tmp_path).items()):
        r = CliRunner().invoke(cli, ["models", "add", f"bad-{i}", str(path)])
        assert r.exit_code != 0 and message in r.output, (name, r.output)
        assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "home" / "models.toml").exists()


def test_the_loader_refuses_before_llama_cpp_sees_the_file(tmp_path, monkeypatch):
    from edgespec.runtime import model as runtime_model

    def never(*_a, **_k):
        raise AssertionError("llama.cpp was asked to load a file the header check refuses")

    monkeypatch.setattr(runtime_model._ll, "llama_model_load_from_file", never, raising=False)
    for name, (path, message) in _cases(tmp_path).items():
        with pytest.raises(ModelError, match="appears|must be|entries|vocabulary|outside"):
            runtime_model.load_model(path)


def test_real_models_pass(model_path):
    for name in ("smollm2-135m", "qwen-0.5b"):
        info = read_gguf_header(model_path(name))
        assert info.vocab_size and info.context_length
