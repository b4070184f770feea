"""Event sources without a UI: the scripted replay and the engine adapter's load policy."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest

from edgespec.errors import InvalidInputError
from edgespec.api.events import Finished, Step
from edgespec.proposers import REGISTRY, names, needs_model
from edgespec.registry import load_registry
from edgespec.tui.source import (Choices, EngineSource, ScriptedSource, Settings, proposer_names,
                        registry_choices)
from tui_helpers import script

D, T = "draft", "target"
TWO_STEPS = script([("a", D), ("b", T)], [("c", T)])


def test_settings_validate_through_generation_params():
    s = Settings(target="m", max_tokens=8, temperature=0.7, seed=3, stop=("\n",))
    p = s.params()
    assert p.max_tokens == 8 and p.stop == ("\n",)
    assert p.sampling.temperature == 0.7 and p.sampling.seed == 3
    with pytest.raises(InvalidInputError, match="temperature"):
        Settings(target="m", temperature=-1).params()


def test_labels_show_paths_by_file_name():
    assert Settings(target="/m/qwen.gguf", proposer="draft", draft="/m/small.gguf").label == \
        "qwen.gguf + draft small.gguf"
    assert Settings(target="qwen-1.5b", proposer="suffix").label == "qwen-1.5b + suffix"


def test_proposer_options_list_the_draft_proposer_once_per_draft_model():
    c = Choices(targets=("t",), drafts=("d1", "d2"), proposers=("none", "ngram", "draft"))
    assert c.proposer_options() == [("none", ("none", None)), ("ngram", ("ngram", None)),
                                    ("draft: d1", ("draft", "d1")), ("draft: d2", ("draft", "d2"))]


def test_proposer_names_come_from_the_one_registry():
    # auto (the engine's default) first, then the plain path and the registry's proposers
    assert Choices(targets=("t",)).proposers == tuple(names(plain=True, auto=True)) == \
        proposer_names()
    assert Settings(target="t").proposer == "auto"  # the engine's default (test_defaults.py)
    # models.toml ships with the package: no pull, no model (every draft offered)
    c = replace(registry_choices(), runnable=None)
    assert c.proposers == tuple(names(plain=True, auto=True))
    labels = [v[0] for _, v in c.proposer_options()]
    # every proposer but one whose draft is a head file the user names (eagle3): no
    # registry model is such a head, so the picker offers none rather than a wrong one
    heads = {n for n, s in REGISTRY.items() if not s.registry_drafts}
    assert heads == {"eagle3"}
    assert set(labels) == set(names(plain=True, auto=True)) - heads


def test_the_draft_picker_offers_only_drafts_sharing_the_target_tokenizer():
    c = replace(registry_choices(), runnable=None)  # as if every draft were pulled
    models = load_registry().models
    for target, drafts in c.compatible_drafts.items():
        assert target not in drafts
        assert all(models[d].tokenizer == models[target].tokenizer for d in drafts)
    assert c.compatible_drafts["qwen-1.5b"] == ("qwen-0.5b",)
    assert c.compatible_drafts["smollm2-135m"] == ()

    def model_opts(target):
        return [v for _, v in c.proposer_options(target) if needs_model(v[0])]

    # the same-vocabulary draft, then the bridge with the drafts pinned as bridge pairs
    assert model_opts("qwen-1.5b") == [("draft", "qwen-0.5b"), ("bridge", "smollm2-135m"),
                                       ("bridge", "gemma-270m")]
    assert model_opts("gemma-270m") == []
    pinned = {(p.target, p.draft) for p in load_registry().pairs if p.bridge_version}
    assert all((t, d) in pinned for t, ds in c.bridge_drafts.items() for d in ds)
    # a target the registry does not know (a .gguf path): every draft, checked at load
    assert [d for p, d in model_opts("/m/other.gguf") if p == "draft"] == list(c.drafts)


def test_scripted_source_replays_and_raises_scripted_errors():
    src = ScriptedSource(TWO_STEPS)
    assert list(src.start("p", Settings(target="t"))) == TWO_STEPS
    boom = ScriptedSource([TWO_STEPS[0], ValueError("x")])
    it = boom.start("p", Settings(target="t"))
    assert next(it) == TWO_STEPS[0]
    with pytest.raises(ValueError):
        next(it)


def test_scripted_cancel_ends_with_a_cancelled_finish_covering_what_was_sent():
    src = ScriptedSource(TWO_STEPS)
    it = src.start("p", Settings(target="t"))
    seen = [next(it), next(it), next(it)]  # started, prefill, first step
    src.cancel()
    rest = list(it)
    assert len(rest) == 1 and isinstance(rest[0], Finished)
    fin = rest[0]
    assert fin.stop_reason == "cancelled" and fin.text == "ab"
    assert fin.stats.generated_tokens == 2 and fin.stats.accepted == 1
    assert isinstance(seen[-1], Step)


class FakeEngine:
    """Records what EngineSource asks of an engine; yields a fixed script."""

    def __init__(self, loads: list, **kw) -> None:
        self.kw = kw
        self.proposers = {"ngram": object(), "suffix": object(),
                          **({"draft": object()} if kw["draft"] else {})}
        self.streams: list = []
        self.chats: list = []
        self.refreshes: list = []
        self.cancels = 0
        self.closed = False
        loads.append(self)

    def stream(self, prompt, params, proposer=None, exact=None):
        self.streams.append((prompt, params, proposer))
        self.exact = exact
        yield from TWO_STEPS

    def chat(self, messages, params, proposer=None, exact=None):
        self.chats.append((messages, exact))
        yield from TWO_STEPS

    def refresh_kv(self, stop=None):
        self.refreshes.append(stop())
        return 40

    def cancel(self) -> None:
        self.cancels += 1

    def close(self) -> None:
        self.closed = True


def _engine_source():
    loads: list[FakeEngine] = []
    return EngineSource(n_ctx=512, threads=1, loader=lambda **kw: FakeEngine(loads, **kw)), loads


def test_engine_source_reuses_the_engine_across_free_proposers_and_reloads_for_models():
    src, loads = _engine_source()
    base = Settings(target="qwen", proposer="ngram")
    assert src.needs_load(base)
    assert list(src.start("hi", base)) == TWO_STEPS
    assert len(loads) == 1 and loads[0].kw == {"target": "qwen", "draft": None, "proposer": "ngram",
                                               "n_ctx": 512, "threads": 1}
    for proposer in ("none", "suffix", "ngram"):
        s = Settings(target="qwen", proposer=proposer)
        assert not src.needs_load(s)
        list(src.start("hi", s))
    assert len(loads) == 1
    assert [p for _, _, p in loads[0].streams] == ["ngram", "none", "suffix", "ngram"]

    with_draft = Settings(target="qwen", proposer="draft", draft="small")
    assert src.needs_load(with_draft)
    list(src.start("hi", with_draft))
    assert len(loads) == 2 and loads[0].closed and loads[1].kw["draft"] == "small"
    # the draft engine still serves the free proposers, but not another draft or target
    assert not src.needs_load(Settings(target="qwen", proposer="ngram"))
    assert src.needs_load(Settings(target="qwen", proposer="draft", draft="other"))
    assert src.needs_load(Settings(target="gemma", proposer="ngram"))

    auto = Settings(target="qwen", proposer="auto")
    list(src.start("hi", auto))
    assert len(loads) == 3 and loads[2].kw["proposer"] == "auto"
    assert loads[2].streams[-1][2] is None  # the plan chose the default proposer at load


def test_a_fixed_draft_length_is_a_load_time_choice():
    src, loads = _engine_source()
    list(src.start("hi", Settings(target="qwen", proposer="ngram")))
    fixed = Settings(target="qwen", proposer="ngram", max_draft=3)
    assert src.needs_load(fixed)
    list(src.start("hi", fixed))
    assert loads[1].kw["max_draft"] == 3 and loads[1].kw["adaptive"] is False
    assert not src.needs_load(Settings(target="qwen", proposer="suffix", max_draft=3))
    with pytest.raises(InvalidInputError, match="draft length"):
        src.start("hi", Settings(target="qwen", max_draft=0))


def test_engine_source_refuses_bad_input_before_loading():
    src, loads = _engine_source()
    with pytest.raises(InvalidInputError):
        src.start("   ", Settings(target="qwen"))
    with pytest.raises(InvalidInputError):
        src.start("hi", Settings(target="qwen", max_tokens=0))
    assert loads == []


def test_a_cancel_that_races_the_start_is_forwarded_to_the_engine():
    src, loads = _engine_source()
    it = src.start("hi", Settings(target="qwen"))
    first = next(it)  # the engine is loaded and streaming
    src.cancel()
    assert loads[0].cancels == 1
    list(it)
    assert loads[0].cancels == 2  # forwarded once more from inside the stream
    assert first == TWO_STEPS[0]


def test_a_cancel_during_loading_skips_the_request():
    gate = threading.Event()
    loads: list = []

    def slow_loader(**kw):
        gate.wait(5)
        return FakeEngine(loads, **kw)

    src = EngineSource(loader=slow_loader)
    out: list = []
    it = src.start("hi", Settings(target="qwen"))
    t = threading.Thread(target=lambda: out.extend(it))
    t.start()
    src.cancel()
    gate.set()
    t.join(5)
    assert out == [] and loads and loads[0].streams == []


def test_chat_messages_are_a_conversation_and_exact_turns_settle():
    src, loads = _engine_source()
    msgs = [{"role": "user", "content": "hi"}]
    assert src.settle(Settings(target="qwen", exact=True), lambda: False) == 0  # nothing loaded
    assert list(src.start(msgs, Settings(target="qwen", exact=True))) == TWO_STEPS
    eng = loads[0]
    assert eng.chats == [(msgs, True)] and eng.streams == []
    # a setting the loaded (exact) engine does not serve refreshes nothing; the refresh
    # hands the engine the stop signal
    assert src.settle(Settings(target="qwen"), lambda: False) == 0 and eng.refreshes == []
    assert src.settle(Settings(target="qwen", exact=True), lambda: True) == 40
    assert eng.refreshes == [True]
    # exact mode runs its own kernel configuration: unticking it loads a default engine
    assert eng.kw.get("exact") is True
    list(src.start("plain text", Settings(target="qwen")))
    plain = loads[-1]
    assert plain is not eng and eng.closed and "exact" not in plain.kw
    assert plain.streams[-1][0] == "plain text" and plain.exact is False
    assert src.settle(Settings(target="qwen", exact=True), lambda: True) == 0  # not this engine


def test_only_pulled_drafts_are_offered(tmp_path, monkeypatch):
    """A draft that is not on disk would fail at load (issue 39: `bridge: gemma-270m` was
    offered unpulled); only pulled ones are listed."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "smollm2-135m.gguf").write_bytes(b"GGUF")
    c = registry_choices()
    assert c.runnable == frozenset({"smollm2-135m"})
    opts = [v for _, v in c.proposer_options("qwen-1.5b") if needs_model(v[0])]
    assert opts == [("bridge", "smollm2-135m")]  # not qwen-0.5b, not gemma-270m
    assert [v for _, v in c.proposer_options("/m/other.gguf") if v[0] == "draft"] == \
        [("draft", "smollm2-135m")]
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "empty"))
    assert not [v for _, v in registry_choices().proposer_options("qwen-1.5b")
                if needs_model(v[0])]
