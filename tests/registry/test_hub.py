"""Hugging Face Hub pulls (edgespec.registry.hub) against a Hub stand-in on loopback.

The stand-in (hub_standin.py) serves real GGUF files of the test models with the routes and
headers huggingface_hub expects; every test points HF_ENDPOINT at it and isolates
EDGESPEC_HOME and HF_HOME, so nothing here reaches the real Hub or the user's caches.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec import registry
from edgespec.cli import cli
from edgespec.errors import ModelError
from edgespec.registry import hub
from hub_standin import StandIn
from registry_fakes import write_gguf

SMOL_REPO = "edgespec-test/SmolLM2-135M-Instruct-GGUF"
SMOL_FILE = "smollm2-135m-instruct-q4_k_m.gguf"
SMOL_URI = f"hf://{SMOL_REPO}/{SMOL_FILE}"


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            h.update(block)
    return h.hexdigest()


def write_split(src: Path, folder: Path, stem: str, parts: int) -> list[Path]:
    """`src` rewritten as a split set (llama.cpp's layout: split.no, split.count and
    split.tensors.count in every part, the metadata in the first) with the gguf package."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    per_part = -(-len(reader.tensors) // parts)
    w = gguf.GGUFWriter(str(folder / f"{stem}.gguf"), arch, split_max_tensors=per_part)
    for key, fld in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = fld.types[0]
        sub = fld.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, fld.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = sorted(folder.glob(f"{stem}-*-of-*.gguf"))
    assert len(out) == parts
    return out


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def smol(model_path) -> Path:
    """The real smollm2-135m GGUF (pulled into the real EDGESPEC_HOME before any test
    isolates it)."""
    return model_path("smollm2-135m")


@pytest.fixture(scope="module")
def smol_sha(smol) -> str:
    from edgespec.registry import load_registry
    return load_registry().get("smollm2-135m").sha256


@pytest.fixture(scope="module")
def standin(smol, smol_sha):
    with StandIn() as s:
        s.add_file(SMOL_REPO, SMOL_FILE, smol, sha256=smol_sha)
        yield s


@pytest.fixture
def env(standin, tmp_path, monkeypatch):
    """A fresh EDGESPEC_HOME and Hugging Face cache per test, HF_ENDPOINT at the stand-in."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", standin.endpoint)
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    # the token file huggingface-cli login writes must not leak in either
    monkeypatch.setattr("huggingface_hub.constants.HF_TOKEN_PATH", str(tmp_path / "no-token"))
    standin.clear_log()
    standin.drop_after.clear()
    standin.stall_after.clear()
    standin.release.clear()
    return tmp_path


def _cli(*args):
    return CliRunner().invoke(cli, list(args))


def _gets(standin, sha: str) -> list:
    return [r for r in standin.log("cdn", "GET") if r.path.endswith(sha)]


def _pins(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "home" / "hub-pins.json").read_text())["files"]


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize("text,repo,rev,filename,quant", [
    ("hf://o/r/m.gguf", "o/r", None, "m.gguf", None),
    ("hf://o/r/sub/dir/m-Q8_0.gguf", "o/r", None, "sub/dir/m-Q8_0.gguf", None),
    ("hf://o/r@v1.0/m.gguf", "o/r", "v1.0", "m.gguf", None),
    ("hf://o/r/m.gguf@0123abc", "o/r", "0123abc", "m.gguf", None),
    ("hf://models/o/r/m.gguf", "o/r", None, "m.gguf", None),
    ("Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", None, None,
     "Q4_K_M"),
    ("o/r", "o/r", None, None, None),
    ("o/r@dev:q8_0", "o/r", "dev", None, "q8_0"),
    ("hf.co/o/r:Q8_0", "o/r", None, None, "Q8_0"),
])
def test_references_parse(text, repo, rev, filename, quant):
    r = hub.parse(text)
    assert (r.repo, r.revision, r.filename, r.quant) == (repo, rev, filename, quant)
    assert hub.is_hub_ref(text)


@pytest.mark.parametrize("text,says", [
    ("hf://o/r", "names no file"),
    ("hf://o", "names no file"),
    ("hf://o/r/README.md", "not a .gguf file"),
    ("hf://datasets/o/r/m.gguf", "only model repositories"),
    ("hf://o/r/../x.gguf", "no '..'"),
    ("hf://o/r@/m.gguf", "not a revision"),
    ("hf://-o/r/m.gguf", "not a repository id"),
])
def test_malformed_references_say_how_to_write_them(text, says):
    with pytest.raises(ModelError, match=says) as e:
        hub.parse(text)
    assert "hf://" in str(e.value)


def test_local_paths_and_other_names_are_not_hub_references(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "x").write_bytes(b"")
    for name in ("qwen-1.5b", "models/x", "dir/model.gguf", "./o/r", "/abs/o",
                 "ollama:qwen2.5-coder:7b", "hfcache:o/r/m.gguf"):
        assert not hub.is_hub_ref(name), name


# --------------------------------------------------------------------------- pulls


def test_pull_by_uri_pins_the_digest_and_serves_the_cache_after(env, standin, smol_sha):
    r = _cli("models", "pull", SMOL_URI)
    assert r.exit_code == 0, r.output
    path = Path(r.output.strip().splitlines()[-1].split("\t")[1])
    # huggingface_hub's cache under HF_HOME, a snapshot link (never a blobs/ file)
    assert path.is_relative_to(env / "hf" / "hub") and "snapshots" in path.parts
    assert _sha(path) == smol_sha
    commit = standin.repos[SMOL_REPO].commit
    pins = _pins(env)
    assert pins[f"{SMOL_REPO}@{commit}/{SMOL_FILE}"]["sha256"] == smol_sha
    assert len(_gets(standin, smol_sha)) == 1

    # a second pull and a resolve by the shorthand find it cached and stamped: no download,
    # no re-hash
    standin.clear_log()
    r = _cli("models", "pull", SMOL_URI)
    assert r.exit_code == 0, r.output
    assert "checking the sha256" not in r.output
    assert registry.resolve(f"{SMOL_REPO}:Q4_K_M") == path
    assert registry.resolve(SMOL_REPO) == path  # no :QUANT: Q4_K_M
    assert _gets(standin, smol_sha) == []


def test_shorthand_picks_the_quant_case_insensitively(env, standin, tmp_path):
    repo = "edgespec-test/quants-GGUF"
    files = {}
    for q in ("Q8_0", "Q4_K_M", "Q4_K_S", "IQ2_XS"):
        f = write_gguf(tmp_path / f"tiny-{q}.gguf", elements=256 + len(files))
        files[q] = standin.add_file(repo, f"Tiny-{q}.gguf", f)
    standin.add_file(repo, "mmproj-Tiny-Q8_0.gguf", write_gguf(tmp_path / "proj.gguf", elements=64))

    assert _sha(registry.resolve(f"{repo}:q8_0")) == files["Q8_0"].sha256
    assert _sha(registry.resolve(f"{repo}:Q4_K_S")) == files["Q4_K_S"].sha256
    assert _sha(registry.resolve(repo)) == files["Q4_K_M"].sha256
    assert _sha(registry.resolve(f"hf.co/{repo}:iq2_xs")) == files["IQ2_XS"].sha256

    with pytest.raises(ModelError) as e:
        registry.resolve(f"{repo}:Q5_K_M")
    assert "no GGUF file carries Q5_K_M" in str(e.value)
    assert "Q8_0, Q4_K_M, Q4_K_S, IQ2_XS" in str(e.value) or all(
        q in str(e.value) for q in ("Q8_0", "Q4_K_M", "Q4_K_S", "IQ2_XS"))


def test_without_quant_and_no_q4_k_m_it_lists_the_quants(env, standin, tmp_path):
    repo = "edgespec-test/noq4-GGUF"
    standin.add_file(repo, "a-Q8_0.gguf", write_gguf(tmp_path / "a.gguf", elements=300))
    standin.add_file(repo, "a-F16.gguf", write_gguf(tmp_path / "b.gguf", elements=301))
    with pytest.raises(ModelError, match=r"no :QUANT was given and it has no Q4_K_M file; its "
                                         r"quants: .*Q8_0"):
        registry.resolve(repo)
    standin.add_file(repo, "b-Q8_0.gguf", write_gguf(tmp_path / "c.gguf", elements=302))
    with pytest.raises(ModelError, match="several GGUF files .* carry Q8_0.*hf://"):
        registry.resolve(f"{repo}:Q8_0")


def test_generate_from_the_hub_end_to_end(env, smol_sha):
    r = _cli("generate", "--target", SMOL_URI, "--threads", "2", "--ctx", "256", "--proposer",
             "none", "--no-adaptive", "--raw", "--max-tokens", "4", "--json",
             "The colours of the rainbow are")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output.strip().splitlines()[-1])
    assert rec["stats"]["generated_tokens"] >= 1 and rec["text"]
    # it ran the file pulled into the Hugging Face cache, the test model's very bytes
    target = Path(rec["identity_record"]["context"]["target"]["path"])
    assert target.is_relative_to(env / "hf" / "hub") and _sha(target) == smol_sha


def test_dropped_connection_resumes_with_a_range_request(env, standin, smol_sha):
    standin.drop_after[smol_sha] = 30_000_000
    path = hub.pull(SMOL_URI)
    gets = _gets(standin, smol_sha)
    assert len(gets) == 2 and gets[0].range is None
    resumed_at = int(gets[1].range.removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_at <= 30_000_000  # huggingface_hub kept what it had written
    assert _sha(path) == smol_sha
    assert not list((env / "hf").rglob("*.incomplete"))


def test_a_killed_pull_leaves_nothing_that_resolves_and_the_next_pull_resumes_it(
        env, standin, smol_sha, monkeypatch):
    standin.stall_after[smol_sha] = 40_000_000
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; from edgespec.registry import hub; "
                               "hub.pull(sys.argv[1])", SMOL_URI],
        env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        partial = []
        while time.monotonic() < deadline:
            partial = [p for p in (env / "hf").rglob("*.incomplete") if p.stat().st_size > 0]
            if partial and partial[0].stat().st_size >= 20_000_000:
                break
            time.sleep(0.1)
        assert partial, "the child never started downloading"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        standin.release.set()
    # the partial file is huggingface_hub's, in blobs/: no reference reaches it
    with pytest.raises(ModelError, match="not pulled yet"):
        registry.resolve(SMOL_URI, pull=False)
    with monkeypatch.context() as m:
        m.setenv("HF_HUB_OFFLINE", "1")
        with pytest.raises(ModelError, match="HF_HUB_OFFLINE is set"):
            registry.resolve(SMOL_URI)
    # the next pull, another process, goes on from where the killed one stopped
    left = [p for p in (env / "hf").rglob("*.incomplete")]
    assert len(left) == 1
    had = left[0].stat().st_size
    standin.clear_log()
    r = _cli("models", "pull", SMOL_URI)
    assert r.exit_code == 0, r.output
    gets = _gets(standin, smol_sha)
    assert [g.range for g in gets] == [f"bytes={had}-"], gets
    assert _sha(Path(r.output.strip().splitlines()[-1].split("\t")[1])) == smol_sha
    assert not list((env / "hf").rglob("*.incomplete"))


def test_a_partial_that_does_not_complete_to_the_listed_file_is_deleted(env, standin, smol,
                                                                         smol_sha):
    """A leftover whose bytes are wrong (another file's, a disk error) is not linked into
    the snapshot; the pull after it downloads the file afresh."""
    from huggingface_hub.file_download import repo_folder_name
    blobs = env / "hf" / "hub" / repo_folder_name(repo_id=SMOL_REPO, repo_type="model") / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{smol_sha}.deadbeef.incomplete").write_bytes(b"\0" * 1_000_000)
    with pytest.raises(ModelError, match="did not complete to the file the Hub lists"):
        hub.pull(SMOL_URI)
    assert not list(blobs.iterdir())
    with pytest.raises(ModelError, match="not pulled yet"):
        registry.resolve(SMOL_URI, pull=False)
    assert _sha(hub.pull(SMOL_URI)) == smol_sha


def test_offline_from_the_cache_with_the_hub_gone(env, smol, smol_sha, monkeypatch):
    with StandIn() as gone:
        gone.add_file(SMOL_REPO, SMOL_FILE, smol, sha256=smol_sha)
        monkeypatch.setenv("HF_ENDPOINT", gone.endpoint)
        path = hub.pull(SMOL_URI)
    # stopped: HF_HUB_OFFLINE=1 resolves by either spelling from the cache, verified
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert registry.resolve(SMOL_URI) == path
    assert registry.resolve(f"{SMOL_REPO}:q4_k_m") == path
    with pytest.raises(ModelError, match="HF_HUB_OFFLINE is set; unset it"):
        registry.resolve("edgespec-test/never-pulled-GGUF:Q8_0")
    # not offline, but unreachable: the cache still answers; what it lacks is a clear error
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert registry.resolve(SMOL_URI) == path
    r = _cli("models", "pull", "edgespec-test/never-pulled-GGUF:Q8_0")
    assert r.exit_code == 1
    assert "unreachable" in r.output and "not in the Hugging Face cache" in r.output
    assert "Traceback" not in r.output


def test_a_changed_file_is_refused_by_its_digest(env, standin, tmp_path, monkeypatch):
    repo, name = "edgespec-test/changing-GGUF", "tiny-Q8_0.gguf"
    first = standin.add_file(repo, name, write_gguf(tmp_path / "v1.gguf", elements=400))
    uri = f"hf://{repo}/{name}"
    path = hub.pull(uri)

    # the cached file edited in place (same size): re-hashed, refused, and --force heals it
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.resolve().write_bytes(bytes(data))
    with pytest.raises(ModelError, match=rf"refusing {uri}: .*{first.sha256}.*--force"):
        registry.resolve(uri)
    r = _cli("models", "pull", uri, "--force")
    assert r.exit_code == 0, r.output
    assert _sha(registry.resolve(uri)) == first.sha256

    # the Hub serves other bytes under the same commit and name; a fresh cache fetches them
    second = standin.add_file(repo, name, write_gguf(tmp_path / "v2.gguf", elements=401))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf2"))
    r = _cli("models", "pull", uri)
    assert r.exit_code == 1
    assert "refusing" in r.output and first.sha256 in r.output and second.sha256 in r.output
    assert f"edgespec models pull {uri} --force" in r.output
    with pytest.raises(ModelError, match="refusing"):  # every later resolve too
        registry.resolve(uri)
    # --force downloads again and pins what arrives
    r = _cli("models", "pull", uri, "--force")
    assert r.exit_code == 0, r.output
    assert "accepted the new file" in r.output
    assert _sha(registry.resolve(uri)) == second.sha256
    commit = standin.repos[repo].commit
    assert _pins(env)[f"{repo}@{commit}/{name}"]["sha256"] == second.sha256


def test_missing_repo_file_and_revision_messages(env, standin):
    r = _cli("models", "pull", "edgespec-test/no-such-repo-GGUF:Q4_K_M")
    assert r.exit_code == 1
    assert "no repository edgespec-test/no-such-repo-GGUF" in r.output
    assert "HF_TOKEN" in r.output and "huggingface-cli login" in r.output
    r = _cli("models", "pull", f"hf://{SMOL_REPO}/absent-Q8_0.gguf")
    assert r.exit_code == 1
    assert "has no file absent-Q8_0.gguf" in r.output and SMOL_FILE in r.output
    r = _cli("models", "pull", f"hf://{SMOL_REPO}@v9/{SMOL_FILE}")
    assert r.exit_code == 1 and "has no revision v9" in r.output
    for out in (r.output,):
        assert "Traceback" not in out


def test_gated_repo_needs_a_token(env, standin, tmp_path, monkeypatch):
    repo = "edgespec-test/gated-GGUF"
    blob = standin.add_file(repo, "g-Q8_0.gguf", write_gguf(tmp_path / "g.gguf", elements=500))
    standin.repos[repo].gated = True
    standin.tokens.add("hf_good")
    r = _cli("models", "pull", f"{repo}:Q8_0")
    assert r.exit_code == 1
    assert "is gated (401)" in r.output and "HF_TOKEN" in r.output
    assert "huggingface-cli login" in r.output
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    r = _cli("models", "pull", f"{repo}:Q8_0")
    assert r.exit_code == 1 and "your token has no access" in r.output and "(403)" in r.output
    monkeypatch.setenv("HF_TOKEN", "hf_good")
    r = _cli("models", "pull", f"{repo}:Q8_0")
    assert r.exit_code == 0, r.output
    assert any(x.authorization == "Bearer hf_good" for x in standin.log("hub", "HEAD"))
    # the token never leaves for the CDN
    assert all(x.authorization is None for x in standin.log("cdn"))
    assert _sha(Path(r.output.strip().splitlines()[-1].split("\t")[1])) == blob.sha256


def test_too_little_disk_is_refused_before_downloading(env, standin, smol_sha, monkeypatch):
    monkeypatch.setattr(hub, "_free_bytes", lambda where: 50_000_000)
    r = _cli("models", "pull", SMOL_URI)
    assert r.exit_code == 1
    assert "needs about 165.5 MB free" in r.output and "only 50.0 MB left" in r.output
    assert "HF_HOME" in r.output
    assert _gets(standin, smol_sha) == []

    # the disk fills up anyway (another writer): the OSError huggingface_hub lets through
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(hub, "_free_bytes", lambda where: 1 << 40)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", full)
    r = _cli("models", "pull", SMOL_URI)
    assert r.exit_code == 1
    assert "the disk filled up while downloading" in r.output and "Traceback" not in r.output


# --------------------------------------------------------------------------- split sets


@pytest.fixture(scope="module")
def split_parts(smol, tmp_path_factory) -> list[Path]:
    return write_split(smol, tmp_path_factory.mktemp("split"), "smollm2-135m-Q8_0", 3)


def test_split_set_is_fetched_whole_and_loads_from_its_first_part(env, standin, smol,
                                                                  split_parts):
    repo = "edgespec-test/split-GGUF"
    for p in split_parts:
        standin.add_file(repo, f"Q8_0/{p.name}", p)
    standin.add_file(repo, "README.md", split_parts[0])  # not a GGUF: never a candidate
    args = ["generate", "--threads", "2", "--ctx", "256", "--proposer", "none", "--no-adaptive",
            "--raw", "--max-tokens", "4", "--json", "The colours of the rainbow are"]
    r = _cli(args[0], "--target", f"{repo}:q8_0", *args[1:])
    assert r.exit_code == 0, r.output
    first = registry.resolve(f"hf://{repo}/Q8_0/{split_parts[1].name}")  # any part: the set
    assert first.name == split_parts[0].name
    for p in split_parts:  # every part beside the first, each pinned
        assert _sha(first.parent / p.name) == _sha(p)
    assert len([k for k in _pins(env) if k.startswith(repo)]) == 3
    # llama.cpp loaded all three parts: the same tokens as the unsplit file
    local = _cli(args[0], "--target", str(smol), *args[1:])
    assert json.loads(r.output.strip().splitlines()[-1])["tokens"] == \
        json.loads(local.output.strip().splitlines()[-1])["tokens"]


def test_a_local_split_set_is_checked_whole(env, split_parts, tmp_path):
    """A split set on disk (--target PATH, `models add`): its first part is what loads, and
    every other part must be beside it, whole, before llama.cpp is asked to open it."""
    folder = tmp_path / "set"
    folder.mkdir()
    for p in split_parts:
        (folder / p.name).symlink_to(p)
    first, second, third = (folder / p.name for p in split_parts)
    assert registry.resolve(str(first)) == first.resolve()
    with pytest.raises(ModelError, match=f"give its first part, {first}"):
        registry.resolve(str(second))
    third.unlink()
    (folder / third.name).write_bytes(split_parts[2].read_bytes()[:100_000])  # truncated
    with pytest.raises(ModelError, match="truncated"):
        registry.resolve(str(first))
    third.unlink()
    with pytest.raises(ModelError, match=f"{third.name} is not beside it in {folder}"):
        registry.resolve(str(first))
    r = _cli("models", "add", "my-split", str(first))
    assert r.exit_code == 2 and "download every part" in r.output, r.output
    assert not (env / "home" / "models.toml").exists()


def test_a_split_set_with_a_part_missing_is_refused(env, standin, split_parts, monkeypatch):
    repo = "edgespec-test/split-broken-GGUF"
    for p in (split_parts[0], split_parts[2]):
        standin.add_file(repo, p.name, p)
    r = _cli("models", "pull", f"{repo}:Q8_0")
    assert r.exit_code == 1
    assert split_parts[1].name in r.output and "incomplete" in r.output
    assert standin.log("cdn", "GET") == []  # refused before any download

    # a cache that lost one part of a set it held, offline: named too
    repo = "edgespec-test/split-ok-GGUF"
    for p in split_parts:
        standin.add_file(repo, p.name, p)
    first = hub.pull(f"{repo}:Q8_0")
    (first.parent / split_parts[2].name).unlink()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match=split_parts[2].name):
        registry.resolve(f"{repo}:Q8_0")


# --------------------------------------------------------------------------- your registry


def test_models_add_pins_a_hub_model_in_the_user_registry(env, standin, smol_sha):
    r = _cli("models", "add", "my-smol", SMOL_URI)
    assert r.exit_code == 0, r.output
    commit = standin.repos[SMOL_REPO].commit
    spec = registry.load_registry().get("my-smol")
    assert spec.sha256 == smol_sha and spec.hub == f"hf://{SMOL_REPO}@{commit}/{SMOL_FILE}"
    assert "hub = " in (env / "home" / "models.toml").read_text()
    r = _cli("models", "list")
    assert r.exit_code == 0 and "my-smol" in r.output
    # the Hugging Face cache forgot it: the name fetches that commit's file again
    import shutil
    shutil.rmtree(env / "hf")
    path = registry.resolve("my-smol")
    assert _sha(path) == smol_sha


def test_models_verify_rehashes_a_hub_model_against_its_pins(env, standin, tmp_path):
    repo, name = "edgespec-test/verify-GGUF", "tiny-Q8_0.gguf"
    blob = standin.add_file(repo, name, write_gguf(tmp_path / "v.gguf", elements=600))
    uri = f"hf://{repo}/{name}"
    r = _cli("models", "verify", uri)
    assert r.exit_code == 1 and "not pulled yet" in r.output
    path = hub.pull(uri)
    r = _cli("models", "verify", uri)
    assert r.exit_code == 0, r.output
    assert f"{uri}\tok\t{blob.sha256}" in r.output
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.resolve().write_bytes(bytes(data))
    r = _cli("models", "verify", f"{repo}:q8_0")
    assert r.exit_code == 1 and "MISMATCH" in r.output and "--force" in r.output
