from types import SimpleNamespace

from edgespec.proposers.vocab_check import vocab_mismatch


def _vocab(n, texts=None, bos=1, eos=2, eog=(2,)):
    texts = texts or {}
    return SimpleNamespace(n_vocab=n, bos=bos, eos=eos, add_bos=False, eog_tokens=list(eog),
                           token_text=lambda t: texts.get(t, f"t{t}"), token_attr=lambda t: 1)


def test_padded_pair_within_128_is_accepted():
    assert vocab_mismatch(_vocab(1064), _vocab(1000)) is None
    assert vocab_mismatch(_vocab(1000), _vocab(1128)) is None


def test_size_gap_over_128_is_refused_with_sizes():
    msg = vocab_mismatch(_vocab(1129), _vocab(1000))
    assert "1000" in msg and "1129" in msg


def test_first_differing_token_is_named():
    msg = vocab_mismatch(_vocab(1064), _vocab(1000, {700: "x"}))
    assert "700" in msg and "'t700'" in msg and "'x'" in msg


def test_tokens_below_5_are_not_compared_but_bos_is():
    assert vocab_mismatch(_vocab(100), _vocab(100, {3: "other"})) is None
    assert "BOS" in vocab_mismatch(_vocab(100), _vocab(100, bos=3))
