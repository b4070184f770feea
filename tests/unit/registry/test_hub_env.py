"""edgespec.registry.hub.env (huggingface_hub's settings read now) and the advice
edgespec.registry.hub.errors words from them, with no Hub and no network."""
from pathlib import Path

import pytest

from edgespec.errors import ModelError
from edgespec.registry.hub.env import _Env, _env
from edgespec.registry.hub.errors import _hub_error
from edgespec.registry.hub.ref import parse

_VARS = ("HF_ENDPOINT", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME",
         "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture
def clean(monkeypatch, tmp_path):
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return monkeypatch


def test_defaults_follow_huggingface_hub(clean, tmp_path):
    env = _env()
    assert env.endpoint == "https://huggingface.co"
    assert env.cache_dir == tmp_path / ".cache" / "huggingface" / "hub"
    assert env.offline is False


def test_the_cache_precedence_and_offline_spellings(clean, tmp_path):
    clean.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert _env().cache_dir == tmp_path / "xdg" / "huggingface" / "hub"
    clean.setenv("HF_HOME", str(tmp_path / "home"))
    assert _env().cache_dir == tmp_path / "home" / "hub"
    clean.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert _env().cache_dir == tmp_path / "cache"
    clean.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert _env().endpoint == "http://127.0.0.1:9"  # no trailing slash in the URLs made from it
    for value, offline in (("1", True), ("yes", True), ("ON", True), ("0", False), ("", False)):
        clean.setenv("HF_HUB_OFFLINE", value)
        assert _env().offline is offline, value


def test_a_missing_cached_file_says_what_to_do_offline_and_online():
    from huggingface_hub.utils import LocalEntryNotFoundError

    ref = parse("hf://owner/repo/m-Q8_0.gguf")
    offline = _Env(endpoint="https://hub.example", cache_dir=Path("/c"), offline=True)
    online = _Env(endpoint="https://hub.example", cache_dir=Path("/c"), offline=False)
    e = LocalEntryNotFoundError("not cached")
    said = str(_hub_error(e, ref, offline, "m-Q8_0.gguf"))
    assert "HF_HUB_OFFLINE is set" in said and "unset HF_HUB_OFFLINE" in said and "/c" in said
    said = str(_hub_error(e, ref, online, "m-Q8_0.gguf"))
    assert "https://hub.example is unreachable" in said and "HF_ENDPOINT" in said
    assert isinstance(_hub_error(OSError("disk full"), ref, online, "m-Q8_0.gguf"), ModelError)
