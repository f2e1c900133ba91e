"""The `vllm serve` line docs/vllm.md gives: the class it names is the one vLLM's engine core
builds. (vLLM's argument parser itself needs a device to infer, so it is not run here.)"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (./dev test-vllm runs these)")

SERVE_FLAGS = ["--scheduler-cls", "kvbudget.vllm.Scheduler", "--no-async-scheduling",
               "--num-gpu-blocks-override", "20000", "--block-size", "16"]


def test_the_scheduler_cls_resolves_to_the_adapter():
    from vllm.config import SchedulerConfig

    from kvbudget.vllm.scheduler import Scheduler

    # What EngineCore does with --scheduler-cls (v1/engine/core.py): the dotted path to a class.
    config = SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, scheduler_cls=SERVE_FLAGS[1],
                             async_scheduling=False)
    assert config.get_scheduler_cls() is Scheduler


def test_the_docs_give_that_line():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "vllm.md").read_text()
    assert "--scheduler-cls kvbudget.vllm.Scheduler --no-async-scheduling" in text
    assert "--num-gpu-blocks-override 20000 --block-size 16" in text
