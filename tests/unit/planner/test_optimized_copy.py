"""edgespec.planner.optimized_copy: the plan's lines about a target's Q8_0 copy (`edgespec
models optimize`): proposed where Q6_K matrices stay unrepacked, silent where this CPU
repacks them, and with a registered copy, each calibrated, the chosen configuration's
predicted speed on both (curves given as device descriptions here)."""
from __future__ import annotations

from dataclasses import replace

from edgespec import planner, registry
from edgespec.planner import optimized_copy
from edgespec.registry import optimize, user
from edgespec.runtime.gguf_header import TensorInfo
from fakes.planner import QWEN_15, cpu
from quantize_fakes import Q4_K, Q6_K, fake_quantizer, write_model

Q6 = replace(QWEN_15, tensors=(
    TensorInfo("token_embd.weight", (1536, 151936), Q6_K, 0, 191_439_360),  # read by row
    TensorInfo("output.weight", (1536, 151936), Q6_K, 0, 191_439_360),
    TensorInfo("blk.0.ffn_down.weight", (8960, 1536), Q6_K, 0, 11_289_600),
    TensorInfo("blk.0.ffn_up.weight", (1536, 8960), Q4_K, 0, 7_741_440)))
#: wall-clock curves of qwen-1.5b and its copy, 2 threads (docs/benchmarks.md): test data
ORIGINAL = {"verify_costs": {"2": 1.49, "4": 2.17, "8": 5.00, "16": 6.22}, "step_ms": 69}
COPY = {"verify_costs": {"2": 1.38, "4": 2.00, "8": 3.74, "16": 5.85}, "step_ms": 69}


def test_unrepacked_q6_k_follows_this_isa():
    names = [t.name for t in optimized_copy.unrepacked_q6_k(Q6, ("avx2",))]
    assert names == ["output.weight", "blk.0.ffn_down.weight"]
    assert optimized_copy.unrepacked_q6_k(Q6, ("asimd", "i8mm")) == []  # ARM repacks Q6_K
    assert optimized_copy.unrepacked_q6_k(QWEN_15, ("avx2",)) == []  # no tensor list


def test_without_a_copy_the_plan_proposes_the_command(world):
    chosen = planner.plan(Q6, device=cpu())
    lines = optimized_copy.notes("qwen-x", None, Q6, chosen, False, lambda c: None)
    assert len(lines) == 1
    assert lines[0].startswith("2 of the target's matrices (203 MB) are Q6_K, which has no "
                               "repacked CPU kernel here")
    assert "`edgespec models optimize qwen-x` writes a copy with them as Q8_0" in lines[0]
    arm = replace(cpu(), isa=("asimd", "i8mm"))
    assert optimized_copy.notes("qwen-x", None, Q6, planner.plan(Q6, device=arm), False,
                                lambda c: None) == ()


def test_with_a_copy_the_plan_compares_both_calibrations(world, tmp_path):
    user.add("tiny-q6", write_model(tmp_path / "tiny-q6.gguf"), progress=lambda m: None)
    optimize.optimize("tiny-q6", quantize=fake_quantizer(tmp_path), progress=lambda m: None)
    sha = registry.load_registry().get("tiny-q6").sha256
    chosen = planner.plan(Q6, device=cpu(synthetic=False, speed=ORIGINAL))
    other = planner.plan(Q6, device=cpu(synthetic=False, speed=COPY))
    asked = []
    described = planner.plan(Q6, device=cpu(speed=ORIGINAL))  # another machine's description
    assert "its gain is measured on the machine itself" in optimized_copy.notes(
        "tiny-q6", sha, Q6, described, True, lambda c: None)[0]

    def plan_copy(copy):
        asked.append(copy.name)
        return other

    (line,) = optimized_copy.notes("tiny-q6", sha, Q6, chosen, False, plan_copy)
    assert "its Q8_0 copy tiny-q6-q8 is registered: `edgespec plan --calibrate` measures " \
           "this target" in line and asked == []
    (line,) = optimized_copy.notes("tiny-q6", sha, Q6, chosen, True, lambda c: None)
    assert "`edgespec plan --target tiny-q6-q8 --calibrate` measures it" in line
    (line,) = optimized_copy.notes("tiny-q6", sha, Q6, chosen, True, plan_copy)
    assert asked == ["tiny-q6-q8"]
    here, there = chosen.predicted_tokens_per_second, other.predicted_tokens_per_second
    assert f"predicted at {there:.1f} tokens/s against {here:.1f} here ({there / here:.2f}x" \
        in line
    assert "a 4-token pass costs 2.00 steps there, 2.17 here" in line
    assert "`--target tiny-q6-q8` runs it" in line
    # a copy of another version of the source is not offered
    assert "writes a copy" in optimized_copy.notes("tiny-q6", "0" * 64, Q6, chosen, True,
                                                    plan_copy)[0]
