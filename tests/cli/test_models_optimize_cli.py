"""`edgespec models optimize`, and how `models list` and `models verify` show the copy it
makes, with a fake llama-quantize (tests/quantize_fakes.py) and EDGESPEC_HOME isolated."""
from __future__ import annotations

import json

from click.testing import CliRunner

from edgespec.cli import cli
from edgespec.registry import user
from quantize_fakes import Q6_K, fake_quantizer, write_model


def run(*args):
    result = CliRunner().invoke(cli, ["models", *args])
    assert "Traceback" not in result.output  # user errors never show one
    return result


def test_optimize_list_verify_and_a_stale_source(world, tmp_path):
    src = write_model(tmp_path / "tiny-q6.gguf")
    user.add("tiny-q6", src, progress=lambda m: None)
    tool = str(fake_quantizer(tmp_path))
    r = run("optimize", "tiny-q6", "--quantize", tool, "--threads", "1")
    assert r.exit_code == 0, r.output
    assert "re-laid 1 Q6_K tensor as Q8_0: blk.0.m0.weight" in r.stdout
    assert "registered tiny-q6-q8\t" in r.stdout and "size " in r.stdout
    assert "`edgespec plan --target tiny-q6-q8 --calibrate`" in r.stdout
    assert "`edgespec generate --target tiny-q6-q8 ...`" in r.stdout

    r = run("list")
    assert r.exit_code == 0, r.output
    assert "COPIES (`edgespec models optimize`)\ntiny-q6-q8  made from tiny-q6 (q6_k->q8_0)" \
        in r.stdout
    rows = {m["name"]: m for m in json.loads(run("list", "--json").stdout)["models"]}
    assert rows["tiny-q6-q8"]["derived"]["from"] == "tiny-q6"
    assert rows["tiny-q6-q8"]["derived"]["stale"] is False and rows["tiny-q6"]["derived"] is None

    r = run("verify", "tiny-q6-q8")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("tiny-q6-q8\tok\t")

    r = run("optimize", "tiny-q6", "--quantize", tool)
    assert r.exit_code == 2 and "--force makes it again" in r.output

    write_model(src, types=(Q6_K, Q6_K))  # the source changes under the copy
    r = run("verify", "tiny-q6-q8")
    assert r.exit_code == 1
    assert r.stdout.startswith("tiny-q6-q8\tSTALE\t")
    assert "`edgespec models optimize tiny-q6 --name tiny-q6-q8 --force`" in r.stdout


def test_nothing_to_relay_and_no_quantizer_exit_2(world, tmp_path, monkeypatch):
    plain = write_model(tmp_path / "plain.gguf", types=(12,))
    r = run("optimize", str(plain), "--quantize", str(fake_quantizer(tmp_path)))
    assert r.exit_code == 2 and "nothing to re-lay" in r.output
    monkeypatch.setenv("EDGESPEC_ANCHORS", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    r = run("optimize", str(write_model(tmp_path / "q6.gguf")))
    assert r.exit_code == 2 and "`make anchors` builds it" in r.output
