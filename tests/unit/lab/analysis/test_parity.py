"""The parity harness's pure parts: prompt loading, divergence classification, sample comparison."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec.lab.analysis import parity as P
from edgespec.decoding import verify
from edgespec.cli import cli
from edgespec.errors import InvalidInputError
from edgespec.api.events import TokenLogprob
from edgespec.decoding.sampling import make_rng, sample


def _write(tmp_path, rows):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return f


# --- prompts ---------------------------------------------------------------------------------

def test_load_prompts_is_stratified_in_file_order(tmp_path):
    f = _write(tmp_path, [
        {"question_id": 1, "category": "a", "turns": ["a1", "second turn"]},
        {"question_id": 2, "category": "a", "turns": ["a2"]},
        {"question_id": 3, "category": "b", "prompt": "b1"},
        {"question_id": 4, "category": "a", "turns": ["a3"]},
    ])
    assert [(p.id, p.prompt) for p in P.load_prompts(f, per_category=1)] == [("1", "a1"), ("3", "b1")]
    assert [p.id for p in P.load_prompts(f, per_category=2)] == ["1", "2", "3"]
    assert [p.id for p in P.load_prompts(f, per_category=5, limit=2)] == ["1", "2"]


def test_default_prompts_cover_all_spec_bench_categories():
    prompts = P.load_prompts()
    assert len({p.category for p in prompts}) == 13 == len(prompts)


@pytest.mark.parametrize("content, message", [
    ('{"category": "a"}\n', "prompt"),
    ("not json\n", "not JSON"),
    ("\n", "no prompts"),
])
def test_load_prompts_rejects_bad_files(tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(content, encoding="utf-8")
    with pytest.raises(InvalidInputError, match=message):
        P.load_prompts(f)


def test_load_prompts_missing_file(tmp_path):
    with pytest.raises(InvalidInputError, match="not found"):
        P.load_prompts(tmp_path / "nope.jsonl")


# --- greedy divergence -------------------------------------------------------------------------

def lp(token, top):
    d = dict(top)
    return TokenLogprob(token, d.get(token, -9.0), tuple(top))


def test_identical_runs_have_no_divergence():
    row = lp(5, [(5, -0.1), (6, -2.0)])
    assert P.first_divergence([5, 5], [5, 5], [row, row], [row, row]) is None


def test_near_tie_flip_is_drift():
    plain = [lp(1, [(1, -0.1)]), lp(7, [(7, -0.70), (8, -0.75), (2, -3.0)])]
    spec = [lp(1, [(1, -0.1)]), lp(8, [(8, -0.69), (7, -0.78), (2, -3.0)])]
    d = P.first_divergence([1, 7, 3], [1, 8, 4], plain, spec, tolerance=0.5)
    assert (d.position, d.plain_token, d.spec_token, d.kind) == (1, 7, 8, "drift")
    assert d.plain_margin == pytest.approx(0.05) and d.spec_margin == pytest.approx(0.09)
    assert d.pair_shift == pytest.approx(0.05 + 0.09)


def test_clear_margin_flip_is_a_defect():
    plain = [lp(7, [(7, -0.1), (8, -3.0)])]
    spec = [lp(8, [(8, -0.2), (7, -2.5)])]
    d = P.first_divergence([7], [8], plain, spec, tolerance=0.6)
    assert d.kind == "defect" and d.pair_shift == pytest.approx(2.9 + 2.3)


def test_zero_tolerance_makes_any_divergence_a_defect():
    plain = [lp(7, [(7, -0.70), (8, -0.70001)])]
    spec = [lp(8, [(8, -0.70), (7, -0.70001)])]
    assert P.first_divergence([7], [8], plain, spec, tolerance=0.0).kind == "defect"


def test_token_outside_the_reported_top_n_is_a_bounded_defect():
    plain = [lp(7, [(7, -0.1), (9, -0.3)])]  # token 8 not listed: far below
    spec = [lp(8, [(8, -0.2), (7, -0.25)])]
    d = P.first_divergence([7], [8], plain, spec, tolerance=10.0)
    assert d.bounded and d.kind == "defect"


# --- sampling comparison -----------------------------------------------------------------------

def _draw(probs, runs, positions, seed):
    rng = make_rng(seed)
    return [[sample(probs, rng) for _ in range(positions)] for _ in range(runs)]


def test_same_law_passes_and_different_law_fails():
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.55, 0.25, 0.15, 0.05])
    a, b, c = _draw(p, 600, 3, 1), _draw(p, 600, 3, 2), _draw(q, 600, 3, 3)
    same = P.compare_samples(a, b, 3)
    assert len(same) == 4 and min(same) > 1e-3 / 4
    assert min(P.compare_samples(a, c, 3)) < 1e-4


def test_runs_that_ended_early_count_as_their_own_category():
    a = [[1, 2]] * 50 + [[1]] * 50
    b = [[1, 2]] * 100
    ps = P.compare_samples(a, b, 2)
    assert ps[0] == 1.0 and ps[1] < 1e-6


def test_report_applies_bonferroni():
    r = P.ConfigReport("x", alpha=1e-3)
    r.sampling.append(P.SamplingOutcome("1", "a", "x", 10, (0.5, 0.0004)))
    r.sampling.append(P.SamplingOutcome("2", "a", "x", 10, (0.5, 0.5)))
    assert r.n_tests == 4 and r.sampling_ok is True  # 0.0004 >= 1e-3 / 4
    r.sampling.append(P.SamplingOutcome("3", "a", "x", 10, (0.0001,)))
    assert r.sampling_ok is False


def test_broken_acceptance_patches_and_restores():
    original = verify.verify_sampling
    # draft q puts all mass on token 0, target p is uniform: after a rejection the residual
    # max(0, p - q) holds only token 1, so a correct verifier never emits (0 accepted, token 0)
    q, p = np.array([[1.0, 0.0]]), np.array([[0.5, 0.5], [0.5, 0.5]])

    def rejected_zero(rng):
        return sum(verify.verify_sampling([0], q, p, rng) == (0, 0) for _ in range(200))

    assert rejected_zero(make_rng(0)) == 0
    with P.broken_acceptance():
        assert verify.verify_sampling is not original
        assert rejected_zero(make_rng(0)) > 20
    assert verify.verify_sampling is original


# --- CLI validation (no model needed) ----------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--proposers", "bogus"], "--proposers"),
    (["--proposers", "draft"], "needs --draft"),
])
def test_parity_cli_rejects_bad_configurations(args, message):
    res = CliRunner().invoke(cli, ["parity", *args])
    assert res.exit_code != 0 and message in res.output


def test_logprob_drift_measures_the_shared_prefix_only():
    a = [lp(1, [(1, -0.5)]), lp(2, [(2, -0.25)]), lp(3, [(3, -1.0)])]
    b = [lp(1, [(1, -0.5)]), lp(2, [(2, -0.125)]), lp(4, [(4, -9.0)])]
    assert P.logprob_drift(a, a, None) == 0.0
    div = P.first_divergence([1, 2, 3], [1, 2, 4], a, b)
    assert div.position == 2
    assert P.logprob_drift(a, b, div) == pytest.approx(0.125)
