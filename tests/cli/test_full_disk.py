"""A full disk loses nothing and shows no traceback (issue #43 item 6): `models add` is one
line and the registry stays as it was; `chat` keeps the conversation when /save fails and
cleans killed saves' leftovers when it starts; `qualify` refuses before its long run. The
disk is a small tmpfs filled to the last byte where the tests run as root (else the atomic
writer is made to fail with ENOSPC: tests/full_disk.py)."""
from __future__ import annotations

import json
import os
import time

import numpy as np
from click.testing import CliRunner
from full_disk import full_disk, temps

from edgespec import paths
from edgespec.cli import cli

THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "2")


def _tiny_gguf(path):
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_head_count(2)
    w.add_context_length(256)
    w.add_array("tokenizer.ggml.tokens", [f"t{i}" for i in range(8)])
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _one_clean_line(result) -> str:
    assert "Traceback" not in result.output, result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.output
    return lines[0]


def test_models_add_on_a_full_disk_is_one_line_and_keeps_the_registry(tmp_path, monkeypatch):
    first, second = _tiny_gguf(tmp_path / "a.gguf"), _tiny_gguf(tmp_path / "b.gguf")
    with full_disk(tmp_path, monkeypatch) as disk:
        home = disk.root / "home"
        monkeypatch.setenv("EDGESPEC_HOME", str(home))
        if disk.real:  # a registry with one model, then the disk fills
            assert CliRunner().invoke(cli, ["models", "add", "mine-a", str(first)]).exit_code == 0
            before = (home / "models.toml").read_bytes()
            disk.fill()
        else:
            before = None
        r = CliRunner().invoke(cli, ["models", "add", "mine-b", str(second)])
        assert r.exit_code == 1
        line = _one_clean_line(r)
        assert "cannot write the user registry" in line and "no space left" in line
        if before is not None:
            assert (home / "models.toml").read_bytes() == before
        else:
            assert not (home / "models.toml").exists()
        assert temps(disk.root) == []


#: long enough that turn 2 reuses turn 1 over either KV cache the default may run (a greedy
#: turn recomputes at least the context's min_pass rows: 64 over F16, runtime.kernel.min_pass)
FIRST = "Name a colour. " + " ".join(f"Not {c}." for c in (
    "red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "brown",
    "pink", "cyan", "magenta", "teal", "navy", "olive", "maroon", "silver", "gold", "beige"))


def test_chat_save_on_a_full_disk_keeps_the_conversation(tmp_path, monkeypatch, model_path):
    model = model_path("smollm2-135m")
    with full_disk(tmp_path, monkeypatch) as disk:
        sessions = disk.root / "sessions"
        sessions.mkdir()
        monkeypatch.setattr(paths, "sessions_dir", lambda: sessions)
        # what a killed /save left (its process is gone): removed when chat starts
        leftover = sessions / f".old.session.{2 ** 22 + 12345}.0123abcd.tmp"
        leftover.write_bytes(b"x" * 1000)
        disk.fill()
        r = CliRunner().invoke(cli, [
            "chat", "--target", str(model), "--threads", THREADS, "--ctx", "256",
            "--proposer", "none", "--max-tokens", "4", "--json"],
            input=f"{FIRST}\n/save first\nAnd another?\n/quit\n")
        assert r.exit_code == 0, r.output
        assert "Traceback" not in r.output
        turns = [json.loads(x) for x in r.stdout.splitlines() if x.startswith('{"turn"')]
        assert [t["turn"] for t in turns] == [1, 2]  # the chat went on after the failed save
        assert turns[1]["prompt_reused"] > 0  # with the conversation it had
        failed = [x for x in r.output.splitlines() if x.startswith("the save failed")]
        assert len(failed) == 1 and "no space left" in failed[0]
        assert "the conversation is kept in memory" in failed[0]
        assert not leftover.exists() and temps(disk.root) == []
        assert not (sessions / "first.session").exists()


def test_qualify_refuses_an_unwritable_home_before_its_run(tmp_path, monkeypatch, model_path):
    model = model_path("smollm2-135m")
    with full_disk(tmp_path, monkeypatch) as disk:
        monkeypatch.setenv("EDGESPEC_HOME", str(disk.root / "home"))
        disk.fill()
        t0 = time.monotonic()
        r = CliRunner().invoke(cli, ["qualify", str(model), "ngram", "--per-slice", "1",
                                     "--threads", THREADS, "--out", str(tmp_path / "evidence")])
        took = time.monotonic() - t0
        assert r.exit_code == 1, r.output
        line = _one_clean_line(r)
        assert "qualification results" in line and "no space left" in line
        assert took < 30  # refused before the benchmark, not after it
        assert not (tmp_path / "evidence" / "bench.json").exists()
        assert temps(disk.root) == []
