"""llama-cpp-python 0.3.36's own test files, run against ``edgespec.apps.Llama``.

The files come from llama-cpp-python's sdist at test time (never copied into this repo):
``$EDGESPEC_LCP_SDIST`` (the .tar.gz), else ``~/.cache/edgespec/sdist/``, else a
``pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36`` into that folder;
the test skips, saying why, when none of these gives the sdist. upstream_plugin.py points
the suite at edgespec's class and at local registry models (a subprocess, so that
replacing ``llama_cpp.Llama`` never leaks into this session).

``EDGESPEC_UPSTREAM_TARGET=llama_cpp`` runs the same files on the real ``llama_cpp.Llama``
(the baseline the counts in docs/api.md compare with).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: what passes on edgespec's Llama every run (test ids as pytest names them; 13, and
#: test_real_llama in some runs: its last check wants two sampled numbers to differ,
#: and edgespec's sampled path depends on what was drafted, so both may come out "10" on
#: the Qwen stand-in); a regression fails here. Not passing:
#: test_llama_cpp_tokenization (vocab_only=True, and it reads llama_cpp.Llama's private
#: _ctx), test_real_model (llama_cpp's internals and Qwen3.5's token ids, not Llama),
#: and the recurrent and hybrid cases (no local model: skipped)
EXPECTED = {
    "test_llama.py::test_llama_cpp_version",
    "test_llama.py::test_real_llama_repeated_prompt_cache",
    "test_llama.py::test_real_llama_embeddings",
    *(f"test_llama.py::{name}[llama_cpp_transformer_model_path-False-False]" for name in (
        "test_exact_cached_prompt_reuse_matches_fresh",
        "test_loaded_exact_cached_prompt_reuse_matches_fresh",
        "test_ram_cache_exact_prompt_hit_matches_fresh",
        "test_shorter_prompt_prefix_reuse_matches_fresh")),
    "test_llama_chat_format.py::test_mistral_instruct",
    "test_llama_chat_format.py::test_hf_tokenizer_config_str_to_chat_formatter",
    "test_llama_grammar.py::test_grammar_from_string",
    "test_llama_grammar.py::test_composed_pydantic_grammar",
    "test_llama_grammar.py::test_grammar_anyof",
    "test_llama_speculative.py::test_find_candidate_pred_tokens",
}


def _sdist() -> Path | None:
    given = os.environ.get("EDGESPEC_LCP_SDIST")
    if given:
        return Path(given) if Path(given).is_file() else None
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgespec" / "sdist"
    path = cache / SDIST
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", f"llama-cpp-python=={VERSION}", "-d", str(cache)],
                       check=True, capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError):
        return None
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    sdist = _sdist()
    if sdist is None:
        pytest.skip(f"llama-cpp-python's sdist ({SDIST}) is not available: set "
                    "EDGESPEC_LCP_SDIST to it, or allow pip to download it")
    out = tmp_path_factory.mktemp("lcp")
    top = f"llama_cpp_python-{VERSION}/"
    wanted = (top + "tests/", top + "vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(wanted) and m.isfile()]
        tar.extractall(out, members=members, filter="data")
    return out / top


def run_suite(root: Path, target: str, junit: Path) -> dict[str, str]:
    """Each test id's outcome (passed, failed, skipped) on ``target``."""
    env = {**os.environ, "EDGESPEC_UPSTREAM_TARGET": target,
           "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "upstream_plugin",
                    "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(root),
                    f"--junitxml={junit}", "tests"], cwd=root, env=env, timeout=1800,
                   capture_output=True)
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcomes[name] = ("failed" if kinds & {"failure", "error"} else
                          "skipped" if "skipped" in kinds else "passed")
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two dozen model loads; the suite's own subprocess is bounded too
def test_llama_cpp_pythons_tests_on_apps_llama(suite, tmp_path):
    target = os.environ.get("EDGESPEC_UPSTREAM_TARGET", "edgespec")
    outcomes = run_suite(suite, target, tmp_path / "junit.xml")
    passed = sorted(k for k, v in outcomes.items() if v == "passed")
    print(f"\n{len(passed)} of {len(outcomes)} llama-cpp-python tests pass on {target}:")
    for k, v in sorted(outcomes.items()):
        print(f"  {v:8} {k}")
    if target == "edgespec":
        assert EXPECTED <= set(passed), sorted(EXPECTED - set(passed))
