"""`edgespec models ...` through click's CliRunner, with EDGESPEC_HOME isolated per test."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from edgespec.cli import cli
from registry_fakes import sha256

REPO_TOML = Path(__file__).resolve().parents[2] / "models.toml"


def run(*args):
    result = CliRunner().invoke(cli, ["models", *args])
    # user errors never show a traceback
    assert "Traceback" not in result.output
    return result


def test_list_real_registry_in_an_empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(REPO_TOML))
    r = run("list")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].split() == ["NAME", "ROLE", "SIZE", "QUANT", "TOKENIZER", "CTX", "CHAT", "STATUS"]
    rows = {line.split()[0]: line.split() for line in lines[1:5]}
    assert set(rows) == {"qwen-1.5b", "qwen-0.5b", "gemma-270m", "smollm2-135m"}
    assert rows["qwen-1.5b"][1] == "target" and rows["qwen-1.5b"][-1] == "missing"
    assert rows["gemma-270m"][-2] == "no" and "smollm-bpe-49152" in rows["smollm2-135m"]
    assert "qwen-1.5b     + draft:qwen-0.5b" in r.output
    assert str(tmp_path / "models") in r.output


def test_list_json_and_status_after_pull(world):
    assert run("pull", "tiny-whole").exit_code == 0
    r = run("list", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    status = {m["name"]: m["status"] for m in doc["models"]}
    assert status["tiny-whole"] == "verified" and status["tiny-parts"] == "missing"
    assert {(p["target"], p["proposer"]) for p in doc["pairs"]} == {
        ("tiny-whole", "draft:tiny-parts"), ("tiny-whole", "ngram")}
    assert doc["home"] == str(world.home)


def test_pull_defaults_to_target_and_draft(world):
    r = run("pull")
    assert r.exit_code == 0, r.output
    printed = dict(line.split("\t") for line in r.stdout.splitlines())
    assert set(printed) == {"tiny-whole", "tiny-parts"}
    for name, path in printed.items():
        assert Path(path).read_bytes() == world.gguf
    assert not (world.home / "models" / "tiny-asm.gguf").exists()


def test_pull_refuses_wrong_digest_with_exit_1(world):
    r = run("pull", "tiny-bad")
    assert r.exit_code == 1
    assert r.output.count("Error: refusing tiny-bad") == 1
    assert f"expected sha256 {'0' * 64}" in r.output and sha256(world.gguf) in r.output
    assert not (world.home / "models" / "tiny-bad.gguf").exists()


def test_pull_unknown_name_fails_before_any_download(world):
    r = run("pull", "tiny-whole", "qwen-99b")
    assert r.exit_code == 1
    assert "unknown model 'qwen-99b'; known models: tiny-whole" in r.output
    assert not (world.home / "models" / "tiny-whole.gguf").exists()


def test_pull_names_and_all_is_a_usage_error(world):
    r = run("pull", "--all", "tiny-whole")
    assert r.exit_code == 2 and "not both" in r.output


def test_verify_reports_mismatch_and_exits_nonzero(world):
    assert run("pull", "tiny-whole", "tiny-parts").exit_code == 0
    r = run("verify")
    assert r.exit_code == 0, r.output
    assert sorted(line.split("\t")[:2][0] for line in r.stdout.splitlines()) == [
        "tiny-parts", "tiny-whole"]
    p = world.home / "models" / "tiny-parts.gguf"
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    r = run("verify")
    assert r.exit_code == 1
    assert "tiny-parts\tMISMATCH" in r.output and "tiny-whole\tok" in r.output
    assert "pull tiny-parts --force" in r.output


def test_verify_named_model_not_pulled_fails(world):
    r = run("verify", "tiny-asm")
    assert r.exit_code == 1 and "tiny-asm is not pulled" in r.output


def test_path_accepts_local_gguf_and_rejects_junk(world, tmp_path):
    good = tmp_path / "local.gguf"
    good.write_bytes(world.gguf)
    r = run("path", str(good))
    assert r.exit_code == 0 and r.stdout.strip() == str(good.resolve())
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"")
    r = run("path", str(junk))
    assert r.exit_code == 1 and "Error:" in r.output and "the file is empty" in r.output
    r = run("path", "--no-pull", "tiny-asm")
    assert r.exit_code == 1 and "not pulled yet" in r.output


def test_malformed_registry_is_a_clean_error(tmp_path, monkeypatch):
    bad = tmp_path / "models.toml"
    bad.write_text('schema = 1\n[models."x"]\nrole = "target"\n')
    monkeypatch.setenv("EDGESPEC_MODELS_TOML", str(bad))
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    r = run("list")
    assert r.exit_code == 1
    assert "Error:" in r.output and "models.x: missing" in r.output and "sha256" in r.output
