"""Release identity: the hash changes when any component changes and only then."""
from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest

from edgespec.identity import identity as idmod
from edgespec.registry import digests
from edgespec.runtime.kernel import KernelConfig
from edgespec.control import ControlSettings
from edgespec.errors import EdgespecError
from edgespec.identity.identity import Identity, canonical, diff, identity_hash
from edgespec.api.stats import JsonlSink, MemorySink
from edgespec.api.params import GenerationParams
from fakes import FakeModel, ScriptedProposer, fake_engine, fixed

BASE = {
    "target": {"sha256": "a" * 64, "size": 100, "file_type": "MOSTLY_Q4_K_M",
               "tokenizer": {"n_vocab": 18, "vocab_sha256": "b" * 64, "eog": [1, 2]}},
    "draft": None,
    "edgespec": {"version": "0.1.0", "commit": "c" * 40, "dirty": False, "diff_sha256": None},
    "llama_cpp": {"llama_cpp_python": "0.3.36", "system_info": "AVX2 = 1",
                  "cmake": {"args": ["-DGGML_AVX2=ON"], "source": "env CMAKE_ARGS"}},
    "kernel": {"repack": True, "flash_attn": True, "kv_type": "q8_0", "n_batch": 512,
               "use_mmap": True, "exact_cap": None},
    "runtime": {"threads": 2, "n_ctx": 4096, "n_gpu_layers": 0},
    "policy": {"default_proposer": "ngram+suffix", "exact": False,
               "control": {"adaptive": True, "max_draft": 15, "guard_threshold": 1.0}},
    "features": {"proposers": {"ngram": {"costly": False}}, "exact": False},
    "hardware": {"cpu_model": "EPYC", "cores": 2, "isa": ["avx2", "fma"], "ram_total": 8 << 30},
}


def leaves(d, path=()):
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, (*path, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            yield from leaves(v, (*path, i))
    else:
        yield path


def changed(d, path):
    d = copy.deepcopy(d)
    cur = d
    for p in path[:-1]:
        cur = cur[p]
    v = cur[path[-1]]
    cur[path[-1]] = (not v if isinstance(v, bool) else v + 1 if isinstance(v, (int, float))
                     else None if isinstance(v, str) else "set")
    return d


@pytest.mark.parametrize("path", list(leaves(BASE)), ids=lambda p: ".".join(map(str, p)))
def test_every_component_changes_the_hash(path):
    after = changed(BASE, path)
    assert identity_hash(after) != identity_hash(BASE)
    # diff names the component (a list is one component: its path without the index)
    assert diff(BASE, after) == [".".join(str(p) for p in path if not isinstance(p, int))]


def test_only_components_change_the_hash():
    a = Identity(BASE, {"date": "2025-01-01", "target": {"path": "/x.gguf"}})
    b = Identity(copy.deepcopy(BASE), {"date": "2026-02-02", "target": {"path": "/y.gguf"},
                                       "ram_available": 123})
    assert a.hash == b.hash and len(a.short) == 12
    # key order and tuple/list are not components
    reordered = dict(reversed(list(BASE.items())))
    reordered["hardware"] = {**BASE["hardware"], "isa": ("avx2", "fma")}
    assert identity_hash(reordered) == a.hash
    assert diff(a, b) == []


def test_the_record_round_trips_through_json():
    a = Identity(BASE, {"date": "d"})
    d = json.loads(json.dumps(a.to_dict()))
    assert d["hash"] == a.hash and Identity.from_dict(d).hash == a.hash and d["schema"] == 1


@pytest.mark.parametrize("bad", [float("nan"), object(), b"bytes"])
def test_components_must_be_plain_data(bad):
    with pytest.raises(EdgespecError, match="identity components"):
        canonical({"x": bad})


# --- collected from an engine (fake backend) ------------------------------------------------
@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def engine(model=None, **kw):
    model = model or FakeModel()
    props = kw.pop("proposers", {"scripted": ScriptedProposer(model, [2])})
    return fake_engine(model, props, **kw)


def test_an_engine_computes_its_identity_once(home, monkeypatch):
    eng = engine()
    calls = []
    real = idmod.collect
    monkeypatch.setattr(idmod, "collect", lambda e: calls.append(1) or real(e))
    first = eng.identity
    assert eng.identity is first and len(calls) == 1
    c = first.components
    assert c["target"]["tokenizer"]["n_vocab"] == 18 and c["target"]["sha256"] is None
    assert c["features"]["proposers"] == {"scripted": {"kind": "scripted", "costly": False}}
    assert c["policy"]["control"]["max_draft"] == 3 and c["kernel"]["kv_type"] == "q8_0"
    assert c["llama_cpp"]["llama_cpp_python"] and c["hardware"]["cores"] >= 1
    # adding a proposer changes the feature matrix, so the identity is taken again
    eng.add_proposer("other", ScriptedProposer(eng.target, [1], name="other"))
    assert eng.identity.hash != first.hash
    assert diff(first, eng.identity) == ["features.proposers.other"]


def test_same_configuration_same_hash_and_each_change_is_named(home):
    base = engine().identity
    assert engine().identity.hash == base.hash
    k = engine()
    # (where the weights live is the base's: unasked, it depends on this machine's pages)
    k.config = replace(k.config, kernel=KernelConfig(
        repack=False, use_mmap=base.components["kernel"]["use_mmap"]))
    assert diff(base, k.identity) == ["kernel.repack"]
    p = engine(control=ControlSettings(adaptive=False, max_draft=5))
    assert diff(base, p.identity) == ["policy.control.max_draft"]
    t = engine(n_ctx=128)
    assert diff(base, t.identity) == ["runtime.n_ctx"]


def test_the_model_digest_and_vocabulary_digest_follow_the_files(home, tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"one model")
    b.write_bytes(b"another model")
    ca, cb = idmod.model_component("a", a), idmod.model_component("b", b)
    assert ca["sha256"] != cb["sha256"] and ca["digest"] == "computed"
    assert idmod.model_component("renamed", a)["sha256"] == ca["sha256"]

    class Vocab(FakeModel):
        def __init__(self, texts):
            super().__init__()
            self.texts = texts
            self.n_vocab = len(texts)

        def token_text(self, t):
            return self.texts[t]

        def token_attr(self, t):
            return 1

    one = digests.vocabulary_digest(Vocab(["a", "b"]), "f" * 64)
    assert digests.vocabulary_digest(Vocab(["a", "c"])) != one
    # cached by the model's digest: a second look does not read the vocabulary again
    assert digests.vocabulary_digest(Vocab([]), "f" * 64) == one


def test_stats_sinks_carry_the_hash_and_the_full_record_once(home, tmp_path):
    mem, path = MemorySink(), tmp_path / "stats.jsonl"
    model = FakeModel()
    eng = fake_engine(model, {"scripted": ScriptedProposer(model, [2])}, control=fixed(2),
                      sinks=[mem, JsonlSink(str(path))])
    for _ in range(2):
        eng.generate("a", GenerationParams(max_tokens=6, chat=False))
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x.get("kind") for x in lines] == ["identity", None, None]
    assert lines[0]["hash"] == eng.identity.hash == lines[1]["identity"] == lines[2]["identity"]
    assert lines[0]["components"]["policy"]["default_proposer"] == "scripted"
    assert [r.identity for r in mem.records] == [eng.identity.hash] * 2
    assert list(mem.identities) == [eng.identity.hash]


def test_without_sinks_no_identity_is_computed(home, monkeypatch):
    monkeypatch.setattr(idmod, "collect", lambda e: pytest.fail("identity computed"))
    r = engine().generate("a", GenerationParams(max_tokens=4, chat=False))
    assert r.stats.identity is None


def test_bench_reports_carry_the_engine_release_identity(home):
    from edgespec.lab.bench.identity import collect_identity
    eng = engine()
    run = collect_identity(None, eng, {}, {"ngram": {"k": 2}})
    assert run["release_hash"] == eng.identity.hash == run["release"]["hash"]
    assert run["release"]["components"] == json.loads(json.dumps(eng.identity.to_dict()))["components"]
    assert run["models"]["target"]["name"] == "fake.gguf"
    assert run["edgespec"]["version"] and "load_average" in run["machine"]
    assert run["engine"]["control_knobs"] == {"ngram": {"k": 2}}


def test_the_draft_model_is_in_the_identity_whichever_proposer_holds_it(home, tmp_path):
    class Holder(ScriptedProposer):
        """A costly proposer holding a draft model, named as the registry names it."""

    target, dmodel = FakeModel(), FakeModel(name="draft.gguf")
    (tmp_path / "draft.gguf").write_bytes(b"a draft model")
    dmodel.path = tmp_path / "draft.gguf"
    same = Holder(target, [2], name="draft", costly=True)
    same.model = dmodel
    bridged = Holder(target, [2], name="bridge", costly=True)
    bridged.model = dmodel
    a = engine(target, proposers={"draft": same}).identity.components["draft"]
    b = engine(target, proposers={"bridge": bridged}).identity.components["draft"]
    assert a["sha256"] == b["sha256"] is not None
    # the bridge is a release artifact: its version is part of the identity
    from edgespec.proposers.vocab_bridge import BRIDGE_VERSION
    assert b["bridge_version"] == BRIDGE_VERSION and "bridge_version" not in a
    assert engine(target).identity.components["draft"] is None
