"""The reasoning splitter: a leading <think> block -> reasoning_content, fed in any pieces."""
from __future__ import annotations

import random

import pytest

from edgespec.agents.reasoning import ReasoningSplitter, held_prefix, prompt_opens_reasoning, \
    splits


def split_whole(text: str, started: bool = False) -> tuple[str, str]:
    s = ReasoningSplitter(started=started)
    s.feed(text)
    s.finish()
    return s.reasoning, s.content


def split_pieces(pieces, started: bool = False) -> tuple[str, str, list]:
    s = ReasoningSplitter(started=started)
    got = [s.feed(p) for p in pieces] + [s.finish()]
    reasoning = "".join(g.reasoning for g in got)
    content = "".join(g.content for g in got)
    assert (reasoning, content) == (s.reasoning, s.content)
    return reasoning, content, got


CASES = [
    # text, started, reasoning, content
    ("<think>\nAdd 2 and 2.\n</think>\n\nIt is 4.", False, "Add 2 and 2.", "It is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("It is 4.", False, "", "It is 4."),
    ("Use <think> tags like <think>x</think>.", False, "", "Use <think> tags like <think>x</think>."),
    ("<think>never closed, cut by max_tokens", False, "never closed, cut by max_tokens", ""),
    ("Add 2 and 2.\n</think>\n4", True, "Add 2 and 2.", "4"),  # the prompt opened the block
    ("<think></think>4", False, "", "4"),  # Qwen3 with thinking off writes an empty block
    ("<thin", False, "", "<thin"),  # a partial tag that never completes is content
    ("<think>a < b and a </thinker> c</think>ok", False, "a < b and a </thinker> c", "ok"),
    ("", False, "", ""),
]


@pytest.mark.parametrize("text,started,reasoning,content", CASES)
def test_whole_text_splits(text, started, reasoning, content):
    assert split_whole(text, started) == (reasoning, content)


@pytest.mark.parametrize("text,started,reasoning,content", CASES)
def test_every_piecewise_feeding_gives_the_whole_texts_split(text, started, reasoning, content):
    # one character at a time (a tag straddles many pieces) ...
    assert split_pieces(list(text), started)[:2] == (reasoning, content)
    # ... and random cuts, as speculative steps of several tokens make them
    rng = random.Random(len(text))
    for _ in range(30):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert split_pieces(pieces, started)[:2] == (reasoning, content), pieces


def test_reasoning_streams_before_the_block_closes():
    _, _, got = split_pieces(["<think>step one, ", "step two", " and more"])
    assert [g.reasoning for g in got] == ["step one,", " step two", " and more", ""]
    assert all(not g.content for g in got)


def test_a_partial_close_tag_is_held_until_decided():
    s = ReasoningSplitter(started=True)
    assert s.feed("x </thi").reasoning == "x"
    assert s.feed("s is not a tag").reasoning == " </this is not a tag"


def test_helpers():
    assert held_prefix("abc</th", "</think>") == 4
    assert held_prefix("abc", "</think>") == 0
    assert held_prefix("</think", "</think>") == 7
    assert prompt_opens_reasoning("<|Assistant|><think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert splits("auto") and splits("deepseek") and not splits("none")
    with pytest.raises(ValueError, match="reasoning format 'raw'"):
        splits("raw")
