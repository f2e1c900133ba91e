"""`kvbudget replay --offline --tensor-parallel-size / --pipeline-parallel-size`, run as the
user runs it: the pool a daemon on one GPU of that engine would hand out.

Llama-3.1-70B, 20e9 B of KV per GPU, block 16, bf16. One GPU: 8 KV heads x 128 dims, 80
layers: 80 x 2 x 16 x 8 x 128 x 2 B = 5,242,880 B per block, 3,814 blocks, 3,813 usable
(block 0 is the null block). Tensor parallel 4: 2 heads per rank, 1,310,720 B per block,
15,258 blocks, 15,257 usable. Pipeline parallel 2 on top: 40 layers per stage, 655,360 B,
30,517 blocks, 30,516 usable.
"""

from __future__ import annotations

import json
import subprocess
import sys

REPLAY = [sys.executable, "-m", "kvbudget", "replay", "azure"]
POOL = ("--model", "llama-3.1-70b", "--kv-cache-memory-bytes", "20e9", "--limit", "5")


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*REPLAY, *args], capture_output=True, text=True, timeout=120, check=False)


def usable_blocks(*args: str) -> int:
    result = replay("--offline", *POOL, *args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["num_blocks"]


def test_offline_pool_is_one_gpus_of_the_parallel_engine():
    assert usable_blocks() == 3_813
    assert usable_blocks("--tensor-parallel-size", "4") == 15_257
    assert usable_blocks("--tensor-parallel-size", "4", "--pipeline-parallel-size", "2") == 30_516


def test_parallel_flags_are_offline_only_and_checked():
    live = replay("--tensor-parallel-size", "4")
    assert live.returncode != 0 and "--tensor-parallel-size: offline only" in live.stderr
    bad = replay("--offline", *POOL, "--tensor-parallel-size", "3")
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert "--tensor-parallel-size 3 neither divides the model's 8 KV heads" in bad.stderr
