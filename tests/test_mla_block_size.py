"""An MLA model gets 64-token blocks when no block size is given, as vLLM gives it on Hopper.

vLLM serves MLA (DeepSeek V2/V3/R1) with a kernel that sets the block size: FlashMLA, its
default on Hopper GPUs, 64 tokens. KVBudget used 16 for every model, so for DeepSeek its
bytes per block, blocks per request and block count disagreed with the engine's. Now a
block size left out resolves (in hf_config, one place) to 64 for a model with MLA layers
and 16 for any other, with a note that says why; one given (flag or file) is used as is,
with a note when vLLM's default MLA backend would replace it (FlashMLA, on Hopper: any size
not a multiple of 64 becomes 64), since the plan's blocks would then not be the engine's.

The deepseek-v3 preset (daemon/config/presets/deepseek-v3.json): 61 layers, every one MLA,
kv_lora_rank 512, qk_rope_head_dim 64, bf16 (2 bytes); one latent of 512 + 64 = 576
elements per token and layer, all 61 layers in one KV-cache group:
  64-token blocks: page 64 x 576 x 2 = 73,728 B; block 73,728 x 61 = 4,497,408 B
  16-token blocks: page 16 x 576 x 2 = 18,432 B; block 18,432 x 61 = 1,124,352 B
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kvbudget.cli.main import build_parser
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.hf_config import MLA_BLOCK_SIZE, load_model, model_from_config, read_config
from kvbudget.daemon.config.pool_setup import setup_pool
from kvbudget.daemon.core.spec import LayerKind

from test_estimate_cli import run, run_json

PAGE_64 = 64 * (512 + 64) * 2  # 73,728 B
PAGE_16 = 16 * (512 + 64) * 2  # 18,432 B
BLOCK_64 = PAGE_64 * 61  # 4,497,408 B
BLOCK_16 = PAGE_16 * 61  # 1,124,352 B


def _block_size_notes(notes) -> list[str]:
    return [n for n in notes if n.startswith("block size")]


# The note for a size given that vLLM's FlashMLA backend (Hopper's MLA default) replaces.
GIVEN_16_NOTE = (
    "block size 16 tokens, as given: the model uses MLA, and vLLM's FlashMLA backend (its "
    "default on Hopper GPUs) would use 64 instead (CUTLASS MLA on Blackwell 128), so the "
    "plan's blocks would not match such an engine's; give the block size the engine really uses"
)


# ------------------------------------------------------------------ the model reader


def test_deepseek_v3_without_a_block_size_gets_64_token_blocks_and_a_note() -> None:
    # (the figures above are the preset's, not remembered ones)
    _, cfg = read_config("deepseek-v3")
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["num_hidden_layers"]) == (512, 64, 61)
    assert cfg["torch_dtype"] == "bfloat16"
    assert (PAGE_64, BLOCK_64, PAGE_16, BLOCK_16) == (73_728, 4_497_408, 18_432, 1_124_352)
    m = load_model("deepseek-v3")
    assert m.layout.block_size == MLA_BLOCK_SIZE == 64
    assert [g.kind for g in m.layout.groups] == [LayerKind.MLA]
    assert m.layout.block_size == 64
    assert m.layout.groups[0].spec.block_size == 64
    # 64 x (512 + 64) x 2 = 73,728 B per layer; x 61 layers = 4,497,408 B per block
    assert m.layout.page_size_bytes == 73_728
    assert m.layout.bytes_per_block == 4_497_408
    [note] = _block_size_notes(m.layout.notes)
    assert note == m.block_size_note
    assert "MLA" in note and "FlashMLA" in note and "Hopper" in note
    assert "--block-size 128" in note and "CUTLASS MLA" in note and "Blackwell" in note


def test_a_block_size_given_is_used_as_given_for_mla_too() -> None:
    default = load_model("deepseek-v3")
    given_16 = load_model("deepseek-v3", block_size=16)
    assert (default.layout.block_size, given_16.layout.block_size) == (64, 16)
    # 16 x 576 x 2 = 18,432 B per layer; x 61 = 1,124,352 B per block
    assert given_16.layout.page_size_bytes == 18_432
    assert given_16.layout.bytes_per_block == 1_124_352
    # (16 is used, but a note says FlashMLA would not keep it: see the tests below)
    assert _block_size_notes(given_16.layout.notes) == [given_16.block_size_note] == [GIVEN_16_NOTE]
    # 64 or 128 given: used, and no note (nothing was chosen for the user, and FlashMLA keeps it)
    given_64 = load_model("deepseek-v3", block_size=64)
    assert given_64.block_size_note == "" and not _block_size_notes(given_64.layout.notes)
    given_128 = load_model("deepseek-v3", block_size=128)
    assert given_128.layout.block_size == 128 and given_128.block_size_note == ""
    assert not _block_size_notes(given_128.layout.notes)
    # 128 x 576 x 2 = 147,456 B per layer
    assert given_128.layout.page_size_bytes == 147_456


def test_a_given_size_flashmla_would_replace_gets_a_note() -> None:
    # vLLM on CUDA: FlashMLA (Hopper's MLA default) turns any block size that is not a
    # multiple of 64 into 64, even one the user gave. Used as given here, but said.
    given = load_model("deepseek-v3", block_size=16)
    assert given.layout.block_size == 16  # (the note changes nothing in the numbers)
    assert given.block_size_note == GIVEN_16_NOTE
    assert _block_size_notes(given.layout.notes) == [GIVEN_16_NOTE]
    assert GIVEN_16_NOTE in given.layout.notes
    for size in (1, 8, 32, 48, 96, 100):
        note = load_model("deepseek-v3", block_size=size).block_size_note
        assert note.startswith(f"block size {size} tokens, as given: ") and "FlashMLA" in note, size
    # multiples of 64: FlashMLA keeps them, no note
    for size in (64, 128, 192, 256):
        m = load_model("deepseek-v3", block_size=size)
        assert m.block_size_note == "" and not _block_size_notes(m.layout.notes), size


def test_no_size_given_keeps_the_default_note_only() -> None:
    m = load_model("deepseek-v3")
    [note] = _block_size_notes(m.layout.notes)
    assert note.startswith("block size 64 tokens, as none was given")
    assert "tokens, as given:" not in " ".join(m.layout.notes)


def test_a_given_size_on_a_model_without_mla_gets_no_note() -> None:
    for preset in ("llama-3.1-8b", "gemma-3-27b", "gpt-oss-120b", "llama-4-scout"):
        for size in (16, 32, 64):
            m = load_model(preset, block_size=size)
            assert m.block_size_note == "" and not _block_size_notes(m.layout.notes), (preset, size)
    # a Mamba hybrid: its block is raised (with its own note), never the MLA one
    jamba = load_model("jamba-v0.1", block_size=16)
    assert not _block_size_notes(jamba.layout.notes) and "FlashMLA" not in " ".join(jamba.layout.notes)


def test_any_config_with_mla_layers_gets_the_note() -> None:
    # (not a preset-name check: any config.json whose layers are MLA)
    _, cfg = read_config("deepseek-v3")
    m = model_from_config({**cfg, "num_hidden_layers": 4}, name="small-mla", block_size=16)
    assert m.block_size_note == GIVEN_16_NOTE


def test_only_mla_models_move_off_16() -> None:
    llama = load_model("llama-3.1-8b")  # full attention, no MLA layer
    assert llama.layout.block_size == 16
    assert llama.block_size_note == "" and not _block_size_notes(llama.layout.notes)
    assert load_model("deepseek-v3").layout.block_size == 64


# ------------------------------------------------------------------ kvbudget estimate


def test_estimate_json_reports_64_and_cdiv_l_64_blocks_per_request() -> None:
    out = run_json("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000")
    assert out["block_size"] == 64 and out["sizing"]["block_size"] == 64
    assert out["page_size_bytes"] == 73_728 and out["bytes_per_block"] == 4_497_408
    # one request of L = 10,000 tokens: cdiv(10000, 64) = 157 (156 x 64 = 9,984 < 10,000)
    assert out["blocks_per_request"] == 157
    assert out["groups"][0]["blocks_per_request"] == 157
    # one group: 1,000 blocks x 64 tokens = 64,000 tokens (vLLM's GPU KV cache size)
    assert out["kv_tokens"] == 64_000
    assert len(_block_size_notes(out["notes"])) == 1


def test_estimate_with_block_size_16_keeps_16() -> None:
    given = run_json("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000",
                     "--block-size", "16")
    default = run_json("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000")
    assert (given["block_size"], default["block_size"]) == (16, 64)
    assert given["bytes_per_block"] == 1_124_352
    # cdiv(10000, 16) = 625 (625 x 16 = 10,000 exactly)
    assert given["blocks_per_request"] == 625
    assert given["kv_tokens"] == 16_000  # 1,000 x 16
    # used as given, with the note that FlashMLA would use 64
    assert _block_size_notes(given["notes"]) == [GIVEN_16_NOTE]
    assert not _block_size_notes(
        run_json("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000",
                 "--block-size", "128")["notes"]
    )


def test_estimate_keeps_16_for_a_model_without_mla() -> None:
    llama = run_json("--model", "llama-3.1-8b", "--num-gpu-blocks", "1000", "--max-model-len", "10000")
    deepseek = run_json("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000")
    assert (llama["block_size"], deepseek["block_size"]) == (16, 64)
    assert llama["blocks_per_request"] == 625  # cdiv(10000, 16)
    assert not _block_size_notes(llama["notes"])
    given = run_json("--model", "llama-3.1-8b", "--num-gpu-blocks", "1000", "--max-model-len", "10000",
                     "--block-size", "16")
    assert not _block_size_notes(given["notes"])


def test_estimate_table_shows_the_resolved_size_and_the_note() -> None:
    result = run("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # (rich wraps long lines)
    assert "block 64 tokens: page 72.00 KiB x 61 layers" in text  # 73,728 B = 72 KiB
    assert "1,000 blocks = 64,000 tokens" in text
    assert "note: block size 64 tokens" in text and "FlashMLA" in text


def test_estimate_table_says_a_given_16_would_not_match_flashmla() -> None:
    result = run("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000",
                 "--block-size", "16")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # (rich wraps long lines)
    assert "block 16 tokens: page 18.00 KiB x 61 layers" in text  # 18,432 B = 18 KiB
    assert f"note: {GIVEN_16_NOTE}" in text
    assert "as none was given" not in text
    for size in ("64", "128"):
        quiet = run("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "10000",
                    "--block-size", size)
        assert quiet.returncode == 0, quiet.stderr
        assert "note: block size" not in " ".join(quiet.stdout.split()), size


# ------------------------------------------------------------------ --help


@pytest.mark.parametrize("command", ["estimate", "replay", "daemon"])
def test_help_says_the_default(command: str) -> None:
    parser = build_parser([command])  # (only the chosen command's flags are added)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help or "" for a in sub.choices[command]._actions}
    assert "16; 64 for MLA models" in helps["block_size"]


# ------------------------------------------------------------------ the daemon


def _config(tmp_path: Path, model_lines: str):
    path = tmp_path / "kvbudget.toml"
    path.write_text(f'[model]\nname = "deepseek-v3"\n{model_lines}'
                    '[pool]\ndevice = "cpu"\nnum_gpu_blocks = 1000\n')
    return load_config(path)


def test_daemon_config_without_block_size_resolves_to_64(tmp_path: Path, caplog) -> None:
    config = _config(tmp_path, "")
    assert config.block_size is None
    with caplog.at_level(logging.INFO, logger="kvbudget.daemon"):
        setup = setup_pool(config, None)
    assert setup.sizing.block_size == 64 and setup.model.layout.block_size == 64
    assert setup.sizing.bytes_per_block == 4_497_408
    assert setup.sizing.kv_tokens == 64_000  # 1,000 blocks x 64 tokens, one group
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.getMessage().startswith("block size")]
    assert logged == [("INFO", setup.model.block_size_note)]


def test_daemon_config_with_block_size_16_keeps_16(tmp_path: Path, caplog) -> None:
    given = _config(tmp_path, "block_size = 16\n")
    assert given.block_size == 16
    with caplog.at_level(logging.INFO, logger="kvbudget.daemon"):
        setup = setup_pool(given, None)
    assert setup.sizing.block_size == 16 and setup.sizing.bytes_per_block == 1_124_352
    # used as given, and the start-up log says FlashMLA would use 64
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.getMessage().startswith("block size")]
    assert logged == [("WARNING", GIVEN_16_NOTE)]  # (a plan that would not match the engine)
    assert setup_pool(_config(tmp_path, ""), None).sizing.block_size == 64  # (left out: 64)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvbudget.daemon"):
        assert setup_pool(_config(tmp_path, "block_size = 64\n"), None).sizing.block_size == 64
    assert not [r for r in caplog.records if r.getMessage().startswith("block size")]


def test_daemon_check_config_prints_the_resolved_size(tmp_path: Path) -> None:
    def check(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kvbudget", "daemon", "--model", "deepseek-v3", "--num-gpu-blocks", "1000",
             "--device", "cpu", "--db-path", str(tmp_path / "d.db"), "--listen", f"unix://{tmp_path}/s.sock",
             "--check-config", *extra],
            capture_output=True, text=True, timeout=60, check=False,
        )

    chosen = check()
    assert chosen.returncode == 0, chosen.stderr
    assert "config OK: deepseek-v3, 1000 blocks of 64 tokens" in chosen.stdout
    assert "block size 64 tokens" in chosen.stderr and "FlashMLA" in chosen.stderr
    given = check("--block-size", "16")
    assert given.returncode == 0, given.stderr
    assert "config OK: deepseek-v3, 1000 blocks of 16 tokens" in given.stdout
    assert GIVEN_16_NOTE in given.stderr and "as none was given" not in given.stderr
    matching = check("--block-size", "64")
    assert matching.returncode == 0, matching.stderr
    assert "config OK: deepseek-v3, 1000 blocks of 64 tokens" in matching.stdout
    assert "block size" not in matching.stderr


@pytest.mark.slow
async def test_a_running_daemon_hands_engines_64_token_blocks(tmp_path: Path) -> None:
    from daemon_harness import DaemonProcess

    from kvbudget.client import EngineClient
    from kvbudget.daemon.core.records import DecisionKind, RequestSpec

    with DaemonProcess(tmp_path, "--model", "deepseek-v3") as daemon:  # 65 blocks: 64 usable
        async with EngineClient(daemon.target, "engine-a") as engine:
            assert engine.plan.block_size_tokens == 64
            assert engine.plan.bytes_per_block == 4_497_408
            # a 1,000-token prompt holds cdiv(1000, 64) = 16 blocks (15 x 64 = 960 < 1,000)
            [admit] = await engine.step(submits=[RequestSpec("r1", prompt_tokens=1000, max_new_tokens=24)])
            assert admit.kind == DecisionKind.ADMIT
            assert admit.blocks_held == (16,)
        stderr = daemon.stderr()
    assert "serving deepseek-v3: " in stderr and " blocks of 64 tokens " in stderr
    assert "block size 64 tokens, as none was given" in stderr


# ------------------------------------------------------------------ kvbudget replay


def test_offline_replay_uses_64_for_deepseek_unless_told(capsys) -> None:
    from kvbudget.cli.main import main

    def replay(*extra: str) -> dict:
        code = main(["replay", "azure", "--offline", "--model", "deepseek-v3", "--num-gpu-blocks", "3000",
                     "--max-model-len", "8192", "--limit", "5", "--json", *extra])
        assert code == 0
        return json.loads(capsys.readouterr().out)

    assert replay()["block_size"] == 64
    assert replay("--block-size", "16")["block_size"] == 16


_REPLAY = ["replay", "azure", "--offline", "--num-gpu-blocks", "3000", "--max-model-len", "8192", "--limit", "5"]


def test_offline_replay_prints_the_layout_notes_as_estimate_does(capsys) -> None:
    from kvbudget.cli.main import main

    assert main([*_REPLAY, "--model", "deepseek-v3"]) == 0
    out, err = capsys.readouterr()
    text = " ".join(out.split())  # (rich wraps long lines)
    assert "note: layer kinds from kv_lora_rank (MLA)" in text
    assert "note: block size 64 tokens, as none was given: the model uses MLA" in text and "FlashMLA" in text
    assert "note:" not in err  # (on stdout, after the table, where estimate prints them)
    assert text.index("optimistic (offline)") < text.index("note: block size")

    assert main([*_REPLAY, "--model", "deepseek-v3", "--block-size", "16"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"note: {GIVEN_16_NOTE}" in text and "as none was given" not in text

    assert main([*_REPLAY, "--model", "llama-3.1-8b", "--block-size", "16"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "note: layer kinds from" in text and "note: block size" not in text


def test_offline_replay_json_carries_the_notes_as_a_list(capsys) -> None:
    from kvbudget.cli.main import main

    assert main([*_REPLAY, "--model", "deepseek-v3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)  # (still one JSON document)
    assert summary["notes"] == list(load_model("deepseek-v3").layout.notes)
    [note] = _block_size_notes(summary["notes"])
    assert note.startswith("block size 64 tokens, as none was given")

    assert main([*_REPLAY, "--model", "deepseek-v3", "--block-size", "16", "--json"]) == 0
    assert _block_size_notes(json.loads(capsys.readouterr().out)["notes"]) == [GIVEN_16_NOTE]

    # --compare: a list, each run's summary with the notes
    assert main([*_REPLAY, "--model", "deepseek-v3", "--compare", "optimistic,guaranteed", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)
    assert [len(_block_size_notes(r["notes"])) for r in runs] == [1, 1]
