"""`kvbudget estimate` run as a subprocess: exit codes, one-line errors, JSON fields.

Figures are computed by hand in the comments; the formulas are budget.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvbudget.cli.cmd_estimate import parse_size
from kvbudget.client.errors import CLIError

KVBUDGET = [sys.executable, "-m", "kvbudget"]
# The same CLI with pynvml made unimportable, so "no GPU" holds on any machine.
KVBUDGET_NO_NVML = [
    sys.executable,
    "-c",
    "import sys; sys.modules['pynvml'] = None; from kvbudget.cli.main import main; "
    "sys.exit(main(sys.argv[1:]))",
]


def run(*args: str, cmd: list[str] = KVBUDGET) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cmd, "estimate", *args], capture_output=True, text=True, timeout=60, check=False
    )


def run_json(*args: str) -> dict:
    result = run(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def write_config(tmp_path, **overrides) -> str:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 32768,
        "vocab_size": 32000,
        "torch_dtype": "bfloat16",
    }
    cfg.update(overrides)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


# ------------------------------------------------------------------ figures


def test_gemma_3_27b_json(tmp_path):
    out = run_json("--model", "gemma-3-27b", "--gpu-memory-bytes", "80e9", "--weights-bytes", "54e9")
    # 80e9 x 0.9 - 54e9 = 18e9 bytes; block = 131072 B page x 10 layers = 1310720 B
    # -> 18e9 // 1310720 = 13732 blocks; 7 KV-cache groups, and every token takes a slot
    # in each: 13732 // 7 = 1961 x 16 = 31376 tokens, vLLM's "GPU KV cache size" (not
    # 13732 x 16 = 219712, 7 times that)
    assert out["num_blocks"] == 13732
    assert out["page_size_bytes"] == 131072
    assert out["bytes_per_block"] == 1310720
    assert out["num_groups"] == 7
    assert out["kv_tokens"] == 31376
    assert out["sizing"]["kv_tokens"] == 31376
    assert out["max_model_len"] == 131072 and out["tokens_per_request"] == 131072
    # 52 sliding layers dealt round-robin over cdiv(52, 10) = 6 groups, as vLLM deals them
    assert [(g["layer_type"], g["num_layers"]) for g in out["groups"]] == [
        ("sliding_window", 9)
    ] * 4 + [("sliding_window", 8)] * 2 + [("full_attention", 10)]
    # sliding group: cdiv(min(1023 + 8192, 131072), 16) + 1 = cdiv(9215, 16) + 1 = 577
    # full group: cdiv(131072, 16) = 8192; total 6 x 577 + 8192 = 11654 blocks per request
    assert out["groups"][0]["sliding_window"] == 1024
    assert out["groups"][0]["blocks_per_request"] == 577
    assert out["groups"][6]["blocks_per_request"] == 8192
    assert "sliding_window" not in out["groups"][6]
    assert out["blocks_per_request"] == 11654
    assert out["max_concurrency"] == pytest.approx(13732 / 11654)
    # naive: 7 groups x 8192 = 57344 blocks -> 13732 / 57344 = 0.239 (not even one request)
    assert out["naive_blocks_per_request"] == 57344
    assert out["naive_max_concurrency"] == pytest.approx(13732 / 57344)
    sizing = out["sizing"]
    assert sizing["source"] == "gpu_memory"
    assert sizing["gpu_total_bytes"] == 80 * 10**9
    assert sizing["gpu_memory_utilization"] == 0.9
    assert sizing["weights_bytes"] == 54 * 10**9 and sizing["weights_estimated"] is False
    assert sizing["activation_reserve_bytes"] == 0
    assert sizing["kv_cache_bytes"] == 18 * 10**9


def test_human_table_shows_layer_aware_and_naive_side_by_side():
    result = run("--model", "gemma-3-27b", "--gpu-memory-bytes", "80e9", "--weights-bytes", "54e9")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "13,732 blocks = 31,376 tokens in every group (vLLM's GPU KV cache size)\n" in out
    header = next(line for line in out.splitlines() if "layer-aware" in line and "naive" in line)
    assert header.index("layer-aware") < header.index("naive")
    row = next(line for line in out.splitlines() if "131,072 " in line and "│" in line)
    # on the daemon's 13731 usable blocks: 13731 / 11654 = 1.18 layer-aware, 13731 / 57344 = 0.24
    # naive, gain 57344 / 11654 = 4.92; vLLM's figure on its 13732: 13732 / 11654 = 1.18 too
    assert "1.18" in row and "0.24" in row and "x4.92" in row
    assert "sliding_window" in out and "1,024" in out


def test_one_group_pool_line_has_no_groups_to_speak_of():
    result = run("--model", "llama-3.1-8b", "--num-gpu-blocks", "100")
    assert result.returncode == 0, result.stderr
    # one group of 32 layers: 100 x 16 tokens, as vLLM reports it
    assert "        100 blocks = 1,600 tokens (vLLM's GPU KV cache size)\n" in result.stdout


def test_kv_tokens_of_a_mamba_hybrid():
    out = run_json("--model", "jamba-v0.1", "--num-gpu-blocks", "1000")
    # 7 mamba groups + 1 attention group, blocks of 80 tokens: 1000 // 8 x 80
    assert out["num_groups"] == 8 and out["block_size"] == 80
    assert out["kv_tokens"] == 10000


def test_hybrid_half_half_at_16384_with_f_1024(tmp_path):
    config = write_config(
        tmp_path, layer_types=["sliding_attention", "full_attention"] * 16, sliding_window=4096
    )
    out = run_json(
        "--model", config, "--kv-cache-memory-bytes", "8GiB", "--max-model-len", "16384",
        "--max-num-batched-tokens", "1024",
    )  # fmt: skip
    # two groups of 16 layers; block = 65536 x 16 = 1 MiB -> 8 GiB = 8192 blocks
    assert out["num_blocks"] == 8192
    # per request: sliding cdiv(min(4095 + 1024, 16384), 16) + 1 = 321, full 1024 -> 1345
    assert [g["blocks_per_request"] for g in out["groups"]] == [321, 1024]
    assert out["max_concurrency"] == pytest.approx(8192 / 1345)  # 6.09
    assert out["naive_max_concurrency"] == 4.0  # 8192 / 2048


def test_max_model_len_auto(tmp_path):
    config = write_config(tmp_path, num_key_value_heads=32, torch_dtype="float16")
    out = run_json("--model", config, "--kv-cache-memory-bytes", "8GiB", "--max-model-len", "auto")
    # page 16 x 32 x 256 x 2 = 256 KiB, x 32 layers = 8 MiB per block; 8 GiB -> 1024 blocks;
    # the daemon has 1023 usable (block 0 is the null block); full attention: cdiv(L, 16) <=
    # 1023 -> L = 16368 (below the model's 32768)
    assert out["page_size_bytes"] == 262144
    assert out["bytes_per_block"] == 8 * 2**20
    assert out["num_blocks"] == 1024 and out["daemon_usable_blocks"] == 1023
    assert out["max_model_len"] == 16368 and out["max_model_len_source"] == "auto"
    assert out["daemon_max_concurrency"] == 1.0  # 1023 / cdiv(16368, 16) = 1023 / 1023


def test_max_model_len_auto_capped_by_model(tmp_path):
    config = write_config(tmp_path, max_position_embeddings=4096)
    out = run_json("--model", config, "--num-gpu-blocks", "100000", "--max-model-len", "auto")
    assert out["max_model_len"] == 4096


def test_mla_and_fp8_pages():
    ds = run_json("--model", "deepseek-v3", "--num-gpu-blocks", "1000", "--max-model-len", "4096")
    # no --block-size: 64 for an MLA model (vLLM's FlashMLA on Hopper)
    assert ds["block_size"] == 64
    assert ds["page_size_bytes"] == 73728  # 64 x (512 + 64) x 2
    assert ds["groups"] == [
        {
            "index": 0,
            "layer_type": "mla",
            "num_layers": 61,
            "layer_ids": list(range(61)),
            "blocks_per_request": 64,  # cdiv(4096, 64)
            "naive_blocks_per_request": 64,
        }
    ]
    fp8 = run_json("--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--kv-dtype", "fp8")
    assert fp8["page_size_bytes"] == 32768 and fp8["kv_dtype"] == "fp8"  # 16 x 8 x 256 x 1


def test_tokens_per_request_and_token_cap():
    out = run_json(
        "--model", "llama-3.1-8b", "--num-gpu-blocks", "4096", "--tokens-per-request", "8192",
        "--token-cap", "2048",
    )  # fmt: skip
    # every layer capped at 2048 tokens: cdiv(2048, 16) = 128 blocks; naive cdiv(8192, 16) = 512
    assert out["tokens_per_request"] == 8192
    assert out["groups"][0]["layer_type"] == "capped"
    assert out["groups"][0]["token_cap"] == 2048
    assert out["max_concurrency"] == 32.0  # 4096 / 128
    assert out["naive_max_concurrency"] == 8.0  # 4096 / 512


def test_estimated_weights_when_not_given():
    out = run_json("--model", "llama-3.1-8b", "--gpu-memory-bytes", "80GB")
    # 8,030,261,248 parameters x 2 bytes = 16,060,522,496; 72e9 - that = 55,939,477,504 B
    # -> // 2 MiB = 26674 blocks
    assert out["sizing"]["weights_bytes"] == 16_060_522_496
    assert out["sizing"]["weights_estimated"] is True
    assert out["num_blocks"] == 26674


def test_trace_percentiles(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens\n0,900,100\n1,1500,500\n2,2000,1000\n3,9000,1000\n"
    )
    config = write_config(tmp_path)
    out = run_json("--model", config, "--num-gpu-blocks", "1000", "--trace", str(trace))
    # lengths sorted 1000, 2000, 3000, 10000. Nearest rank: p50 = 2nd = 2000,
    # p99 = ceil(3.96) = 4th = 10000; mean = 16000 / 4 = 4000.
    t = out["trace"]
    assert t["num_requests"] == 4
    assert (t["p50"]["tokens"], t["mean"]["tokens"], t["p99"]["tokens"]) == (2000, 4000, 10000)
    assert t["p50"]["max_concurrency"] == 8.0  # 1000 / cdiv(2000, 16) = 1000 / 125
    assert t["mean"]["max_concurrency"] == 4.0  # 1000 / 250
    assert t["p99"]["max_concurrency"] == 1.6  # 1000 / 625


# ------------------------------------------------------------------ bad input


def config_missing_layers(tmp_path):
    return write_config(tmp_path, num_hidden_layers=None)


BAD_INPUTS = [
    (["--model", "no-such-model", "--num-gpu-blocks", "10"], "unknown model 'no-such-model'"),
    (["--num-gpu-blocks", "10"], "--model is required"),
    (["--model", "llama-3.1-8b", "--gpu-memory-bytes=-80GB"], "--gpu-memory-bytes must be positive"),
    (["--model", "llama-3.1-8b", "--num-gpu-blocks", "-5"], "--num-gpu-blocks must be positive"),
    (["--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "0"], "--kv-cache-memory-bytes must be"),
    (["--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "8XB"], "unknown unit 'XB'"),
    (["--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "1e400"], "--kv-cache-memory-bytes '1e400': too large"),
    (["--model", "deepseek-v3", "--num-gpu-blocks", "100", "--token-cap", "100"], "--token-cap applies to K/V attention"),
    (["--model", "llama-3.1-8b", "--gpu-memory-bytes", "1e308"], "--gpu-memory-bytes '1e308': too large"),
    (["--model", "llama-3.1-8b", "--gpu-memory-bytes", "eighty"], "expected a size"),
    (
        ["--model", "llama-3.1-8b", "--gpu-memory-bytes", "80e9", "--gpu-memory-utilization", "1.5"],
        "--gpu-memory-utilization must be in (0, 1]",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu-memory-bytes", "80e9", "--weights-bytes", "-1"],
        "--weights-bytes must be >= 0",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu-memory-bytes", "80e9", "--activation-reserve-bytes=-1GB"],
        "--activation-reserve-bytes must be >= 0",
    ),
    (["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--block-size", "0"], "--block-size"),
    (["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--max-model-len", "-1"], "--max-model-len"),
    (
        ["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--max-model-len", "999999999"],
        "exceeds the model's max_position_embeddings (131072)",
    ),
    (
        ["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--max-model-len", "1024",
         "--tokens-per-request", "2048"],
        "--tokens-per-request 2048 exceeds max_model_len 1024",
    ),  # fmt: skip
    (["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--kv-dtype", "int3"], "--kv-dtype 'int3'"),
    (["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--kv-dtype", "fp32"], "--kv-dtype 'fp32'"),
    (["--model", "deepseek-v3", "--num-gpu-blocks", "10", "--token-cap", "100"], "MLA"),
    (
        ["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--kv-cache-memory-bytes", "8GiB"],
        "give one memory source, not --kv-cache-memory-bytes and --num-gpu-blocks",
    ),
    (
        ["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--gpu-memory-bytes", "80GB"],
        "give one memory source, not --num-gpu-blocks and --gpu-memory-bytes",
    ),
    (
        ["--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "8GiB", "--activation-reserve-bytes", "1GB"],
        "--activation-reserve-bytes only applies with --gpu-memory-bytes",
    ),
    (
        ["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--weights-bytes", "1GB"],
        "--weights-bytes only applies with --gpu-memory-bytes",
    ),
    (
        ["--model", "llama-3.1-8b", "--gpu-memory-bytes", "10GB", "--weights-bytes", "20GB"],
        "no memory left for the KV cache",
    ),
    (
        ["--model", "llama-3.1-8b", "--kv-cache-memory-bytes", "1MiB"],
        "less than one block",
    ),
    (
        ["--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--trace", "/no/such/trace.csv"],
        "cannot read",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kvbudget estimate: error: ")
    assert message in lines[0]


# Every name one of them takes, the other takes: `kvbudget estimate --kv-dtype` and the
# daemon's `kv_dtype` (checked by load_config, used by pool setup) read spec.KV_DTYPES.
KV_DTYPE_NAMES = ["bf16", "fp16", "fp8", "int4", "int2", "BF16", "bfloat16", "float16",
                  "fp8_e4m3", "fp8_e5m2", "fp32", "float32", "int3", "auto8",
                  "auto", "AUTO"]  # fmt: skip


@pytest.mark.parametrize("name", KV_DTYPE_NAMES)
def test_estimate_and_daemon_take_the_same_kv_dtypes(name):
    from kvbudget.daemon.config.loading import load_config
    from kvbudget.daemon.config.settings import ConfigError

    try:
        load_config(None, {"model": "llama-3.1-8b", "kv_dtype": name, "num_gpu_blocks": 10})
        daemon_takes = True
    except ConfigError as exc:
        assert "kv_dtype" in str(exc)
        daemon_takes = False
    result = run("--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--kv-dtype", name, "--json")
    assert (result.returncode == 0) == daemon_takes, result.stderr
    assert daemon_takes == (name.lower() not in ("fp32", "float32", "int3", "auto8") and name != "AUTO")
    if name == "auto":  # the daemon's default, and vLLM's --kv-cache-dtype's: the model's dtype
        assert json.loads(result.stdout)["kv_dtype"] == "bf16"


# The daemon refuses what estimate refuses: one rule (sizing.memory_source_conflict,
# hf_config.resolve_max_model_len) for both.
@pytest.mark.parametrize(
    "settings",
    [
        {"kv_cache_memory_bytes": "8GiB", "num_gpu_blocks": "10"},
        {"num_gpu_blocks": "10", "gpu_memory_bytes": "80GB"},
        {"num_gpu_blocks": "10", "weights_bytes": "1GB"},
        {"kv_cache_memory_bytes": "8GiB", "activation_reserve_bytes": "1GB"},
    ],
    ids=lambda settings: "+".join(settings),
)  # fmt: skip
def test_estimate_and_daemon_refuse_the_same_memory_sources(settings):
    from kvbudget.cli.cmd_estimate import parse_size
    from kvbudget.daemon.config.loading import load_config
    from kvbudget.daemon.config.settings import ConfigError

    flags = [part for name, value in settings.items() for part in ("--" + name.replace("_", "-"), value)]
    result = run("--model", "llama-3.1-8b", *flags)
    assert result.returncode == 2
    assert "give one memory source" in result.stderr or "only applies" in result.stderr
    values = {
        name: int(value) if name == "num_gpu_blocks" else parse_size(value, name)
        for name, value in settings.items()
    }
    with pytest.raises(ConfigError):
        load_config(None, {"model": "llama-3.1-8b", **values})


def test_daemon_refuses_a_max_model_len_estimate_refuses():
    from kvbudget.daemon.config.loading import load_config
    from kvbudget.daemon.config.pool_setup import PoolSetupError, setup_pool

    result = run("--model", "llama-3.1-8b", "--num-gpu-blocks", "10", "--max-model-len", "200000")
    assert result.returncode == 2 and "exceeds the model's max_position_embeddings" in result.stderr
    config = load_config(None, {"model": "llama-3.1-8b", "num_gpu_blocks": 10, "max_model_len": 200000})
    with pytest.raises(PoolSetupError, match="max_model_len 200000 exceeds the model's max_position_embeddings"):
        setup_pool(config, None)


def test_unreadable_and_incomplete_configs(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{oops")
    result = run("--model", str(broken), "--num-gpu-blocks", "10")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "not valid JSON" in result.stderr

    result = run("--model", config_missing_layers(tmp_path), "--num-gpu-blocks", "10")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "config field 'num_hidden_layers' is missing" in result.stderr


def test_no_memory_source_without_a_gpu():
    result = run("--model", "llama-3.1-8b", cmd=KVBUDGET_NO_NVML)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "kvbudget estimate: error: no memory source: give --gpu-memory-bytes, "
        "--kv-cache-memory-bytes or --num-gpu-blocks (no GPU: "
    )


# ------------------------------------------------------------------ sizes


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80e9", 80 * 10**9),
        ("80GB", 80 * 10**9),
        ("80 gb", 80 * 10**9),
        ("8GiB", 8 * 2**30),
        ("8G", 8 * 2**30),
        ("8g", 8 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5GiB", 3 * 2**29),
        ("123", 123),
        ("2TB", 2 * 10**12),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text, "--x") == value


def test_parse_size_rejects():
    for text in ("-1GB", "0", "abc", "8XB", ""):
        with pytest.raises(CLIError, match="--x"):
            parse_size(text, "--x")
    assert parse_size("0", "--x", allow_zero=True) == 0


def test_usage_mistakes_are_one_line_too() -> None:
    # argparse's own errors (unknown flag, bad choice) follow the one-line rule like ours.
    for argv in (["estimate", "--kv-dtype"], ["no-such-command"], ["estimate", "--model"]):
        result = subprocess.run([sys.executable, "-m", "kvbudget", *argv], capture_output=True, text=True)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "error:" in result.stderr and "Traceback" not in result.stderr
    # A command's unknown flag points at that command's help, not the top level's.
    result = subprocess.run([sys.executable, "-m", "kvbudget", "estimate", "--bogus", "1"], capture_output=True, text=True)
    assert result.stderr == "kvbudget estimate: error: unrecognized arguments: --bogus 1 (see kvbudget estimate --help)\n"


# The CLI in a fresh interpreter where importing torch or pynvml (or any part of them)
# fails, as on a host that has neither: `estimate` and `tui --help` must not need them.
KVBUDGET_NO_TORCH_NO_NVML = [
    sys.executable,
    "-c",
    "import sys\n"
    "class Refuse:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] in ('torch', 'pynvml'):\n"
    "            raise ImportError(f'{name} is blocked in this test')\n"
    "        return None\n"
    "sys.meta_path.insert(0, Refuse())\n"
    "from kvbudget.cli.main import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:  # argparse's --help\n"
    "    code = exc.code\n"
    "assert not {m.split('.')[0] for m in sys.modules} & {'torch', 'pynvml'}\n"
    "sys.exit(code)\n",
]


def test_the_finder_really_blocks_torch_and_pynvml():
    # torch is installed here: the finder, not its absence, is what the tests below rely on.
    done = subprocess.run([*KVBUDGET_NO_TORCH_NO_NVML[:2], KVBUDGET_NO_TORCH_NO_NVML[2].replace(
        "from kvbudget.cli.main import main", "import torch")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "torch is blocked in this test" in done.stderr


def test_estimate_needs_neither_torch_nor_pynvml():
    out = subprocess.run(
        [*KVBUDGET_NO_TORCH_NO_NVML, "estimate", "--model", "llama-3.1-8b", "--num-gpu-blocks", "4096",
         "--tokens-per-request", "8192", "--json"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    # cdiv(8192, 16) = 512 blocks per request; 4096 / 512 = 8 at once
    assert json.loads(out.stdout)["max_concurrency"] == 8.0


def test_tui_help_needs_neither_torch_nor_pynvml():
    out = subprocess.run([*KVBUDGET_NO_TORCH_NO_NVML, "tui", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--target" in out.stdout and "--recording" in out.stdout


def test_names_from_the_users_files_are_not_read_as_markup(tmp_path):
    """The report's labels are Rich markup; a model directory named "[b]m", or an
    architecture such as "Llama[/]ForCausalLM", is the user's text: shown as it is, never
    eaten ("m") nor a MarkupError traceback."""
    model_dir = tmp_path / "[b]m"
    model_dir.mkdir()
    write_config(model_dir, architectures=["Llama[/]ForCausalLM"])
    result = run("--model", str(model_dir), "--num-gpu-blocks", "1000")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split(",")[0] == "model   [b]m (Llama[/]ForCausalLM)"
