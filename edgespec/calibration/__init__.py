"""The device's verify-cost curve and exactness probe, cached per kernel configuration.

    calibration.py   measure the curve, probe the exact batch size, the cache on disk
"""
