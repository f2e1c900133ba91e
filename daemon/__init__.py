"""The daemon and its I/O-free core (spec, sizing, pool, budget, admission).

Nothing here imports torch, NVML or textual at import time.
"""
