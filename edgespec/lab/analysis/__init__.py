"""Offline analysis of runs: parity, statistics, attribution, export (the offline
replay is :mod:`edgespec.lab.replay`).

    parity.py      plain vs speculative divergence report and sampling homogeneity tests
    stattests.py   the statistical tests parity and the bench use
    attribute.py   which cause explains a goodput change between two record sets
    export.py      a qualified pair's speculative settings for vLLM, SGLang, llama-server
"""
