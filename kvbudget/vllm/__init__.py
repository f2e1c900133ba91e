"""The vLLM adapter: `kvbudget.vllm.Scheduler`, a vLLM 0.33 scheduler that admits, grows and
preempts as the daemon decides (`pip install kvbudget[vllm]`; docs/vllm.md).

`Scheduler` loads vLLM on first use, so the pure parts (settings, books, plan) import
without it.
"""

from __future__ import annotations

import importlib

__all__ = ["Scheduler"]


def __getattr__(name: str) -> object:
    if name == "Scheduler":
        return importlib.import_module("kvbudget.vllm.scheduler").Scheduler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
