"""The benchmark's anchors: other implementations run on the same prompts, in the same run.

    llama-completion           llama.cpp's own plain decode (the reference for our plain path)
    llama-lookup[:N]           llama.cpp's n-gram cache lookup, drafts of at most N (default 3)
    llama-speculative-simple[:N]  llama.cpp's draft-model speculation (needs the bench's --draft)
    llama-pld[:N]              llama-cpp-python's LlamaPromptLookupDecoding(num_pred_tokens=N),
                               default 10; llama-pld:0 is the same Llama drafting nothing

Every speculative anchor is compared with *its own* plain path (llama-lookup with
llama-completion, llama-pld:N with llama-pld:0), so its ratio measures its speculation and
not the speed gap between two runtimes; that gap is the plain anchors' ratio to our plain
path. The runner adds an anchor's own plain path to the matrix when it is missing.
"""
from __future__ import annotations

from dataclasses import dataclass

from ....errors import InvalidInputError

ANCHOR_KIND = "anchor"


@dataclass(frozen=True)
class AnchorSpec:
    name: str
    description: str
    tool: bool  # a llama.cpp program (built by `make anchors`), else llama-cpp-python in-process
    knob: str | None  # what NAME:N sets
    default: int | None  # the knob's value when N is not given (None: the tool's own default)
    plain: str | None  # the label of its own plain path; None: it is a plain path
    needs_draft: bool = False


ANCHORS: dict[str, AnchorSpec] = {a.name: a for a in (
    AnchorSpec("llama-completion", "llama.cpp's plain decode", True, None, None, None),
    AnchorSpec("llama-lookup", "llama.cpp's n-gram cache lookup", True, "draft_max", None,
               "llama-completion"),
    AnchorSpec("llama-speculative-simple", "llama.cpp's draft-model speculation", True,
               "draft_max", None, "llama-completion", needs_draft=True),
    AnchorSpec("llama-pld", "llama-cpp-python's LlamaPromptLookupDecoding", False,
               "num_pred_tokens", 10, "llama-pld:0"),
)}
KNOWN = ", ".join(f"{n}[:N]" if a.knob else n for n, a in ANCHORS.items())


def parse_anchor(text: str) -> tuple[str, int | None]:
    """``"llama-lookup"`` -> ("llama-lookup", None); ``"llama-pld:2"`` -> ("llama-pld", 2)."""
    name, colon, value = text.strip().partition(":")
    spec = ANCHORS.get(name)
    if spec is None:
        hint = (f" (llama-cpp-python's prompt lookup with {name} tokens is llama-pld:{name})"
                if name.isdigit() else "")
        raise InvalidInputError(f"unknown anchor {text!r}; known anchors: {KNOWN}{hint}")
    if not colon:
        return name, spec.default
    if spec.knob is None:
        raise InvalidInputError(f"anchor {name} takes no :N (it is a plain path)")
    try:
        n = int(value)
    except ValueError:
        raise InvalidInputError(f"anchor {text!r}: N must be a whole number ({spec.knob})") from None
    if n < 0 or (n == 0 and spec.name != "llama-pld"):
        raise InvalidInputError(f"anchor {text!r}: {spec.knob} must be >= 1")
    return name, n


def label(name: str, n: int | None) -> str:
    return name if n is None else f"{name}:{n}"


def own_plain(label_: str) -> str | None:
    """The label an anchor's speedup is paired with; None for a plain anchor."""
    name, n = parse_anchor(label_)
    spec = ANCHORS[name]
    if spec.plain is None or (name == "llama-pld" and n == 0):
        return None
    return spec.plain
