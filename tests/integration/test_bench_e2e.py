"""A tiny real benchmark on smollm2-135m: CLI -> engine + llama-cpp-python anchor -> JSON + report,
a qualification round trip into a throwaway EDGESPEC_HOME, and (slow) llama.cpp's own
llama-lookup and llama-completion built by `make anchors`."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from click.testing import CliRunner

from edgespec.cli import cli

TARGET = "smollm2-135m"
THREADS = os.environ.get("EDGESPEC_TEST_THREADS", "2")


def test_bench_writes_json_and_report(model_path, tmp_path):
    path = model_path(TARGET)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "rep", "category": "copy", "prompt": "Repeat exactly: red green blue, "
                    "red green blue, red green blue."}) + "\n"
        + json.dumps({"id": "hi", "category": "chat", "prompt": "Say hello."}) + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "bench", "--target", str(path), "--proposer", "ngram", "--anchor", "llama-pld:2",
        "--categories", "none", "--humanevalfix", "0", "--jsonl", str(prompts),
        "--max-tokens", "8", "--warmup", "1", "--threads", THREADS, "--ctx", "512",
        "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "bench.json").read_text())
    assert [c["label"] for c in data["matrix"]["configs"]] == [
        "none", "ngram", "llama-pld:0", "llama-pld:2"]
    assert data["matrix"]["configs"][3]["baseline"] == "llama-pld:0"
    recs = data["records"]
    assert len(recs) == 8 and data["warmup_discarded"] == 4 and not data["interrupted"]
    assert all("error" not in r for r in recs), [r.get("error") for r in recs]
    for r in recs:
        assert 1 <= r["generated_tokens"] <= 8 and len(r["tokens"]) == r["generated_tokens"]
        assert r["prefill_seconds"] > 0 and r["e2e_seconds"] >= r["prefill_seconds"]
        assert r["rss_peak_bytes"] > 0 and r["category"] in ("copy", "chat")
    # exact decoding: the engine's speculative output equals the plain path's
    assert all(r["parity"] for r in recs if r["config"] == "ngram")
    ident = data["identity"]
    assert ident["models"]["target"]["sha256"] and ident["llama_cpp"]["llama_cpp_python"]
    assert ident["machine"]["cpu_model"] and ident["engine"]["threads"] == int(THREADS)
    # every llama-pld:N shares one llama-cpp-python model, each drafting its own N
    assert set(data["load_seconds"]) == {"target", "llama-pld:0"}
    drafted = {c: sum(r["drafted"] for r in recs if r["config"] == c)
               for c in ("llama-pld:0", "llama-pld:2")}
    assert drafted["llama-pld:0"] == 0 and drafted["llama-pld:2"] > 0, drafted
    report = (out / "report.md").read_text()
    assert "## Speedup over the plain path" in report and "(speedup.png)" in report
    assert "llama-pld:2 (vs llama-pld:0)" in report and "## Verify pass sizes" in report
    assert (out / "speedup.png").stat().st_size > 1000
    # the report can be rebuilt from the JSON alone
    again = CliRunner().invoke(cli, ["bench", "--report-from", str(out / "bench.json"),
                                     "--out", str(tmp_path / "re")])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "re" / "report.md").read_text() == report


def test_oracles_draft_the_plain_answer_and_the_target_accepts_all_of_it(model_path, tmp_path):
    """bench.oracle on a real model: the plain answer taken first, then drafted by the oracle
    (everything) and the copy oracle (only what an earlier occurrence holds), each draft
    verified by the target in real passes."""
    path = model_path(TARGET)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "rep", "category": "copy", "prompt": (
        "Repeat this list exactly, twice: apple, banana, cherry, damson, elderberry, fig.")})
        + "\n")
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "bench", "--target", str(path), "--proposer", "oracle", "--proposer", "oracle-copy",
        "--categories", "none", "--humanevalfix", "0", "--jsonl", str(prompts),
        "--max-tokens", "32", "--warmup", "0", "--threads", THREADS, "--ctx", "512",
        "--out", str(out)])
    assert res.exit_code == 0, res.output
    recs = {r["config"]: r for r in json.loads((out / "bench.json").read_text())["records"]}
    plain, oracle, copy = recs["none"], recs["oracle"], recs["oracle-copy"]
    assert oracle["drafted"] > 0 and oracle["accepted"] == oracle["drafted"]
    assert oracle["mean_accepted_length"] > 1.5
    # each oracle drafts its own settled answer (bench.oracle.settle): never rejected
    assert len(oracle["tokens"]) == len(plain["tokens"])
    assert 0 < copy["drafted"] <= oracle["drafted"] and copy["accepted"] == copy["drafted"]
    report = (out / "report.md").read_text()
    assert "| oracle |" in report and "| oracle-copy |" in report


def test_qualify_records_into_the_registry(model_path, tmp_path, monkeypatch):
    real = model_path(TARGET)
    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    # the verified model, visible under the throwaway home without copying 100 MB
    (home / "models" / real.name).symlink_to(real)
    shutil.copy(real.with_name(real.name + ".verified"), home / "models")
    # the controller's cached speed calibration, so the run does not re-measure it
    calibration = real.parent.parent / "calibration"
    if calibration.is_dir():
        shutil.copytree(calibration, home / "calibration")
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    from edgespec import registry

    assert registry.qualification(TARGET, "ngram") == {}
    res = CliRunner().invoke(cli, [
        "qualify", TARGET, "ngram", "--slices", "qa", "--per-slice", "1", "--max-tokens", "8",
        "--threads", THREADS, "--ctx", "512", "--out", str(tmp_path / "ev")])
    assert res.exit_code == 0, res.output
    got = registry.qualification(TARGET, "ngram")
    assert set(got) == {"qa"}
    qa = got["qa"]
    assert qa["n"] == 1 and qa["speedup"] > 0 and qa["speedup_ci_low"] == qa["speedup"]
    assert 0 <= (qa["acceptance_rate"] or 0) <= 1 and qa["mean_accepted_length"] >= 1
    assert qa["target_sha256"] == registry.load_registry().get(TARGET).sha256
    assert qa["edgespec_commit"] and qa["evidence"].endswith("bench.json")
    assert (home / "qualification.json").is_file()


@pytest.mark.slow
def test_llama_cpp_lookup_anchor_against_its_own_plain_path(model_path, tmp_path):
    """Needs `make anchors` (slow tier: `make test` builds nothing new); a missing build fails
    here with the message that says how to build it."""
    path = model_path(TARGET)
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "bench", "--target", str(path), "--proposer", "ngram", "--anchor", "llama-lookup",
        "--categories", "summarization,coding", "--humanevalfix", "0", "--max-tokens", "16",
        "--warmup", "0", "--threads", THREADS, "--ctx", "2048", "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "bench.json").read_text())
    assert [c["label"] for c in data["matrix"]["configs"]] == [
        "none", "ngram", "llama-completion", "llama-lookup"]
    tools = [r for r in data["records"] if r["config"] in ("llama-completion", "llama-lookup")]
    assert len(tools) == 4 and all("error" not in r for r in tools), [r.get("error") for r in tools]
    plain = {r["prompt_id"]: r for r in data["records"] if r["config"] == "none"}
    for r in tools:
        # the tool read exactly the engine's prompt tokens, and generated about what we did
        assert r["prompt_tokens"] == plain[r["prompt_id"]]["prompt_tokens"]
        assert r["decode_tokens_per_second"] > 0 and r["prefill_seconds"] > 0
        assert 1 <= r["generated_tokens"] <= 16 + 4  # lookup may overshoot by a draft
    assert all("AVX" in r["system_info"] for r in tools if r["config"] == "llama-completion")
    lookup = [r for r in tools if r["config"] == "llama-lookup"]
    assert all(0 <= r["accepted"] <= r["drafted"] for r in lookup)
    report = (out / "report.md").read_text()
    assert "llama-lookup (vs llama-completion)" in report and "### Plain paths" in report
