"""The bench's llama-cpp-python prompt-lookup anchor on a real model (smollm2-135m): what it
holds while it generates. llama-cpp-python keeps every evaluated row's logits in
``Llama.scores``; the anchor folds those rows into one (fold_scores), which must leave its
tokens unchanged and its resident memory without the prompt's rows."""
from __future__ import annotations

import os

from edgespec.lab.bench.anchors.llama_api import anchor_prompt_lookup
from edgespec.runtime import backend

TARGET = "smollm2-135m"
THREADS = int(os.environ.get("EDGESPEC_TEST_THREADS", "2"))
N_CTX = 2048


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def _prompt(llm) -> list[int]:
    text = "\n".join(f"def f{i}(x):\n    return x * {i} + {i * 7}" for i in range(120))
    toks = llm.tokenize(("Repeat this code:\n" + text).encode(), add_bos=True)
    return toks[:1500]


def _generate(anchor, prompt):
    """(tokens, RssAnon growth while generating)."""
    before = _rss_anon()
    trace = anchor.generate(prompt, max_tokens=24)
    return trace.tokens, _rss_anon() - before


def test_folded_scores_keep_the_tokens_and_drop_the_prompt_rows(model_path):
    path = model_path(TARGET)
    # folded first: memory a freed model leaves to malloc must not make it look smaller
    folded = anchor_prompt_lookup(path, n_ctx=N_CTX, threads=THREADS)
    try:
        prompt = _prompt(folded._llm)
        assert len(prompt) >= 1200
        vocab = folded._llm.n_vocab()
        tokens_folded, grew_folded = _generate(folded, prompt)
    finally:
        folded.close()

    # llama-cpp-python as its users hold it: every row of scores its own memory
    LlamaPromptLookupDecoding = backend.prompt_lookup_decoding()
    from edgespec.lab.bench.anchors.llama_api import PromptLookupAnchor
    lookup = LlamaPromptLookupDecoding(max_ngram_size=2, num_pred_tokens=10)
    llm = backend.high_level_llama(path, N_CTX, THREADS, draft_model=lookup, logits_all=True,
                                   use_mmap=False)
    whole = PromptLookupAnchor(llm, lookup, [])
    try:
        tokens_whole, grew_whole = _generate(whole, prompt)
    finally:
        whole.close()

    assert tokens_folded == tokens_whole and len(tokens_folded) > 0
    rows = len(prompt) * vocab * 4
    # the unfolded anchor pinned (about) every prompt row; the folded one did not
    assert grew_whole - grew_folded >= 0.8 * rows, (grew_whole, grew_folded, rows)


def test_an_anchor_on_the_engines_loaded_model_gives_its_own_copys_tokens(model_path):
    from edgespec.lab.bench.anchors.llama_api import shares_weights
    from edgespec.runtime.model import load_model

    path = model_path(TARGET)
    model = load_model(path, n_gpu_layers=0, use_extra_bufts=True, use_mmap=False)
    try:
        assert shares_weights(model)
        before = _rss_anon()
        shared = anchor_prompt_lookup(path, n_ctx=N_CTX, threads=THREADS, loaded=model)
        added_shared = _rss_anon() - before
        try:
            assert shared.shared_weights
            prompt = _prompt(shared._llm)[:600]
            tokens_shared, _ = _generate(shared, prompt)
        finally:
            shared.close()
        # closing the anchor left the model to its owner: it still makes a working context
        ctx = model.new_context(n_ctx=256, n_batch=64, n_threads=THREADS)
        ctx.close()
    finally:
        model.close()

    # loaded after the shared one is gone: its copy of the weights is new memory
    before = _rss_anon()
    own = anchor_prompt_lookup(path, n_ctx=N_CTX, threads=THREADS)
    added_own = _rss_anon() - before
    try:
        assert not own.shared_weights
        tokens_own, _ = _generate(own, prompt)
    finally:
        own.close()
    assert tokens_shared == tokens_own and len(tokens_own) > 0
    # the shared anchor added its context only, not a second copy of the weights
    assert added_own - added_shared >= 0.8 * model.size_bytes, (added_own, added_shared)
