"""Attribution names the right cause on constructed before/after record sets."""
from __future__ import annotations

import json
import math

import pytest

from edgespec.lab.analysis.attribute import attribute, compared_configs, load, normalise
from edgespec.errors import InvalidInputError

STEP = 0.02  # seconds of a one-token pass


def record(prompt, *, acc=(0.8, 0.6, 0.4), sizes=None, cost=None, config="ngram", parity=True,
           divergence=None, events=None, error=None, scale=1.0):
    """A bench record whose decode time is its target passes: tokens follow acceptance
    (e(n) = 1 + sum of the first n-1 position rates), seconds the per-size cost."""
    if error:
        return {"config": config, "prompt_id": prompt, "turn": 0, "error": error}
    sizes = sizes or {1: 10, 4: 30}
    cost = cost or {1: STEP, 4: STEP * 1.3}
    tokens = sum(c * (1 + sum(acc[:n - 1])) for n, c in sizes.items())
    seconds = sum(c * cost[n] * scale for n, c in sizes.items())
    verify = sum(c for n, c in sizes.items() if n > 1)
    drafted = [sum(c for n, c in sizes.items() if n - 1 > i) for i in range(3)]
    return {"config": config, "prompt_id": prompt, "turn": 0, "category": "x",
            "generated_tokens": tokens + 1, "decode_seconds": seconds,
            "decode_tokens_per_second": tokens / seconds, "verify_passes": verify,
            "plain_steps": sizes.get(1, 0), "drafted": sum(drafted),
            "pass_size_hist": {str(n): c for n, c in sizes.items()},
            "pass_seconds": {str(n): c * cost[n] * scale for n, c in sizes.items()},
            "position_drafted": drafted, "position_accepted": [d * a for d, a in zip(drafted, acc)],
            "control_events": events or {}, "parity": parity,
            "divergence": {"kind": divergence} if divergence else None}


def side(*recs):
    return [normalise(r) for r in recs]


BEFORE = side(*(record(f"p{i}") for i in range(4)))


def test_unchanged_records_have_no_cause():
    a = attribute(BEFORE, side(*(record(f"p{i}") for i in range(4))), "ngram")
    assert a.change == pytest.approx(1.0) and a.cause == "none"


def test_worse_acceptance_is_proposer_quality():
    after = side(*(record(f"p{i}", acc=(0.5, 0.3, 0.1)) for i in range(4)))
    a = attribute(BEFORE, after, "ngram")
    assert a.cause == "proposer_quality" and a.change < 0.8
    assert math.exp(a.effects["proposer_quality"]) == pytest.approx(a.change, rel=1e-6)
    assert abs(a.effects["verification_cost"]) < 1e-9 and abs(a.effects["scheduling"]) < 1e-9
    assert "proposer quality" in a.explanation[0]


def test_slower_passes_at_equal_sizes_are_verification_cost():
    slow = {1: STEP * 1.4, 4: STEP * 1.9}  # a new build with slower batched kernels
    after = side(*(record(f"p{i}", cost=slow) for i in range(4)))
    a = attribute(BEFORE, after, "ngram")
    assert a.cause == "verification_cost"
    assert abs(a.effects["proposer_quality"]) < 1e-9 and abs(a.effects["scheduling"]) < 1e-9
    assert math.exp(a.effects["verification_cost"]) == pytest.approx(a.change)


def test_more_plain_steps_is_scheduling():
    after = side(*(record(f"p{i}", sizes={1: 30, 4: 10}, events={"fallback": 3})
                   for i in range(4)))
    a = attribute(BEFORE, after, "ngram")
    assert a.cause == "scheduling" and a.change < 1
    assert abs(a.effects["proposer_quality"]) < 1e-9
    assert abs(a.effects["verification_cost"]) < 1e-9
    assert "fallback×12" in " ".join(a.explanation)


def test_diverged_outputs_are_numerical_drift():
    # two prompts' outputs left the plain path at near-ties and became slower text to
    # speculate on; the prompts that kept parity did not change at all
    after = side(record("p0"), record("p1"),
                 record("p2", parity=False, divergence="near-tie", acc=(0.2, 0.1, 0.0)),
                 record("p3", parity=False, divergence="near-tie", acc=(0.2, 0.1, 0.0)))
    a = attribute(BEFORE, after, "ngram")
    assert a.cause == "numerical_drift"
    assert math.exp(a.effects["numerical_drift"]) == pytest.approx(a.change)
    assert "near-ties 0 -> 2" in " ".join(a.explanation)


def test_refused_requests_are_feature_incompatibility():
    after = side(record("p0"), record("p1"),
                 record("p2", error="a grammar cannot be combined with --exact"),
                 record("p3", error="a grammar cannot be combined with --exact"))
    a = attribute(BEFORE, after, "ngram")
    assert a.cause == "feature_incompatibility"
    assert math.exp(a.effects["feature_incompatibility"]) == pytest.approx(0.5)
    assert "refused 0/4 -> 2/4" in " ".join(a.explanation)


def test_files_of_both_shapes_load(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"schema": 1, "identity": {}, "records": [
        record("p0"), record("p0", config="none", sizes={1: 40}, acc=())]}))
    gen = tmp_path / "gen.jsonl"
    lines = [{"kind": "identity", "hash": "h", "components": {}},
             {"text": "x", "proposer": "ngram", "identity": "h", "stats": {
                 "proposer": "ngram", "generated_tokens": 41, "decode_seconds": 0.5,
                 "plain_steps": 10, "plain_seconds": 0.2, "verify_passes": 10, "drafted": 30,
                 "verify_seconds": 0.3, "position_acceptance": [0.8, 0.5, 0.2],
                 "control_events": {}}}]
    gen.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    b, g = load(bench), load(gen)
    assert compared_configs(b, b) == ["ngram", "none"]
    assert len(g) == 1 and g[0].passes == {1: 10, 4: 10}
    assert g[0].pass_seconds[4] == pytest.approx(0.3)
    assert g[0].position_accepted == pytest.approx([8, 5, 2])


def test_bad_inputs_are_clear_errors(tmp_path):
    junk = tmp_path / "junk.jsonl"
    junk.write_text("{not json\n")
    with pytest.raises(InvalidInputError, match="not JSON"):
        load(junk)
    with pytest.raises(InvalidInputError, match="cannot read"):
        load(tmp_path / "missing.json")
    with pytest.raises(InvalidInputError, match="--config"):
        attribute(BEFORE, BEFORE, "suffix")


def test_cli_names_the_cause(tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import cli
    b, a = tmp_path / "before.json", tmp_path / "after.json"
    b.write_text(json.dumps({"records": [record(f"p{i}") for i in range(4)]}))
    a.write_text(json.dumps({"records": [record(f"p{i}", acc=(0.5, 0.3, 0.1)) for i in range(4)]}))
    r = CliRunner().invoke(cli, ["attribute", str(b), str(a)])
    assert r.exit_code == 0, r.output
    assert "explained mostly by proposer quality" in r.output
    r = CliRunner().invoke(cli, ["attribute", str(b), str(a), "--json"])
    assert json.loads(r.output)[0]["cause"] == "proposer_quality"
