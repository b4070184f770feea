"""The RPC split: which of the target's layers each remote device holds, and whether they fit.

llama.cpp's rule (llama-model.cpp, split mode "layer"): with ``n_gpu_layers = g`` the last
g "layers" (blocks, then the output layer counted as one more) leave this machine, and
block ``il`` goes to the first device whose cumulative share exceeds ``(il - start) / g``.
Shares default to each device's free memory. :func:`place` applies the same rule to the
GGUF header's per-block bytes, so the plan shows what each server will hold, and refuses
a split that cannot fit, before a byte is sent.

Each remote device holds its blocks' weights, their KV cells (llama.cpp keeps a layer's
KV where the layer runs) and a compute buffer; the one holding the output layer also
holds the output matrix (a copy of the embeddings when they are tied) and the logits rows.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any, Sequence

from ..runtime.kernel import KernelConfig
from ..runtime.device import fmt_size
from ..errors import EdgespecError
from ..runtime.gguf_facts import ModelFacts
from ..runtime.rpc import RemoteDevice, RemoteServer
from .memory import layer_kv_bytes, output_matrix_bytes, pad_ctx


class PlacementError(EdgespecError):
    """The RPC servers cannot hold the layers asked of them."""


def reserve(total: int) -> int:
    """Kept free on every remote device (its OS and the server's own runtime)."""
    return max(256 * 2**20, total // 20)


def assign(n_layers: int, n_gpu_layers: int, shares: Sequence[float]) -> list[int]:
    """Device index of every block 0..n_layers-1 and of the output layer (index n_layers);
    -1 stays on this machine. ``shares`` need not be normalized."""
    start = max(n_layers + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layers + 1)
    total = float(sum(shares))
    cum, acc = [], 0.0
    for s in shares:
        acc += s
        cum.append(acc / total)
    out = []
    for il in range(n_layers + 1):
        if il < start or act <= 0:
            out.append(-1)
        else:
            out.append(min(bisect.bisect_right(cum, (il - start) / act), len(shares) - 1))
    return out


@dataclass(frozen=True)
class RemoteShare:
    device: RemoteDevice
    blocks: tuple[int, ...]
    output: bool
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def budget(self) -> int:
        return max(self.device.free - reserve(self.device.total), 0)

    @property
    def fits(self) -> bool:
        return self.total <= self.budget

    def layers_text(self) -> str:
        if not self.blocks:
            return "output" if self.output else "-"
        text = (f"block {self.blocks[0]}" if len(self.blocks) == 1
                else f"blocks {self.blocks[0]}-{self.blocks[-1]}")
        return text + (" + output" if self.output else "")


@dataclass(frozen=True)
class RpcPlacement:
    servers: tuple[RemoteServer, ...]
    n_gpu_layers: int
    split: tuple[float, ...]           # the shares passed to llama.cpp (one per device)
    shares: tuple[RemoteShare, ...]

    def lines(self) -> list[str]:
        out = []
        for s in self.shares:
            out.append(f"  rpc        {s.device.label}: {s.layers_text()}, {fmt_size(s.total)} "
                       f"(weights {fmt_size(s.weights)}, KV {fmt_size(s.kv)}, compute "
                       f"{fmt_size(s.compute)}) of {fmt_size(s.budget)} usable")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"servers": [{"endpoint": s.endpoint, "protocol": ".".join(map(str, s.version))}
                            for s in self.servers],
                "n_gpu_layers": self.n_gpu_layers, "split": list(self.split),
                "devices": [{"device": s.device.label, "blocks": list(s.blocks), "output": s.output,
                             "bytes": s.total, "weights": s.weights, "kv": s.kv,
                             "compute": s.compute, "free": s.device.free, "total": s.device.total}
                            for s in self.shares]}


def _shares(facts: ModelFacts, devices: Sequence[RemoteDevice], n_gpu_layers: int,
            split: Sequence[float], n_ctx: int,
            kernel: KernelConfig) -> tuple[RemoteShare, ...]:
    where = assign(facts.n_layers, n_gpu_layers, split)
    per_pass = kernel.n_batch * 8 * facts.n_embd  # hidden states of a full batch
    out = []
    for d, dev in enumerate(devices):
        blocks = tuple(il for il in range(facts.n_layers) if where[il] == d)
        output = where[facts.n_layers] == d
        weights = sum(facts.layer_bytes[il] for il in blocks)
        if output:
            weights += output_matrix_bytes(facts)
        kv = sum(int(layer_kv_bytes(facts, il, pad_ctx(n_ctx), kernel.kv_type)) for il in blocks)
        compute = (per_pass if blocks or output else 0) + (kernel.n_batch * 4 * facts.n_vocab if output else 0)
        out.append(RemoteShare(dev, blocks, output, weights, kv, compute))
    return tuple(out)


def place(facts: ModelFacts, servers: tuple[RemoteServer, ...], *, n_ctx: int,
          kernel: KernelConfig, n_gpu_layers: int | None = None,
          split: tuple[float, ...] | None = None) -> RpcPlacement:
    """The layers the servers take: ``n_gpu_layers`` when given (refused if a device cannot
    hold its part), else as many as fit, the rest staying here. ``split`` defaults to the
    devices' usable memory (so each fills about as much as the others)."""
    devices = [d for s in servers for d in s.devices]
    if not devices:
        raise PlacementError("the RPC servers report no devices")
    if split is not None and len(split) != len(devices):
        raise PlacementError(f"--tensor-split gives {len(split)} shares, but the RPC servers have "
                             f"{len(devices)} devices ({', '.join(d.label for d in devices)})")
    shares = tuple(float(x) for x in split) if split is not None else tuple(
        float(max(d.free - reserve(d.total), 0)) for d in devices)
    if sum(shares) > 0:
        shares = tuple(round(x / sum(shares), 4) for x in shares)
    if sum(shares) <= 0:
        raise PlacementError("no RPC device has memory to spare: "
                             + ", ".join(f"{d.label} {fmt_size(d.free)} free" for d in devices))
    top = facts.n_layers + 1

    def at(g: int) -> RpcPlacement:
        return RpcPlacement(servers, g, shares, _shares(facts, devices, g, shares, n_ctx, kernel))

    if n_gpu_layers is not None and n_gpu_layers > 0:
        p = at(min(n_gpu_layers, top))
        bad = [s for s in p.shares if not s.fits]
        if bad:
            s = bad[0]
            raise PlacementError(
                f"{s.device.label} would hold {s.layers_text()} ({fmt_size(s.total)}) but has "
                f"{fmt_size(s.budget)} to spare: offload fewer layers, give it a smaller "
                "--tensor-split share, or add a server")
        return p
    for g in range(top, 0, -1):
        p = at(g)
        if all(s.fits for s in p.shares):
            return p
    raise PlacementError("not even one layer fits the RPC servers' free memory: "
                         + ", ".join(f"{d.label} {fmt_size(d.free)} free" for d in devices))
