"""Cross-tokenizer pairs as release artifacts: a bridged draft runs only for a pair that
models.toml pins to this bridge's version and to both vocabularies' digests.

Your own models (and shipped ones you pair differently) are pinned in your registry
($EDGESPEC_HOME/models.toml, edgespec.registry.user): ``edgespec models pin-bridge TARGET
DRAFT`` writes the same [[pairs]] entry there (:func:`pin_user`). The check is the same
for both registries: a pin matches by the vocabulary digests, whatever the models are
called, and a re-converted file whose tokenizer changed is refused until pinned again.

A vocabulary digest (:func:`edgespec.registry.digests.vocabulary_digest`) covers every token's text
and attributes, so a re-converted GGUF whose tokenizer changed in any token is refused
until the pair is qualified again (the bridge's tests pass on it) and the pin updated:

    python -m edgespec.registry.bridge_pins qwen-1.5b smollm2-135m    # prints the [[pairs]] entry
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import digests
from ..errors import IncompatibleDraftError, InvalidInputError
from ..proposers.vocab_bridge import BRIDGE_VERSION
from .pull import resolve
from .spec import PairSpec, load_registry


class UnqualifiedBridgeError(IncompatibleDraftError, InvalidInputError):
    """No pin in models.toml covers this target/draft tokenizer pair at this bridge version.

    Also an InvalidInputError, so an engine that loads a draft model for another proposer
    skips the bridge quietly instead of failing (the engine raises it only when asked for).
    """


def vocab_digest(model) -> str:
    """The digest a pin holds (cached by the model file's sha256)."""
    return digests.vocabulary_digest(model, digests.model_identity(model.path)["sha256"])


def check_pair(target, draft, version: str) -> PairSpec:
    """The models.toml pair that qualifies ``draft`` bridging for ``target`` (loaded models),
    or :class:`UnqualifiedBridgeError` saying what differs and how to requalify."""
    tdig, ddig = vocab_digest(target), vocab_digest(draft)
    pairs = [p for p in load_registry().pairs if p.proposer == "bridge"]
    same = [p for p in pairs if (p.target_vocab_sha256, p.draft_vocab_sha256) == (tdig, ddig)]
    for p in same:
        if p.bridge_version == version:
            return p
    tn, dn = _name(target.path), _name(draft.path)
    how = (f"pin it in your registry with `edgespec models pin-bridge {tn} {dn}` (models "
           f"of edgespec's own registry: run the bridge's tests on the pair, "
           f"tests/unit/proposers/test_vocab_bridge.py and tests/integration/test_bridge_real.py, "
           f"then "
           f"`python -m edgespec.registry.bridge_pins {tn} {dn}` prints the [[pairs]] entry for "
           "models.toml)")
    if same:
        raise UnqualifiedBridgeError(
            f"the {tn} + {dn} bridge pair was qualified with bridge version "
            f"{same[0].bridge_version}, this edgespec's bridge is version {version}; requalify: "
            f"{how}")
    named = [p for p in pairs if (p.target, p.draft) == (tn, dn)]
    if named:
        p = named[0]
        changed = [f"{what} {name} (vocabulary pinned {pin}, found {got})"
                   for what, name, pin, got in (("target", tn, p.target_vocab_sha256, tdig),
                                                ("draft", dn, p.draft_vocab_sha256, ddig))
                   if pin != got]
        raise UnqualifiedBridgeError(
            f"the tokenizer of {' and '.join(changed)} changed since the bridge pair was "
            f"qualified; it is refused until requalified: {how}")
    raise UnqualifiedBridgeError(
        f"no bridge pair in models.toml covers target {tn} with draft {dn} (their tokenizers "
        f"are not qualified together); qualify it: {how}")


def _vocab_digests(target: str, draft: str) -> list[str]:
    from ..runtime.model import load_model  # deferred: it loads llama.cpp
    digests = []
    for name in (target, draft):
        model = load_model(resolve(name))
        try:
            digests.append(vocab_digest(model))
        finally:
            model.close()
    return digests


def pin_user(target: str, draft: str) -> tuple[dict, bool]:
    """Pin registry models ``target`` and ``draft`` (either registry) as a bridge pair in the
    user registry, at this bridge's version and their vocabularies' digests; returns (the
    pins, whether they were written: False when that pin is registered already). A pair
    pinned before at another version or vocabulary is re-pinned. ModelError when they share
    a tokenizer (proposer 'draft' pairs them) or a name is unknown."""
    # deferred: only pinning writes the user registry
    from . import user
    reg = load_registry()
    reg.get(target), reg.get(draft)
    tdig, ddig = _vocab_digests(target, draft)
    pins = {"bridge_version": BRIDGE_VERSION, "target_vocab_sha256": tdig,
            "draft_vocab_sha256": ddig}
    if any(p.proposer == "bridge" and (p.target_vocab_sha256, p.draft_vocab_sha256,
                                       p.bridge_version) == (tdig, ddig, BRIDGE_VERSION)
           for p in reg.pairs):
        return pins, False
    user.drop_pair(target, "bridge", draft)
    return pins, user.add_pair(target, "bridge", draft, **pins)


def pin_entry(target: str, draft: str, version: str | None = None) -> str:
    """The TOML [[pairs]] entry pinning registry models ``target`` and ``draft``."""
    digests = _vocab_digests(target, draft)
    return (f'[[pairs]]\ntarget = "{target}"\nproposer = "bridge"\ndraft = "{draft}"\n'
            f'bridge_version = "{version or BRIDGE_VERSION}"\n'
            f'target_vocab_sha256 = "{digests[0]}"\ndraft_vocab_sha256 = "{digests[1]}"\n')


def _name(path) -> str:
    """The registry name of a model file (pulled, ``models/<name>.gguf``, or pinned by the
    user registry), else the file name."""
    p = Path(path)
    reg = load_registry()
    for spec in reg.models.values():
        if spec.path is not None and spec.path.resolve() == p.resolve():
            return spec.name
    return p.stem if p.suffix == ".gguf" and p.stem in reg.models else p.name


if __name__ == "__main__":  # pragma: no cover - a maintainer's tool
    if len(sys.argv) != 3:
        sys.exit("usage: python -m edgespec.registry.bridge_pins TARGET DRAFT")
    print(pin_entry(sys.argv[1], sys.argv[2]), end="")
