"""Offline analysis of runs: replay, parity, statistics, attribution, export.

    simulate.py    offline replay of recorded traces through the same controller protocol
    parity.py      plain vs speculative divergence report and sampling homogeneity tests
    stattests.py   the statistical tests parity and the bench use
    attribute.py   which cause explains a goodput change between two record sets
    export.py      a qualified pair's speculative settings for vLLM, SGLang, llama-server
"""
