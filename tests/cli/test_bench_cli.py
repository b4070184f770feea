"""`edgespec bench` / `qualify` argument handling (dry runs: no model is loaded)."""
from click.testing import CliRunner

from edgespec.lab.bench.prompts import SPEC_BENCH_FILE, default_data_dir
from edgespec.cli import cli


def run(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env)


def test_the_shipped_prompt_data_is_there():
    # the prompt sets ship inside the package (edgespec/lab/bench/data): their absence fails,
    # it never skips the tests below
    assert (default_data_dir() / SPEC_BENCH_FILE).is_file()


def test_quick_dry_run_lists_plain_free_proposers_and_the_pld_anchor_with_its_plain_path():
    res = run("bench", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "configurations: none, ngram, suffix, llama-pld:0, llama-pld:10" in res.output
    assert "15 prompts (15 turns), 64 new tokens" in res.output
    assert "80 requests" in res.output  # (15 units + 1 warm-up) x 5 configurations


def test_repeats_multiply_the_units_not_the_warmup():
    res = run("bench", "--dry-run", "--repeats", "3")
    assert res.exit_code == 0, res.output
    assert "15 prompts (15 turns x 3 rounds), 64 new tokens" in res.output
    assert "230 requests" in res.output  # (3 x 15 units + 1 warm-up) x 5 configurations
    bad = run("bench", "--dry-run", "--repeats", "0")
    assert bad.exit_code != 0 and "--repeats" in bad.output


def test_standard_and_long_presets():
    res = run("bench", "--dry-run", "--preset", "standard")
    assert res.exit_code == 0, res.output
    assert ("configurations: none, none[exact=True], auto, auto[exact=True], llama-completion, "
            "llama-lookup" in res.output)
    assert "49 prompts (49 turns), 128 new tokens" in res.output  # 13 x 3 + 10 HumanEvalFix
    res = run("bench", "--dry-run", "--preset", "long")
    assert res.exit_code == 0, res.output
    assert "6 prompts (6 turns), 128 new tokens" in res.output  # 2k/4k/8k x summary/code


def test_full_preset_adds_the_draft_only_with_a_draft_model():
    assert "draft," not in run("bench", "--dry-run", "--preset", "full").output
    res = run("bench", "--dry-run", "--preset", "full", "--draft", "qwen-0.5b")
    assert res.exit_code == 0, res.output
    assert "none, ngram, suffix, draft," in res.output


def test_explicit_configurations_anchors_and_prompt_selection():
    res = run("bench", "--dry-run", "--proposer", "ngram:min_n=3", "--no-anchor",
              "--categories", "coding,summarization", "--per-category", "2", "--humanevalfix", "0")
    assert res.exit_code == 0, res.output
    assert "configurations: none, ngram[min_n=3]\n" in res.output
    assert "4 prompts" in res.output
    res = run("bench", "--dry-run", "--proposer", "suffix", "--anchor", "llama-lookup:3",
              "--anchor", "llama-pld:2", "--categories", "qa", "--humanevalfix", "0")
    assert res.exit_code == 0, res.output
    # each speculative anchor brings its own plain path
    assert ("configurations: none, suffix, llama-completion, llama-lookup:3, llama-pld:0, "
            "llama-pld:2\n") in res.output


def test_user_errors_are_one_line_messages(tmp_path):
    res = run("bench", "--dry-run", "--proposer", "draft")
    assert res.exit_code == 1 and "needs a draft model" in res.output
    res = run("bench", "--dry-run", "--buckets", "a,b")
    assert res.exit_code == 1 and "--buckets" in res.output
    res = run("bench", "--dry-run", "--categories", "poetry")
    assert res.exit_code == 1 and "unknown Spec-Bench categor" in res.output
    res = run("bench", "--dry-run", "--anchor", "llama-fast")
    assert res.exit_code == 1 and "unknown anchor 'llama-fast'; known anchors: llama-completion" \
        in res.output and "llama-pld[:N]" in res.output
    res = run("bench", "--dry-run", "--anchor", "10")
    assert res.exit_code == 1 and "llama-pld:10" in res.output
    res = run("bench", "--dry-run", "--anchor", "llama-speculative-simple")
    assert res.exit_code == 1 and "needs a draft model" in res.output
    res = run("bench", "--report-from", __file__)
    assert res.exit_code == 1 and "not a benchmark JSON file" in res.output
    res = run("qualify", "qwen-1.5b", "ngram", "--slices", "poetry")
    assert res.exit_code == 1 and "unknown slice(s) poetry" in res.output
    res = run("qualify", "qwen-1.5b", "telepathy")
    assert res.exit_code == 1 and "unknown proposer 'telepathy'" in res.output


def test_llama_cpp_anchors_not_built_say_how_to_build_them(tmp_path):
    # refused before any model loads, with the command that builds them
    res = run("bench", "--target", "smollm2-135m", "--anchor", "llama-lookup", "--categories", "qa",
              "--humanevalfix", "0", "--out", str(tmp_path / "o"),
              env={"EDGESPEC_ANCHORS": str(tmp_path / "nothing-here")})
    assert res.exit_code == 1
    assert "llama-completion, llama-lookup not found" in res.output and "make anchors" in res.output
    assert not (tmp_path / "o").exists()


def test_the_eta_prices_each_configuration_at_its_own_pace():
    # issue 39: one global rate drifted from 5:38 to 7:54 as fast and slow configurations
    # took turns; each configuration's remaining requests are priced at its own mean
    from edgespec.cli.bench import _Progress

    p = _Progress(total=2 * 3 + 2, label="bench", configs=2, warmup=1)  # 3 units, 2 configs
    assert p.eta() is None
    p(1, 8, None)  # warm-ups carry no time
    p(2, 8, None)
    p(3, 8, {"config": "none", "category": "qa", "decode_tokens_per_second": 1.0,
             "wall_seconds": 10.0})
    assert p.eta() == 2 * 10.0 + 3 * 10.0  # the unmeasured one at the others' mean
    p(4, 8, {"config": "ngram", "category": "qa", "decode_tokens_per_second": 1.0,
             "wall_seconds": 2.0})
    assert p.eta() == 2 * 10.0 + 2 * 2.0
    p.close()
