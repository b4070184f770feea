"""The Conversation API on the fake backend: history, reuse across turns, cancellation, and the
suffix proposer's global tree learning every turn."""
from __future__ import annotations

import pytest

from edgespec.chat.conversation import Conversation
from edgespec.errors import InvalidInputError
from edgespec.api.events import Finished, Step
from edgespec.api.params import GenerationParams, SamplingParams
from fakes import FakeModel, fake_engine

# a ChatML-like template: the generation prompt ("!") is what an assistant turn starts with,
# so the next turn's rendering begins with everything the last request held
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}!{{ m['content'] }}"
            "\n{% else %}#{{ m['content'] }}\n{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}!{% endif %}")


def engine(**kw):
    return fake_engine(FakeModel(chat_template=TEMPLATE), {}, **kw)


#: an unseeded sample reuses every held position, the answers' too (greedy reuses only what
#: a prefill wrote: tests/unit/decoding/test_kv_refresh.py); the fake's PEAK makes its text
#: greedy's at this temperature
ANY_TEXT = SamplingParams(temperature=0.05)


def test_turns_keep_history_and_reuse_the_conversation_so_far():
    eng = engine()
    conv = Conversation(eng, params=GenerationParams(max_tokens=5, sampling=ANY_TEXT))
    t1 = conv.ask("x")
    assert t1.text == "#!#!#" and t1.stats.prompt_reused == 0
    t2 = conv.ask("ab")
    assert conv.messages == [{"role": "user", "content": "x"},
                             {"role": "assistant", "content": "#!#!#"},
                             {"role": "user", "content": "ab"},
                             {"role": "assistant", "content": t2.text}]
    # held after turn 1: BOS # x \n ! and four of the five answer tokens
    assert t2.stats.prompt_reused == 5 + 4
    ref = fake_engine(FakeModel(chat_template=TEMPLATE), {}).generate(
        conv.history()[:-1], GenerationParams(max_tokens=5))
    assert ref.text == t2.text


def test_system_message_and_reset():
    eng = engine()
    conv = Conversation(eng, system="a", params=GenerationParams(max_tokens=3))
    conv.ask("x")
    assert conv.history()[0] == {"role": "system", "content": "a"}
    conv.reset()
    assert conv.messages == [] and conv.history() == [{"role": "system", "content": "a"}]
    conv.set_system(None)
    assert conv.history() == []


def test_a_bad_message_leaves_the_history_as_it_was():
    conv = Conversation(engine(), params=GenerationParams(max_tokens=3))
    conv.ask("x")
    before = list(conv.messages)
    with pytest.raises(InvalidInputError):
        conv.ask("   ")
    with pytest.raises(Exception):
        conv.ask("q")  # the fake vocabulary has no "q": refused before anything runs
    assert conv.messages == before


def test_a_cancelled_turn_keeps_what_was_shown_and_the_next_turn_is_right():
    eng = engine()
    conv = Conversation(eng, params=GenerationParams(max_tokens=30, sampling=ANY_TEXT))
    shown = ""
    for ev in conv.send("x"):
        if isinstance(ev, Step):
            shown += ev.text
            if len(shown) >= 4:
                eng.cancel()
    t = conv.turns[-1]
    assert t.stop_reason == "cancelled" and conv.messages[-1]["content"] == shown
    nxt = conv.ask("ab")
    ref = fake_engine(FakeModel(chat_template=TEMPLATE), {}).generate(
        conv.history()[:-1], GenerationParams(max_tokens=30))
    assert nxt.text == ref.text and nxt.stats.prompt_reused > 5


def test_an_abandoned_stream_still_records_the_turn():
    conv = Conversation(engine(), params=GenerationParams(max_tokens=30))
    it = conv.send("x")
    for ev in it:
        if isinstance(ev, Step) and ev.text:
            break
    it.close()
    assert conv.turns[-1].stop_reason == "cancelled" and conv.messages[-1]["content"]


def test_the_suffix_proposers_global_tree_sees_every_turn():
    from edgespec.proposers.suffix import SuffixProposer
    model = FakeModel(chat_template=TEMPLATE)
    sp = SuffixProposer()
    eng = fake_engine(model, {"suffix": sp})
    conv = Conversation(eng, params=GenerationParams(max_tokens=6))
    n0 = sp.global_tree.num_tokens
    conv.ask("x")
    n1 = sp.global_tree.num_tokens
    conv.ask("ab")
    n2 = sp.global_tree.num_tokens
    assert n0 < n1 < n2  # each turn's answer joined the tree
    fins = [ev for ev in conv.send("x") if isinstance(ev, Finished)]
    assert fins[0].stats.prompt_reused > 0
