"""What an engine is built from: one validated object for the CLI, the API and the planner.

    cfg = EngineConfig(target="qwen-1.5b", proposer="auto").validate()
    plan = planner.plan_engine(cfg)          # fills what "auto" leaves open, with reasons
    engine = Engine.from_config(plan.config) # loads exactly what the plan shows

``edgespec plan`` and ``edgespec generate`` build the same object from the same flags,
so the plan a user is shown is the plan that runs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

from .. import proposers
from ..api.labels import AUTO, PLAIN
from ..errors import ensure
from ..runtime import hugepages
from ..runtime.kernel import KV_GGML_TYPE, KV_TYPES, KernelConfig
from ..runtime.rpc import parse_endpoints

if TYPE_CHECKING:
    from ..control.settings import ControlSettings

# PLAIN, AUTO (edgespec.api.labels) and the kernel names (edgespec.runtime.kernel) are
# re-exported for callers that know them as configuration; the modules import them from home
__all__ = ["AUTO", "EngineConfig", "KV_GGML_TYPE", "KV_TYPES", "KernelConfig", "PLAIN"]


def split_proposers(label: str) -> tuple[str, ...]:
    """``"ngram+suffix"`` -> ("ngram", "suffix"); ``"none"`` -> ()."""
    if label == PLAIN:
        return ()
    return tuple(p for p in label.split("+") if p)



@dataclass(frozen=True)
class EngineConfig:
    """Everything :meth:`edgespec.engine.Engine.from_config` needs, validated up front.

    ``proposer`` is the default for requests: ``"auto"`` (the planner decides), ``"none"``
    (the plain path) or a name from :mod:`edgespec.proposers`. ``draft`` names a draft
    model when a model-based proposer is wanted. ``exact`` adds the bitwise promise
    (greedy output equals the plain path's) on top of the lossless default.
    """

    target: str
    draft: str | None = None
    proposer: str = AUTO
    proposer_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # None: the mode's own. Exact mode runs KernelConfig() (batch invariant, docs/parity.md);
    # the default runs the fastest candidate measured on this device (planner.kernels)
    kernel: KernelConfig | None = None
    exact: bool = False
    n_ctx: int | None = None  # per sequence: with parallel > 1 the context holds parallel * n_ctx
    parallel: int = 1  # sequences that decode together in one pass (edgespec serve --parallel)
    # scratch KV sequences for draft trees (edgespec.loop.treepass): a tree's branches are
    # verified in one pass where the cost curve says a tree pays; 0 = linear drafts only
    tree_width: int = 0
    threads: int | None = None
    n_gpu_layers: int = 0
    draft_gpu_layers: int = 0
    # llama.cpp RPC servers (host:port) that hold the target's last n_gpu_layers layers
    # (0: as many as their memory takes), split by tensor_split shares (one per remote
    # device; None: by free memory); edgespec.runtime.rpc, docs/rpc.md
    rpc: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] | None = None
    adaptive: bool = True  # --adaptive/--no-adaptive
    max_draft: int | None = None  # --max-draft: fixed length, or with adaptive control the cap
    control: ControlSettings | None = None  # the full control settings; win over the two above
    budget: str | int | None = None
    pull: bool = True
    # RAM for earlier conversations' KV states, reused when a conversation comes back
    # (edgespec.decoding.kvcache.StateCache; None: its default, 0: keep only what the KV cache holds)
    kv_cache_ram: int | None = None
    # a chat template (Jinja text, --chat-template FILE) replacing the target GGUF's own
    chat_template: str | None = None
    # False reads the weights into RAM (llama.cpp's --no-mmap) whatever kernel is picked: a
    # mapped load that repacks keeps both the file's pages and the repacked copy resident
    # (edgespec.planner.repack); True maps the file; None decides (loaded_as)
    use_mmap: bool | None = None

    def validate(self) -> "EngineConfig":
        ensure(bool(self.target), "a target model is required (a registry name or a .gguf path)")
        ensure(self.chat_template is None or (isinstance(self.chat_template, str)
                                              and bool(self.chat_template.strip())),
               "chat_template must be the non-empty text of a Jinja chat template")
        proposers.check_label(self.proposer)
        for name, opts in self.proposer_options.items():
            proposers.spec(name).check_options(opts)
        if any(proposers.needs_model(n) for n in self.proposer.split("+")):
            ensure(self.draft is not None,
                   f"--proposer {self.proposer} needs --draft NAME|PATH (for draft: a model "
                   "that shares the target's vocabulary; for bridge: a pinned bridge pair; see "
                   "`edgespec models list`)")
        ensure(self.max_draft is None or self.max_draft >= 1,
               f"--max-draft must be >= 1 (got {self.max_draft})")
        ensure(self.n_ctx is None or self.n_ctx >= 16,
               f"--ctx must be at least 16 tokens (got {self.n_ctx})")
        ensure(1 <= self.parallel <= 64,
               f"--parallel must be between 1 and 64 sequences (got {self.parallel})")
        ensure(0 <= self.tree_width <= 32,
               f"--tree-width must be between 0 and 32 branches (got {self.tree_width})")
        ensure(not (self.tree_width and self.exact and self.parallel > 1),
               "draft trees share KV cells between sequences, which an exact engine with "
               "--parallel > 1 keeps apart (docs/parity.md); drop --tree-width, --exact or "
               "--parallel")
        ensure(self.threads is None or self.threads >= 1,
               f"--threads must be >= 1 (got {self.threads})")
        # more threads than cores only oversubscribe them; llama.cpp's OpenMP pool hung at
        # 1,000-20,000 and crashed at 100,000 (issue #43)
        ensure(self.threads is None or self.threads <= (os.cpu_count() or 1),
               f"--threads must be at most this machine's {os.cpu_count() or 1} CPU cores "
               f"(got {self.threads})")
        ensure(self.kv_cache_ram is None or self.kv_cache_ram >= 0,
               f"the KV state cache's RAM must be >= 0 bytes (got {self.kv_cache_ram})")
        ensure(self.n_gpu_layers >= -1 and self.draft_gpu_layers >= -1,
               "GPU layer counts must be >= 0 (or -1 for all)")
        if self.rpc:
            parse_endpoints(self.rpc)
        if self.tensor_split is not None:
            ensure(bool(self.rpc), "--tensor-split shares layers between RPC servers: give --rpc too")
            ensure(all(x >= 0 for x in self.tensor_split) and sum(self.tensor_split) > 0,
                   f"--tensor-split shares must be >= 0 and not all 0 (got {self.tensor_split})")
        if self.kernel is not None:
            self.kernel.validate()
        if self.control is not None:
            self.control.validate()
        return self

    def layout(self) -> KernelConfig:
        """The kernel configuration as far as it is known before a model is measured: the
        weight layout (repack, mmap) a load needs, with the mode's KV type and attention."""
        return self.loaded_as(self.kernel if self.kernel is not None else KernelConfig())

    def loaded_as(self, kernel: KernelConfig) -> KernelConfig:
        """``kernel`` with the weight loading this configuration asks for (``use_mmap``).

        Unasked, a load that repacks on this machine's CPU alone reads the weights into RAM
        where they can go on transparent huge pages: every weight then sits on 2 MiB pages,
        and decode runs 4-6% faster than from the mapped file, whose pages stay small
        (docs/benchmarks.md), in less memory (no file pages beside the repacked copies).
        The price is a slower load and pages no other process shares."""
        if self.use_mmap is not None:
            return replace(kernel, use_mmap=self.use_mmap)
        if (kernel.use_mmap and kernel.repack and not self.n_gpu_layers and not self.rpc
                and hugepages.available()):
            return replace(kernel, use_mmap=False)
        return kernel

    def with_(self, **changes: Any) -> "EngineConfig":
        return replace(self, **changes)
