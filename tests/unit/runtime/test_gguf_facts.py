"""GGUF facts: real headers of the four registry models, synthetic files with known shapes,
and corrupt or hostile headers (a clear ModelError, never a crash or a large allocation)."""
from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec.errors import ModelError
from edgespec.runtime.gguf_facts import read_facts

# (layers, n_embd, trained ctx, vocab, kv heads, head dim, sliding window, windowed layers, tied)
REAL = {
    "qwen-1.5b": (28, 1536, 32768, 151936, 2, 128, 0, 0, False),
    "qwen-0.5b": (24, 896, 32768, 151936, 2, 64, 0, 0, False),
    "gemma-270m": (18, 640, 32768, 262144, 1, 256, 512, 15, True),
    "smollm2-135m": (30, 576, 8192, 49152, 3, 64, 0, 0, True),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_headers(model_path, name):
    path = model_path(name)
    f = read_facts(path)
    layers, embd, ctx, vocab, kv, hd, window, n_swa, tied = REAL[name]
    assert (f.n_layers, f.n_embd, f.n_ctx_train, f.n_vocab) == (layers, embd, ctx, vocab)
    assert f.n_head_kv_per_layer == (kv,) * layers
    assert (f.head_dim_k, f.head_dim_v) == (hd, hd)
    assert (f.sliding_window, f.n_swa_layers) == (window, n_swa)
    assert f.tied_embeddings is tied
    # every tensor byte is accounted for once, and the tensors are nearly the whole file
    assert sum(f.layer_bytes) + f.token_embd_bytes + f.output_bytes + f.other_bytes == f.weight_bytes
    assert sum(f.bytes_by_type.values()) == f.weight_bytes
    assert 0.9 * f.file_bytes < f.weight_bytes < f.file_bytes
    assert all(b > 0 for b in f.layer_bytes)
    assert f.kv_elems_per_token() == layers * kv * 2 * hd
    # the tensor list the memory model reads (repacked matrices, the mapped range)
    assert len(f.tensors) == f.n_tensors and sum(t.nbytes for t in f.tensors) == f.weight_bytes
    assert f.data_offset > 0 and f.data_offset + max(t.offset + t.nbytes for t in f.tensors) <= f.file_bytes


def test_gemma_window_pattern_matches_llama_cpp(model_path):
    f = read_facts(model_path("gemma-270m"))
    # llama.cpp's gemma3 default: every 6th layer (5, 11, 17) attends globally
    assert [il for il, swa in enumerate(f.swa_layers) if not swa] == [5, 11, 17]


@pytest.mark.slow  # GGUFReader walks every tokenizer string: ~15 s on a busy 2-core box
def test_tensor_bytes_agree_with_gguf_reader(model_path):
    import gguf

    path = model_path("smollm2-135m")
    r = gguf.GGUFReader(str(path))
    assert read_facts(path).weight_bytes == sum(int(t.n_bytes) for t in r.tensors)


# --- synthetic files ------------------------------------------------------------------------
def write_model(path: Path, arch: str = "llama", layers: int = 2, embd: int = 64, heads: int = 4,
                kv_heads=2, ctx: int = 256, vocab: int = 8, window: int = 0, tied: bool = False,
                merges: int = 0) -> Path:
    import gguf

    hd = embd // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_embedding_length(embd)
    w.add_feed_forward_length(2 * embd)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads if isinstance(kv_heads, int) else max(kv_heads))
    w.add_context_length(ctx)
    if window:
        w.add_sliding_window(window)
    w.add_string("general.name", "synthetic")
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(vocab)])
    if merges:
        w.add_array("tokenizer.ggml.merges", [f"a b{i}" for i in range(merges)])
    per_layer = kv_heads if not isinstance(kv_heads, int) else [kv_heads] * layers
    w.add_tensor("token_embd.weight", np.zeros((vocab, embd), np.float32))
    for il in range(layers):
        w.add_tensor(f"blk.{il}.attn_q.weight", np.zeros((embd, embd), np.float16))
        w.add_tensor(f"blk.{il}.attn_k.weight", np.zeros((per_layer[il] * hd, embd), np.float16))
        w.add_tensor(f"blk.{il}.attn_norm.weight", np.zeros(embd, np.float32))
    if not tied:
        w.add_tensor("output.weight", np.zeros((vocab, embd), np.float16))
    w.add_tensor("output_norm.weight", np.zeros(embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_synthetic_sizes(tmp_path):
    f = read_facts(write_model(tmp_path / "m.gguf", layers=3, embd=64, heads=4, kv_heads=2, vocab=8,
                               merges=5))
    hd = 16
    layer = 64 * 64 * 2 + 2 * hd * 64 * 2 + 64 * 4
    assert f.layer_bytes == (layer,) * 3
    assert f.token_embd_bytes == 8 * 64 * 4
    assert f.output_bytes == 8 * 64 * 2
    assert f.other_bytes == 64 * 4
    assert f.bytes_by_type == {"F16": 3 * (64 * 64 * 2 + 2 * hd * 64 * 2) + 8 * 64 * 2,
                               "F32": 3 * 64 * 4 + 8 * 64 * 4 + 64 * 4}
    assert (f.n_vocab, f.n_merges, f.head_dim_k, f.n_head_kv) == (8, 5, hd, 2)


def test_kv_heads_per_layer_come_from_the_k_tensors(tmp_path):
    f = read_facts(write_model(tmp_path / "m.gguf", layers=3, kv_heads=(1, 4, 2)))
    assert f.n_head_kv_per_layer == (1, 4, 2)
    assert f.kv_elems_per_token() == (1 + 4 + 2) * 2 * 16


def test_window_pattern_default_for_gemma3(tmp_path):
    f = read_facts(write_model(tmp_path / "m.gguf", arch="gemma3", layers=12, window=64))
    assert f.sliding_window == 64
    assert f.swa_layers == (True,) * 5 + (False,) + (True,) * 5 + (False,)
    # an architecture without a known pattern windows every layer (llama.cpp: pattern 0)
    f = read_facts(write_model(tmp_path / "n.gguf", arch="llama", layers=3, window=64))
    assert f.swa_layers == (True, True, True)


# --- corrupt and hostile headers ------------------------------------------------------------------
def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


HOSTILE = {
    "bad magic": b"GGML" + b"\0" * 40,
    "big-endian": b"GGUF" + struct.pack(">IQQ", 3, 0, 0),
    "version 99": _header(0, 0, version=99),
    "2^60 tensors": _header(1 << 60, 0),
    "2^60 metadata": _header(0, 1 << 60),
    "2^62 tokens": _header(0, 1) + _s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 1 << 62),
    "2^63 string": _header(0, 1) + _s(b"general.name") + struct.pack("<IQ", 8, 1 << 63),
    "2^63 key": _header(0, 1) + struct.pack("<Q", 1 << 63),
    "unknown value type": _header(0, 1) + _s(b"k") + struct.pack("<I", 77),
    "nested arrays": _header(0, 1) + _s(b"k") + struct.pack("<IIQ", 9, 9, 1 << 40),
    "tensor with 2^31 dims": _header(1, 0) + _s(b"t") + struct.pack("<I", 1 << 31),
    "no metadata": _header(0, 0),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_fail_cleanly_and_small(tmp_path, case):
    path = tmp_path / "bad.gguf"
    path.write_bytes(HOSTILE[case] + b"\0" * 64)
    tracemalloc.start()
    try:
        with pytest.raises(ModelError) as err:
            read_facts(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(err.value)
    assert peak < 2 * 2**20, f"{case}: parsing allocated {peak} bytes"


def test_missing_required_keys(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    w.add_context_length(128)
    w.add_tensor("blk.0.x", np.zeros(32, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ModelError, match="block_count"):
        read_facts(tmp_path / "m.gguf")


def test_truncated_tensor_data(tmp_path):
    path = write_model(tmp_path / "m.gguf")
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ModelError, match="truncated"):
        read_facts(path)


def test_unknown_tensor_type(tmp_path):
    path = write_model(tmp_path / "m.gguf", layers=1)
    data = bytearray(path.read_bytes())
    # the first tensor info: name "token_embd.weight", 2 dims, then its u32 type (F32 = 0)
    at = data.index(b"token_embd.weight") + len(b"token_embd.weight") + 4 + 16
    assert struct.unpack_from("<I", data, at)[0] == 0
    struct.pack_into("<I", data, at, 9999)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="type 9999"):
        read_facts(path)


@pytest.mark.parametrize("make", ["missing", "empty", "directory"])
def test_not_a_file(tmp_path, make):
    path = tmp_path / "x.gguf"
    if make == "empty":
        path.write_bytes(b"")
    elif make == "directory":
        path.mkdir()
    with pytest.raises(ModelError):
        read_facts(path)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> bytes:
    return write_model(tmp_path_factory.mktemp("fuzz") / "m.gguf", layers=2, vocab=4).read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_corruption_is_a_model_error_or_a_result(tmp_path, small_model, data):
    buf = bytearray(small_model)
    header_end = min(len(buf), 1200)
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, header_end - 1))
        buf[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(bytes(buf))
    try:
        f = read_facts(path)
    except ModelError:
        return
    assert f.weight_bytes <= len(buf)
    assert f.n_layers == len(f.layer_bytes)


def test_nextn_layers_come_from_the_header(tmp_path):
    plain = read_facts(write_model(tmp_path / "plain.gguf", layers=3))
    assert (plain.nextn_predict_layers, plain.mtp_bytes) == (0, 0)
    import gguf
    path = write_model(tmp_path / "mtp.gguf", layers=3)
    # the same model with its last block declared a NextN (MTP) layer
    r = gguf.GGUFReader(str(path))
    w = gguf.GGUFWriter(str(tmp_path / "mtp2.gguf"), "llama")
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    w.add_uint32("llama.nextn_predict_layers", 1)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = read_facts(tmp_path / "mtp2.gguf")
    assert f.nextn_predict_layers == 1 and f.mtp_bytes == f.layer_bytes[2] > 0
