"""The note that says where a config's layer kinds came from matches the config."""

from __future__ import annotations

from kvbudget.daemon.config.hf_config import model_from_config
from kvbudget.daemon.core.spec import LayerKind

from test_hf_config import kinds_of, small_config


def test_use_sliding_window_true_without_a_window_is_all_full_and_says_so() -> None:
    # Qwen-style: the switch is on but no window is given; nothing slides, and the note
    # must not claim the switch was off.
    m = model_from_config(small_config(use_sliding_window=True))
    assert kinds_of(m) == [(LayerKind.FULL, 32)]
    note = next(n for n in m.layout.notes if n.startswith("layer kinds from"))
    assert note == "layer kinds from use_sliding_window true without a sliding_window (all full attention)"


def test_use_sliding_window_false_still_says_false() -> None:
    m = model_from_config(small_config(use_sliding_window=False, sliding_window=4096))
    assert kinds_of(m) == [(LayerKind.FULL, 32)]
    assert "layer kinds from use_sliding_window false" in m.layout.notes
