"""The planner on synthetic devices and models: every branch (tiny RAM, big RAM, GPU with
little or much memory, a draft that cannot pay, one that does), the memory arithmetic, the
speed model, and the refusal that names the smallest change that fits."""
from __future__ import annotations

import json

import pytest

from edgespec.runtime import device as devmod
from edgespec import planner
from edgespec.calibration.curve import Calibration
from edgespec.config import EngineConfig
from edgespec.runtime.kernel import KernelConfig
from edgespec.runtime.device import parse_size
from edgespec.errors import InvalidInputError
from edgespec.planner import Acceptance, BudgetError

from fakes.planner import FAST_GPU, GiB, MiB, QWEN_05, QWEN_15, cpu, facts, gpu


# --- the branches ---------------------------------------------------------------------------
def test_big_ram_cpu_prefers_a_free_proposer_over_the_draft():
    p = planner.plan(QWEN_15, QWEN_05, device=cpu())
    assert p.proposer in ("suffix", "ngram")
    assert p.draft is None and p.n_gpu_layers == 0 and p.draft_gpu_layers == 0
    # the engine's kernel configuration (Q8_0 KV, flash attention, repacked weights), not F16
    assert (p.n_ctx, p.kv_type, p.n_batch) == (4096, "q8_0", 512)
    assert p.kernel == KernelConfig() and p.config.kernel == p.kernel
    by = {c.proposer: c for c in p.candidates}
    assert by["draft"].fits and by["draft"].speedup < 1.0 < p.predicted_speedup
    why = "\n".join(p.reasons)
    assert "not draft" in why and "would need" in why and "acceptance to match" in why
    assert 1 <= p.draft_range[0] <= p.draft_range[1] <= planner.K_MAX


def test_gpu_with_much_memory_offloads_everything_and_picks_the_draft():
    p = planner.plan(QWEN_15, QWEN_05, device=gpu(7 * GiB, speed=FAST_GPU))
    assert p.proposer == "draft" and p.draft == QWEN_05.path
    assert p.n_gpu_layers == QWEN_15.n_layers + 1
    assert p.draft_gpu_layers == QWEN_05.n_layers + 1
    assert p.predicted_speedup > 1.3
    # everything but the input embeddings (and runtime, tokenizer, logits) has left host memory
    assert p.memory.host < 600 * MiB and p.memory.device > 1.5 * GiB
    assert any("not suffix" in r for r in p.reasons)


def test_gpu_with_little_memory_offloads_part_of_the_target_and_no_draft():
    p = planner.plan(QWEN_15, QWEN_05, device=gpu(1 * GiB))
    assert 0 < p.n_gpu_layers < QWEN_15.n_layers + 1
    assert p.draft_gpu_layers == 0 and p.proposer != "draft"
    assert p.memory.device <= p.budget_device
    assert any("does not fit in its memory" in r for r in p.reasons)


def test_gpu_too_small_for_even_one_layer_runs_on_the_cpu():
    p = planner.plan(QWEN_15, None, device=gpu(300 * MiB))
    assert p.n_gpu_layers == 0 and p.memory.device == 0


def test_tiny_ram_refuses_with_the_smallest_change():
    with pytest.raises(BudgetError) as err:
        planner.plan(QWEN_15, QWEN_05, device=cpu(ram_available=900 * MiB))
    msg = str(err.value)
    assert "does not fit" in msg and "raise --budget to at least" in msg
    need = parse_size(msg.split("raise --budget to at least ")[1].split(" (")[0].replace(" ", ""))
    assert need > QWEN_15.weight_bytes
    # and that budget does fit (within the rounding of the printed size)
    planner.plan(QWEN_15, device=cpu(), budget=int(need * 1.01))


def test_explicit_context_too_big_suggests_a_smaller_one():
    with pytest.raises(BudgetError, match=r"lower --ctx to \d+"):
        planner.plan(QWEN_15, device=cpu(), budget=int(1.4 * GiB), ctx=32768)


def test_tight_budget_shrinks_context_before_refusing():
    full = planner.estimate_memory(QWEN_15, n_ctx=4096, verify_rows=planner.K_MAX + 1)
    p = planner.plan(QWEN_15, device=cpu(), budget=full.host - 40 * MiB)
    assert p.memory.host <= p.budget_host
    assert (p.n_ctx, p.kv_type) != (4096, "f16") or p.n_batch < 512
    assert any("reduced" in r or "batch" in r or "KV cache: q" in r for r in p.reasons)


def test_explicit_context_quantizes_the_kv_cache_when_f16_does_not_fit():
    f16 = planner.estimate_memory(QWEN_15, n_ctx=32768, kv_type="f16", n_batch=128)
    q8 = planner.estimate_memory(QWEN_15, n_ctx=32768, kv_type="q8_0", n_batch=128)
    p = planner.plan(QWEN_15, device=cpu(), budget=(f16.host + q8.host) // 2, ctx=32768)
    assert p.n_ctx == 32768 and p.kv_type == "q8_0" and p.kv_ggml_type == 8
    assert any("KV cache: q8_0" in r for r in p.reasons)


def test_draft_that_does_not_fit_is_reported_not_chosen():
    alone = planner.estimate_memory(QWEN_15, n_ctx=4096)
    p = planner.plan(QWEN_15, QWEN_05, device=cpu(), budget=alone.host + 50 * MiB,
                     calibrations={})
    by = {c.proposer: c for c in p.candidates}
    assert not by["draft"].fits and "does not fit" in by["draft"].note
    assert p.proposer != "draft"


def test_incompatible_draft_vocabulary():
    other = facts("smol", layers=30, embd=576, vocab=49152)
    p = planner.plan(QWEN_15, other, device=cpu())
    by = {c.proposer: c for c in p.candidates}
    assert not by["draft"].fits and "vocabulary differs" in by["draft"].note


def test_context_beyond_training_is_an_input_error():
    with pytest.raises(InvalidInputError, match="trained for"):
        planner.plan(QWEN_15, device=cpu(), ctx=65536)


def test_measured_acceptance_can_make_the_draft_win_on_a_cpu(monkeypatch):
    def fake(kind, target_name, draft_name=None):
        return {"draft": Acceptance(0.95, 1.0, "qualification (3 slices)")}.get(
            kind, planner.DEFAULT_ACCEPTANCE[kind])

    monkeypatch.setattr(planner.search, "acceptance_for", fake)
    p = planner.plan(QWEN_15, QWEN_05, device=cpu())
    assert p.proposer == "draft"
    assert any("qualification (3 slices)" in r for r in p.reasons)


def test_registry_qualification_records_are_read(monkeypatch):
    from edgespec import registry

    records = {"summarization": {"acceptance": 0.9, "coverage": 0.6},
               "writing": {"acceptance": 0.4, "coverage": 0.2},
               "coding": {"acceptance": 0.7, "coverage": 0.5}}
    monkeypatch.setattr(registry, "qualification", lambda target, proposer: records)
    acc = planner.acceptance_for("suffix", "qwen-1.5b")
    assert (acc.alpha, acc.coverage) == (0.7, 0.5) and acc.source.startswith("qualification")
    monkeypatch.setattr(registry, "qualification", lambda t, p: {})
    assert planner.acceptance_for("suffix", "qwen-1.5b") == planner.DEFAULT_ACCEPTANCE["suffix"]


def test_measured_calibration_is_preferred_to_the_prior():
    flat = Calibration.from_costs({1: 1.0, 2: 1.01, 4: 1.03, 8: 1.06, 16: 1.12}, step_seconds=0.05,
                                  source="measured")
    draft = Calibration.from_costs({1: 1.0}, step_seconds=0.005, source="measured")
    p = planner.plan(QWEN_15, QWEN_05, device=cpu(synthetic=False),
                     calibrations={"target": flat, "draft": draft})
    assert p.proposer == "draft"
    assert "calibration measured" in p.speed.source
    assert p.speed.draft_ratio == pytest.approx(0.1)
    assert p.predicted_tokens_per_second == pytest.approx(p.predicted_speedup / 0.05)


# --- memory arithmetic ------------------------------------------------------------------------
def test_kv_cache_bytes():
    host, dev = planner.kv_bytes(QWEN_15, 4096, "f16")
    assert (host, dev) == (4096 * 28 * 2 * (128 + 128) * 2, 0)
    q8, _ = planner.kv_bytes(QWEN_15, 4096, "q8_0")
    q4, _ = planner.kv_bytes(QWEN_15, 4096, "q4_0")
    assert q8 == host * 34 // 64 and q4 == host * 18 // 64
    # llama.cpp pads the context to 256 cells
    assert planner.kv_bytes(QWEN_15, 4000, "f16") == (host, 0)


def test_kv_cache_of_sliding_window_layers():
    swa = tuple(il % 6 < 5 for il in range(18))
    g = facts("gemma", layers=18, embd=640, kv=1, hd=256, window=512, swa=swa)
    full, _ = planner.kv_bytes(g, 8192, "f16")
    assert full == 8192 * 18 * 512 * 2  # swa_full (llama.cpp's default): every layer full size
    windowed, _ = planner.kv_bytes(g, 8192, "f16", n_batch=512, swa_full=False)
    assert windowed == (3 * 8192 + 15 * 1024) * 512 * 2


def test_offload_moves_the_last_layers_and_the_output():
    n = QWEN_15.n_layers
    assert planner.weight_bytes(QWEN_15, 0) == (QWEN_15.weight_bytes, 0)
    host, dev = planner.weight_bytes(QWEN_15, 1)  # the output layer only
    assert dev == QWEN_15.output_bytes and host + dev == QWEN_15.weight_bytes
    host, dev = planner.weight_bytes(QWEN_15, n + 1)
    assert host == QWEN_15.token_embd_bytes + QWEN_15.other_bytes
    kh, kd = planner.kv_bytes(QWEN_15, 4096, "f16", n_gpu_layers=8)  # 7 blocks + output
    assert kd == 7 * kh // 21
    # tied embeddings: the GPU gets its own copy for the output layer
    tied = facts("tied", out_bytes=0)
    host, dev = planner.weight_bytes(tied, n + 1)
    assert dev == n * tied.layer_bytes[0] + tied.token_embd_bytes
    assert host == tied.token_embd_bytes + tied.other_bytes


def test_compute_buffer_host_is_touched_pages_device_is_allocation():
    host, dev = planner.compute_bytes(QWEN_15, 512, 17, 0)
    assert dev == 0
    assert host == 512 * 14 * (8960 + 1536) + 3 * MiB
    host, dev = planner.compute_bytes(QWEN_15, 512, 17, QWEN_15.n_layers + 1)
    assert dev == 512 * (4 * 151936 + 8 * 1536) and host == 3 * MiB


def test_estimate_lists_every_component():
    est = planner.estimate_memory(QWEN_15, n_ctx=4096, draft=QWEN_05)
    names = [i.name for i in est.items]
    for part in ("runtime", "target weights", "target KV cache", "target compute", "target logits",
                 "draft weights", "draft KV cache", "suffix cache", "n-gram index"):
        assert part in names
    assert est.host == sum(i.host for i in est.items)
    assert est.host_at_load < est.host
    assert "total" in est.table()


# --- speed model ---------------------------------------------------------------------------------
def test_expected_tokens():
    assert planner.expected_tokens(0.0, 4) == 1.0
    assert planner.expected_tokens(1.0, 4) == 5.0
    assert planner.expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_speedups():
    flat = lambda n: 1.0  # noqa: E731
    acc = Acceptance(0.5, 1.0)
    assert planner.predicted_speedup("none", 4, acc, flat) == 1.0
    assert planner.predicted_speedup("draft", 2, acc, flat, draft_ratio=0.0) == pytest.approx(1.75)
    assert planner.predicted_speedup("draft", 2, acc, flat, draft_ratio=0.5) == pytest.approx(0.875)
    # a free proposer that never drafts is exactly plain decoding
    assert planner.predicted_speedup("ngram", 4, Acceptance(0.9, 0.0), lambda n: n) == 1.0


def test_best_k_and_break_even():
    cost = Calibration.prior_cpu().cost
    k, s, (lo, hi) = planner.best_k("suffix", planner.DEFAULT_ACCEPTANCE["suffix"], cost)
    assert lo <= k <= hi and s > 1.0
    need = planner.break_even_alpha(1.02, cost, 0.5)
    assert need is not None and 0.8 < need < 1.0
    # a draft as expensive as the target can never win
    assert planner.break_even_alpha(1.0, cost, 1.0) is None


# --- devices and budgets ---------------------------------------------------------------------------
def test_default_budget_keeps_a_margin():
    host, vram = planner.default_budgets(gpu(8 * GiB, ram_available=10 * GiB))
    assert host == 10 * GiB - 32 * GiB // 20
    assert vram == 8 * GiB - (9 * GiB) // 20
    assert planner.default_budgets(cpu(), "4GiB") == (4 * GiB, 0)


@pytest.mark.parametrize("text,expected", [("4GiB", 4 * GiB), ("512 MiB", 512 * MiB), ("1.5G", 1_500_000_000),
                                           ("100", 100), (2048, 2048), ("2gib", 2 * GiB)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["four", "4XB", "-1", "", True])
def test_parse_size_rejects(text):
    with pytest.raises(InvalidInputError):
        parse_size(text)


def test_device_from_json(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps({"name": "box", "cpu": {"cores": 8, "flags": ["avx2"]},
                                "ram_total": "32GiB", "ram_available": "24GiB",
                                "gpus": [{"name": "RTX", "free": "7.5GiB", "total": "8GiB"}],
                                "speed": FAST_GPU}))
    d = devmod.from_json(path)
    assert (d.name, d.cores, d.isa, d.ram_available) == ("box", 8, ("avx2",), 24 * GiB)
    assert d.gpu.free_bytes == int(7.5 * GiB) and d.gpu.kind == "gpu" and d.synthetic
    assert d.speed["draft_step_ratio"] == 0.15


@pytest.mark.parametrize("bad", ["[1, 2]", "{not json", '{"gpus": [{"name": "x"}]}',
                                 '{"gpus": [{"free": "1GiB", "type": "tpu"}]}', '{"ram_total": "lots"}'])
def test_device_from_json_rejects(bad):
    with pytest.raises(InvalidInputError):
        devmod.from_json(bad)


def test_probe_this_machine():
    d = devmod.probe()
    assert d.cores >= 1 and 0 < d.ram_available <= d.ram_total and not d.synthetic
    assert all(a.kind in ("gpu", "igpu", "accel") for a in d.accelerators)


def test_plain_decoding_wins_when_verifying_costs_as_much_as_decoding():
    steep = {"verify_costs": {str(n): float(n) for n in range(2, 17)}}
    p = planner.plan(QWEN_15, QWEN_05, device=cpu(speed=steep))
    assert p.proposer == "none" and p.draft is None and p.predicted_speedup == 1.0
    # a request that names a free proposer itself still gets a usable draft length
    assert p.draft_range[0] >= 1
    assert all(c.speedup <= 1.0 for c in p.candidates if c.fits)


def test_at_load_leaves_out_what_only_use_fills():
    est = planner.estimate_memory(QWEN_15, n_ctx=4096)
    grows = sum(i.host for i in est.items
                if i.name in ("target compute", "target logits", "suffix cache", "n-gram index"))
    assert est.host - est.host_at_load == grows


def _cal(step, costs, spread=0.0):
    """A calibration with five repeats per batch size, spread by ±spread around each median."""
    samples = {n: tuple(step * c * (1 + spread * d) for d in (-1, -0.5, 0, 0.5, 1))
               for n, c in costs.items()}
    return Calibration(step_seconds=step, points=tuple(costs.items()), source="measured",
                       samples=samples)


def test_noisy_calibration_is_ignored_for_the_prior():
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
    noisy = _cal(0.086, flat, spread=0.5)
    p = planner.plan(QWEN_15, QWEN_05, device=cpu(synthetic=False),
                     calibrations={"target": noisy, "draft": _cal(0.009, {1: 1.0}, spread=0.5)})
    assert p.proposer != "draft"  # the flat noisy curve would have made the draft win
    assert "ignored the cached calibration" in p.speed.source and "prior" in p.speed.source
    ok, why = planner.calibration_trust(_cal(0.086, flat, spread=0.01), 0.086)
    assert ok and why == ""


def test_calibration_timed_on_a_busy_machine_is_refused():
    from dataclasses import replace
    costs = {1: 1.0, 2: 1.5, 4: 1.9}
    quiet = _cal(0.086, costs)
    assert planner.calibration_trust(quiet, 0.086) == (True, "")
    assert planner.calibration_trust(replace(quiet, busy=0.1), 0.086)[0]
    ok, why = planner.calibration_trust(replace(quiet, busy=0.8), 0.086)
    assert not ok and "busy" in why and "--recalibrate" in why


def test_calibration_far_from_the_size_estimate():
    costs = {1: 1.0, 2: 1.5, 4: 1.9}
    assert planner.calibration_trust(_cal(2.0, costs), 0.086)[0] is False      # 23x: refused
    ok, why = planner.calibration_trust(_cal(0.5, costs), 0.086)                # 5.8x: remarked
    assert ok and "size suggests" in why


# --- the kernel configuration that runs: repacked copies, mmap, KV type (issue 11) ------------
from dataclasses import replace as _replace  # noqa: E402

from edgespec.runtime.gguf_header import TensorInfo  # noqa: E402
from edgespec.planner import repack  # noqa: E402

F32, Q4_0, Q4_K, Q6_K = 0, 2, 12, 14


def _tensor_facts(tied=False, embd_type=Q6_K, rows=1536):
    """A two-block model with a real tensor list, laid out as llama.cpp writes files:
    token_embd first, then the blocks, then output_norm and output."""
    sizes = {F32: (1, 4), Q4_0: (32, 18), Q4_K: (256, 144), Q6_K: (256, 210)}
    specs = [("token_embd.weight", (1536, 1000), embd_type)]
    for il in range(2):
        specs += [(f"blk.{il}.attn_norm.weight", (1536,), F32),
                  (f"blk.{il}.attn_q.weight", (1536, rows), Q4_K),
                  (f"blk.{il}.ffn_down.weight", (1536, 1536), Q6_K)]
    specs.append(("output_norm.weight", (1536,), F32))
    if not tied:
        specs.append(("output.weight", (1536, 1000), Q6_K))
    tensors, off = [], 0
    for name, shape, t in specs:
        block, size = sizes[t]
        n = 1
        for d in shape:
            n *= d
        nb = n // block * size
        tensors.append(TensorInfo(name, shape, t, off, nb))
        off += -(-nb // 32) * 32
    base = facts("tensors", layers=2, layer_bytes=sum(x.nbytes for x in tensors if x.name.startswith("blk.0")),
                 embd_bytes=tensors[0].nbytes, out_bytes=0 if tied else tensors[-1].nbytes)
    return _replace(base, tensors=tuple(tensors), data_offset=4096,
                    bytes_by_type={"Q4_K": 1, "Q6_K": 1}), {t.name: t for t in tensors}


def test_repack_rules_follow_llama_cpp():
    assert repack.repacks("Q4_K", 1536, ("avx2",)) and not repack.repacks("Q4_K", 1540, ("avx2",))
    assert not repack.repacks("Q6_K", 1536, ("avx2", "avx512f"))       # no x86 Q6_K kernel
    assert repack.repacks("Q6_K", 1536, ("asimd", "asimddp"))          # ARM has one
    assert repack.repacks("Q2_K", 1536, ("avx2", "avx512f")) and not repack.repacks("Q2_K", 1536, ("avx2",))
    assert not repack.repacks("Q4_K", 1536, ())                        # no ISA flags: no kernel


def test_repacked_matrices_are_resident_twice_with_mmap_once_without():
    f, t = _tensor_facts()
    q4k = t["blk.0.attn_q.weight"].nbytes + t["blk.1.attn_q.weight"].nbytes
    mapped, anon, copies = repack.split_weights(f, ("avx2",), repack=True, use_mmap=True,
                                                gpu_start=f.n_layers + 1)
    # the mapping spans token_embd .. output: the repacked matrices' pages stay inside it
    assert copies == q4k and anon == 0
    assert mapped == t["output.weight"].offset + t["output.weight"].nbytes
    assert mapped == pytest.approx(f.weight_bytes, rel=0.001)
    mapped, anon, copies = repack.split_weights(f, ("avx2",), repack=True, use_mmap=False,
                                                gpu_start=f.n_layers + 1)
    assert (mapped, copies) == (0, q4k) and anon + copies == f.weight_bytes
    mapped, anon, copies = repack.split_weights(f, ("avx2",), repack=False, use_mmap=True,
                                                gpu_start=f.n_layers + 1)
    assert copies == 0 and mapped == pytest.approx(f.weight_bytes, rel=0.001)


def test_tied_output_gets_its_own_repacked_copy():
    f, t = _tensor_facts(tied=True, embd_type=Q4_0)
    _, _, copies = repack.split_weights(f, ("avx2",), True, True, f.n_layers + 1)
    q4k = t["blk.0.attn_q.weight"].nbytes * 2
    assert copies == q4k + t["token_embd.weight"].nbytes


def test_memory_estimate_describes_the_engine_configuration():
    """Defect: the estimate described plain mapped weights (1.2 GiB for Qwen 1.5B) while the
    engine runs repacked ones, whose copy sits beside the mapped pages (1.79 GiB measured)."""
    f, t = _tensor_facts()
    q4k = t["blk.0.attn_q.weight"].nbytes * 2
    engine = planner.estimate_memory(f, n_ctx=4096, isa=("avx2",))
    items = {i.name: i for i in engine.items}
    assert items["target repacked"].host == q4k
    assert items["target KV cache"].note.startswith("q8_0")          # the engine's KV type
    plain = planner.estimate_memory(f, n_ctx=4096, isa=("avx2",), kernel=KernelConfig(repack=False))
    assert engine.host - plain.host == q4k and "target repacked" not in {i.name for i in plain.items}
    ram = planner.estimate_memory(f, n_ctx=4096, isa=("avx2",), kernel=KernelConfig(use_mmap=False))
    assert ram.host == plain.host  # read into RAM: each matrix once, repacked or not
    nofa = planner.estimate_memory(f, n_ctx=4096, isa=("avx2",), kernel=KernelConfig(flash_attn=False))
    assert nofa.host > engine.host  # the KQ scores of a batch against the whole context


def test_plan_reads_weights_into_ram_when_the_repacked_copy_does_not_fit():
    dev = cpu()
    mapped = planner.estimate_memory(QWEN_15, n_ctx=4096, isa=dev.isa)
    ram = planner.estimate_memory(QWEN_15, n_ctx=4096, isa=dev.isa, kernel=KernelConfig(use_mmap=False))
    assert mapped.host - ram.host > 500 * MiB   # Q4_K matrices: the repacked copy
    p = planner.plan(QWEN_15, device=dev, budget=(mapped.host + ram.host) // 2, proposer="none")
    assert p.kernel.repack and not p.kernel.use_mmap and p.n_ctx == 4096
    assert p.config.kernel == p.kernel
    assert any("read into RAM instead of mapped" in r for r in p.reasons)
    roomy = planner.plan(QWEN_15, device=dev, budget=mapped.host + 100 * MiB, proposer="none")
    assert roomy.kernel == KernelConfig()


def test_plan_config_is_the_engine_config_with_auto_resolved():
    base = EngineConfig(target="qwen-1.5b", draft="qwen-0.5b", threads=2)
    p = planner.plan(QWEN_15, QWEN_05, device=cpu(), base=base, draft_name="qwen-0.5b")
    c = p.config.validate()
    assert c.proposer != "auto" and set(c.proposer.split("+")) >= {p.proposer}
    assert c.draft is None  # the free proposers won: no draft model to load
    assert (c.n_ctx, c.kernel, c.n_gpu_layers, c.threads) == (p.n_ctx, p.kernel, 0, 2)
    g = planner.plan(QWEN_15, QWEN_05, device=gpu(7 * GiB, speed=FAST_GPU), base=base,
                     draft_name="qwen-0.5b")
    assert g.config.proposer.endswith("draft") and g.config.draft == "qwen-0.5b"
    assert (g.config.n_gpu_layers, g.config.draft_gpu_layers) == (29, 25)
    fixed = planner.plan(QWEN_15, device=cpu(), proposer="ngram")
    assert fixed.proposer == "ngram" and fixed.config.proposer == "ngram"


def test_exact_mode_caps_drafts_and_never_quantizes_the_kv_cache_further():
    p = planner.plan(QWEN_15, device=cpu(), exact=True, exact_cap=2)
    assert p.draft_range[1] <= 2 and p.config.exact and p.kv_type == "q8_0"
    q8 = planner.estimate_memory(QWEN_15, n_ctx=32768, kernel=KernelConfig(use_mmap=False), isa=("avx2",))
    q4 = planner.estimate_memory(QWEN_15, n_ctx=32768, kv_type="q4_0", isa=("avx2",),
                                 kernel=KernelConfig(use_mmap=False))
    budget = (q8.host + q4.host) // 2
    assert planner.plan(QWEN_15, device=cpu(), ctx=32768, budget=budget).kv_type == "q4_0"
    with pytest.raises(BudgetError, match="q8_0 KV cache"):
        planner.plan(QWEN_15, device=cpu(), ctx=32768, budget=budget, exact=True, exact_cap=2)


def test_arm64_without_cpuinfo_gets_neon_dotprod(monkeypatch):
    """macOS has no /proc/cpuinfo: without flags no repacked copy would be counted."""
    monkeypatch.setattr(devmod, "_cpuinfo", lambda: ("Apple M2", set()))
    monkeypatch.setattr(devmod.platform, "machine", lambda: "arm64")
    d = devmod.probe(with_accelerators=False)
    assert {"asimd", "asimddp"} <= set(d.isa) and repack.repacks("Q4_0", 4096, d.isa)


def test_a_jittery_quiet_calibration_keeps_its_shape_but_noise_and_load_do_not():
    from dataclasses import replace
    steep = {1: 1.0, 2: 1.7, 4: 2.9, 8: 6.6, 16: 8.0}
    jittery = _cal(0.040, steep, spread=0.22)  # MAD 11%: a VM's jitter, measured quietly
    assert not planner.calibration_trust(jittery, 0.086)[0]
    assert planner.usable_shape(jittery, 0.086)
    assert not planner.usable_shape(_cal(0.040, steep, spread=0.8), 0.086)  # MAD 40%: noise
    assert not planner.usable_shape(replace(jittery, busy=0.5), 0.086)  # timed under load
    assert not planner.usable_shape(_cal(2.0, steep, spread=0.22), 0.086)  # 23x the size's step
    assert not planner.usable_shape(Calibration.prior_cpu(), 0.086)  # nothing measured


def test_self_speculation_counts_the_derived_model_without_loading_it_as_a_draft():
    from edgespec.planner.self_draft import self_draft_facts
    half = self_draft_facts(QWEN_15, range(0, 28, 2))
    assert half.n_layers == 14 and len(half.layer_bytes) == 14
    assert half.weight_bytes == (sum(QWEN_15.layer_bytes) // 2 + QWEN_15.token_embd_bytes
                                 + QWEN_15.output_bytes + QWEN_15.other_bytes)
    plain = planner.plan(QWEN_15, device=cpu(), proposer="none")
    selfp = planner.plan(QWEN_15, half, device=cpu(), proposer="self")
    assert selfp.proposer == "self"
    names = [i.name for i in selfp.memory.items]
    assert "draft weights" in names and "draft KV cache" in names
    grown = selfp.memory.host - plain.memory.host
    assert grown >= half.weight_bytes * 0.9  # its own file and context, not the target's
    assert selfp.draft is None and selfp.config.draft is None  # built from the target
    # a budget that holds the target alone does not hold both
    assert planner.plan(QWEN_15, device=cpu(), proposer="none", budget="1900MiB").proposer == "none"
    with pytest.raises(BudgetError):
        planner.plan(QWEN_15, half, device=cpu(), proposer="self", budget="1900MiB")


def test_a_self_draft_file_is_laid_out_back_to_back():
    from edgespec.planner.self_draft import self_draft_facts
    tensors = tuple(TensorInfo(f"blk.{i}.ffn.weight", (64, 64), 12, i * 1000, 1000)
                    for i in range(4)) + (TensorInfo("output.weight", (64, 64), 12, 4000, 1000),)
    f = _replace(QWEN_15, tensors=tensors, n_layers=4, layer_bytes=(1000,) * 4,
                 n_head_kv_per_layer=(2,) * 4, swa_layers=(False,) * 4)
    d = self_draft_facts(f, [0, 3])
    assert [t.name for t in d.tensors] == ["blk.0.ffn.weight", "blk.3.ffn.weight", "output.weight"]
    assert [t.offset for t in d.tensors] == [0, 1024, 2048]  # 32-byte aligned, no holes
