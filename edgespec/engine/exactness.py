"""Exact mode's policy: how many drafts a verify pass may hold and stay bitwise the plain
path's, and what that bound does to a request's control settings."""
from __future__ import annotations

from dataclasses import replace

from ..calibration import cache as calibration_cache
from ..control import ControlSettings
from ..errors import UnsupportedError
from ..runtime.kernel import KernelConfig
from ..runtime.model import Model
from ..config import EngineConfig


def max_drafts(target: Model, config: EngineConfig, n_threads: int) -> int:
    """Most drafts a verify pass may hold in exact mode: the probed bitwise-invariant
    batch size of this device and kernel configuration, minus the pending token."""
    if not config.layout().exact_capable:
        return 0  # an F16 KV cache or no flash attention: never bitwise at length
    return int(calibration_cache.exact_cap(target, config.layout(), n_threads))


def bound(control: ControlSettings, cap: int, k: KernelConfig,
          speculates: bool) -> ControlSettings:
    """Exact mode bounds the adaptive controller's drafts to ``cap`` and refuses what it
    cannot verify bitwise (a longer fixed draft; any draft where no batch is invariant).
    ``k`` is the engine's kernel layout; ``speculates``: the request has proposers."""
    if cap == 0 and speculates and not k.exact_capable:
        raise UnsupportedError(
            f"this engine runs the default mode's kernel configuration (KV {k.kv_type}, flash "
            f"attention {'on' if k.flash_attn else 'off'}), whose verify passes are not bitwise "
            "single-token decoding: exact requests need an engine built for them (--exact, "
            "Engine.load(..., exact=True)), or --proposer none")
    if cap == 0 and speculates:
        raise UnsupportedError(
            "exact mode cannot speculate here: no verify batch on this device gives logits "
            "bitwise equal to single-token decoding (edgespec plan shows the probe); use "
            "--proposer none, or drop --exact (the default is lossless)")
    if speculates and not control.adaptive and control.max_draft > cap:
        raise UnsupportedError(
            f"a fixed draft length of {control.max_draft} cannot be verified exactly: on "
            f"this device llama.cpp's logits match the plain path only for verify passes of "
            f"up to {cap} drafts; use --max-draft {cap} or less, adaptive control, or drop "
            "--exact (the default is lossless; greedy output may then differ at near-ties)")
    if cap == 0:
        return control
    return replace(control, max_draft=min(control.max_draft, cap),
                   min_draft=min(control.min_draft, cap))
