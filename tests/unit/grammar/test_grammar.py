"""Constraints are compiled and refused before any model loads: GBNF through llama.cpp's own
parser, JSON schemas through llama-cpp-python's converter, and every schema keyword the
converter would silently drop is refused rather than left unenforced."""
from __future__ import annotations

import json

import pytest

from edgespec.errors import EdgespecError, InvalidInputError, UnsupportedError
from edgespec.grammar.constraint import GrammarError, constraint_for, constraint_of
from edgespec.api.params import GenerationParams

PERSON = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def test_a_parsable_grammar_becomes_a_constraint():
    c = constraint_of(grammar='root ::= "yes" | "no"')
    assert c.kind == "grammar" and "yes" in c.gbnf


@pytest.mark.parametrize("gbnf, reason", [
    ('root ::= "a" [0-9', "unexpected end of input"),
    ("root ::= y", "Undefined rule identifier 'y'"),
    ('root ::= x\nx ::= x "a" | "b"', "left recursion"),
    ('start ::= "a"', "'root' symbol"),
    ("", "empty"),
    ("   \n", "empty"),
])
def test_an_unparsable_grammar_is_refused_with_llama_cpps_reason(gbnf, reason):
    with pytest.raises(GrammarError) as e:
        constraint_for(GenerationParams(grammar=gbnf))
    assert reason in str(e.value) and isinstance(e.value, InvalidInputError)


def test_a_schema_becomes_gbnf_with_its_fixed_keys():
    for given in (PERSON, json.dumps(PERSON)):
        c = constraint_for(GenerationParams(json_schema=given))
        assert c.kind == "json_schema" and '\\"name\\"' in c.gbnf and '\\"age\\"' in c.gbnf
        assert c.output_error('{"name": "Ann", "age": 3}') is None
        assert "required" in c.output_error('{"name": "Ann"}')


@pytest.mark.parametrize("schema, needle", [
    ({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}}, "'minimum'"),
    ({"type": "string", "format": "email"}, "'email'"),
    ({"oneOf": [{"type": "string"}, {"type": "integer"}]}, "use anyOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems'"),
    ({"allOf": [{"properties": {"a": {"type": "string"}}}]}, "allOf"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
     "without a schema"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "'not'"),
    ({"type": "string", "pattern": "^a$", "minLength": 2}, "'minLength'"),
    ({"$ref": "https://example.com/s.json"}, "only local"),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "abc"}}},
     "cannot be turned into a grammar"),
])
def test_a_schema_feature_the_converter_cannot_enforce_is_refused(schema, needle):
    with pytest.raises(UnsupportedError) as e:
        constraint_for(GenerationParams(json_schema=schema))
    assert needle in str(e.value)


@pytest.mark.parametrize("schema, needle", [
    ("{not json", "not valid JSON"),
    ('"a string"', "must be an object"),
    ({"type": "strin"}, "invalid at /type"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "points nowhere"),
])
def test_an_invalid_schema_is_refused(schema, needle):
    with pytest.raises(GrammarError, match=needle):
        constraint_for(GenerationParams(json_schema=schema))


def test_supported_keywords_pass_and_annotations_are_ignored():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "t",
              "type": "object", "description": "d", "additionalProperties": False,
              "$defs": {"tag": {"type": "string", "maxLength": 8}},
              "properties": {"when": {"type": "string", "format": "date"},
                             "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
                             "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"},
                                      "maxItems": 3},
                             "kind": {"enum": ["a", "b"]}, "n": {"type": ["integer", "null"]},
                             "x": {"anyOf": [{"type": "number"}, {"const": "none"}]}},
              "required": ["when"]}
    assert constraint_for(GenerationParams(json_schema=schema)).kind == "json_schema"


def test_json_mode_is_any_json_object_and_one_constraint_at_most():
    c = constraint_for(GenerationParams(json_mode=True))
    assert c.kind == "json" and c.output_error('{"a": [1, 2]}') is None
    assert c.output_error("[1]") == "not a JSON object"
    with pytest.raises(InvalidInputError, match="one of"):
        constraint_for(GenerationParams(json_mode=True, grammar='root ::= "a"'))
    assert constraint_for(GenerationParams()) is None


def test_every_refusal_is_an_edgespec_error():
    for kw in ({"grammar": "root ::= ("}, {"json_schema": {"type": "integer", "maximum": 3}}):
        with pytest.raises(EdgespecError):
            constraint_for(GenerationParams(**kw))
