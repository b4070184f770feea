"""The device's verify-cost curve and exactness probe, cached per kernel configuration.

    curve.py       Calibration: cost(n) relative to a 1-token pass, the exactness limit, JSON
    measuring.py   time n-token passes of a loaded model, probe the exact batch size
    cache.py       the cache on disk: device fingerprint, key, load_or_measure, exact_cap
    cpu.py         other processes' CPU share while timing (a busy machine is re-measured)
"""
