"""Copy a real GGUF file with metadata replaced, added or repeated, by splicing its header.

The tensor data is copied as it is (tensor offsets are relative to the data section, so
only the header and its alignment padding change): a hostile chat template, a duplicated
key or a bad token array goes into a model llama.cpp can otherwise load, in about a second
for smollm2-135m, where GGUFReader + GGUFWriter take tens of seconds.
"""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def _skip_value(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _SCALAR:
        return pos + _SCALAR[vtype]
    if vtype == STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == ARRAY:
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in _SCALAR:
            return pos + count * _SCALAR[etype]
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ValueError(f"value type {vtype}")


def gguf_string(s: str | bytes) -> bytes:
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv_string(key: str, value: str | bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", STRING) + gguf_string(value)


def kv_u32(key: str, value: int) -> bytes:
    return gguf_string(key) + struct.pack("<II", 4, value)


def rewrite(src: Path, dst: Path, replace: dict[str, bytes | None] | None = None,
            extra: list[bytes] = (), n_tensors_delta: int = 0) -> Path:
    """Copy ``src`` to ``dst`` with the kv pairs named in ``replace`` swapped for the given
    encoded pair (``kv_string``...; None drops it) and the encoded pairs ``extra`` appended."""
    replace = dict(replace or {})
    with open(src, "rb") as f:
        head = f.read(64 << 20)  # the header of a small model is well within this
    n_tensors, n_kv = struct.unpack_from("<QQ", head, 8)
    pos, out = 24, []
    for _ in range(n_kv):
        start = pos
        (klen,) = struct.unpack_from("<Q", head, pos)
        key = head[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", head, pos)
        pos = _skip_value(head, pos + 4, vtype)
        if key in replace:
            new = replace.pop(key)
            if new is not None:
                out.append(new)
        else:
            out.append(head[start:pos])
    alignment = 32
    tensors_start = pos
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", head, pos)
        pos += 8 + nlen
        (ndims,) = struct.unpack_from("<I", head, pos)
        pos += 4 + 8 * ndims + 4 + 8
    old_data = -(-pos // alignment) * alignment
    kvs = out + [v for v in replace.values() if v is not None] + list(extra)
    header = (head[:8] + struct.pack("<QQ", n_tensors + n_tensors_delta, len(kvs))
              + b"".join(kvs) + head[tensors_start:pos])
    header += b"\0" * (-len(header) % alignment)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(header)
        fin.seek(old_data)
        shutil.copyfileobj(fin, fout, 8 << 20)
    return dst
