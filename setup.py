"""Builds the native extension edgespec._native; all metadata lives in pyproject.toml.

Build switches (environment):
  EDGESPEC_SANITIZE=1  AddressSanitizer + UndefinedBehaviorSanitizer (load the
                       extension with the ASan runtime preloaded, see native/README.md)
  EDGESPEC_COVERAGE=1  gcov/llvm-cov instrumentation (-O0 --coverage)
"""
import os
import sys

from setuptools import Extension, setup

SOURCES = ["native/edgespec_native.c", "native/es_util.c", "native/es_ngram.c", "native/es_ngstat.c",
           "native/es_stree.c"]


def _flags() -> tuple[list[str], list[str]]:
    if sys.platform == "win32":
        return ["/O2", "/fp:precise"], []
    # -ffp-contract=off: no fused multiply-add, so speculation scores are
    # bit-identical to the pure-Python reference on every CPU.
    compile_args = ["-std=c11", "-O2", "-ffp-contract=off", "-Wall", "-Wextra",
                    "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
    link_args: list[str] = []
    if os.environ.get("EDGESPEC_SANITIZE") == "1":
        san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
               "-fno-omit-frame-pointer", "-g"]
        compile_args = [a for a in compile_args if a != "-O2"] + ["-O1"] + san
        link_args += san
    if os.environ.get("EDGESPEC_COVERAGE") == "1":
        compile_args = [a for a in compile_args if a != "-O2"] + ["-O0", "-g", "--coverage"]
        link_args += ["--coverage"]
    return compile_args, link_args


_compile, _link = _flags()

setup(
    ext_modules=[
        Extension(
            "edgespec._native",
            sources=SOURCES,
            include_dirs=["native"],
            depends=["native/es_native.h", "native/es_internal.h"],
            extra_compile_args=_compile,
            extra_link_args=_link,
        )
    ],
)
