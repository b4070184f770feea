"""huggingface_hub's settings as the environment says now: the endpoint, the cache folder,
offline mode and whether a token is set (errors.py words its advice from them, listing.py
and download.py read the cache)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class _Env:
    endpoint: str
    cache_dir: Path
    offline: bool  # HF_HUB_OFFLINE set

    @property
    def token(self) -> bool:
        # deferred: huggingface_hub is slow to import and only some calls need it
        from huggingface_hub import get_token
        return get_token() is not None


def _truthy(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _env() -> _Env:
    """huggingface_hub's settings as the environment says now (its constants module read
    them once, at import), with the precedence it documents."""
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
            "huggingface")
        cache = os.path.join(os.path.expandvars(os.path.expanduser(home)), "hub")
    offline = _truthy(os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"))
    return _Env(endpoint=endpoint,
                cache_dir=Path(os.path.expandvars(os.path.expanduser(cache))), offline=offline)
