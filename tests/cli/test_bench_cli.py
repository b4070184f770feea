"""`edgespec bench` / `qualify` argument handling (dry runs: no model is loaded)."""
import pytest
from click.testing import CliRunner

from edgespec.bench.prompts import SPEC_BENCH_FILE, default_data_dir
from edgespec.cli import cli

needs_data = pytest.mark.skipif(not (default_data_dir() / SPEC_BENCH_FILE).is_file(),
                                reason="shared prompt data not present in this checkout")


def run(*args):
    return CliRunner().invoke(cli, list(args))


@needs_data
def test_quick_dry_run_lists_plain_free_proposers_and_the_anchor():
    res = run("bench", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "configurations: none, ngram, suffix, llama-cpp-pld[num_pred_tokens=10]" in res.output
    assert "15 prompts (15 turns), 64 new tokens" in res.output
    assert "64 requests" in res.output  # (15 units + 1 warm-up) x 4 configurations


@needs_data
def test_full_preset_adds_the_draft_only_with_a_draft_model():
    assert "draft," not in run("bench", "--dry-run", "--preset", "full").output
    res = run("bench", "--dry-run", "--preset", "full", "--draft", "qwen-0.5b")
    assert res.exit_code == 0, res.output
    assert "none, ngram, suffix, draft," in res.output


@needs_data
def test_explicit_configurations_and_prompt_selection():
    res = run("bench", "--dry-run", "--proposer", "ngram:min_n=3", "--no-anchor",
              "--categories", "coding,summarization", "--per-category", "2", "--humanevalfix", "0")
    assert res.exit_code == 0, res.output
    assert "configurations: none, ngram[min_n=3]\n" in res.output
    assert "4 prompts" in res.output


def test_user_errors_are_one_line_messages():
    res = run("bench", "--dry-run", "--proposer", "draft")
    assert res.exit_code == 1 and "needs a draft model" in res.output
    res = run("bench", "--dry-run", "--buckets", "a,b")
    assert res.exit_code == 1 and "--buckets" in res.output
    res = run("bench", "--dry-run", "--categories", "poetry")
    assert res.exit_code == 1 and "unknown Spec-Bench categor" in res.output
    res = run("bench", "--report-from", __file__)
    assert res.exit_code == 1 and "not a benchmark JSON file" in res.output
    res = run("qualify", "qwen-1.5b", "ngram", "--slices", "poetry")
    assert res.exit_code == 1 and "unknown slice(s) poetry" in res.output
    res = run("qualify", "qwen-1.5b", "telepathy")
    assert res.exit_code == 1 and "no registered pair" in res.output
