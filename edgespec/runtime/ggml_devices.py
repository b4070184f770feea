"""The compute devices llama.cpp's backend registry holds, and llama.cpp RPC servers
registered as devices of this process (edgespec.runtime.rpc probes and places them)."""
from __future__ import annotations

import ctypes
from typing import Sequence

from ..errors import EdgespecError
from .backend import ensure_init, ggml_lib, ll as _ll, rpc_registered

_DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}  # enum ggml_backend_dev_type


def list_devices() -> list[dict]:
    """The compute devices this llama.cpp build can use, without loading a model.

    Plain dicts: ``name``, ``description``, ``type`` ("cpu", "gpu", "igpu",
    "accel"), ``free`` and ``total`` memory in bytes (for the CPU device, host RAM).
    A build without GPU/Metal/Vulkan backends lists the CPU only; RPC servers added by
    :func:`rpc_devices` are left out (they are not this machine's).
    """
    lib = ggml_lib()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        if not dev or _is_rpc(lib, dev):
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append({
            "name": (lib.ggml_backend_dev_name(dev) or b"?").decode("utf-8", "replace"),
            "description": (lib.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
            "type": _DEVICE_TYPES.get(lib.ggml_backend_dev_type(dev), "other"),
            "free": int(free.value),
            "total": int(total.value),
        })
    return out


# --- RPC: layers on other machines (edgespec.runtime.rpc) ------------------------------------
def _is_rpc(lib, dev) -> bool:
    reg = lib.ggml_backend_dev_backend_reg(dev)
    return bool(reg) and (lib.ggml_backend_reg_name(reg) or b"").startswith(b"RPC")


def rpc_supported() -> bool:
    """Whether this llama.cpp was built with GGML_RPC."""
    ensure_init()
    return bool(_ll.llama_supports_rpc())


def require_rpc() -> None:
    if not rpc_supported():
        raise EdgespecError(
            "this llama.cpp was built without the RPC backend: reinstall it with -DGGML_RPC=ON "
            "(`make install` does; with your own CMAKE_ARGS, add -DGGML_RPC=ON to them)")


def _rpc_proc(name: str):
    lib = ggml_lib()
    require_rpc()
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    addr = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not addr:  # pragma: no cover - a GGML_RPC build always has both
        raise EdgespecError(f"llama.cpp's RPC backend has no {name}")
    return addr


def rpc_devices(endpoints: Sequence[str]) -> list[int]:
    """The devices of these RPC servers, in order, registered with llama.cpp once each.

    Probe every endpoint first (:func:`edgespec.runtime.rpc.probe`): llama.cpp aborts the process
    when a server cannot be reached, and it connects here."""
    lib = ggml_lib()
    add = None
    out: list[int] = []
    for ep in endpoints:
        reg = rpc_registered.get(ep)
        if reg is None:
            add = add or ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(
                _rpc_proc("ggml_backend_rpc_add_server"))
            reg = add(ep.encode())
            if not reg:
                raise EdgespecError(f"RPC server {ep} reports no devices")
            lib.ggml_backend_register(reg)
            rpc_registered[ep] = reg
        out += [lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg))]
    return out


def local_accelerators() -> list[int]:
    """This machine's GPU devices, what llama.cpp's default device choice would take when no
    RPC server had been registered in this process."""
    lib = ggml_lib()
    devs = (lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count()))
    return [d for d in devs if d and lib.ggml_backend_dev_type(d) in (1, 2) and not _is_rpc(lib, d)]


def serve_rpc(endpoint: str, n_threads: int, cache_dir: str | None = None) -> None:
    """Serve this machine's CPU to RPC clients at ``endpoint``; returns only when llama.cpp's
    server loop does (it could not listen). Run it in a thread of its own process."""
    lib = ggml_lib()
    start = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                             ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))(
        _rpc_proc("ggml_backend_rpc_start_server"))
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not cpu:  # pragma: no cover
        raise EdgespecError("llama.cpp reports no CPU device")
    devices = (ctypes.c_void_p * 1)(cpu)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, 1, devices)

