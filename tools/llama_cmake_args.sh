#!/bin/sh
# The GGML CMake flags for this CPU: exactly the x86 extensions /proc/cpuinfo reports, and
# never AMX. A native build (-march=native) is what llama.cpp would pick, but some VMs report
# AMX and fault on it, and a fixed list of extensions faults on CPUs that lack one of them
# (AVX-VNNI is Intel-only; AMD EPYC has AVX512-VNNI but not AVX-VNNI).
# Elsewhere (macOS, Arm) this prints nothing and llama.cpp detects the CPU itself.
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
[ -n "$flags" ] || exit 0
out="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512f:AVX512 avx512vbmi:AVX512_VBMI \
            avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
  f=${pair%%:*}; g=${pair##*:}
  case " ${flags#*:} " in
    *" $f "*) out="$out -DGGML_$g=ON" ;;
    *) out="$out -DGGML_$g=OFF" ;;
  esac
done
echo "$out"
