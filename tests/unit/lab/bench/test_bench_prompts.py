"""Prompt sets, buckets and the configuration matrix (pure, no model)."""
import json

import pytest

from edgespec.lab.bench.matrix import BASELINE, ConfigSpec, Matrix, apply_overrides, parse_config
from edgespec.lab.bench.presets import load_toml, preset
from edgespec.lab.bench.prompts import (SPEC_BENCH_CATEGORIES, BenchPrompt, bucket_label, bucket_labels,
                                    default_data_dir, humanevalfix_prompt, load_humanevalfix,
                                    load_jsonl_prompts, load_spec_bench)
from edgespec.errors import InvalidInputError

DATA = default_data_dir()


def test_the_shipped_prompt_sets_are_found():
    # the prompt sets ship inside the package (edgespec/lab/bench/data): a missing file is a
    # failure, not a reason to skip
    assert (DATA / "spec_bench_question.jsonl").is_file(), DATA
    assert (DATA / "humanevalfix_python.jsonl").is_file(), DATA


def test_spec_bench_has_thirteen_categories_first_question_each():
    prompts = load_spec_bench(per_category=1)
    assert [p.category for p in prompts] == list(SPEC_BENCH_CATEGORIES)
    by_cat = {p.category: p for p in prompts}
    # MT-bench categories are two-turn conversations, the Spec-Bench additions one-turn
    assert len(by_cat["writing"].turns) == 2
    assert len(by_cat["summarization"].turns) == 1
    assert by_cat["writing"].id == "spec_bench/81"
    assert len({p.id for p in prompts}) == 13


def test_spec_bench_selection_and_turn_cap():
    prompts = load_spec_bench(categories=["coding", "summarization"], per_category=3, max_turns=1)
    assert [p.category for p in prompts] == ["coding"] * 3 + ["summarization"] * 3
    assert all(len(p.turns) == 1 for p in prompts)
    with pytest.raises(InvalidInputError, match="unknown Spec-Bench category"):
        load_spec_bench(categories=["poetry"])


def test_humanevalfix_prompt_is_buggy_code_tests_and_instruction():
    rows = [json.loads(l) for l in open(DATA / "humanevalfix_python.jsonl")]
    text = humanevalfix_prompt(rows[0])
    assert text.startswith(rows[0]["declaration"] + rows[0]["buggy_solution"])
    assert rows[0]["test"] in text
    assert text.endswith("Fix bugs in has_close_elements.")
    prompts = load_humanevalfix(n=2)
    assert [p.id for p in prompts] == ["humanevalfix/Python/0", "humanevalfix/Python/1"]
    assert prompts[0].category == "humanevalfix"


def test_messages_carry_the_models_own_answers():
    p = BenchPrompt(id="x/1", category="writing", turns=("Write a poem.", "Shorter."), source="x")
    assert p.messages([]) == [{"role": "user", "content": "Write a poem."}]
    assert p.messages(["Roses..."]) == [
        {"role": "user", "content": "Write a poem."},
        {"role": "assistant", "content": "Roses..."},
        {"role": "user", "content": "Shorter."},
    ]
    with pytest.raises(ValueError):
        p.messages(["a", "b"])


def test_any_jsonl_with_a_prompt_field(tmp_path):
    f = tmp_path / "mine.jsonl"
    f.write_text('{"prompt": "hello", "category": "chat"}\n\n{"id": "q7", "prompt": ["a", "b"]}\n')
    prompts = load_jsonl_prompts(f)
    assert prompts[0] == BenchPrompt(id="mine/0", category="chat", turns=("hello",), source="mine.jsonl")
    assert prompts[1].id == "mine/q7" and prompts[1].turns == ("a", "b")
    assert prompts[1].category == "mine"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hello"}\n')
    with pytest.raises(InvalidInputError, match="--prompt-field"):
        load_jsonl_prompts(bad)
    with pytest.raises(InvalidInputError, match="not found"):
        load_jsonl_prompts(tmp_path / "absent.jsonl")
    broken = tmp_path / "broken.jsonl"
    broken.write_text("{nope\n")
    with pytest.raises(InvalidInputError, match="broken.jsonl:1"):
        load_jsonl_prompts(broken)


def test_buckets():
    edges = [1024, 256]
    assert bucket_label(0, edges) == "<256"
    assert bucket_label(256, edges) == "256-1024"
    assert bucket_label(1023, edges) == "256-1024"
    assert bucket_label(1024, edges) == ">=1024"
    assert bucket_labels(edges) == ["<256", "256-1024", ">=1024"]
    assert bucket_label(5, []) == "all" and bucket_labels([]) == ["all"]


def test_parse_config_knobs():
    assert parse_config("ngram") == ConfigSpec("ngram")
    c = parse_config("ngram:k=3, min_n=2,mode=fast,adaptive=true,p=0.5")
    assert c.knob_dict == {"k": 3, "min_n": 2, "mode": "fast", "adaptive": True, "p": 0.5}
    assert c.label == "ngram[adaptive=True,k=3,min_n=2,mode=fast,p=0.5]"
    a = parse_config("llama-pld:2")
    assert a.kind == "anchor" and a.knob_dict == {"num_pred_tokens": 2} and a.label == "llama-pld:2"
    assert a.baseline == "llama-pld:0"
    with pytest.raises(InvalidInputError):
        parse_config("ngram:k")


def test_presets():
    q = preset("quick")
    assert q.labels[0] == BASELINE
    assert {"ngram", "suffix"} <= set(q.labels)
    assert any(c.kind == "anchor" for c in q.configs)
    assert q.max_new_tokens == 64 and q.humanevalfix == 2 and q.per_category == 1
    f = preset("full")
    assert "draft" in f.labels
    assert apply_overrides(f, {"draft": "qwen-0.5b"}).validate().draft == "qwen-0.5b"
    with pytest.raises(InvalidInputError, match="quick, standard, long, full"):
        preset("huge")


def test_toml_overrides(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(
        'target = "smollm2-135m"\nmax_new_tokens = 16\nbuckets = [100]\n'
        '[prompts]\nspec_bench = ["coding"]\nper_category = 2\nhumanevalfix = 0\n'
        '[[config]]\nproposer = "ngram"\nknobs = { k = 4 }\n'
        '[[anchor]]\nnum_pred_tokens = 3\n')
    m = load_toml(f).with_baseline().validate()
    assert m.target == "smollm2-135m" and m.max_new_tokens == 16 and m.buckets == (100,)
    assert m.spec_bench == ("coding",) and m.per_category == 2 and m.humanevalfix == 0
    # the old [[anchor]] schema still means llama-cpp-python's lookup, with its own plain path
    assert m.labels == ["none", "ngram[k=4]", "llama-pld:0", "llama-pld:3"]
    f.write_text('max_new_tokns = 3\n')
    with pytest.raises(InvalidInputError, match="unknown keys max_new_tokns"):
        load_toml(f)


def test_matrix_guards():
    with pytest.raises(InvalidInputError, match="needs a draft model"):
        Matrix(configs=(ConfigSpec(BASELINE), ConfigSpec("draft"))).validate()
    with pytest.raises(InvalidInputError, match="plain path"):
        Matrix(configs=(ConfigSpec("ngram"),)).validate()
    with pytest.raises(InvalidInputError, match="no prompts"):
        Matrix(spec_bench=()).validate()
    with pytest.raises(InvalidInputError, match="twice"):
        Matrix(configs=(ConfigSpec(BASELINE), ConfigSpec("ngram"), ConfigSpec("ngram"))).validate()
    assert Matrix(configs=(ConfigSpec("ngram"),)).with_baseline().labels == ["none", "ngram"]
