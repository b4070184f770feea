"""`edgespec models scan` and store references (ollama:, hfcache:, lmstudio:, llamacpp:).

Each test builds the stores in a tmp dir in the layout their tools write, around the real
smollm2-135m GGUF file (hard links where the filesystem allows, so nothing is copied and
the real file is never written to), and isolates every location they are looked up in:
HOME, EDGESPEC_HOME, HF_HOME and the variables that move the stores.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec import registry
from edgespec.cli import cli
from edgespec.errors import ModelError
from edgespec.registry import refs, scan, store
from registry_fakes import sha256, write_gguf

MODEL_LAYER = "application/vnd.ollama.image.model"
COMMIT = "3f5a1c9e0b7d2a4c6e8f0a1b2c3d4e5f60718293"
OLD_COMMIT = "0123456789abcdef0123456789abcdef01234567"
_ISOLATED = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME", "LLAMA_CACHE",
             "OLLAMA_MODELS", scan.LMSTUDIO_ENV, "EDGESPEC_MODELS_TOML")


@dataclass(frozen=True)
class Real:
    path: Path
    sha256: str
    size: int


@pytest.fixture(scope="module")
def smol(model_path) -> Real:
    """The real smollm2-135m, resolved with the real EDGESPEC_HOME before any test
    isolates it."""
    path = model_path("smollm2-135m")
    spec = registry.load_registry().get("smollm2-135m")
    return Real(path, spec.sha256, spec.size)


def _link(src: Path, dst: Path) -> Path:
    """dst as a hard link to src (a copy across filesystems). Never writes through an
    existing dst: it may be a link to the real model."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        assert dst.samefile(src), f"{dst} exists and is another file"
        return dst
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, dst)
    return dst


class Disk:
    """A home directory whose tool stores the tests fill."""

    def __init__(self, root: Path):
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.es_home = root / "edgespec"
        self.hf_hub = root / "hf" / "hub"
        self.ollama = self.home / ".ollama" / "models"
        self.lmstudio = self.home / ".lmstudio" / "models"
        self.llamacpp = self.home / ".cache" / "llama.cpp"

    def ollama_model(self, name: str, tag: str, src: Path | None, digest: str,
                     size: int | None = None, namespace: str = "library",
                     host: str = "registry.ollama.ai", manifest: str | None = None) -> Path:
        """manifests/HOST/NAMESPACE/NAME/TAG naming the model blob blobs/sha256-DIGEST (a
        link to `src`; none when src is None), as `ollama pull` leaves them."""
        blob = self.ollama / "blobs" / f"sha256-{digest}"
        if src is not None:
            _link(src, blob)
        layers = [{"mediaType": "application/vnd.ollama.image.template",
                   "digest": "sha256:" + "e" * 64, "size": 10},
                  {"mediaType": MODEL_LAYER, "digest": f"sha256:{digest}",
                   "size": size if size is not None else (src.stat().st_size if src else 1)}]
        doc = {"schemaVersion": 2,
               "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
               "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                          "digest": "sha256:" + "c" * 64, "size": 400},
               "layers": layers}
        path = self.ollama / "manifests" / host / namespace / name / tag
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(manifest if manifest is not None else json.dumps(doc))
        return blob

    def hf_file(self, repo_id: str, filename: str, src: Path, etag: str,
                commit: str = COMMIT, main: bool = True, hub: Path | None = None) -> Path:
        """What hf_hub_download writes: blobs/<etag>, snapshots/<commit>/<file> -> a
        relative symlink to the blob, refs/main holding the commit."""
        repo = (hub or self.hf_hub) / f"models--{repo_id.replace('/', '--')}"
        _link(src, repo / "blobs" / etag)
        snap = repo / "snapshots" / commit / filename
        snap.parent.mkdir(parents=True, exist_ok=True)
        snap.symlink_to(os.path.relpath(repo / "blobs" / etag, snap.parent))
        if main:
            (repo / "refs").mkdir(exist_ok=True)
            (repo / "refs" / "main").write_text(commit)
        return snap

    def everywhere(self, smol: Real) -> None:
        self.ollama_model("smollm2", "135m", smol.path, smol.sha256)
        self.hf_file("HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-q4_1.gguf",
                     smol.path, smol.sha256)
        _link(smol.path, self.lmstudio / "HuggingFaceTB" / "SmolLM2-135M-Instruct-GGUF"
              / "smollm2-135m-q4_1.gguf")
        _link(smol.path, self.llamacpp / "HuggingFaceTB_SmolLM2-135M-Instruct-GGUF_smollm2.gguf")


@pytest.fixture
def disk(smol, tmp_path, monkeypatch) -> Disk:
    d = Disk(tmp_path)
    monkeypatch.setenv("HOME", str(d.home))
    monkeypatch.setenv("EDGESPEC_HOME", str(d.es_home))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for var in _ISOLATED:
        monkeypatch.delenv(var, raising=False)
    # the Linux system service's store is not this test's
    from edgespec.registry.scan import locations
    real_dirs = locations.ollama_dirs
    monkeypatch.setattr(locations, "ollama_dirs", lambda: real_dirs()[:1])
    return d


def run(*args, input=None):
    result = CliRunner().invoke(cli, list(args), input=input)
    assert "Traceback" not in result.output, result.output
    return result


def scanned(*args) -> dict:
    r = run("models", "scan", "--json", *args)
    assert r.exit_code == 0, r.output
    return {m["name"]: m for m in json.loads(r.output)["models"]}


NAMES = {
    "ollama:smollm2:135m": "ollama",
    "hfcache:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-q4_1.gguf": "hfcache",
    "lmstudio:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-q4_1.gguf": "lmstudio",
    "llamacpp:HuggingFaceTB_SmolLM2-135M-Instruct-GGUF_smollm2.gguf": "llamacpp",
}


# --------------------------------------------------------------------------- listing


def test_scan_lists_every_store_with_header_facts(disk, smol):
    disk.everywhere(smol)
    r = run("models", "scan")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "ARCH", "QUANT", "VOCAB", "PATH"]
    rows = {line.split()[0]: line.split() for line in lines[1:5]}
    assert set(rows) == set(NAMES)
    for row in rows.values():
        assert row[1:6] == ["98", "MB", "llama", "Q4_1", "49152"]
    assert rows["ollama:smollm2:135m"][-1] == str(disk.ollama / "blobs" / f"sha256-{smol.sha256}")
    assert "UNUSABLE" not in r.output
    stores = {tuple(line.split()[:2]): " ".join(line.split()[2:])
              for line in r.output.split("STORES\n", 1)[1].splitlines()}
    assert stores == {
        ("ollama", str(disk.ollama)): "1 model", ("hfcache", str(disk.hf_hub)): "1 model",
        ("lmstudio", str(disk.lmstudio)): "1 model",
        ("lmstudio", str(disk.home / ".cache" / "lm-studio" / "models")):
            f"absent (set {scan.LMSTUDIO_ENV} to move it)",
        ("llamacpp", str(disk.llamacpp)): "1 model"}


def test_scan_json_and_the_digest_recorded_once(disk, smol, monkeypatch):
    disk.everywhere(smol)
    models = scanned()
    assert {n: m["source"] for n, m in models.items()} == NAMES
    for m in models.values():
        assert m["usable"] and m["problem"] is None
        assert (m["size"], m["architecture"], m["vocab_size"], m["quant"]) == \
            (smol.size, "llama", 49152, "Q4_1")
        assert m["context_length"] == 8192
    # ollama blobs and Hub LFS blobs are named by their sha256; the others by nothing
    assert models["ollama:smollm2:135m"]["sha256"] == smol.sha256
    hf = "hfcache:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF/smollm2-135m-q4_1.gguf"
    assert models[hf]["sha256"] == smol.sha256
    assert models[hf]["path"].endswith(f"snapshots/{COMMIT}/smollm2-135m-q4_1.gguf")
    assert {m["verified"] for n, m in models.items() if m["sha256"]} == {False}
    assert {m["verified"] for n, m in models.items() if not m["sha256"]} == {None}

    path = registry.resolve("ollama:smollm2:135m")
    assert path == disk.ollama / "blobs" / f"sha256-{smol.sha256}"
    assert scanned()["ollama:smollm2:135m"]["verified"] is True

    # once stamped, an unchanged blob is not hashed again
    def no_hashing(p):
        raise AssertionError(f"re-hashed {p}")
    monkeypatch.setattr(scan, "sha256_file", no_hashing)
    assert registry.resolve("ollama:smollm2:135m") == path


def test_every_store_absent_is_reported_not_an_error(disk):
    r = run("models", "scan")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("no usable GGUF models found")
    stores = [line.split() for line in r.output.split("STORES\n", 1)[1].splitlines()]
    assert [(s[0], s[1], s[4]) for s in stores] == [
        ("ollama", str(disk.ollama), "OLLAMA_MODELS"),
        ("hfcache", str(disk.hf_hub), "HF_HUB_CACHE"),
        ("lmstudio", str(disk.lmstudio), scan.LMSTUDIO_ENV),
        ("lmstudio", str(disk.home / ".cache" / "lm-studio" / "models"), scan.LMSTUDIO_ENV),
        ("llamacpp", str(disk.llamacpp), "LLAMA_CACHE")]
    assert all(s[2] == "absent" for s in stores)
    doc = json.loads(run("models", "scan", "--json").output)
    assert doc["models"] == [] and not any(s["present"] for s in doc["stores"])


def test_truncated_and_non_gguf_files_are_listed_unusable(disk, smol):
    disk.everywhere(smol)
    trunc = disk.lmstudio / "someone" / "cut-GGUF" / "cut.gguf"
    trunc.parent.mkdir(parents=True)
    with open(smol.path, "rb") as f:
        trunc.write_bytes(f.read(smol.size // 2))
    (disk.llamacpp / "notes.gguf").write_text("these are my notes, not a model\n" * 4)
    (disk.llamacpp / "empty.gguf").write_bytes(b"")
    models = scanned()
    assert models["lmstudio:someone/cut-GGUF/cut.gguf"]["usable"] is False
    cut = models["lmstudio:someone/cut-GGUF/cut.gguf"]["problem"]
    assert cut.startswith(f"{trunc}: the file is truncated: its header describes {smol.size} "
                          f"bytes but it holds {smol.size // 2}")
    assert cut.endswith("; re-download it in LM Studio, or delete the file")
    notes = models["llamacpp:notes.gguf"]["problem"]
    assert "not a GGUF file: it starts with b'thes'" in notes
    assert notes.endswith("delete it and let llama.cpp download it again")  # its store's advice
    assert "the file is empty" in models["llamacpp:empty.gguf"]["problem"]
    assert all(models[n]["usable"] for n in NAMES)  # the good ones are still there

    r = run("models", "scan")
    assert r.exit_code == 0
    unusable = r.output.split("UNUSABLE\n", 1)[1].split("\n\nSTORES", 1)[0].splitlines()
    assert [line.split()[0] for line in unusable] == [
        "lmstudio:someone/cut-GGUF/cut.gguf", "llamacpp:empty.gguf", "llamacpp:notes.gguf"]
    # a broken file is refused by name with the reason and the way to get it back
    with pytest.raises(ModelError, match=r"lmstudio:someone/cut-GGUF/cut.gguf: .*the file is "
                                         r"truncated.*re-download it in LM Studio"):
        registry.resolve("lmstudio:someone/cut-GGUF/cut.gguf")


def test_broken_ollama_manifests_never_stop_the_scan(disk, smol, tmp_path):
    disk.everywhere(smol)
    disk.ollama_model("qwen2.5-coder", "7b", None, "a" * 64, size=4_683_073_184)
    disk.ollama_model("llama3.2", "1b", None, "b" * 64, manifest="{not json")
    disk.ollama_model("embed", "v1", None, "c" * 64, manifest=json.dumps(
        {"layers": [{"mediaType": "application/vnd.ollama.image.license", "digest": "x"}]}))
    cut = tmp_path / "cut.gguf"
    with open(smol.path, "rb") as f:
        cut.write_bytes(f.read(1 << 20))
    disk.ollama_model("smollm2", "cut", cut, smol.sha256.replace("b", "0", 1), size=smol.size)
    models = scanned("--source", "ollama")
    assert set(models) == {"ollama:smollm2:135m", "ollama:qwen2.5-coder:7b",
                           "ollama:llama3.2:1b", "ollama:embed:v1", "ollama:smollm2:cut"}
    assert models["ollama:smollm2:135m"]["usable"]
    missing = models["ollama:qwen2.5-coder:7b"]
    assert not missing["usable"] and f"sha256-{'a' * 64}, which is missing" in missing["problem"]
    assert "not valid JSON" in models["ollama:llama3.2:1b"]["problem"]
    assert f"names no layer of mediaType {MODEL_LAYER}" in models["ollama:embed:v1"]["problem"]
    # the manifest's size tells a truncated blob without hashing it
    assert f"has {1 << 20} bytes, its manifest says {smol.size}: it is truncated" \
        in models["ollama:smollm2:cut"]["problem"]
    assert all(m["problem"].endswith(f"re-pull it with `ollama pull {n[len('ollama:'):]}`")
               for n, m in models.items() if not m["usable"])


def test_a_store_that_cannot_be_read_is_a_note_not_a_crash(disk, smol, monkeypatch):
    disk.everywhere(smol)
    manifests = disk.ollama / "manifests"
    real_iterdir = Path.iterdir

    def iterdir(self):
        if self == manifests:  # as for the ollama service's store, owned by its own user
            raise PermissionError(13, "Permission denied", str(self))
        return real_iterdir(self)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    doc = json.loads(run("models", "scan", "--json").output)
    ollama = next(s for s in doc["stores"] if s["source"] == "ollama")
    assert ollama["present"] and ollama["notes"] == [
        f"cannot read it (Permission denied: {manifests})"]
    assert {m["name"] for m in doc["models"]} == set(NAMES) - {"ollama:smollm2:135m"}
    with pytest.raises(ModelError, match=r"it holds no GGUF models \(.*: cannot read it "
                                         r"\(Permission denied"):
        registry.resolve("ollama:smollm2:135m")


def test_split_set_with_a_part_missing_is_unusable(disk, tmp_path):
    part = write_gguf(tmp_path / "part.gguf")
    folder = disk.lmstudio / "pub" / "Big-GGUF"
    _link(part, folder / "big-Q4_K_M-00001-of-00003.gguf")
    _link(part, folder / "big-Q4_K_M-00003-of-00003.gguf")
    _link(part, folder / "whole-00001-of-00002.gguf")
    _link(part, folder / "whole-00002-of-00002.gguf")
    models = scanned("--source", "lmstudio")
    assert set(models) == {"lmstudio:pub/Big-GGUF/big-Q4_K_M-00001-of-00003.gguf",
                           "lmstudio:pub/Big-GGUF/whole-00001-of-00002.gguf"}
    broken = models["lmstudio:pub/Big-GGUF/big-Q4_K_M-00001-of-00003.gguf"]
    assert not broken["usable"] and broken["problem"].endswith("lacks part 00002")
    whole = models["lmstudio:pub/Big-GGUF/whole-00001-of-00002.gguf"]
    assert whole["usable"] and whole["parts"] == 2 and whole["size"] == 2 * part.stat().st_size


# --------------------------------------------------------------------------- references


def test_generate_runs_on_an_ollama_model(disk, smol):
    disk.ollama_model("smollm2", "135m", smol.path, smol.sha256)
    # --no-adaptive: nothing to calibrate in the isolated EDGESPEC_HOME; the reference is
    # what is under test
    r = run("generate", "--target", "ollama:smollm2:135m", "--max-tokens", "4",
            "--proposer", "none", "--no-adaptive", "--json", "Say hi")
    assert r.exit_code == 0, r.output
    record = json.loads(r.stdout.strip().splitlines()[-1])
    assert record["target"] == "ollama:smollm2:135m"
    assert record["stop_reason"] == "length" and len(record["tokens"]) == 4
    assert record["text"].strip()
    assert "checking the sha256 of ollama:smollm2:135m" in r.stderr


def test_each_scanned_name_resolves_to_its_file(disk, smol):
    disk.everywhere(smol)
    for name, source in NAMES.items():
        r = run("models", "path", name)
        assert r.exit_code == 0, r.output
        path = Path(r.stdout.strip())
        assert path.samefile(smol.path)
        assert path == Path(scanned()[name]["path"])


def test_ollama_names_as_ollama_reads_them(disk, smol, tmp_path):
    tiny = write_gguf(tmp_path / "tiny.gguf")
    digest = sha256(tiny.read_bytes())
    disk.ollama_model("smollm2", "latest", smol.path, smol.sha256)
    disk.ollama_model("coder", "v1", tiny, digest, namespace="someone")
    disk.ollama_model("SmolLM2-GGUF", "Q4_1", smol.path, smol.sha256, host="hf.co",
                      namespace="bartowski")
    blob = disk.ollama / "blobs" / f"sha256-{smol.sha256}"
    assert registry.resolve("ollama:smollm2") == blob  # tag latest
    assert registry.resolve("ollama:library/smollm2:latest") == blob
    assert registry.resolve("ollama:registry.ollama.ai/library/smollm2:latest") == blob
    assert registry.resolve("ollama:someone/coder:v1") == disk.ollama / "blobs" / f"sha256-{digest}"
    assert registry.resolve("ollama:hf.co/bartowski/SmolLM2-GGUF:Q4_1") == blob
    assert set(scanned()) == {"ollama:smollm2:latest", "ollama:someone/coder:v1",
                              "ollama:hf.co/bartowski/SmolLM2-GGUF:Q4_1"}


def test_unknown_ollama_model_lists_the_present_ones(disk, smol):
    disk.ollama_model("smollm2", "135m", smol.path, smol.sha256)
    r = run("generate", "--target", "ollama:qwen2.5-coder:7b", "hi")
    assert r.exit_code == 1
    assert "no ollama model ollama:qwen2.5-coder:7b in " in r.output
    assert "present: ollama:smollm2:135m" in r.output
    assert "`ollama pull qwen2.5-coder:7b`" in r.output


def test_absent_store_says_which_variable_moves_it(disk):
    with pytest.raises(ModelError, match=rf"there is no ollama store here \({disk.ollama} "
                                         r"does not exist\); set OLLAMA_MODELS"):
        registry.resolve("ollama:smollm2:135m")


def test_manifest_naming_a_missing_blob_is_refused(disk):
    disk.ollama_model("qwen2.5-coder", "7b", None, "a" * 64, size=4_683_073_184)
    r = run("generate", "--target", "ollama:qwen2.5-coder:7b", "hi")
    assert r.exit_code == 1
    assert f"names the blob {disk.ollama / 'blobs' / ('sha256-' + 'a' * 64)}, which is " \
           "missing" in r.output
    assert "re-pull it with `ollama pull qwen2.5-coder:7b`" in r.output


def test_manifest_that_is_not_json_is_refused(disk):
    disk.ollama_model("llama3.2", "1b", None, "b" * 64, manifest='{"layers": [')
    with pytest.raises(ModelError, match=r"ollama:llama3.2:1b: its manifest .*/manifests/"
                                         r"registry.ollama.ai/library/llama3.2/1b is not valid "
                                         r"JSON .*re-pull it with `ollama pull llama3.2:1b`"):
        registry.resolve("ollama:llama3.2:1b")


def test_blob_whose_digest_does_not_match_its_name_is_refused(disk, tmp_path):
    tiny = write_gguf(tmp_path / "tiny.gguf")
    wrong = "d" * 64
    disk.ollama_model("tiny", "v1", tiny, wrong)
    with pytest.raises(ModelError) as e:
        registry.resolve("ollama:tiny:v1")
    msg = str(e.value)
    assert f"has sha256 {sha256(tiny.read_bytes())}, but its store names it by sha256 " \
           f"{wrong}: the file is corrupt or was changed" in msg
    assert "`ollama pull tiny:v1`" in msg
    # nothing was recorded: the next try hashes and refuses again
    assert not store.stamp_matches(disk.ollama / "blobs" / f"sha256-{wrong}", wrong)
    assert scanned()["ollama:tiny:v1"]["verified"] is False
    with pytest.raises(ModelError, match="corrupt or was changed"):
        registry.resolve("ollama:tiny:v1")


def test_models_verify_rehashes_scanned_models(disk, smol, tmp_path):
    disk.everywhere(smol)
    tiny = write_gguf(tmp_path / "tiny.gguf")
    disk.ollama_model("tiny", "v1", tiny, "d" * 64)
    r = run("models", "verify", "ollama:smollm2:135m", "lmstudio:HuggingFaceTB/"
            "SmolLM2-135M-Instruct-GGUF/smollm2-135m-q4_1.gguf", "ollama:tiny:v1")
    assert r.exit_code == 1  # the tiny blob is not what its name says
    lines = r.stdout.splitlines()
    assert lines[0] == f"ollama:smollm2:135m\tok\t{smol.sha256}"
    assert lines[1].split("\t")[1:3] == ["ok", smol.sha256]
    assert "its store names no digest" in lines[1]
    assert lines[2].split("\t")[:2] == ["ollama:tiny:v1", "MISMATCH"]
    assert f"names it by sha256 {'d' * 64}" in lines[2]
    assert scanned()["ollama:smollm2:135m"]["verified"] is True


def test_changed_blob_after_its_digest_was_stamped_is_refused(disk, tmp_path):
    tiny = write_gguf(tmp_path / "tiny.gguf")
    digest = sha256(tiny.read_bytes())
    blob = disk.ollama_model("tiny", "v1", tiny, digest)
    assert registry.resolve("ollama:tiny:v1") == blob
    os.unlink(blob)  # replace the link by a file of the same size with other data
    data = bytearray(tiny.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    with pytest.raises(ModelError, match="corrupt or was changed"):
        registry.resolve("ollama:tiny:v1")


def test_hf_cache_honours_hf_hub_cache_and_revisions(disk, smol, tmp_path, monkeypatch):
    tiny = write_gguf(tmp_path / "tiny.gguf")
    repo = "someone/Tiny-GGUF"
    new = disk.hf_file(repo, "tiny.gguf", tiny, sha256(tiny.read_bytes()))
    old = disk.hf_file(repo, "tiny.gguf", smol.path, smol.sha256, commit=OLD_COMMIT, main=False)
    names = scanned("--source", "hfcache")
    assert set(names) == {f"hfcache:{repo}/tiny.gguf",
                          f"hfcache:{repo}/tiny.gguf@{OLD_COMMIT[:12]}"}
    assert registry.resolve(f"hfcache:{repo}/tiny.gguf") == new       # what main points to
    assert registry.resolve(f"hfcache:{repo}/tiny.gguf@main") == new
    assert registry.resolve(f"hfcache:{repo}/tiny.gguf@{OLD_COMMIT[:8]}") == old
    with pytest.raises(ModelError, match=rf"present: hfcache:{repo}/tiny.gguf"):
        registry.resolve(f"hfcache:{repo}/other.gguf")

    moved = tmp_path / "elsewhere"
    shutil.move(disk.hf_hub, moved)
    monkeypatch.setenv("HF_HUB_CACHE", str(moved))  # over HF_HOME, as huggingface_hub does
    assert registry.resolve(f"hfcache:{repo}/tiny.gguf") == moved / new.relative_to(disk.hf_hub)


def test_store_locations_follow_their_variables(disk, smol, tmp_path, monkeypatch):
    for var, name in (("OLLAMA_MODELS", "ollama"), ("LLAMA_CACHE", "llama.cpp"),
                      (scan.LMSTUDIO_ENV, "lms")):
        monkeypatch.setenv(var, str(tmp_path / name))
    _link(smol.path, tmp_path / "llama.cpp" / "a_b_c.gguf")
    _link(smol.path, tmp_path / "lms" / "pub" / "repo" / "m.gguf")
    models = scanned("--source", "llamacpp", "--source", "lmstudio")
    assert set(models) == {"llamacpp:a_b_c.gguf", "lmstudio:pub/repo/m.gguf"}
    doc = json.loads(run("models", "scan", "--json", "--source", "ollama").output)
    assert doc["stores"] == [{"source": "ollama", "root": str(tmp_path / "ollama"),
                              "env": "OLLAMA_MODELS", "present": False, "notes": []}]


def test_a_name_in_two_folders_of_one_store_means_the_first(disk, tmp_path, monkeypatch):
    first, second = tmp_path / "lms-a", tmp_path / "lms-b"
    monkeypatch.setenv(scan.LMSTUDIO_ENV, f"{first}{os.pathsep}{second}")
    for folder in (first, second):
        (folder / "pub" / "repo").mkdir(parents=True)
    a = write_gguf(first / "pub" / "repo" / "m.gguf")
    b = write_gguf(second / "pub" / "repo" / "m.gguf")
    doc = json.loads(run("models", "scan", "--json", "--source", "lmstudio").output)
    assert [(m["path"], m["usable"]) for m in doc["models"]] == [(str(a), True), (str(b), False)]
    assert doc["models"][1]["problem"] == (
        f"the name lmstudio:pub/repo/m.gguf resolves to {a} in an earlier folder; set "
        f"{scan.LMSTUDIO_ENV} to this folder to use this file")
    assert registry.resolve("lmstudio:pub/repo/m.gguf") == a


def test_llamacpp_cache_in_the_hugging_face_layout(disk, smol, tmp_path, monkeypatch):
    cache = tmp_path / "llama-cache"
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    snap = disk.hf_file("ggml-org/SmolLM2-GGUF", "smol-q4_1.gguf", smol.path, smol.sha256,
                        hub=cache)
    _link(smol.path, cache / "ggml-org_SmolLM2-GGUF_smol-q4_1.gguf")  # not migrated yet
    (cache / "ggml-org_SmolLM2-GGUF_smol-q4_1.gguf.etag").write_text('"abc"')
    doc = json.loads(run("models", "scan", "--json", "--source", "llamacpp").output)
    assert [m["name"] for m in doc["models"]] == [
        "llamacpp:ggml-org_SmolLM2-GGUF_smol-q4_1.gguf",
        "llamacpp:ggml-org/SmolLM2-GGUF/smol-q4_1.gguf"]
    assert all(m["usable"] for m in doc["models"])
    assert doc["stores"][0]["notes"] == []  # the flat files are not broken repos
    assert registry.resolve("llamacpp:ggml-org/SmolLM2-GGUF/smol-q4_1.gguf") == snap
    assert registry.resolve("llamacpp:ggml-org/SmolLM2-GGUF/smol-q4_1.gguf@main") == snap
    assert scanned("--source", "llamacpp")[
        "llamacpp:ggml-org/SmolLM2-GGUF/smol-q4_1.gguf"]["verified"] is True


def test_models_add_pins_a_scanned_model(disk, smol):
    disk.ollama_model("smollm2", "135m", smol.path, smol.sha256)
    r = run("models", "add", "my-smol", "ollama:smollm2:135m", "--role", "draft")
    assert r.exit_code == 0, r.output
    blob = disk.ollama / "blobs" / f"sha256-{smol.sha256}"
    assert r.stdout.split("\t") == ["my-smol", str(blob), smol.sha256 + "\n"]
    listed = json.loads(run("models", "list", "--json").output)
    mine = next(m for m in listed["models"] if m["name"] == "my-smol")
    assert (mine["origin"], mine["role"], mine["path"], mine["status"]) == \
        ("user", "draft", str(blob), "verified")
    assert registry.resolve("my-smol") == blob
    bad = run("models", "add", "nope", "ollama:nothing:here")
    assert bad.exit_code == 2 and "no ollama model ollama:nothing:here" in bad.output


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("locator, canonical, short", [
    ("qwen2.5-coder:7b", "registry.ollama.ai/library/qwen2.5-coder:7b", "qwen2.5-coder:7b"),
    ("smollm2", "registry.ollama.ai/library/smollm2:latest", "smollm2:latest"),
    ("owner/name:tag", "registry.ollama.ai/owner/name:tag", "owner/name:tag"),
    ("hf.co/bartowski/X-GGUF:Q4_K_M", "hf.co/bartowski/X-GGUF:Q4_K_M",
     "hf.co/bartowski/X-GGUF:Q4_K_M"),
    ("localhost:5000/me/m", "localhost:5000/me/m:latest", "localhost:5000/me/m:latest"),
])
def test_parse_ollama_names(locator, canonical, short):
    name = refs.parse_ollama(locator)
    assert (name.canonical, name.short) == (canonical, short)


@pytest.mark.parametrize("locator", ["a/b/c/d:t", "name:", "/name", "na me:t", "n:t:u"])
def test_bad_ollama_names_say_how_to_write_one(locator):
    with pytest.raises(ModelError, match=r"ollama"):
        refs.parse_ollama(locator)


def test_store_refs_are_told_from_paths_and_names():
    assert refs.is_store_ref("ollama:owner/name:tag")
    assert refs.is_store_ref("lmstudio:pub/repo/file.gguf")
    assert not refs.is_store_ref("qwen-1.5b")
    assert not refs.is_store_ref("/models/ollama:x.gguf")
    assert not refs.is_store_ref("C:\\models\\x.gguf")
    with pytest.raises(ModelError, match="names no model after ollama:"):
        registry.resolve("ollama:")
