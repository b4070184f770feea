"""References to models other tools already keep on disk: ``<store>:<locator>``.

One scheme per store, and the locator is what that tool calls the file, so a name
``edgespec models scan`` prints can be pasted wherever a model name is accepted:

    ollama:NAME[:TAG]                 ollama's own name; ``ollama:qwen2.5-coder:7b``,
    ollama:NAMESPACE/NAME[:TAG]       ``ollama:owner/name:tag``, ``ollama:hf.co/owner/repo:Q4_K_M``
    ollama:HOST/NAMESPACE/NAME[:TAG]  (host registry.ollama.ai, namespace library, tag latest
                                      when left out, as ``ollama run`` reads them)
    hfcache:OWNER/REPO/FILE.gguf[@REV]  a file in the Hugging Face cache (REV: a ref such as
                                      main, or a commit prefix; default the revision main
                                      points to, else the newest)
    lmstudio:PUBLISHER/REPO/FILE.gguf a file under LM Studio's models folder
    llamacpp:FILE.gguf                a file in llama.cpp's download cache (``-hf`` wrote
                                      ``owner_repo_file.gguf`` before 2026)
    llamacpp:OWNER/REPO/FILE.gguf[@REV]  the same cache in the Hugging Face layout
                                      (models--OWNER--REPO/...), llama.cpp's since 2026

The parsing is pure; :mod:`edgespec.registry.scan` finds the files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ModelError

SCHEMES = ("ollama", "hfcache", "lmstudio", "llamacpp")

OLLAMA_HOST = "registry.ollama.ai"
OLLAMA_NAMESPACE = "library"
OLLAMA_TAG = "latest"

# ollama's own name rules (types/model/name.go): parts of letters, digits, '_', '-', '.';
# a host may carry a port
_OLLAMA_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
_OLLAMA_HOST_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*(:[0-9]+)?$")


@dataclass(frozen=True)
class StoreRef:
    scheme: str   # one of SCHEMES
    locator: str  # everything after "<scheme>:"

    def __str__(self) -> str:
        return f"{self.scheme}:{self.locator}"


@dataclass(frozen=True)
class OllamaName:
    """A model name as ollama resolves it: host/namespace/model:tag."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def canonical(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def short(self) -> str:
        """What ollama prints (``ollama list``): the default host and namespace left out."""
        prefix = ""
        if self.host != OLLAMA_HOST:
            prefix = f"{self.host}/{self.namespace}/"
        elif self.namespace != OLLAMA_NAMESPACE:
            prefix = f"{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"


def is_store_ref(name: str) -> bool:
    """Whether `name` names a file in another tool's store (``ollama:…``, ``hfcache:…``)."""
    scheme, sep, _ = str(name).partition(":")
    return bool(sep) and scheme in SCHEMES


def parse(name: str) -> StoreRef:
    """Split ``<scheme>:<locator>``; ModelError for an empty locator."""
    scheme, sep, locator = str(name).partition(":")
    if not sep or scheme not in SCHEMES:
        raise ModelError(f"{name!r} is not a store reference; use one of "
                         + ", ".join(f"{s}:…" for s in SCHEMES))
    if not locator.strip():
        raise ModelError(f"{name!r} names no model after {scheme}:; see `edgespec models scan` "
                         "for the names of the models on disk")
    return StoreRef(scheme, locator)


def parse_ollama(locator: str) -> OllamaName:
    """``[host/][namespace/]model[:tag]`` with ollama's defaults filled in.

    >>> parse_ollama("qwen2.5-coder:7b").canonical
    'registry.ollama.ai/library/qwen2.5-coder:7b'
    >>> parse_ollama("hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0").short
    'hf.co/bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0'
    """
    path, tag = locator, OLLAMA_TAG
    last = locator.rsplit("/", 1)[-1]
    if ":" in last:  # a host's port sits before the first '/', never in the last part
        path, tag = locator.rsplit(":", 1)
    parts = path.split("/")
    if len(parts) > 3 or not all(parts) or not tag:
        raise ModelError(f"ollama:{locator}: not an ollama model name; write it as ollama "
                         "does: NAME[:TAG], NAMESPACE/NAME[:TAG] or HOST/NAMESPACE/NAME[:TAG]")
    host, namespace = OLLAMA_HOST, OLLAMA_NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    bad = [p for p in (namespace, model, tag) if not _OLLAMA_PART.match(p)]
    if bad or not _OLLAMA_HOST_PART.match(host):
        raise ModelError(f"ollama:{locator}: {bad[0] if bad else host!r} is not a valid part "
                         "of an ollama name (letters, digits, '_', '-', '.')")
    return OllamaName(host, namespace, model, tag)
