"""The proposers an engine's requests may name: those the builder loaded, plus any added
later (another instance of a kind with other options, a self-draft being measured).

    names = ProposerSet(loaded, options, resources, on_change=forget_identity)
    names.check("ngram+suffix")          # every name loaded, or InvalidInputError
    names.clone("suffix", "cfg/suffix", {"factor": 2.0})

``on_change`` runs whenever the set changes (the engine's release identity names its
proposers, so it is computed again); ``resources`` closes what :meth:`add` was given when
the engine closes.
"""
from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Callable, Mapping

from .. import proposers as registry_of_proposers
from ..api.labels import AUTO, PLAIN
from ..config import split_proposers
from ..errors import InvalidInputError
from ..proposers import BuildContext, Proposer

Options = dict[str, Any]


class ProposerSet:
    """Loaded proposers by name, and the options each kind was built with."""

    def __init__(self, loaded: Mapping[str, Proposer], options: Mapping[str, Mapping[str, Any]],
                 resources: ExitStack, on_change: Callable[[], None] = lambda: None) -> None:
        #: name -> proposer; the engine hands this same dict to callers as ``engine.proposers``
        self.loaded: dict[str, Proposer] = dict(loaded)
        #: kind -> the options the engine built it with (a clone starts from them)
        self.options: dict[str, Options] = {k: dict(v) for k, v in options.items()}
        self._resources = resources
        self._on_change = on_change

    def label(self) -> str:
        """Every loaded proposer joined by ``+`` (the plain path when there are none)."""
        return "+".join(self.loaded) or PLAIN

    def check(self, label: str) -> None:
        """Refuse a request label naming a proposer that is not loaded."""
        missing = [n for n in split_proposers(label) if n not in self.loaded]
        if missing:
            raise InvalidInputError(f"proposer {missing[0]!r} is not loaded in this engine "
                                    f"(loaded: {', '.join([PLAIN, *self.loaded])})")

    def add(self, name: str, proposer: Proposer) -> None:
        """Make another proposer available under ``name``; closed with the engine."""
        if name in (PLAIN, AUTO) or "+" in name or not name or name in self.loaded:
            raise InvalidInputError(f"a proposer named {name!r} is already loaded or reserved")
        self.loaded[name] = proposer
        self._resources.callback(proposer.close)
        self._on_change()

    def remove(self, name: str, keep: str) -> None:
        """Close and drop proposer ``name`` now; ``keep`` (the engine's default) stays."""
        if name not in self.loaded or name == keep:
            raise InvalidInputError(f"proposer {name!r} is not an added proposer of this engine")
        self.loaded.pop(name).close()  # closing again when the engine closes is harmless
        self._on_change()

    def clone(self, name: str, as_name: str, overrides: Mapping[str, Any]) -> str:
        """A fresh instance of loaded proposer ``name`` (the options its kind was built with,
        ``overrides`` on top) under ``as_name``: what it learns stays its own."""
        if name not in self.loaded:
            raise InvalidInputError(f"proposer {name!r} is not loaded in this engine")
        kind = str(getattr(self.loaded[name], "name", name))
        spec = registry_of_proposers.spec(kind)
        if spec.costly:
            raise InvalidInputError(f"the {kind} proposer holds a model and cannot be cloned")
        options = {**self.options.get(kind, {}), **overrides}
        self.add(as_name, spec.build(BuildContext(), options))
        return as_name


__all__ = ["ProposerSet"]
