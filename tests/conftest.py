"""Shared fixtures: real models from the registry (pulled on first use, cached under
EDGESPEC_HOME), and engines loaded once per session because loading costs seconds."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def model_path():
    """model_path(name) -> Path of a pulled, digest-checked registry model."""
    from edgespec import registry

    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = Path(registry.resolve(name, pull=True))
        return cache[name]

    return get


@pytest.fixture(scope="session", autouse=True)
def _fresh_learned_state(tmp_path_factory):
    """Real-model tests start from no persisted n-gram statistics and no saved sessions:
    what the proposers learned in earlier runs on this machine (a benchmark, a previous
    test run) must not decide what a test sees. Models and calibration stay shared."""
    from edgespec import paths

    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("learned")
    home = os.environ.get("EDGESPEC_HOME")
    ngram, sessions = paths.ngram_dir, paths.sessions_dir

    # a test that points EDGESPEC_HOME elsewhere gets exactly that home
    mp.setattr(paths, "ngram_dir", lambda: root / "ngram"
               if os.environ.get("EDGESPEC_HOME") == home else ngram())
    mp.setattr(paths, "sessions_dir", lambda: root / "sessions"
               if os.environ.get("EDGESPEC_HOME") == home else sessions())
    yield
    mp.undo()


_ENGINES: dict = {}


@pytest.fixture(scope="session")
def engine_factory(model_path):
    """engine_factory(target, draft=None, **kw) -> a cached Engine (closed at session end)."""
    from edgespec.engine.engine import Engine

    def get(target: str, draft: str | None = None, **kw):
        key = (target, draft, tuple(sorted(kw.items())))
        if key not in _ENGINES:
            t = str(model_path(target))
            d = str(model_path(draft)) if draft else None
            kw.setdefault("proposer", "draft" if d else "ngram")
            kw.setdefault("n_ctx", 2048)
            # Fixed-length drafting by default so parity tests really exercise verification;
            # adaptive control has its own tests.
            kw.setdefault("adaptive", False)
            # The parity tests assert bitwise equality with the plain path: exact mode.
            kw.setdefault("exact", True)
            kw.setdefault("threads", int(os.environ.get("EDGESPEC_TEST_THREADS", "2")))
            _ENGINES[key] = Engine.load(t, draft=d, **kw)
        return _ENGINES[key]

    yield get
    for eng in _ENGINES.values():
        eng.close()
    _ENGINES.clear()


# --- a fake package world for registry pulls (no network, tiny GGUF files) ---------------
@pytest.fixture(scope="session")
def world_files(tmp_path_factory):
    from registry_fakes import FakeWorld
    return FakeWorld(tmp_path_factory.mktemp("world"))


@pytest.fixture
def world(world_files, tmp_path, monkeypatch):
    """The fake world with a fresh EDGESPEC_HOME per test."""
    from registry_fakes import FakeWorld
    w = FakeWorld.__new__(FakeWorld)
    w.__dict__.update(world_files.__dict__)
    w.root = tmp_path
    w.home = w.install(monkeypatch)
    return w


# --- the fake backend (tests/fakes): the engine loop without llama.cpp or a pulled model ----
@pytest.fixture
def fake_model():
    """A fresh :class:`fakes.FakeModel`: a deterministic table language model whose KV cache
    refuses any position an engine gets wrong; build engines over it with
    ``fakes.fake_engine(model, proposers, control=fixed(k))``."""
    from fakes import FakeModel
    return FakeModel()
