"""bench/simulate_policies.py's claim, kept true: on its fixed trace, `guaranteed` never
preempts and `predictive` preempts less than `optimistic`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "simulate_policies.py"


def load_script():
    spec = importlib.util.spec_from_file_location("simulate_policies", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_guaranteed_never_preempts_and_predictive_preempts_less_than_optimistic():
    script = load_script()
    # the script's own seed and sizes (400 requests, seed 7, 12,000 blocks); naive is left
    # out only because it drains the trace slowest (one request at a time, by design).
    results = script.simulate_policies(("optimistic", "guaranteed", "predictive"))
    assert {name: r.finished for name, r in results.items()} == dict.fromkeys(results, 400)
    assert results["guaranteed"].preemptions == 0
    assert results["predictive"].preemptions < results["optimistic"].preemptions
    assert results["optimistic"].preemptions > 0  # the trace does put the pool under pressure
