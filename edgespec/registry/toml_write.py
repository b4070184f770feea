"""Writes the small TOML subset a registry file uses (tomllib only reads).

Enough for models.toml: strings, integers, floats, booleans, lists of those, tables of
tables (``[models."name".source]``) and arrays of tables (``[[pairs]]``). Anything else is
a bug in the caller and raises TypeError rather than writing a file tomllib cannot read back.
"""
from __future__ import annotations

import json
import math
import re
from typing import Mapping

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    # model names hold dots ("qwen-1.5b"): quoted, or the dot would nest a table
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise TypeError(f"TOML subset: non-finite float {v!r}")
        return repr(v)
    if isinstance(v, str):
        # JSON string escapes are valid TOML basic-string escapes
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)) and not any(isinstance(x, Mapping) for x in v):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"TOML subset: cannot write {type(v).__name__} {v!r}")


def _is_table_array(v) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _emit(table: Mapping, prefix: list[str], out: list[str]) -> None:
    scalars = [(k, v) for k, v in table.items() if not isinstance(v, Mapping)
               and not _is_table_array(v)]
    for k, v in scalars:
        out.append(f"{_key(k)} = {_value(v)}")
    for k, v in table.items():
        if isinstance(v, Mapping):
            name = ".".join(_key(p) for p in [*prefix, k])
            # a table of tables only ([models]) needs no header of its own
            if not v or any(not isinstance(x, Mapping) for x in v.values()):
                out += ["", f"[{name}]"]
            _emit(v, [*prefix, k], out)
        elif _is_table_array(v):
            name = ".".join(_key(p) for p in [*prefix, k])
            for item in v:
                out += ["", f"[[{name}]]"]
                _emit(item, [*prefix, k], out)


def dumps(doc: Mapping, header: str = "") -> str:
    """`doc` as TOML text, after `header` (each line becomes a comment)."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    if out:
        out.append("")
    _emit(doc, [], out)
    return "\n".join(out).strip("\n") + "\n"
