# Quick start: `make demo` (set up + a real speculative generation), `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
EDGESPEC := $(VENV)/bin/edgespec
LLAMA_CPP_VERSION := 0.3.36

# llama.cpp is built for the ISA extensions this CPU reports, never AMX (some VMs report it
# and fault on it): edgespec/runtime/llama_build.py. Your own CMAKE_ARGS (CUDA, Metal, Vulkan) win:
# `CMAKE_ARGS="-DGGML_CUDA=on" make install`. The RPC backend is built in (it changes no
# kernel; `--rpc host:port,...` splits a target across machines): keep -DGGML_RPC=ON in yours.
DEFAULT_CMAKE_ARGS := $(shell $(PYTHON) edgespec/runtime/llama_build.py) -DGGML_RPC=ON
LLAMA_CMAKE_ARGS := $(if $(CMAKE_ARGS),$(CMAKE_ARGS),$(DEFAULT_CMAKE_ARGS))
# pip's wheel cache keys a source build by the sdist alone, not by its CMAKE_ARGS, so a wheel
# built for another CPU or backend would be reused. We keep our own wheels, keyed by the flags
# and the Python version: the first build takes ~5 minutes, later installs are instant.
EDGESPEC_CACHE := $(or $(EDGESPEC_HOME),$(HOME)/.cache/edgespec)
LLAMA_WHEEL_KEY = $(shell printf '%s %s %s' '$(LLAMA_CPP_VERSION)' '$(LLAMA_CMAKE_ARGS)' "$$($(PY) -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-16)
LLAMA_WHEEL_DIR = $(EDGESPEC_CACHE)/wheels/llama-cpp-python-$(LLAMA_WHEEL_KEY)

DEMO_PROMPT ?= Here is a Python function with a bug. Fix the bug and return the whole corrected function.\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / (len(xs) - 1)\n

.PHONY: install models demo test browser test-fast test-slow typecheck soak native native-test native-sanitize fuzz-smoke bench-quick anchors clean

$(VENV)/bin/activate:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# Rebuilt when the package metadata or the native sources change.
$(VENV)/.installed: $(VENV)/bin/activate Makefile pyproject.toml setup.py edgespec/runtime/llama_build.py $(wildcard native/*.c native/*.h)
	@if ! ls $(LLAMA_WHEEL_DIR)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) (CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)); first build takes ~5 min"; \
	  mkdir -p $(LLAMA_WHEEL_DIR).tmp && \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
	    -w $(LLAMA_WHEEL_DIR).tmp llama-cpp-python==$(LLAMA_CPP_VERSION) && \
	  rm -rf $(LLAMA_WHEEL_DIR) && mv $(LLAMA_WHEEL_DIR).tmp $(LLAMA_WHEEL_DIR); \
	fi
	$(PIP) install -q --force-reinstall --no-deps $(LLAMA_WHEEL_DIR)/llama_cpp_python-*.whl
	$(PIP) install -q -e ".[test,fuzz]"
	$(PY) setup.py -q build_ext --inplace
	@touch $@

install: $(VENV)/.installed

models: install
	$(EDGESPEC) models pull qwen-1.5b qwen-0.5b

demo: models
	@printf '$(DEMO_PROMPT)' | $(EDGESPEC) generate --target qwen-1.5b --proposer auto --max-tokens 160 --stats

# The default suite: the type check, unit, native, CLI, TUI and fast real-model tests (small
# models). The type check, sanitizer and fuzz runs go first so that pytest's summary is the
# last line printed.
test: install browser
	$(EDGESPEC) models pull smollm2-135m gemma-270m qwen-0.5b qwen-1.5b
	$(MAKE) typecheck native-sanitize fuzz-smoke
	$(PY) -m pytest -q -m "not slow" tests

# The web page's browser test (tests/web) drives headless Chromium: Debian's chromium and
# chromium-driver, installed here when missing and when we run as root with apt-get;
# elsewhere the test is skipped and says how to install them.
browser:
	@if command -v chromedriver >/dev/null 2>&1 && { command -v chromium >/dev/null 2>&1 || \
	    command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; }; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium and chromium-driver for tests/web"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } || \
	    echo "note: apt-get could not install chromium: tests/web's browser test will be skipped"; \
	else \
	  echo "note: no chromium/chromedriver and not root with apt-get: tests/web's browser test will be skipped (apt-get install chromium chromium-driver)"; \
	fi

# mypy --strict over the packages named in pyproject.toml's [tool.mypy] (api, decoding,
# control, proposers), run from the repository root so that it reads that configuration.
typecheck: install
	$(VENV)/bin/mypy

test-slow: install
	$(PY) -m pytest -q -m slow tests

# edgespec serve under ten minutes of mixed requests, cancellations and disconnects (a
# one-minute version runs in `make test`): no errors, RSS growth < 5%, nothing left running.
SOAK_SECONDS ?= 600
soak: install
	$(EDGESPEC) models pull smollm2-135m
	$(PY) tools/soak.py --seconds $(SOAK_SECONDS)

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
	  native/es_ngram.c native/es_ngstat.c native/es_stree.c -lm -o native/build/fuzz_native
	native/build/fuzz_native -max_total_time=$(FUZZ_SECONDS) -max_len=4096 native/build/fuzz-corpus

# llama.cpp's own llama-completion, llama-lookup and llama-speculative-simple, built from the
# llama.cpp that the installed llama-cpp-python vendors with the same flags, for
# `edgespec bench --anchor ...`, and llama-quantize for `edgespec models optimize` (into
# $EDGESPEC_HOME/anchors/<version>/bin or $EDGESPEC_ANCHORS; 12 min on this 2-core machine;
# a second run with the same flags does nothing, a new tool builds in the same tree).
anchors: install
	nice $(PY) -m edgespec.lab.bench.anchors.build --cmake-args "$(LLAMA_CMAKE_ARGS)"

clean:
	rm -rf build native/build edgespec/*.so $(VENV)
