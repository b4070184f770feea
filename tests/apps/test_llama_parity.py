"""What apps call on ``llama_cpp.Llama`` besides completions, on edgespec's ``Llama``:
embeddings, the tokenizer, metadata, state save/load/reset, the prompt cache, the seed
chain, ``logits_processor`` (plain path) and ``from_pretrained`` (SmolLM2-135M)."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.errors import ContextOverflowError, InvalidInputError, UnsupportedError

MODEL = "smollm2-135m"
FOX = "The quick brown fox jumps over the lazy dog. The quick brown fox"
#: long enough that a greedy request reuses a prefix over either KV cache the default may run
#: (it recomputes at least the context's min_pass rows: 64 over F16, runtime.kernel.min_pass)
FOX_LONG = " ".join([FOX + " jumps over the lazy dog."] * 8)
PICK = "Pick a number from 1 to 10?:\n"
NUMBERS = 'root ::= "1" | "2" | "3" | "4" | "5" | "6" | "7" | "8" | "9" | "10"'


class Records:
    def __init__(self) -> None:
        self.records = []

    def emit(self, stats) -> None:
        self.records.append(stats)


@pytest.fixture(scope="module")
def llm(model_path):
    from edgespec.apps import Llama
    with Llama(model_path=str(model_path(MODEL)), n_ctx=256, n_threads=2, seed=1337,
               verbose=False, proposer="ngram+suffix", embedding=True) as llm:
        yield llm


def test_embed_shapes_and_consistency(llm):
    one = llm.embed("Hello World")
    assert isinstance(one, list) and len(one) == llm.n_embd() == 576
    both = llm.embed(["Hello World", "A different prompt"])
    np.testing.assert_allclose(both[0], one, rtol=1e-4, atol=1e-4)  # batched == alone
    assert not np.allclose(both[0], both[1])
    unit, n = llm.embed("Hello World", normalize=True, return_count=True)
    assert abs(np.linalg.norm(unit) - 1.0) < 1e-5 and n == len(llm.tokenize(b"Hello World"))
    out = llm.create_embedding(["Hello", "World"], model="m")
    assert out["object"] == "list" and out["model"] == "m"
    assert [d["index"] for d in out["data"]] == [0, 1]
    assert out["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    with pytest.raises(InvalidInputError):
        llm.embed([""])
    with pytest.raises(ContextOverflowError):
        llm.embed("word " * 400, truncate=False)  # past the 256-token context
    assert len(llm.embed("word " * 400)) == 576  # truncated to it


def test_embedding_leaves_generation_alone(llm):
    before = llm.create_completion(FOX, max_tokens=6, temperature=0)["choices"][0]["text"]
    llm.embed(["something else entirely", FOX])
    assert llm.create_completion(FOX, max_tokens=6, temperature=0)["choices"][0]["text"] == before


def test_tokenizer_metadata_and_sizes(llm):
    tok = llm.tokenizer()
    ids = tok.encode("Hello world", add_bos=False)
    assert ids == llm.tokenize(b"Hello world", add_bos=False, special=True)
    assert tok.decode(ids) == "Hello world"
    assert llm.metadata["general.architecture"] == "llama"
    assert llm.metadata["tokenizer.ggml.eos_token_id"] == str(llm.token_eos())
    assert llm.n_ctx() == 256 and llm.n_vocab() == 49152
    assert llm.tokenize(b"\n", add_bos=False) == [llm.token_nl()]


def test_seed_chain_and_state(llm):
    kw = dict(max_tokens=4, top_k=50, top_p=0.9, temperature=1.0, grammar=NUMBERS)
    llm.set_seed(1337)
    state = llm.save_state()
    firsts = [llm.create_completion(PICK, **kw)["choices"][0]["text"] for _ in range(4)]
    assert len(set(firsts)) > 1  # each request draws the next seed of the chain
    llm.load_state(state)
    assert llm.create_completion(PICK, **kw)["choices"][0]["text"] == firsts[0]
    llm.set_seed(1337)
    assert llm.create_completion(PICK, **kw)["choices"][0]["text"] == firsts[0]


def test_saved_state_is_reused(llm):
    records = Records()
    llm.engine.sinks.append(records)
    try:
        llm.reset()
        greedy = llm.create_completion(FOX_LONG, max_tokens=6, temperature=0)["choices"][0]["text"]
        saved = llm.save_state()
        assert saved.n_tokens > 0 and saved.llama_state_size == len(saved.llama_state)
        llm.create_completion("Something unrelated", max_tokens=2, temperature=0)
        llm.load_state(saved)
        again = llm.create_completion(FOX_LONG, max_tokens=6, temperature=0)["choices"][0]["text"]
        assert again == greedy
        assert records.records[-1].prompt_reused > 0  # prefilled only what the state lacked
        llm.reset()
        llm.create_completion(FOX_LONG, max_tokens=6, temperature=0)
        assert records.records[-1].prompt_reused == 0
    finally:
        llm.engine.sinks.remove(records)
    with pytest.raises(InvalidInputError):
        llm.load_state("not a state")


def test_prompt_cache_loads_a_state_once(llm):
    class Cache(dict):  # llama-cpp-python's caches: longest-prefix lookup by token tuple
        def __getitem__(self, key):
            best = max(self, key=lambda k: _prefix(k, key), default=None)
            if best is None or _prefix(best, key) == 0:
                raise KeyError(key)
            return dict.__getitem__(self, best)

        def __setitem__(self, key, value):
            dict.__setitem__(self, tuple(key), value)

    cache = Cache()
    tokens = llm.tokenize(FOX.encode())
    llm.set_cache(cache)
    try:
        first = llm.create_completion(tokens, max_tokens=1, temperature=0)
        assert len(cache) == 1
        llm.reset()
        loads = []
        original = llm.load_state
        llm.load_state = lambda s: (loads.append(s), original(s))[1]
        second = llm.create_completion(tokens, max_tokens=1, temperature=0)
        assert len(loads) == 1
        assert second["choices"][0]["text"] == first["choices"][0]["text"]
        assert first["usage"]["prompt_tokens"] == len(tokens)
    finally:
        llm.set_cache(None)
        del llm.load_state


def _prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_logits_processor_runs_on_the_plain_path(llm):
    target = llm.tokenize(b" rot", add_bos=False)[0]
    seen = []

    def force(input_ids, scores):
        seen.append(len(input_ids))
        scores[target] += 1000.0
        return scores

    records = Records()
    llm.engine.sinks.append(records)
    try:
        out = llm.create_completion(FOX, max_tokens=3, temperature=0, logits_processor=[force])
    finally:
        llm.engine.sinks.remove(records)
    assert out["choices"][0]["text"] == llm.detokenize([target] * 3).decode()
    assert seen == [seen[0], seen[0] + 1, seen[0] + 2]  # once per token, the ids growing
    stats = records.records[-1]
    assert stats.proposer == "none" and stats.drafted == 0
    with pytest.raises(InvalidInputError, match="logits_processor"):
        llm.create_completion(FOX, max_tokens=1, logits_processor=3)


def test_token_id_prompts(llm):
    ids = llm.tokenize(FOX.encode())
    by_ids = llm.create_completion(ids, max_tokens=6, temperature=0)
    by_text = llm.create_completion(FOX, max_tokens=6, temperature=0)
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    assert by_ids["usage"] == by_text["usage"]


def test_keyword_refusals(model_path):
    from edgespec.apps import Llama
    with pytest.raises(UnsupportedError, match="pooling_type"):
        Llama(model_path=str(model_path(MODEL)), pooling_type=4, verbose=False)
    with pytest.raises(UnsupportedError, match="Hugging Face cache"):
        Llama.from_pretrained("owner/repo", "x.gguf", local_dir="/tmp")


def test_from_pretrained_pulls_through_the_hub(monkeypatch, model_path):
    from edgespec.apps import Llama, llama_compat
    from edgespec.registry import hub

    asked = []
    monkeypatch.setattr(hub, "resolve", lambda ref: asked.append(ref) or model_path(MODEL))
    monkeypatch.setattr(llama_compat, "_hub_file", lambda repo, name: "sub/m-Q8_0.gguf")
    with Llama.from_pretrained("owner/repo-GGUF", "*q8_0.gguf", n_ctx=64, verbose=False,
                               proposer="none") as llm:
        assert llm.n_ctx() == 64
    assert asked == ["hf://owner/repo-GGUF/sub/m-Q8_0.gguf"]
