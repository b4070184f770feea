# Quick start: `make demo` (set up + a real speculative generation), `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EDGESPEC := $(VENV)/bin/edgespec
LLAMA_CPP_VERSION := 0.3.36

# This VM's CPU reports AMX but faults on it, so the default build names the ISA
# explicitly instead of -march=native. Your own CMAKE_ARGS (CUDA, Metal, Vulkan)
# win: `CMAKE_ARGS="-DGGML_CUDA=on" make install`.
DEFAULT_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
  -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON
LLAMA_CMAKE_ARGS := $(if $(CMAKE_ARGS),$(CMAKE_ARGS),$(DEFAULT_CMAKE_ARGS))
# pip caches a source build's wheel without its CMAKE_ARGS; a custom build must not reuse ours.
LLAMA_PIP_FLAGS := $(if $(CMAKE_ARGS),--no-cache-dir --force-reinstall --no-deps,)

DEMO_PROMPT ?= Here is a Python function with a bug. Fix the bug and return the whole corrected function.\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / (len(xs) - 1)\n

.PHONY: install models demo test test-fast test-slow native native-test native-sanitize fuzz-smoke bench-quick clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Rebuilt when the package metadata or the native sources change.
$(VENV)/.installed: $(VENV)/bin/activate pyproject.toml setup.py $(wildcard native/*.c native/*.h)
	@if ! $(PY) -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$(LLAMA_CPP_VERSION)')" 2>/dev/null \
	   || [ -n "$(CMAKE_ARGS)" ]; then \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) (CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)); first build takes ~5 min"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install $(LLAMA_PIP_FLAGS) llama-cpp-python==$(LLAMA_CPP_VERSION); \
	fi
	$(PIP) install -q -e ".[test,fuzz]"
	$(PY) setup.py -q build_ext --inplace
	@touch $@

install: $(VENV)/.installed

models: install
	$(EDGESPEC) models pull qwen-1.5b qwen-0.5b

demo: models
	@printf '$(DEMO_PROMPT)' | $(EDGESPEC) generate --target qwen-1.5b --proposer auto --max-tokens 160 --stats

# The default suite: unit, native, CLI, TUI and fast real-model tests (small models).
# The sanitizer and fuzz runs go first so that pytest's summary is the last line printed.
test: install
	$(EDGESPEC) models pull smollm2-135m gemma-270m qwen-0.5b qwen-1.5b
	$(MAKE) native-sanitize fuzz-smoke
	$(PY) -m pytest -q -m "not slow" tests

test-slow: install
	$(PY) -m pytest -q -m slow tests

native: install

native-test: install
	$(PY) -m pytest -q tests/native

# The native tests again under AddressSanitizer + UndefinedBehaviorSanitizer (~1 min).
native-sanitize: install
	PYTHON=$(abspath $(PY)) native/run_sanitized.sh

# A short coverage-guided libFuzzer run over the C API (long runs: native/README.md).
FUZZ_SECONDS ?= 60
fuzz-smoke:
	@command -v clang >/dev/null || { echo "installing clang for libFuzzer"; \
	  (apt-get update -qq && apt-get install -y -qq clang) >/dev/null; }
	mkdir -p native/build/fuzz-corpus
	clang -g -O1 -std=c11 -ffp-contract=off -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=all -Inative native/fuzz/fuzz_native.c native/es_util.c \
	  native/es_ngram.c native/es_stree.c -lm -o native/build/fuzz_native
	native/build/fuzz_native -max_total_time=$(FUZZ_SECONDS) -max_len=4096 native/build/fuzz-corpus

clean:
	rm -rf build native/build edgespec/*.so $(VENV)
