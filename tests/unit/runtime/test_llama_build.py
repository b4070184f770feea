"""edgespec.runtime.llama_build: the build's CMake flags and features against the machine."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from edgespec.runtime.llama_build import Build, Host, cmake_args, diagnose, parse_system_info

EPYC = {"avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512vbmi", "avx512_vnni",
        "avx512_bf16", "sse3"}  # AMD: AVX512-VNNI but no AVX-VNNI
CPU_LINE = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
            "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | OPENMP = 1 | "
            "REPACK = 1 |")


def _build(info=CPU_LINE, rpc=True, devices=("CPU",)):
    return Build("0.3.36", info, rpc=rpc, gpu_offload=False, devices=devices)


def test_cmake_args_follow_the_cpu_and_never_enable_amx():
    args = cmake_args(EPYC | {"amx_int8", "amx_tile"}).split()
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AMX_INT8=OFF" in args
    assert "-DGGML_AVX512_VNNI=ON" in args and "-DGGML_AVX_VNNI=OFF" in args
    assert not [a for a in args if a.startswith("-DGGML_AMX") and a.endswith("=ON")]
    assert cmake_args(set()) == "" and cmake_args(None) == ""


def test_the_script_prints_the_flags_for_this_cpu():
    script = Path(__file__).parents[3] / "edgespec" / "runtime" / "llama_build.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True)
    flags = Host.local().cpu_flags
    assert out.stdout.strip() == cmake_args(set(flags))


def test_system_info_sections_parse():
    info = parse_system_info("CUDA : ARCHS = 890 | USE_GRAPHS = 1 | " + CPU_LINE)
    assert info["CUDA"] == {"ARCHS": "890", "USE_GRAPHS": "1"}
    assert info["CPU"]["AVX512"] == "1" and "AVX_VNNI" not in info["CPU"]


def test_a_matching_build_needs_nothing():
    d = diagnose(_build(), Host("EPYC", frozenset(EPYC)))
    assert d.worst == "ok" and d.rebuild is None
    assert any(f.topic == "cpu" and f.level == "ok" for f in d.findings)


def test_an_extension_the_cpu_lacks_is_an_error_with_the_rebuild_command():
    d = diagnose(_build(CPU_LINE.replace("BMI2 = 1", "BMI2 = 1 | AVX_VNNI = 1")),
                 Host("EPYC", frozenset(EPYC)))
    assert d.worst == "error"
    assert any("AVX_VNNI" in f.detail and "illegal instruction" in f.detail for f in d.findings)
    assert "-DGGML_AVX_VNNI=OFF" in d.rebuild and "-DGGML_RPC=ON" in d.rebuild
    assert d.rebuild.endswith("--no-binary llama-cpp-python llama-cpp-python==0.3.36")


def test_an_extension_the_build_skips_is_a_warning():
    d = diagnose(_build(CPU_LINE.replace("AVX512 = 1 | ", "")), Host("EPYC", frozenset(EPYC)))
    assert d.worst == "warn" and "-DGGML_AVX512=ON" in d.rebuild
    assert any("has AVX512 but the build does not use it" in f.detail for f in d.findings)


def test_amx_a_missing_gpu_backend_and_no_rpc_are_each_reported():
    d = diagnose(_build(CPU_LINE + " AMX_INT8 = 1 |", rpc=False),
                 Host("Xeon", frozenset(EPYC), accelerators=("CUDA",)))
    topics = {f.topic: f for f in d.findings}
    assert topics["amx"].level == "error"  # the CPU does not even report AMX
    assert "built without it" in topics["accelerator"].detail
    assert "--rpc" in topics["rpc"].detail
    assert "-DGGML_CUDA=ON" in d.rebuild


def test_doctor_on_this_machine_and_on_a_cpu_the_build_does_not_fit(monkeypatch):
    from edgespec.cli import cli
    r = CliRunner().invoke(cli, ["doctor", "--json"])
    assert r.exit_code in (0, 1), r.output
    assert '"system_info": "CPU :' in r.output
    # the same build on a CPU without AVX: it would crash there
    monkeypatch.setattr(Host, "local", staticmethod(lambda: Host("old", frozenset({"sse3"}))))
    r = CliRunner().invoke(cli, ["doctor"])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.output and "illegal instruction" in r.output
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF' in r.output and "-DGGML_AVX=OFF" in r.output
