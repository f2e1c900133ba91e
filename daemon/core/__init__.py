"""The pure core: layout, budget formulas, pool, ledger, admission and the engine step.

It imports only the standard library and itself (tests/test_layering.py holds that): no I/O,
no clock of its own (`now` is passed in), no grpc.
"""
