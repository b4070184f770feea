"""`edgespec models ...` through click's CliRunner, with EDGESPEC_HOME isolated per test."""
from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from edgespec.cli import cli
from registry_fakes import sha256, to_toml

REPO_TOML = Path(__file__).resolve().parents[2] / "edgespec" / "registry" / "models.toml"


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
    assert lines[0].split() == ["NAME", "FROM", "ROLE", "SIZE", "QUANT", "TOKENIZER", "CTX",
                                "CHAT", "STATUS"]
    rows = {line.split()[0]: line.split() for line in lines[1:5]}
    assert set(rows) == {"qwen-1.5b", "qwen-0.5b", "gemma-270m", "smollm2-135m"}
    assert rows["qwen-1.5b"][1:3] == ["shipped", "target"] and rows["qwen-1.5b"][-1] == "missing"
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
    assert r.exit_code == 2  # a registry to fix, like a usage error: nothing ran
    assert "Error:" in r.output and "models.x: missing" in r.output and "sha256" in r.output


# --- the user registry: edgespec models add / remove, layered over the shipped one ---------


def _user_toml(world) -> Path:
    return world.home / "models.toml"


def test_add_lists_resolves_and_removes_a_user_model(world, tmp_path):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(world.gguf)
    r = run("add", "my-tiny", str(mine), "--role", "draft")
    assert r.exit_code == 0, r.output
    assert r.stdout.split("\t") == ["my-tiny", str(mine), sha256(world.gguf) + "\n"]
    doc = json.loads(run("list", "--json").output)
    rows = {m["name"]: m for m in doc["models"]}
    assert rows["my-tiny"]["origin"] == "user" and rows["tiny-whole"]["origin"] == "shipped"
    assert rows["my-tiny"]["status"] == "verified" and rows["my-tiny"]["path"] == str(mine)
    assert rows["my-tiny"]["role"] == "draft" and rows["my-tiny"]["context"] == 128
    table = run("list").output
    assert any(line.split()[:3] == ["my-tiny", "user", "draft"] for line in table.splitlines())
    # a user name resolves wherever a registry name does
    r = run("path", "my-tiny")
    assert r.exit_code == 0 and r.stdout.strip() == str(mine)
    assert run("verify", "my-tiny").stdout.startswith("my-tiny\tok")
    r = run("remove", "my-tiny")
    assert r.exit_code == 0 and "still there" in r.output and mine.is_file()
    assert "my-tiny" not in run("list").output


def test_a_changed_user_file_is_refused_like_a_shipped_model(world, tmp_path):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(world.gguf)
    assert run("add", "my-tiny", str(mine)).exit_code == 0
    data = bytearray(world.gguf)
    data[-1] ^= 1
    mine.write_bytes(bytes(data))
    r = run("path", "my-tiny")
    assert r.exit_code == 1 and "expected " + sha256(world.gguf) in r.output
    assert "edgespec models remove my-tiny" in r.output
    mine.unlink()
    r = run("path", "my-tiny")
    assert r.exit_code == 1 and f"{mine} is missing" in r.output


def test_add_refuses_bad_files_and_names_with_exit_2_writing_nothing(world, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(world.not_gguf)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(world.gguf[: len(world.gguf) - 100])
    cases = [(("my-junk", str(junk)), "not a GGUF"),
             (("my-cut", str(cut)), "truncated"),
             (("my-gone", str(tmp_path / "absent.gguf")), "no such file"),
             (("tiny-whole", str(junk)), "is a shipped model"),
             (("My Model", str(junk)), "a model name is lowercase")]
    for args, message in cases:
        r = run("add", *args)
        assert r.exit_code == 2, (args, r.output)
        assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not _user_toml(world).exists()
    good = tmp_path / "good.gguf"
    good.write_bytes(world.gguf)
    assert run("add", "my-tiny", str(good)).exit_code == 0
    before = _user_toml(world).read_bytes()
    r = run("add", "my-tiny", str(good))
    assert r.exit_code == 2 and "already in" in r.output
    assert _user_toml(world).read_bytes() == before


def test_remove_refuses_shipped_and_unknown_names(world):
    r = run("remove", "tiny-whole")
    assert r.exit_code == 2 and "is a shipped model" in r.output
    r = run("remove", "nobody")
    assert r.exit_code == 2 and "no model 'nobody' in the user registry" in r.output


def test_a_user_registry_that_is_not_toml_stops_with_exit_2_and_stays(world, tmp_path):
    _user_toml(world).parent.mkdir(parents=True, exist_ok=True)
    _user_toml(world).write_text("schema = 1\n[models.\n")
    good = tmp_path / "good.gguf"
    good.write_bytes(world.gguf)
    for args in (("list",), ("add", "my-tiny", str(good))):
        r = run(*args)
        assert r.exit_code == 2 and "not valid TOML" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1
    assert _user_toml(world).read_text() == "schema = 1\n[models.\n"


def test_a_name_in_both_registries_is_an_error_that_remove_repairs(world, tmp_path):
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(world.gguf)
    entry = {k: v for k, v in world.doc()["models"]["tiny-whole"].items() if k != "source"}
    clash = {"schema": 1, "models": {"tiny-whole": {**entry, "path": str(mine)},
                                     "my-tiny": {**entry, "path": str(mine)}}}
    _user_toml(world).parent.mkdir(parents=True, exist_ok=True)
    _user_toml(world).write_text(to_toml(clash))
    r = run("list")
    assert r.exit_code == 2 and "'tiny-whole' is also defined in the shipped registry" in r.output
    # remove takes the user's entry out (the shipped one stays), and nothing else
    r = run("remove", "tiny-whole")
    assert r.exit_code == 0, r.output
    r = run("list")
    assert r.exit_code == 0 and "my-tiny" in r.output
    doc = json.loads(run("list", "--json").output)
    assert [m["origin"] for m in doc["models"] if m["name"] == "tiny-whole"] == ["shipped"]
