#!/bin/sh
# Builds edgespec._native with AddressSanitizer + UndefinedBehaviorSanitizer into
# a scratch copy of the package and runs tests/native against it. The in-place
# build is left alone (other processes may be using it).
#   native/run_sanitized.sh [pytest args...]
# Env: PYTHON (default .venv/bin/python), CC (default gcc), SAN_DIR (scratch dir).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
CC=${CC:-gcc}
OUT=${SAN_DIR:-$ROOT/native/build/sanitize}
rm -rf "$OUT"
mkdir -p "$OUT/tests"
cd "$ROOT"
EDGESPEC_SANITIZE=1 CC="$CC" "$PY" setup.py -q build_ext --build-lib "$OUT" --build-temp "$OUT/tmp" >/dev/null
# the Python sources next to the sanitized extension (no stale in-place .so)
tar cf - --exclude='__pycache__' --exclude='*.so' edgespec | tar xf - -C "$OUT"
cp -r tests/native "$OUT/tests/"
find "$OUT/tests" -name __pycache__ -prune -exec rm -rf {} +
# python is not built with ASan: its runtime must be loaded first
case "$CC" in
  *clang*) ASAN_LIB=$("$CC" -print-file-name=libclang_rt.asan-$(uname -m).so) ;;
  *) ASAN_LIB=$("$CC" -print-file-name=libasan.so) ;;
esac
cd "$OUT"
export LD_PRELOAD="$ASAN_LIB"
# CPython's own allocations look like leaks at exit; the fuzz target checks ours
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# a config of its own, so pytest does not root itself (and its pythonpath) in the repo
printf '[pytest]\n' > pytest.ini
printf 'import edgespec._native as n\nassert n.__file__.startswith("%s"), n.__file__\n' \
  "$OUT" > tests/conftest.py
# --capture=sys: a sanitizer report written to fd 2 must reach the terminal
exec "$PY" -m pytest -q -p no:cacheprovider --capture=sys tests/native "$@"
