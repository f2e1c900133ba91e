"""A token cap on sliding-window layers (`--token-cap`, `[model] token_cap`): never more
blocks than no cap. A cap under the window W binds, and the layer is capped, cdiv(min(L, T),
B); a cap at or over it never binds (the window keeps W - 1 computed tokens), and the layer
keeps the window's formula, min(cdiv(min(W - 1 + F, L), B) + 1, cdiv(L, B)) (budget.py,
`token_cap_binds`).

The model: 4 layers, sliding / full alternating, W = 1024, 8 KV heads of 128, bf16, blocks
of B = 16, F = 8192 (max_num_batched_tokens), L = 32768 (max_position_embeddings).
Uncapped, one request of L holds on the sliding group min(cdiv(min(1023 + 8192, 32768), 16)
+ 1, 2048) = cdiv(9215, 16) + 1 = 576 + 1 = 577 blocks, on the full group cdiv(32768, 16)
= 2048.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbudget.daemon.config.hf_config import model_from_config
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.pool_setup import setup_pool
from kvbudget.daemon.core import budget
from kvbudget.daemon.core.spec import LayerKind

from test_estimate_cli import run_json, write_config

L, F = 32_768, 8_192
WINDOWED = {
    "num_hidden_layers": 4, "sliding_window": 1024,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
}  # fmt: skip


def _model(tmp_path: Path, cap: int | None):
    path = write_config(tmp_path, **WINDOWED)
    return model_from_config(json.loads(Path(path).read_text()), token_cap=cap)


def _worst(tmp_path: Path, cap: int | None) -> dict[LayerKind, int]:
    layout = _model(tmp_path, cap).layout
    blocks = budget.request_worst_case(layout, L, F).per_group
    return {g.kind: n for g, n in zip(layout.groups, blocks)}


@pytest.mark.parametrize("cap, expected", [
    # under the window: every layer capped, one group of 4: cdiv(512, 16) = 32 (577 + 2048 uncapped)
    (512, {LayerKind.CAPPED: 32}),
    # at the window: the sliding layers keep 577; the full ones capped, cdiv(1024, 16) = 64
    (1024, {LayerKind.SLIDING: 577, LayerKind.CAPPED: 64}),
    # over it: 577 again (capped, cdiv(4096, 16) = 256 would undercount the F in flight)
    (4096, {LayerKind.SLIDING: 577, LayerKind.CAPPED: 256}),
    # past W - 1 + F: capped would be cdiv(16384, 16) = 1024, more than the uncapped 577
    (16_384, {LayerKind.SLIDING: 577, LayerKind.CAPPED: 1024}),
    (None, {LayerKind.SLIDING: 577, LayerKind.FULL: 2048}),
])  # fmt: skip
def test_worst_case_per_group_against_the_cap(tmp_path: Path, cap, expected) -> None:
    assert _worst(tmp_path, cap) == expected


def test_a_cap_never_charges_more_than_no_cap(tmp_path: Path) -> None:
    uncapped = _worst(tmp_path, None)
    for cap in (1, 15, 16, 1023, 1024, 1025, 9215, 9216, 40_000):
        worst = _worst(tmp_path, cap)
        sliding = worst.get(LayerKind.SLIDING, worst[LayerKind.CAPPED])
        assert sliding <= uncapped[LayerKind.SLIDING], cap
        assert worst[LayerKind.CAPPED] <= uncapped[LayerKind.FULL], cap


def test_a_kept_window_releases_as_uncapped_over_the_requests_life(tmp_path: Path) -> None:
    # 5,000 tokens computed, 5,016 slots: the window's first 5000 - 1024 + 1 = 3,977 tokens
    # are out of view, 3977 // 16 = 248 leading blocks released of cdiv(5016, 16) = 314: 66
    # held, capped at 4096 or not
    for cap in (None, 4096):
        spec = next(g.spec for g in _model(tmp_path, cap).layout.groups if g.kind is LayerKind.SLIDING)
        assert budget.blocks_held(spec, 5016, 5000) == 66


def test_full_attention_alone_is_capped_whatever_the_cap(tmp_path: Path) -> None:
    # llama-like, 32 full layers: cap 2048 -> cdiv(2048, 16) = 128 of 2048; a cap past L is
    # cdiv(min(32768, 65536), 16) = 2048, the uncapped figure
    path = write_config(tmp_path)
    cfg = json.loads(Path(path).read_text())
    for cap, blocks in ((2048, 128), (65_536, 2048)):
        layout = model_from_config(cfg, token_cap=cap).layout
        assert [g.kind for g in layout.groups] == [LayerKind.CAPPED]
        assert budget.request_worst_case(layout, L, F).total == blocks


def test_estimate_and_the_daemon_agree_on_gemma_3(tmp_path: Path) -> None:
    # gemma-3-27b: 52 sliding layers (W 1024) in 6 groups, 10 full in 1; cap 2048 >= W:
    # each sliding group min(cdiv(min(1023 + 8192, 32768), 16) + 1, 2048) = 577, the full
    # group capped cdiv(2048, 16) = 128: 6 x 577 + 128 = 3,590 blocks per request
    # (uncapped 6 x 577 + 2048 = 5,510)
    out = run_json("--model", "gemma-3-27b", "--num-gpu-blocks", "100000", "--max-model-len", "32768",
                   "--token-cap", "2048")  # fmt: skip
    assert out["blocks_per_request"] == 3_590
    assert [g["layer_type"] for g in out["groups"]] == ["sliding_window"] * 6 + ["capped"]
    path = tmp_path / "kvbudget.toml"
    path.write_text('[model]\nname = "gemma-3-27b"\nmax_model_len = 32768\ntoken_cap = 2048\n'
                    "[pool]\nnum_gpu_blocks = 100000\n")  # fmt: skip
    layout = setup_pool(load_config(path), gpu=None).model.layout
    daemon = budget.request_worst_case(layout, 32_768, 8192)
    assert daemon.total == 3_590
    assert list(daemon.per_group) == [g["blocks_per_request"] for g in out["groups"]]
