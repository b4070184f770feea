"""llama-cpp-python's examples on edgespec, against a real ``llama_cpp.Llama`` on the same model.

Both sides load SmolLM2-135M with the same constructor keywords (a Q8_0 KV cache with flash
attention: the kernel configuration both compute alike); edgespec adds its own keywords
(exact mode, fixed-length n-gram + suffix drafting), so greedy text must be the plain path's
token for token, i.e. llama-cpp-python's, while speculation runs.
"""
from __future__ import annotations

import json

import pytest

from edgespec.errors import EdgespecError, InvalidInputError, UnsupportedError

MODEL = "smollm2-135m"
# the constructor keywords both libraries are given
COMMON = dict(n_ctx=512, n_threads=2, seed=1337, verbose=False, flash_attn=True, type_k=8,
              type_v=8)
# edgespec's own: bitwise the plain path's greedy output, drafting on every step it can
EDGESPEC = dict(exact=True, proposer="ngram+suffix", adaptive=False)

PLANETS = "Q: Name the planets in the solar system? A: "
COUNTING = "Count from 1 to 30: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name the planets in the solar system."}]


class Records:
    """A stats sink: what each request did (drafted, accepted, stop reason)."""

    def __init__(self) -> None:
        self.records = []

    def emit(self, stats) -> None:
        self.records.append(stats)


@pytest.fixture(scope="module")
def path(model_path):
    return str(model_path(MODEL))


@pytest.fixture(scope="module")
def llm(path):
    from edgespec.apps import Llama
    with Llama(model_path=path, **COMMON, **EDGESPEC) as llm:
        yield llm


@pytest.fixture(scope="module")
def ref(path):
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(model_path=path, **COMMON)
    yield ref
    ref.close()


@pytest.fixture
def records(llm):
    sink = Records()
    llm.engine.sinks.append(sink)
    yield sink
    llm.engine.sinks.remove(sink)


def shape(obj):
    """The structure of a response: keys and value types, recursively (values dropped)."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(v) for v in obj[:1]]
    if type(obj).__name__ in ("float", "float32"):  # llama-cpp-python's logprobs: float32
        return "float"
    return type(obj).__name__


def without_identity(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("id", "created")}


# --- llama-cpp-python's README, unchanged but for the constructor ------------------------
def test_readme_completion_example(llm, ref):
    output = llm(
        "Q: Name the planets in the solar system? A: ",  # Prompt
        max_tokens=32,  # Generate up to 32 tokens
        stop=["Q:", "\n"],  # Stop generating just before the model would generate a new question
        echo=True  # Echo the prompt back in the output
    )  # Generate a completion, can also call create_completion
    theirs = ref(PLANETS, max_tokens=4, stop=["Q:", "\n"], echo=True)  # its shape
    assert shape(output) == shape(theirs)
    assert output["id"].startswith("cmpl-") and output["object"] == "text_completion"
    assert output["model"] == theirs["model"] == llm.model_path
    choice = output["choices"][0]
    assert choice["text"].startswith(PLANETS)  # echo
    assert "\n" not in choice["text"] and "Q:" not in choice["text"][len(PLANETS):]
    assert choice["logprobs"] is None and choice["finish_reason"] in ("stop", "length")
    u = output["usage"]
    assert u["prompt_tokens"] == theirs["usage"]["prompt_tokens"]
    assert 1 <= u["completion_tokens"] <= 32
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_readme_chat_example(llm, ref):
    out = llm.create_chat_completion(
        messages=[
            {"role": "system", "content": "You are an assistant who perfectly describes images."},
            {
                "role": "user",
                "content": "Describe this image in detail please."
            }
        ],
        max_tokens=24,  # the README's call has no limit; a short answer keeps the test fast
    )
    theirs = ref.create_chat_completion(messages=CHAT, max_tokens=4)
    assert shape(out) == shape(theirs)
    assert out["id"].startswith("chatcmpl-") and out["object"] == "chat.completion"
    message = out["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].strip()
    assert out["choices"][0]["finish_reason"] in ("stop", "length")


def test_readme_json_schema_example(llm):
    out = llm.create_chat_completion(
        messages=[
            {
                "role": "system",
                "content": "You are a helpful assistant that outputs in JSON.",
            },
            {"role": "user", "content": "Who won the world series in 2020"},
        ],
        response_format={
            "type": "json_object",
            "schema": {
                "type": "object",
                "properties": {"team_name": {"type": "string"}},
                "required": ["team_name"],
            },
        },
        temperature=0.7,
        max_tokens=48,
    )
    answer = json.loads(out["choices"][0]["message"]["content"])
    assert isinstance(answer["team_name"], str)
    assert out["choices"][0]["finish_reason"] == "stop"


def test_json_modes(llm):
    """Any JSON object (json_object), and OpenAI's json_schema form, through edgespec's
    grammar path."""
    msgs = [{"role": "user", "content": 'Reply with the JSON object {"answer": "yes"} and '
                                        'nothing else.'}]
    obj = llm.create_chat_completion(msgs, response_format={"type": "json_object"},
                                     temperature=0, max_tokens=24)
    assert json.loads(obj["choices"][0]["message"]["content"]) == {"answer": "yes"}
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}},
              "required": ["ok"], "additionalProperties": False}
    out = llm.create_chat_completion(
        msgs, temperature=0, max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    assert isinstance(json.loads(out["choices"][0]["message"]["content"])["ok"], bool)


# --- the same answers as llama-cpp-python, with speculation on ---------------------------
def test_greedy_chat_equals_llama_cpp(llm, ref):
    ours = llm.create_chat_completion(messages=CHAT, temperature=0, max_tokens=10)
    theirs = ref.create_chat_completion(messages=CHAT, temperature=0, max_tokens=10)
    assert without_identity(ours) == without_identity(theirs)
    assert ours["choices"][0]["message"]["content"]


def test_greedy_completion_speculates_and_equals_llama_cpp(llm, ref, records):
    ours = llm.create_completion(COUNTING, temperature=0, max_tokens=16)
    theirs = ref.create_completion(COUNTING, temperature=0, max_tokens=16)
    assert without_identity(ours) == without_identity(theirs)
    (stats,) = records.records
    assert stats.drafted > 0 and stats.accepted > 0  # the n-gram drafts were verified


def test_streamed_chat_chunks_equal_llama_cpp(llm, ref, records):
    ours = list(llm.create_chat_completion(messages=CHAT, temperature=0, max_tokens=8,
                                           stream=True))
    theirs = list(ref.create_chat_completion(messages=CHAT, temperature=0, max_tokens=8,
                                             stream=True))
    assert [without_identity(c) for c in ours] == [without_identity(c) for c in theirs]
    assert len({c["id"] for c in ours}) == 1 and ours[0]["id"].startswith("chatcmpl-")
    assert ours[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert ours[-1]["choices"][0]["delta"] == {}
    assert ours[-1]["choices"][0]["finish_reason"] == "length"
    # the app's usual loop over the stream
    text = ""
    for chunk in ours:
        delta = chunk["choices"][0]["delta"]
        if "content" in delta:
            text += delta["content"]
    assert text.startswith("The planets")
    (stats,) = records.records
    assert stats.generated_tokens == 8 and stats.stop_reason == "length"


def test_streamed_completion_chunks_equal_llama_cpp(llm, ref):
    kw = dict(temperature=0, max_tokens=12, stop=[", 16"], stream=True)
    ours = list(llm.create_completion(COUNTING, **kw))
    theirs = list(ref.create_completion(COUNTING, **kw))
    assert "".join(c["choices"][0]["text"] for c in ours) == \
        "".join(c["choices"][0]["text"] for c in theirs)
    assert shape(ours[0]) == shape(theirs[0]) and shape(ours[-1]) == shape(theirs[-1])
    assert ours[-1]["choices"][0] == theirs[-1]["choices"][0]  # "", stop
    assert all(c["object"] == "text_completion" and "usage" not in c for c in ours)


def test_logprobs_shape(llm, path):
    llama_cpp = pytest.importorskip("llama_cpp")
    out = llm.create_completion(COUNTING, temperature=0, max_tokens=3, logprobs=2)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    assert lp["text_offset"][0] == len(COUNTING)
    assert all(tok in top for tok, top in zip(lp["tokens"], lp["top_logprobs"]))
    # llama-cpp-python computes logprobs only with logits_all=True
    ref = llama_cpp.Llama(model_path=path, logits_all=True, **COMMON)
    try:
        theirs = ref.create_completion(COUNTING, temperature=0, max_tokens=3, logprobs=2)
    finally:
        ref.close()
    assert shape(out) == shape(theirs)
    assert lp["tokens"] == theirs["choices"][0]["logprobs"]["tokens"]
    assert lp["text_offset"] == theirs["choices"][0]["logprobs"]["text_offset"]
    # the same distribution: llama-cpp-python's logprobs are the raw logits' log-softmax
    assert lp["token_logprobs"] == pytest.approx(
        [float(v) for v in theirs["choices"][0]["logprobs"]["token_logprobs"]], abs=1e-3)
    chat = llm.create_chat_completion(CHAT, temperature=0, max_tokens=2, logprobs=True,
                                      top_logprobs=2)
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and set(content[0]) == {"token", "bytes", "logprob", "top_logprobs"}


# --- refusals: named, before anything runs -----------------------------------------------
@pytest.mark.parametrize("kwargs, named", [
    (dict(suffix="}"), "suffix"),
    (dict(stopping_criteria=[lambda ids, scores: False]), "stopping_criteria"),
    (dict(mirostat_mode=2, temperature=0.8), "mirostat_mode"),
    (dict(typical_p=0.5, temperature=0.8), "typical_p"),
    (dict(echo=True, logprobs=1), "echo with logprobs"),
])
def test_refused_completion_arguments(llm, kwargs, named):
    with pytest.raises(UnsupportedError, match=named):
        llm.create_completion(PLANETS, **kwargs)
    assert not llm.engine._lock.locked()


def test_refused_chat_arguments(llm):
    with pytest.raises(InvalidInputError, match="response_format type 'yaml'"):
        llm.create_chat_completion(CHAT, response_format={"type": "yaml"})
    with pytest.raises(InvalidInputError, match="logit_bias key '99999999'"):
        llm.create_chat_completion(CHAT, logit_bias={99999999: 5.0})
    with pytest.raises(UnsupportedError, match=r"messages\[0\]\.content\[1\] is a 'image_url'"):
        llm.create_chat_completion([{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    with pytest.raises(InvalidInputError, match="grammar or response_format"):
        llm.create_chat_completion(CHAT, grammar='root ::= "a"',
                                   response_format={"type": "json_object"})


def test_what_llama_cpp_ignores_is_ignored(llm):
    """tfs_z (no tail-free step in llama-cpp-python's sampler), mirostat and typical_p when
    greedy (read only when sampling), top_logprobs without logprobs."""
    out = llm.create_chat_completion(CHAT, temperature=0, max_tokens=2, tfs_z=0.5,
                                     mirostat_mode=2, typical_p=0.5, top_logprobs=3)
    assert out["choices"][0]["logprobs"] is None


def test_grammar_and_logit_bias(llm):
    llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")
    g = llama_grammar.LlamaGrammar.from_string('root ::= "yes" | "no"', verbose=False)
    out = llm.create_chat_completion(CHAT, grammar=g, temperature=0, max_tokens=4)
    assert out["choices"][0]["message"]["content"] in ("yes", "no")
    banned = llm.tokenize(b"The", add_bos=False)
    first = llm.create_chat_completion(CHAT, temperature=0, max_tokens=1)
    assert first["choices"][0]["message"]["content"] == "The"
    biased = llm.create_chat_completion(CHAT, temperature=0, max_tokens=1,
                                        logit_bias={banned[0]: float("-inf")})
    assert biased["choices"][0]["message"]["content"] != "The"


@pytest.mark.parametrize("kwargs, named", [
    (dict(lora_path="adapter.gguf"), "lora_path"),
    (dict(pooling_type=4), "pooling_type"),
    (dict(rope_freq_base=10000.0), "rope_freq_base"),
    (dict(chat_format="chatml"), "chat_format='chatml'"),
    (dict(type_k=8), "type_k=8 and type_v=None"),
])
def test_refused_constructor_keywords(path, kwargs, named):
    from edgespec.apps import Llama
    with pytest.raises(UnsupportedError, match=named):
        Llama(model_path=path, verbose=False, **kwargs)


def test_unknown_constructor_keyword_is_refused(path):
    from edgespec.apps import Llama
    with pytest.raises(InvalidInputError, match="unexpected keyword argument 'n_ctxx'"):
        Llama(model_path=path, n_ctxx=2048, verbose=False)


def test_performance_keywords_are_accepted(path):
    from edgespec.apps import Llama
    with Llama(model_path=path, n_batch=64, n_threads_batch=2, use_mlock=False, n_ctx=0,
               verbose=False, proposer="none", adaptive=False, exact=True) as small:
        assert small.n_ctx() == small.engine.target.n_ctx_train  # n_ctx=0: as trained
        assert small.create_completion(PLANETS, max_tokens=2, temperature=0)["usage"][
            "completion_tokens"] == 2


def test_completions_over_an_engine_are_the_same_api(llm):
    # edgespec.apps.completions takes a bare Engine (the engine itself knows no front end)
    from edgespec.apps import completions
    out = completions.create_chat_completion(llm.engine, CHAT, temperature=0, max_tokens=2)
    assert out["model"] == llm.engine.target_name
    assert out["choices"][0]["message"]["content"] == llm.create_chat_completion(
        CHAT, temperature=0, max_tokens=2)["choices"][0]["message"]["content"]
    with pytest.raises(EdgespecError):
        completions.create_completion(llm.engine, ["not", "text"])
    assert not hasattr(llm.engine, "create_chat_completion")
