"""Engine.from_config as a builder: whatever fails releases what was loaded, in reverse
order (issue 11: a failed draft load leaked the target; the exact-mode refusal freed the
model before its context). Hermetic: the registry and the backend are replaced by fakes."""
from __future__ import annotations

import pytest

from edgespec.runtime import model as runtime_model
from edgespec import registry
from edgespec.config import EngineConfig
from edgespec.engine.engine import Engine
from edgespec.errors import IncompatibleDraftError, ModelError, UnsupportedError
from fakes import FakeModel


@pytest.fixture
def world(monkeypatch):
    """Models by name; records every close in order."""
    closed: list[str] = []
    models: dict[str, FakeModel] = {}

    class Tracked(FakeModel):
        def close(self):
            closed.append(f"model:{self.path.name}")
            super().close()

        def new_context(self, **kw):
            ctx = super().new_context(**kw)
            orig = ctx.close

            def close():
                closed.append(f"ctx:{self.path.name}")
                orig()
            ctx.close = close
            return ctx

    def load_model(path, n_gpu_layers=0, use_extra_bufts=True, use_mmap=True):
        name = str(path)
        if name == "corrupt.gguf":
            raise ModelError("llama.cpp could not load corrupt.gguf")
        m = Tracked(name=name)
        if name == "other-vocab.gguf":  # another tokenizer: token 8 means something else
            text = m.token_text
            m.token_text = lambda t: "zz" if t == 8 else text(t)
        models[name] = m
        return m

    monkeypatch.setattr(registry, "resolve", lambda name, pull=True: name)
    monkeypatch.setattr(registry, "check_gguf", lambda path: None)
    monkeypatch.setattr(runtime_model, "load_model", load_model)
    monkeypatch.setattr("edgespec.registry.digests.model_identity", lambda path, *a, **k: {"sha256": "0" * 64})
    return closed, models


def cfg(**kw) -> EngineConfig:
    base = dict(target="target.gguf", proposer="ngram", adaptive=False, n_ctx=128, pull=False)
    return EngineConfig(**{**base, **kw})


def test_a_failed_draft_load_releases_the_target_context_then_the_target(world):
    closed, _ = world
    with pytest.raises(ModelError):
        Engine.from_config(cfg(draft="corrupt.gguf", proposer="draft"))
    assert closed == ["ctx:target.gguf", "model:target.gguf"]


def test_an_incompatible_draft_releases_everything_in_reverse_order(world):
    closed, _ = world
    with pytest.raises(IncompatibleDraftError):
        Engine.from_config(cfg(draft="other-vocab.gguf", proposer="draft"))
    assert closed == ["model:other-vocab.gguf", "ctx:target.gguf", "model:target.gguf"]


def test_the_exact_mode_refusal_frees_the_context_before_the_model(world, monkeypatch):
    closed, _ = world
    monkeypatch.setattr("edgespec.calibration.cache.exact_cap", lambda model, kernel, n_threads: 2)
    with pytest.raises(UnsupportedError, match="cannot be verified exactly"):
        Engine.from_config(cfg(exact=True, max_draft=5))
    assert closed[-2:] == ["ctx:target.gguf", "model:target.gguf"]


def test_a_built_engine_closes_once_in_reverse_order(world):
    closed, _ = world
    eng = Engine.from_config(cfg())
    assert eng.default_proposer == "ngram" and "suffix" in eng.proposers
    eng.close()
    assert closed == ["ctx:target.gguf", "model:target.gguf"]


def test_exact_mode_shrinks_a_default_draft_length_before_the_engine_exists(world, monkeypatch):
    """The probed cap settles the control settings in the builder: the engine is built with
    them (and the cap), nothing is assigned to it afterwards."""
    probes = []
    monkeypatch.setattr("edgespec.calibration.cache.exact_cap",
                        lambda model, kernel, n_threads: probes.append(1) or 2)
    with Engine.from_config(cfg(exact=True)) as eng:
        assert eng.control.max_draft == 2 and eng.config.control == eng.control
        assert eng.exact_max_draft() == 2 and eng.upkeep.exact_cap == 2
    assert probes == [1]  # probed once, by the builder; the engine reuses it


def test_a_default_engine_probes_no_exact_cap(world, monkeypatch):
    def never(*a, **k):
        raise AssertionError("the default mode probes no exact cap at load")
    monkeypatch.setattr("edgespec.calibration.cache.exact_cap", never)
    with Engine.from_config(cfg()) as eng:
        assert eng.upkeep.exact_cap is None and eng.control.max_draft == 3


def test_no_mmap_reads_every_load_into_ram_whatever_kernel_is_picked(world, monkeypatch):
    """--no-mmap (EngineConfig.use_mmap=False) reaches the target's and the draft's loads and
    the engine's kernel, which the default mode still picks (its KV type here); the kernel's
    cache key is the mapped one's, since where the weights live changes no arithmetic."""
    from dataclasses import replace as dc_replace
    from edgespec.planner import kernels as kernel_choice
    from edgespec.runtime.kernel import KernelConfig

    loads: list[tuple[str, bool]] = []  # (file, use_mmap) per load
    fake_load = runtime_model.load_model
    monkeypatch.setattr(runtime_model, "load_model",
                        lambda path, **kw: loads.append((str(path), kw["use_mmap"]))
                        or fake_load(path, **kw))
    picked = KernelConfig(kv_type="f16", flash_attn=True)
    monkeypatch.setattr(kernel_choice, "cached",
                        lambda *a, **k: type("C", (), {"kernel": picked, "source": "cache"})())
    with Engine.from_config(cfg(draft="draft.gguf", proposer="draft", use_mmap=False)) as eng:
        assert eng.config.kernel.use_mmap is False and eng.config.kernel.kv_type == "f16"
        assert eng.config.kernel.key() == dc_replace(eng.config.kernel, use_mmap=True).key()
    assert loads == [("target.gguf", False), ("draft.gguf", False)]
    loads.clear()
    # unasked: read into RAM where huge pages are available (EngineConfig.loaded_as), else mapped
    for huge in (False, True):
        monkeypatch.setattr("edgespec.runtime.hugepages.available", lambda: huge)
        with Engine.from_config(cfg()) as eng:
            assert eng.config.kernel.use_mmap is not huge
        assert loads == [("target.gguf", not huge)]
        loads.clear()
    with Engine.from_config(cfg(use_mmap=True)) as eng:  # --mmap maps it whatever the pages
        assert eng.config.kernel.use_mmap is True
    assert loads == [("target.gguf", True)]
