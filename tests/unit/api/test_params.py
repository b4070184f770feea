"""Request parameters are refused at the edge, before any model loads."""
from __future__ import annotations

import pytest

from edgespec.errors import EdgespecError, InvalidInputError
from edgespec.api.params import GenerationParams, SamplingParams
from edgespec.grammar.constraint import constraint_for


def test_defaults_validate_and_return_themselves():
    p = GenerationParams()
    assert p.validate() is p
    assert p.sampling.greedy


def test_a_grammar_that_does_not_parse_is_refused_not_ignored():
    # tests/unit/grammar/test_grammar.py covers grammars and schemas in depth
    with pytest.raises(InvalidInputError, match="cannot parse the grammar") as e:
        constraint_for(GenerationParams(grammar='root ::= "yes" | [a-'))
    assert isinstance(e.value, EdgespecError)
    assert constraint_for(GenerationParams(grammar='root ::= "yes" | "no"')) is not None


def test_an_empty_grammar_is_still_a_grammar():
    # "" is a request for a (degenerate) grammar, not "no grammar": refuse it, never ignore it
    with pytest.raises(InvalidInputError, match="empty"):
        constraint_for(GenerationParams(grammar=""))


@pytest.mark.parametrize("kw, needle", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ("",)}, "stop strings"),
    ({"sampling": SamplingParams(temperature=-0.1)}, "temperature"),
    ({"sampling": SamplingParams(top_p=0.0)}, "top_p"),
    ({"sampling": SamplingParams(min_p=1.0)}, "min_p"),
    ({"sampling": SamplingParams(top_k=-1)}, "top_k"),
    ({"sampling": SamplingParams(repeat_penalty=0.0)}, "repeat_penalty"),
    ({"sampling": SamplingParams(repeat_last_n=-1)}, "repeat_last_n"),
    ({"sampling": SamplingParams(seed=-1)}, "seed"),
])
def test_out_of_range_values_name_the_field(kw, needle):
    with pytest.raises(InvalidInputError, match=needle):
        GenerationParams(**kw).validate()
