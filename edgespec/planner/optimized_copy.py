"""The Q8_0 copy of a target (`edgespec models optimize`) as an option of the plan.

A target whose Q6_K matrices this CPU does not repack (planner.repack) multiplies each of
their rows once per token of a verify pass; its copy with them as Q8_0 (edgespec.registry.
optimize) goes through llamafile's tinyBLAS instead, so a multi-token pass may cost fewer
plain steps. Whether it does is measured, never assumed: with no copy registered the plan
says what the command would change; with one, and a calibration of each on this machine,
it shows the chosen configuration's predicted speed on both (the same speed model, fed
each file's own measured curve).
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..registry.optimize import Q6_K, copies_of
from ..registry.spec import ModelSpec
from ..runtime.gguf_facts import ModelFacts
from ..runtime.gguf_header import TensorInfo
from .repack import repacks
from .result import Plan

#: a registered copy -> the chosen configuration planned on it, or None when the copy has
#: no calibration on this machine (or cannot be planned)
CopyPlanner = Callable[[ModelSpec], "Plan | None"]


def unrepacked_q6_k(facts: ModelFacts, isa: Sequence[str]) -> list[TensorInfo]:
    """The target's Q6_K matrices that verify passes multiply without a repacked kernel on
    this ISA (the token embeddings are read by row, not multiplied, unless tied)."""
    return [t for t in facts.tensors
            if t.ggml_type == Q6_K and len(t.shape) == 2
            and (t.name != "token_embd.weight" or facts.tied_embeddings)
            and not repacks("Q6_K", t.shape[1], isa)]


def notes(target: str, sha256: str | None, facts: ModelFacts, chosen: Plan,
          target_calibrated: bool, plan_copy: CopyPlanner) -> tuple[str, ...]:
    """The plan's "why" lines about the copy: none when the target has no Q6_K matrix that
    stays unrepacked here. ``target`` is its registry name or path, as `models optimize`
    records a copy's source."""
    q6 = unrepacked_q6_k(facts, chosen.device.isa)
    if not q6:
        return ()
    size = sum(t.nbytes for t in q6) / 1e6
    what = (f"{len(q6)} of the target's matrices ({size:.0f} MB) are Q6_K, which has no "
            "repacked CPU kernel here (each verified token multiplies them row by row)")
    copies = copies_of(target, sha256)
    if not copies:
        return (f"{what}: `edgespec models optimize {target}` writes a copy with them as Q8_0, "
                "which llama.cpp batches through llamafile's tinyBLAS, so passes of several "
                "tokens may cost fewer steps; plan it with --calibrate to see the measured gain",)
    copy = copies[0]
    if chosen.device.synthetic:
        return (f"{what}; its Q8_0 copy {copy.name} is registered: its gain is measured on "
                "the machine itself (`edgespec plan --target NAME --calibrate` there)",)
    if not target_calibrated:
        return (f"{what}; its Q8_0 copy {copy.name} is registered: `edgespec plan --calibrate` "
                "measures this target, and the plan compares the two",)
    other = plan_copy(copy)
    if other is None:
        return (f"{what}; its Q8_0 copy {copy.name} is registered but has no calibration "
                f"here: `edgespec plan --target {copy.name} --calibrate` measures it (or says "
                "why it does not fit), and the plan compares the two",)
    here, there = chosen.predicted_tokens_per_second, other.predicted_tokens_per_second
    if not here or not there:
        return ()
    return (f"{what}; on its Q8_0 copy {copy.name} the same choice ({other.config.proposer}) is "
            f"predicted at {there:.1f} tokens/s against {here:.1f} here ({there / here:.2f}x; "
            f"a 4-token pass costs {other.speed.cost(4):.2f} steps there, "
            f"{chosen.speed.cost(4):.2f} here, both measured on this machine): "
            f"`--target {copy.name}` runs it",)
