"""Read and sanity-check a GGUF header before llama.cpp ever sees the file.

llama.cpp trusts the header it reads; a truncated download or a stray file
should fail here, with a message that says what is wrong and what to do,
instead of inside native code. The parser walks the header over a read-only
mmap with a bounds check on every read, so a corrupt length field costs one
comparison, never an allocation: every count is checked against the bytes
that are actually left in the file before it is used.

Layout (GGUF v2/v3, little-endian)::

    magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv      x (string key, u32 value type, value)
    n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset)
    padding to general.alignment (default 32), then tensor data at data_offset + offset

A string is a u64 length followed by that many bytes; an array is a u32
element type, a u64 count, then the elements.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v1 used 32-bit counts; llama.cpp no longer reads it
HEADER_SIZE = 24
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_NESTING = 4
# Strings longer than this are kept as a length only (chat templates are a few KiB).
MAX_KEPT_STRING = 1 << 20

# value type -> struct format of a fixed-size scalar
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
# Smallest encoded size of one element, to bound counts before looping over them.
_MIN_ELEMENT_SIZE = {**{t: struct.calcsize(f) for t, f in _SCALAR_FORMATS.items()},
                     _STRING: 8, _ARRAY: 12}
# Smallest possible kv pair (empty key, one-byte value) and tensor info (empty name, 0 dims).
_MIN_KV_SIZE = 8 + 4 + 1
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 4 + 8


@dataclass(frozen=True)
class ArrayInfo:
    """An array value, summarised: element type and length (token lists are 150k long)."""

    element_type: int
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to GGUFInfo.data_offset
    nbytes: int


@dataclass(frozen=True)
class GGUFInfo:
    """What the header says, and how it squares with the file on disk."""

    path: Path
    version: int
    file_size: int
    data_offset: int
    data_size: int  # bytes of tensor data the header describes (end of the last tensor)
    alignment: int
    # scalar values as Python values; arrays as ArrayInfo; over-long strings as their length
    metadata: dict[str, object] = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)

    @property
    def n_tensors(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_value(self, key: str):
        """`{architecture}.{key}`, e.g. arch_value("context_length")."""
        return self.metadata.get(f"{self.architecture}.{key}")

    @property
    def context_length(self) -> int | None:
        value = self.arch_value("context_length")
        return value if isinstance(value, int) else None

    @property
    def vocab_size(self) -> int | None:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        return tokens.length if isinstance(tokens, ArrayInfo) else None

    @property
    def has_chat_template(self) -> bool:
        return "tokenizer.chat_template" in self.metadata


class _Corrupt(Exception):
    """Internal: the header is malformed; turned into a ModelError with the path."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class _Reader:
    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.remaining():
            raise _Corrupt(f"the header ends early while reading {what} at byte {self.pos} "
                           f"(needs {n} bytes, {self.remaining()} left): the file is truncated")

    def scalar(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str, keep: bool = True) -> str | int:
        length = self.scalar("<Q", f"the length of {what}")
        self.need(length, what)
        start = self.pos
        self.pos += length
        if not keep or length > MAX_KEPT_STRING:
            return length
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace")

    def _skip_strings(self, count: int, what: str) -> None:
        # The hot loop of the whole check: token and merge lists hold ~150k strings each.
        buf, size, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        for _ in range(count):
            if pos + 8 > size:
                break
            pos += 8 + unpack(buf, pos)[0]
            if pos > size:
                break
        else:
            self.pos = pos
            return
        raise _Corrupt(f"{what}: a string runs past the end of the file: the file is truncated")

    def value(self, vtype: int, what: str, depth: int = 0, keep: bool = True):
        if vtype in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[vtype], what)
        if vtype == _STRING:
            return self.string(what, keep)
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise _Corrupt(f"{what}: arrays nested deeper than {MAX_ARRAY_NESTING}")
            etype = self.scalar("<I", f"the element type of {what}")
            count = self.scalar("<Q", f"the length of {what}")
            if etype not in _MIN_ELEMENT_SIZE:
                raise _Corrupt(f"{what}: unknown array element type {etype}")
            if count * _MIN_ELEMENT_SIZE[etype] > self.remaining():
                raise _Corrupt(f"{what}: array of {count} elements does not fit in the "
                               f"{self.remaining()} bytes left: the file is truncated or corrupt")
            if etype in _SCALAR_FORMATS:
                self.pos += count * _MIN_ELEMENT_SIZE[etype]  # fixed size: skip in one step
            elif etype == _STRING:
                self._skip_strings(count, what)
            else:
                for _ in range(count):
                    self.value(etype, what, depth + 1, keep=False)
            return ArrayInfo(etype, count)
        raise _Corrupt(f"{what}: unknown value type {vtype}")


def _tensor_nbytes(name: str, shape: tuple[int, ...], ggml_type: int) -> int:
    # The table is plain data from the gguf package (no file access).
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise _Corrupt(f"tensor {name!r} has unknown ggml type {ggml_type} "
                       "(a corrupt header, or a quantization newer than this gguf package)") from None
    n_elements = 1
    for d in shape:
        n_elements *= d
    if shape and shape[0] % block_size:
        raise _Corrupt(f"tensor {name!r}: first dimension {shape[0]} is not a multiple of the "
                       f"block size {block_size} of type {GGMLQuantizationType(ggml_type).name}")
    return n_elements // block_size * type_size


def _parse(buf, file_size: int, path: Path) -> GGUFInfo:
    r = _Reader(buf, file_size)
    magic = bytes(buf[:4])
    if magic != GGUF_MAGIC:
        raise _Corrupt(f"not a GGUF file: it starts with {magic!r}, expected {GGUF_MAGIC!r}",
                       hint="pass the path of a .gguf model file, or a registry name "
                            "(see `edgespec models list`)")
    r.pos = 4
    version = r.scalar("<I", "the version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            raise _Corrupt("a big-endian GGUF file; this machine needs the little-endian one")
        raise _Corrupt(f"unsupported GGUF version {version} (supported: "
                       f"{', '.join(map(str, SUPPORTED_VERSIONS))})")
    n_tensors = r.scalar("<Q", "the tensor count")
    n_kv = r.scalar("<Q", "the metadata count")
    if n_kv * _MIN_KV_SIZE > r.remaining():
        raise _Corrupt(f"the header claims {n_kv} metadata entries, more than the "
                       f"{file_size} byte file can hold: corrupt or truncated")
    if n_tensors * _MIN_TENSOR_INFO_SIZE > r.remaining():
        raise _Corrupt(f"the header claims {n_tensors} tensors, more than the "
                       f"{file_size} byte file can hold: corrupt or truncated")

    metadata: dict[str, object] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}")
        vtype = r.scalar("<I", f"the type of {key!r}")
        if key in metadata:
            # two values for one key: which one llama.cpp reads is not ours to guess
            raise _Corrupt(f"metadata key {key!r} appears twice")
        metadata[key] = r.value(vtype, repr(key))

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment must be a power of two (got {alignment!r})")

    tensors = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = r.string(f"the name of tensor #{i}")
        if name in names:
            raise _Corrupt(f"tensor {name!r} appears twice in the tensor table")
        names.add(name)
        n_dims = r.scalar("<I", f"the rank of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise _Corrupt(f"tensor {name!r} claims {n_dims} dimensions (at most {MAX_DIMS})")
        shape = tuple(r.scalar("<Q", f"the shape of tensor {name!r}") for _ in range(n_dims))
        ggml_type = r.scalar("<I", f"the type of tensor {name!r}")
        offset = r.scalar("<Q", f"the offset of tensor {name!r}")
        if offset % alignment:
            raise _Corrupt(f"tensor {name!r} offset {offset} is not aligned to {alignment}")
        nbytes = _tensor_nbytes(name, shape, ggml_type)
        tensors.append(TensorInfo(name, shape, ggml_type, offset, nbytes))

    data_offset = -(-r.pos // alignment) * alignment
    data_size = max((t.offset + t.nbytes for t in tensors), default=0)
    if sum(t.nbytes for t in tensors) > data_size:
        # tensors of a real file never share bytes; overlapping offsets mean a corrupt table
        raise _Corrupt("the tensor table is corrupt: tensors overlap in the data section")
    if data_offset + data_size > file_size:
        missing = data_offset + data_size - file_size
        raise _Corrupt(f"the file is truncated: its header describes {data_offset + data_size} "
                       f"bytes but it holds {file_size} ({missing} missing)")
    _check_model_metadata(metadata, tensors)
    return GGUFInfo(path=path, version=version, file_size=file_size, data_offset=data_offset,
                    data_size=data_size, alignment=alignment, metadata=metadata,
                    tensors=tuple(tensors))


# Bounds no real model comes near (Llama 4 Scout trains 10M tokens of context, the deepest
# models have ~200 blocks); a header past them is corrupt or hostile, and llama.cpp would
# size buffers by it.
MAX_CONTEXT_LENGTH = 1 << 27
MAX_BLOCK_COUNT = 10_000
MAX_EMBEDDING_LENGTH = 1 << 20
MAX_HEAD_COUNT = 1 << 16

#: the tokenizer arrays llama.cpp reads, with the element type each must have
_TOKEN_ARRAYS = {"tokenizer.ggml.tokens": (_STRING, "strings"),
                 "tokenizer.ggml.scores": (6, "float32 values"),
                 "tokenizer.ggml.token_type": (5, "int32 values"),
                 "tokenizer.ggml.merges": (_STRING, "strings")}
#: arrays that hold one value per token
_PER_TOKEN = ("tokenizer.ggml.scores", "tokenizer.ggml.token_type")


def _check_model_metadata(metadata: dict[str, object], tensors: list[TensorInfo]) -> None:
    """What llama.cpp would trust and size allocations by: the tokenizer arrays' types and
    lengths, the vocabulary against the embedding matrix, and the architecture's counts."""
    for key, (etype, what) in _TOKEN_ARRAYS.items():
        value = metadata.get(key)
        if value is None:
            continue
        if not isinstance(value, ArrayInfo) or value.element_type != etype:
            got = (f"an array of type {value.element_type}" if isinstance(value, ArrayInfo)
                   else f"a {type(value).__name__}")
            raise _Corrupt(f"{key} must be an array of {what}, not {got}")
    tokens = metadata.get("tokenizer.ggml.tokens")
    n_vocab = tokens.length if isinstance(tokens, ArrayInfo) else None
    for key in _PER_TOKEN:
        value = metadata.get(key)
        if isinstance(value, ArrayInfo) and n_vocab is not None and value.length != n_vocab:
            raise _Corrupt(f"{key} has {value.length} entries for {n_vocab} tokens")
    if n_vocab is not None:
        embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
        if embd is not None and len(embd.shape) >= 2 and embd.shape[1] != n_vocab:
            raise _Corrupt(f"the vocabulary has {n_vocab} tokens but token_embd.weight has "
                           f"{embd.shape[1]} rows")
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return
    for key, bound in (("context_length", MAX_CONTEXT_LENGTH), ("block_count", MAX_BLOCK_COUNT),
                       ("embedding_length", MAX_EMBEDDING_LENGTH),
                       ("attention.head_count", MAX_HEAD_COUNT)):
        value = metadata.get(f"{arch}.{key}")
        if isinstance(value, bool) or not isinstance(value, int):
            continue  # absent, or an array (per-layer head counts): read where it is used
        if not 0 < value <= bound:
            raise _Corrupt(f"{arch}.{key} is {value}, outside 1..{bound:,}: not a real model")


def read_gguf_header(path: str | os.PathLike, fix: str | None = None) -> GGUFInfo:
    """Parse and check the header of `path`; raise ModelError saying what is wrong.

    Checks: the file exists and is a regular file, holds at least a header,
    starts with b"GGUF", has a supported version, counts that fit the file, a
    well-formed metadata and tensor table without repeated keys or tensor names,
    enough bytes for every tensor the table describes (a truncated download fails
    here), tokenizer arrays of the right types and lengths, a vocabulary as long as
    the embedding matrix, and architecture counts (context, blocks, width, heads)
    within bounds no real model comes near. It does not hash
    or read the tensor data. `fix` replaces the advice on a broken file for a
    caller that knows where the file came from (another tool's store).
    """
    p = Path(path)
    own_fix = fix
    fix = fix or ("re-download it, or if it came from the registry re-pull it with "
                  "`edgespec models pull NAME --force`")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelError(f"{p}: no such file; check the path, or pass a registry name "
                         "(see `edgespec models list`)") from None
    except OSError as e:
        raise ModelError(f"{p}: cannot read it ({e.strerror or e})") from None
    if not p.is_file():
        raise ModelError(f"{p}: not a regular file; pass the path of a .gguf model file")
    if st.st_size == 0:
        raise ModelError(f"{p}: the file is empty, not a GGUF model; {fix}")
    if st.st_size < HEADER_SIZE:
        raise ModelError(f"{p}: only {st.st_size} bytes, too small for a GGUF header; {fix}")
    try:
        with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, st.st_size, p)
    except _Corrupt as e:
        raise ModelError(f"{p}: {e}; {own_fix or e.hint or fix}") from None
    except (OSError, ValueError, OverflowError, struct.error, MemoryError) as e:
        raise ModelError(f"{p}: cannot read the GGUF header ({type(e).__name__}: {e}); {fix}") from None
