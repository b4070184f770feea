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


def test_fit_row_cuts_ids_the_target_lacks_and_bans_ids_the_draft_lacks():
    import numpy as np
    from edgespec.proposers.draft import fit_row
    row = np.arange(6, dtype=np.float32)
    assert fit_row(row, 6) is row
    np.testing.assert_array_equal(fit_row(row, 4), [0, 1, 2, 3])
    wide = fit_row(row, 8)
    np.testing.assert_array_equal(wide[:6], row)
    assert wide.dtype == row.dtype and np.all(np.isneginf(wide[6:]))
    assert int(np.argmax(fit_row(row[::-1].copy(), 4))) == 0


def test_check_compatible_names_both_files_and_the_token():
    from pathlib import Path
    import pytest
    from edgespec.errors import IncompatibleDraftError
    from edgespec.proposers.draft import check_compatible
    t, d = _vocab(1064), _vocab(1000, {700: "x"})
    t.path, d.path = Path("/m/target.gguf"), Path("/m/draft.gguf")
    with pytest.raises(IncompatibleDraftError, match=r"draft\.gguf .*target\.gguf.*token 700"):
        check_compatible(t, d)
    check_compatible(_named(_vocab(1064), "t"), _named(_vocab(1000), "d"))  # padded: accepted


def _named(v, name):
    from pathlib import Path
    v.path = Path(f"/m/{name}.gguf")
    return v
