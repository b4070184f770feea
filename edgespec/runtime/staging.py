"""llama.cpp's staging API (``src/llama-ext.h``): the one place its functions are bound.

These functions are exported with C++ linkage and not bound by llama-cpp-python, so they
are reached by their mangled names, checked at first use. Two proposers use them: ``mtp``
(the NextN hidden states, :mod:`edgespec.runtime.mtp`) and ``eagle3`` (the target's layer
inputs and the draft's pre-norm state, :mod:`edgespec.runtime.eagle3`).
"""
from __future__ import annotations

import ctypes
from typing import Any

from ..errors import EdgespecError
from .backend import ll as _ll

FloatP = ctypes.POINTER(ctypes.c_float)
_SYMBOLS = {
    "set_nextn": ("_Z26llama_set_embeddings_nextnP13llama_contextbb",
                  [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None),
    "get_nextn": ("_Z26llama_get_embeddings_nextnP13llama_context", [ctypes.c_void_p], FloatP),
    "get_nextn_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                      [ctypes.c_void_p, ctypes.c_int32], FloatP),
    "set_layer_inp": ("_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
                      [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool], None),
    "get_layer_inp": ("_Z30llama_get_embeddings_layer_inpP13llama_contextj",
                      [ctypes.c_void_p, ctypes.c_uint32], FloatP),
    "target_layer_ids": ("_Z28llama_model_target_layer_idsPK11llama_model", [ctypes.c_void_p],
                         ctypes.POINTER(ctypes.c_int32)),
    "target_layer_ids_n": ("_Z30llama_model_target_layer_ids_nPK11llama_model",
                           [ctypes.c_void_p], ctypes.c_uint32),
}
_fns: dict[str, Any] = {}


def staging(name: str) -> Any:
    """A function of llama.cpp's staging API, by its key in ``_SYMBOLS`` (all checked once)."""
    if not _fns:
        if _ll is None:
            raise EdgespecError("llama-cpp-python is not importable; run `make install`")
        lib = _ll.llama_cpp._lib  # the loaded libllama (the backend imported llama_cpp)
        found: dict[str, Any] = {}
        for key, (sym, args, res) in _SYMBOLS.items():
            fn = getattr(lib, sym, None)
            if fn is None:
                raise EdgespecError(
                    f"this llama.cpp build does not export {sym} (llama.cpp's staging API, "
                    "used by the mtp and eagle3 proposers); they need the llama-cpp-python "
                    "0.3.36 that `make install` builds")
            fn.argtypes, fn.restype = args, res
            found[key] = fn
        _fns.update(found)
    return _fns[name]
