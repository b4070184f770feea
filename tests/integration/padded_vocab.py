"""Build a padded-vocabulary copy of a real GGUF model with the ``gguf`` package.

Qwen2.5 7B/14B/32B/72B files carry 152,064 tokens where the 0.5B carries 151,936: the
converter pads the vocabulary with ``[PAD<id>]`` tokens of type UNUSED and the embedding
and output matrices with as many rows. :func:`pad_vocabulary` writes such a copy of a
smaller model, so a real padded pair can be tested without a 7B download:

- the vocabulary gains ``[PAD<id>]`` tokens (type UNUSED) up to ``n_vocab``;
- ``token_embd.weight`` gains zero rows (a zero block of Q5_0/Q8_0 dequantizes to 0);
- ``output.weight`` gains rows that are each a real token's row with its block scales
  doubled (Q8_0 only): a draft that ranked the whole row would prefer the pad id over that
  token whenever its logit is positive, so a test sees whether the engine lets a draft
  propose an id the target lacks;
- ``rename`` replaces the text of chosen real tokens (a pair that differs at one token).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

#: bytes of one Q8_0 block: an f16 scale, then 32 int8 values
_Q8_0_BLOCK = 34


def pad_vocabulary(src: Path, dst: Path, n_vocab: int, *,
                   rename: dict[int, str] | None = None) -> Path:
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    n_old = len(tokens)
    if n_vocab < n_old:
        raise ValueError(f"{src.name} has {n_old} tokens already")
    for i, text in (rename or {}).items():
        tokens[i] = text
    extra = n_vocab - n_old
    tokens += [f"[PAD{i}]" for i in range(n_old, n_vocab)]
    types = list(reader.fields["tokenizer.ggml.token_type"].contents())
    types += [int(gguf.TokenType.UNUSED)] * extra

    w = gguf.GGUFWriter(str(dst), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            value = tokens
        elif key == "tokenizer.ggml.token_type":
            value = types
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        data = t.data
        if t.name == "token_embd.weight":
            data = np.concatenate([data, np.zeros((extra,) + data.shape[1:], dtype=data.dtype)])
        elif t.name == "output.weight":
            data = np.concatenate([data, _doubled_rows(data[:extra], t.tensor_type)])
        w.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _doubled_rows(rows: np.ndarray, qtype) -> np.ndarray:
    import gguf
    if qtype != gguf.GGMLQuantizationType.Q8_0:
        raise ValueError(f"output rows of type {qtype.name}: only Q8_0 rows are doubled here")
    out = rows.copy()
    blocks = out.reshape(out.shape[0], -1, _Q8_0_BLOCK)
    scale = blocks[:, :, :2].copy().view(np.float16)
    blocks[:, :, :2] = (scale * np.float16(2)).view(np.uint8)
    return out
