"""tools/verify_curve.py: its perf-report parsing and kernel grouping on a recorded report (a
4-token pass of Qwen2.5-Coder 1.5B Q4_K_M, repacked, 1 thread) and the curve arithmetic
(the per-tensor type list it hands llama-quantize is the product's:
tests/unit/registry/test_optimize.py). Nothing here loads a model or runs perf."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "verify_curve.py"

# perf report --stdio --sort dso,symbol, trimmed (perf 6.1 appends IPC columns)
REPORT = """\
# To display the perf.data header info, please use --header/--header-only options.
#
# Samples: 4K of event 'cpu-clock'
# Event count (approx.): 2302500000
#
# Overhead  Shared Object                            Symbol                                  IPC   [IPC Coverage]
# ........  .......................................  ......................................  ....................
#
    60.09%  libggml-cpu.so.0                         [.] ggml_gemm_q4_K_8x8_q8_K             -      -            
    34.40%  libggml-cpu.so.0                         [.] ggml_vec_dot_q6_K_q8_K              -      -            
     1.00%  libggml-cpu.so.0                         [.] ggml_compute_forward_flash_attn_ext -      -            
     0.63%  libggml-base.so.0                        [.] dequantize_row_q8_0                 -      -            
     0.48%  libggml-cpu.so.0                         [.] ggml_compute_forward_mul_mat        -      -            
     0.48%  libggml-cpu.so.0                         [.] ggml_vec_dot_q8_0_q8_0              -      -            
     0.28%  libggml-base.so.0                        [.] quantize_row_q8_K_ref               -      -            
     0.17%  libc.so.6                                [.] __memmove_avx_unaligned             -      -            
     0.17%  libggml-cpu.so.0                         [.] ggml_quantize_mat_q8_K_4x8          -      -            
     0.17%  libggml-cpu.so.0                         [.] ggml_vec_swiglu_f32                 -      -            
     0.07%  [kernel.kallsyms]                        [k] __get_user_8                        -      -            
     0.04%  libggml-cpu.so.0                         [.] ggml_threadpool_chunk_add           -      -            
     0.04%  libggml-cpu.so.0                         [.] 0x00000000000a28a8                  -      -            
     0.02%  libggml-cpu.so.0                         [.] ggml_gemv_q4_K_8x8_q8_K             -      -            

#
# (Tip: For a higher level overview, try: perf report --sort comm,dso)
#
"""


def _module():
    spec = importlib.util.spec_from_file_location("verify_curve", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while building the class
    spec.loader.exec_module(mod)
    return mod


vc = _module()


def test_parse_report_reads_every_row_and_no_comment():
    rows = vc.parse_report(REPORT)
    assert len(rows) == 14
    assert rows[0] == vc.Sample("ggml_gemm_q4_K_8x8_q8_K", 60.09, False, "libggml-cpu.so.0")
    assert rows[10].kernel_space and rows[10].symbol == "__get_user_8"
    assert rows[12].symbol == "0x00000000000a28a8"  # the IPC columns are not the symbol
    assert sum(r.percent for r in rows) == pytest.approx(98.04)


def test_parse_report_without_a_dso_column():
    rows = vc.parse_report("    66.21%  [.] ggml_vec_dot_q4_1_q8_1               -      -   \n"
                           "     4.32%  [k] clear_page_erms\n")
    assert [(r.symbol, r.percent, r.kernel_space, r.dso) for r in rows] == [
        ("ggml_vec_dot_q4_1_q8_1", 66.21, False, ""), ("clear_page_erms", 4.32, True, "")]


def test_kernels_group_by_tensor_type_and_path():
    cats = vc.by_category(vc.parse_report(REPORT))
    assert list(cats)[:2] == ["Q4_K repacked gemm (4-row tiles)", "Q6_K vec_dot (not repacked)"]
    assert cats["Q4_K repacked gemm (4-row tiles)"] == pytest.approx(60.09)
    assert cats["Q4_K repacked gemv (1 row)"] == pytest.approx(0.02)
    assert cats["attention"] == pytest.approx(1.00 + 0.63)  # flash attention + its Q8_0 KV
    assert cats["quantize activations"] == pytest.approx(0.28 + 0.17)
    assert cats["Q8_0 vec_dot (not repacked)"] == pytest.approx(0.48)
    assert cats["sync / spin"] == pytest.approx(0.04)
    assert cats[vc.KERNEL] == pytest.approx(0.07)
    assert cats["ggml-cpu, unnamed (static)"] == pytest.approx(0.04)
    assert vc.categorize("tinyBLAS_Q0_AVX<block_q8_0, block_q8_0, float>::gemm4xN<2>") == \
        "llamafile tinyBLAS (Q8_0/Q4_0 gemm)"
    assert vc.categorize("PyEval_EvalFrameDefault", dso="libpython3.11.so") == "Python"
    assert vc.categorize("something_else") == vc.OTHER


def test_curve_rows_are_cpu_time_over_the_one_token_pass():
    rows = vc.curve_rows({"cpu": {4: 0.3, 1: 0.1, 16: 0.55}})
    assert [(n, round(ms, 6), round(s, 6)) for n, ms, s in rows] == [
        (1, 100.0, 1.0), (4, 300.0, 3.0), (16, 550.0, 5.5)]


def test_bare_addresses_are_named_by_the_exported_functions_around_them():
    table = {"libggml-cpu.so.0": [(0x53820, "ggml_cpu_extra_work_size"),
                                  (0x746c0, "ggml_tiled_wdata_size"),
                                  (0xe4310, "std::__introsort_loop<_Iter_comp_iter<cmp_argsort>>"),
                                  (0xfa7d0, "llamafile_sgemm")]}
    rows = vc.name_unresolved(vc.parse_report(
        "  13.91%  libggml-cpu.so.0  [.] 0x0000000000055ffb\n"
        "   3.14%  libggml-cpu.so.0  [.] 0x00000000000e5a65\n"
        "   0.01%  libggml-cpu.so.0  [.] 0x0000000000001000\n"
        "   0.01%  libggml-cpu.so.0  [.] 0x00000000000fb000\n"
        "   5.00%  libc.so.6  [.] 0x0000000000076962\n"), table)
    assert [r.symbol for r in rows] == [
        "0x0000000000055ffb (before ggml_tiled_wdata_size; after ggml_cpu_extra_work_size)",
        "0x00000000000e5a65 (before llamafile_sgemm; "
        "after std::__introsort_loop<_Iter_comp_iter<cmp_argsort>>)",
        "0x0000000000001000 (before ggml_cpu_extra_work_size)",
        "0x00000000000fb000 (after llamafile_sgemm)",
        "0x0000000000076962"]  # another library: no table, left bare
    cats = [vc.categorize(r.symbol, r.kernel_space, r.dso) for r in rows]
    assert cats == ["tiled K-quant matmul (not repacked, n >= 8)",
                    "llamafile tinyBLAS (Q8_0/Q4_0 gemm)",  # not "sync": comp_iter is no omp_
                    "ggml-cpu, unnamed (static)", "llamafile tinyBLAS (Q8_0/Q4_0 gemm)",
                    vc.OTHER]


def test_bad_arguments_say_what_is_wrong_before_any_model_loads():
    with pytest.raises(SystemExit, match="different files"):
        vc.main(["pair", "a.gguf", "a.gguf"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        vc.parse_env(["GGML_CPU_TILED_MM"])
    assert vc.parse_env(["GGML_CPU_TILED_MM=0", "A=b=c"]) == {"GGML_CPU_TILED_MM": "0", "A": "b=c"}
