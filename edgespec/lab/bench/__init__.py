"""Benchmark harness: prompt sets, the configuration matrix, the interleaved runner, reports.

Only ``runner`` touches the engine; ``prompts``, ``matrix``, ``stats`` and
``report`` are pure and importable without llama.cpp.
"""
