"""The lab: what measures the product and sits beside it; nothing under edgespec imports it
but the front ends that run it (``edgespec bench``, ``parity``, ``attribute``, ``export``).

    bench/      the interleaved benchmark (``edgespec bench``): matrix, runner, records,
                figures, report, plots, llama.cpp anchors, the shipped prompt sets
    replay/     the one offline replay: a recorded run pass for pass (replay.py), any
                controller over recorded generations (generations.py)
    analysis/   parity (plain vs speculative), statistical tests, attribution, export
"""
