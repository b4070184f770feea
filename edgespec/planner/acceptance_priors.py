"""What each proposer is expected to achieve: qualification results, else conservative defaults."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelError
from .. import proposers, registry
from ..proposers import needs_model


@dataclass(frozen=True)
class Acceptance:
    """What a proposer is expected to achieve: per-token acceptance and how often it drafts."""
    alpha: float          # P(a drafted token is accepted | the ones before it were)
    coverage: float       # fraction of steps with a draft (1 for a draft model)
    source: str = "default"


#: Conservative until `edgespec qualify` measures the pair on this machine: a same-family
#: draft model accepts ~70% of tokens; model-free proposers draft on a minority of steps.
DEFAULT_ACCEPTANCE = {
    "draft": Acceptance(0.70, 1.0),
    # another tokenizer through the bridge (docs/bridge.md): a smaller, other-family model
    "bridge": Acceptance(0.40, 1.0),
    "suffix": Acceptance(0.55, 0.30),
    "ngram": Acceptance(0.50, 0.25),
    # a model's own NextN head drafts every step; its acceptance depends on how it was
    # trained, which nothing here has measured: a prior until a qualification record exists
    "mtp": Acceptance(0.60, 1.0, source="prior for an MTP head, not measured on this model; a "
                                        "qualification record replaces it"),
}
#: for a proposer registered later without a default of its own
UNKNOWN_FREE = Acceptance(0.50, 0.25)
UNKNOWN_MODEL = Acceptance(0.60, 1.0)


def default_acceptance(kind: str) -> Acceptance:
    return DEFAULT_ACCEPTANCE.get(kind) or (UNKNOWN_MODEL if needs_model(kind) else UNKNOWN_FREE)


def acceptance_for(kind: str, target_name: str | None, draft_name: str | None = None) -> Acceptance:
    """Qualification results for a registered pair (median over workload slices), else defaults.

    Reads ``acceptance`` (per drafted token) and ``coverage`` (fraction of steps
    with a draft) from each slice record. A pair the registry does not list, or a
    target that is not a registry model, gets the defaults; an unreadable results
    file too (the planner still plans; `edgespec qualify` says what is wrong with it).
    """
    default = default_acceptance(kind)
    if not target_name:
        return default
    key = f"{kind}:{draft_name}" if proposers.needs_model(kind) and draft_name else kind
    try:
        slices = registry.qualification(target_name, key)
    except ModelError:  # unregistered model or pair, unreadable results file: defaults
        return default
    alphas = [float(r["acceptance"]) for r in slices.values()
              if isinstance(r.get("acceptance"), (int, float)) and 0 <= r["acceptance"] <= 1]
    covs = [float(r["coverage"]) for r in slices.values()
            if isinstance(r.get("coverage"), (int, float)) and 0 <= r["coverage"] <= 1]
    if not alphas:
        return default
    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]
    return Acceptance(min(med(alphas), 0.99), med(covs) if covs else default.coverage,
                      source=f"qualification ({len(alphas)} slices)")
