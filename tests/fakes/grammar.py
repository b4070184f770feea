"""A grammar stand-in for the fake backend: a finite language of byte strings.

It implements what :class:`edgespec.grammar.state.GrammarState` uses of ``runtime.grammar_binding.Grammar``
(``allowed``, ``accept``, ``clone``, ``reset``, ``close``) with llama.cpp's rules: a
token is admissible when the text so far plus its piece is a prefix of a word of the
language; an end-of-generation token only when the text is a whole word; accepting a
forbidden token is an error (llama.cpp would abort).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from .backend import FakeModel


class FakeGrammar:
    def __init__(self, model: FakeModel, words: Iterable[bytes], text: bytes = b"") -> None:
        self.model = model
        self.words = frozenset(words)
        self.text = text
        self.closed = False

    def _ok(self, tok: int) -> bool:
        if self.model.is_eog(tok):
            return self.text in self.words
        t = self.text + self.model.token_piece(tok)
        return any(w.startswith(t) for w in self.words) and t != self.text

    def allowed(self, ids: np.ndarray) -> np.ndarray:
        assert not self.closed
        return np.array([self._ok(int(t)) for t in ids], dtype=bool)

    def accept(self, tok: int) -> None:
        assert not self.closed
        assert self._ok(tok), f"token {tok} accepted against the grammar after {self.text!r}"
        if not self.model.is_eog(tok):
            self.text += self.model.token_piece(tok)

    def clone(self) -> "FakeGrammar":
        return FakeGrammar(self.model, self.words, self.text)

    def reset(self) -> None:
        self.text = b""

    def close(self) -> None:
        self.closed = True


def constrain(model: FakeModel, *words: bytes) -> FakeModel:
    """Give ``model`` a ``grammar()`` whose every grammar is this language (the GBNF text the
    request carries is parsed by llama.cpp for validation, then ignored here)."""
    model.grammar = lambda gbnf, root="root": FakeGrammar(model, words)
    return model
