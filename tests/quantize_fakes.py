"""A small GGUF model holding Q6_K tensors, and a fake llama-quantize (a script, gguf-py
inside) for `edgespec models optimize` tests (edgespec.registry.optimize) without llama.cpp."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np

Q4_K, Q6_K, Q8_0, F32 = 12, 14, 8, 0


def write_model(path: Path, types=(Q6_K, Q4_K)) -> Path:
    """A small GGUF model: one 2x256 matrix per type in ``types``, and a norm."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_block_count(1)
    w.add_string("general.name", "tiny q6 model")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_K_M))
    for i, t in enumerate(types):
        qt = gguf.GGMLQuantizationType(t)
        block, size = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor(f"blk.0.m{i}.weight", np.full((2, 256 // block * size), i, np.uint8),
                     raw_dtype=qt)
    w.add_tensor("blk.0.norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


#: llama-quantize's command line, gguf-py inside; FAKE_QUANTIZE says how to misbehave
FAKE = textwrap.dedent('''\
    import os, re, sys
    import numpy as np
    import gguf
    args = sys.argv[1:]
    assert args[0] == "--allow-requantize" and args[1] == "--tensor-type-file"
    types_file, src, out, ftype, threads = args[2:7]
    assert ftype == "Q4_K_M" and int(threads) >= 1
    mode = os.environ.get("FAKE_QUANTIZE", "ok")
    if mode == "fail":
        open(out, "wb").write(b"GGUF partial")
        print("llama_model_quantize: failed to quantize: disk full")
        sys.exit(3)
    rules = [line.rsplit("=", 1) for line in open(types_file).read().split()]
    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(out, "llama")
    w.add_context_length(128)
    w.add_block_count(1)
    for t in r.tensors:
        kind = next((k for pat, k in rules if re.match(pat, t.name)), None)
        if mode == "keep" or kind is None:
            qt = t.tensor_type
        else:
            qt = gguf.GGMLQuantizationType[kind.upper()]
        if mode == "drop" and t.name.endswith("m1.weight"):
            continue
        rows, n = int(np.prod(t.shape[1:])), int(t.shape[0])
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, np.zeros(n * rows, np.float32).reshape(rows, n) if rows > 1
                         else np.zeros(n, np.float32))
        else:
            block, size = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor(t.name, np.zeros((rows, n // block * size), np.uint8), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
''')


def fake_quantizer(folder: Path) -> Path:
    """The fake llama-quantize as an executable in ``folder``."""
    script = folder / "fake-quantize"
    script.write_text(f"#!{sys.executable}\n" + FAKE)
    script.chmod(0o755)
    return script
