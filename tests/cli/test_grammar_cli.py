"""`edgespec generate --grammar/--json-schema/--json-mode` on a real small model: outputs follow
the constraint on every proposer, identical to the plain path; bad input fails before loading."""
from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner

from edgespec.cli import cli

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 30},
                         "age": {"type": "integer"},
                         "city": {"type": "string", "maxLength": 30}},
          "required": ["name", "age", "city"], "additionalProperties": False}
PROMPT = "Extract name, age and city as JSON: Maria Lopez, 34, is an engineer in Madrid."


@pytest.fixture()
def runner():
    return CliRunner()


def _gen(runner, model, *args):
    return runner.invoke(cli, ["generate", "--target", str(model), "--threads", "1", "--ctx",
                               "1024", "--json", *args])


def _record(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(r.output.strip().splitlines()[-1])


def test_json_schema_output_validates_and_equals_the_plain_path(runner, model_path, tmp_path):
    f = tmp_path / "person.json"
    f.write_text(json.dumps(SCHEMA))
    m = model_path("smollm2-135m")
    recs = {p: _record(_gen(runner, m, "--proposer", p, "--json-schema", str(f),
                            "--max-tokens", "60", PROMPT))
            for p in ("none", "ngram", "suffix", "ngram+suffix")}
    for p, rec in recs.items():
        assert rec["stop_reason"] == "eos", (p, rec["text"])
        jsonschema.validate(json.loads(rec["text"]), SCHEMA)
        assert rec["tokens"] == recs["none"]["tokens"], p


def test_grammar_and_json_mode(runner, model_path, tmp_path):
    g = tmp_path / "yn.gbnf"
    g.write_text('root ::= "yes" | "no"\n')
    m = model_path("smollm2-135m")
    rec = _record(_gen(runner, m, "--proposer", "ngram+suffix", "--grammar", str(g),
                       "Is water wet? Answer yes or no."))
    assert rec["text"] in ("yes", "no") and rec["stop_reason"] == "eos"
    rec = _record(_gen(runner, m, "--proposer", "suffix", "--json-mode", "--max-tokens", "60",
                       PROMPT))
    assert isinstance(json.loads(rec["text"]), dict)


def test_bad_schemas_fail_before_loading_with_a_message(runner, tmp_path):
    cases = {"bad.json": ("{nope", "not valid JSON"),
             "min.json": (json.dumps({"type": "integer", "minimum": 1}), "'minimum'")}
    for name, (text, needle) in cases.items():
        f = tmp_path / name
        f.write_text(text)
        # the target does not exist: the schema is refused before anything loads
        r = runner.invoke(cli, ["generate", "--target", str(tmp_path / "none.gguf"),
                                "--json-schema", str(f), "hi"])
        assert r.exit_code == 1 and needle in r.output and "Traceback" not in r.output


def test_an_unfinished_constrained_output_is_reported(runner, model_path, tmp_path):
    f = tmp_path / "person.json"
    f.write_text(json.dumps(SCHEMA))
    r = runner.invoke(cli, ["generate", "--target", str(model_path("smollm2-135m")),
                            "--threads", "1", "--json-schema", str(f), "--max-tokens", "3",
                            PROMPT])
    assert r.exit_code == 0
    assert "incomplete under the grammar" in r.output and "--max-tokens" in r.output
