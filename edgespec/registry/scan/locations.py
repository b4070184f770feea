"""Where the model stores of other tools live (edgespec.registry.scan lists them) and
what a listing of one holds before headers are read."""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ...errors import ModelError
from .. import refs

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
LMSTUDIO_ENV = "EDGESPEC_LMSTUDIO_MODELS"

_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
# llama.cpp's split naming (gguf-split): <prefix>-00001-of-00003.gguf
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")

# What to do about a broken file, per store: the tool that wrote it can write it again.
_REFETCH = {
    "hfcache": "re-download it (`hf download {repo} {file}`) or delete that snapshot",
    "lmstudio": "re-download it in LM Studio, or delete the file",
    "ollama": "re-pull it with `ollama pull {ollama}`",
    "llamacpp": "delete it and let llama.cpp download it again",
}


@dataclass(frozen=True)
class Store:
    """One place a tool keeps models, and whether it exists on this machine."""

    source: str      # a refs.SCHEMES scheme
    root: Path
    env: str         # the variable that moves it
    present: bool
    notes: tuple[str, ...] = ()  # what the store's own scan reported (a corrupt repo folder)


@dataclass(frozen=True)
class _Candidate:
    """A file a store lists, before its header is read."""

    name: str                  # the reference that resolves to it
    source: str
    path: Path                 # what llama.cpp loads (a split set: its first part)
    size: int                  # bytes on disk (a split set: all parts)
    sha256: str | None = None  # the digest the store names the file by, if it does
    problem: str | None = None
    hint: str = ""             # what to do when the file is broken
    ollama: str = ""           # ollama: the canonical name a reference is compared with
    commit: str = ""           # Hugging Face layout: the snapshot's commit and the refs
    ref_names: tuple[str, ...] = ()  # (branches, tags) pointing to it
    parts: int = 1


# --------------------------------------------------------------------------- locations


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def hf_cache_dir() -> Path:
    """huggingface_hub's cache, from the environment as it is now (huggingface_hub itself
    reads it once, at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if (p := _env_path(var)) is not None:
            return p
    if (home := _env_path("HF_HOME")) is not None:
        return home / "hub"
    xdg = _env_path("XDG_CACHE_HOME") or Path.home() / ".cache"
    return xdg / "huggingface" / "hub"


def lmstudio_dirs() -> list[Path]:
    value = os.environ.get(LMSTUDIO_ENV)
    if value:
        return [Path(p).expanduser() for p in value.split(os.pathsep) if p]
    return [Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"]


def ollama_dirs() -> list[Path]:
    if (p := _env_path("OLLAMA_MODELS")) is not None:
        return [p]
    dirs = [Path.home() / ".ollama" / "models"]
    if sys.platform.startswith("linux"):  # the install script's systemd service runs as ollama
        dirs.append(Path("/usr/share/ollama/.ollama/models"))
    return dirs


def llamacpp_dir() -> Path:
    """llama.cpp's fs_get_cache_directory()."""
    if (p := _env_path("LLAMA_CACHE")) is not None:
        return p
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llama.cpp"
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "llama.cpp"
    return (_env_path("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"


def stores(sources: Iterable[str] | None = None) -> tuple[Store, ...]:
    """Every store location of `sources` (default all), present or not."""
    wanted = tuple(sources) if sources else refs.SCHEMES
    out = []
    for source in wanted:
        if source == "hfcache":
            env, roots = "HF_HUB_CACHE", [hf_cache_dir()]
        elif source == "lmstudio":
            env, roots = LMSTUDIO_ENV, lmstudio_dirs()
        elif source == "ollama":
            env, roots = "OLLAMA_MODELS", ollama_dirs()
        elif source == "llamacpp":
            env, roots = "LLAMA_CACHE", [llamacpp_dir()]
        else:
            raise ModelError(f"unknown model store {source!r}; the stores are "
                             + ", ".join(refs.SCHEMES))
        out += [Store(source, r, env, r.is_dir()) for r in roots]
    return tuple(out)
