"""KVBudget's policies against vLLM 0.33's own scheduler on issue 28's four rows.

Each row is one `kvbudget replay --offline --compare` of every policy, and of optimistic
with vLLM's strict settings (FCFS head, no watermark, nothing asked ahead) as a reference,
on the model configs vLLM's planner sizes: the models folder holds llama31_8b/,
llama8b_swa/ and gemma3_12b/, each with its config.json (the vLLM peer's models folder).
vLLM's side is issue 28's stored figures, or with --vllm-venv and --peer a rerun of the
peer's sim_vllm.py (vLLM's real scheduler on CPU) per row.

    .venv/bin/python bench/replay_compare.py --models MODELS
    .venv/bin/python bench/replay_compare.py --models MODELS --vllm-venv VENV --peer PEER

It rewrites the marked section of docs/replay-compare.md and the rows' plots in docs/img/.
Same code, same figures: the replay is deterministic (seed 0) and nothing timed is written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- bench/replay_compare.py: begin (generated: rerun the bench, do not edit) -->"
END = "<!-- bench/replay_compare.py: end -->"
STRICT = "vllm-strict=optimistic:backfill_depth=0:watermark=0:grow_ahead_blocks=0"
RUNS = ("naive", "optimistic", "guaranteed", "predictive", STRICT)
COLUMNS = ("naive", "optimistic", "guaranteed", "predictive", "vllm-strict")
ENGINE = ("--block-size", "16", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192")
# The replay's default engine model asks growth as vLLM's own scheduler allocates it: what
# each step needs, nothing ahead (the vLLM adapter asks by the block: `--engine-model vllm`).
GROWTH = ("--grow-ahead-blocks", "0")
# The default's watermark (1.5%) against its neighbours: the trade-off the default was chosen on.
SWEEP = (0.0, 0.01, 0.0125, 0.02, 0.03)
SWEEP_RUNS = tuple(f"watermark-{w:g}=optimistic:watermark={w:g}" for w in SWEEP)


@dataclass(frozen=True)
class Row:
    key: str  # the plot's name: docs/img/replay-compare-<key>.png
    title: str
    trace: str  # a shipped trace
    model: str  # a folder of --models
    kv_bytes: int
    max_model_len: int
    vllm: tuple[int, float, float, float]  # vLLM 0.33: preemptions, wait p50 / p99 s, makespan s


# Issue 28's table: vLLM 0.33.0's v1 scheduler (sim_vllm.py, CPU), first 500 requests.
ROWS = (
    Row("azure-llama31_8b", "Azure conv · llama31_8b · 5.24 GB · 32,768",
        "azure", "llama31_8b", 5_242_880_000, 32768, (98, 3.76, 7.30, 144.0)),
    Row("azure-llama8b_swa", "Azure conv · llama8b_swa (sliding window) · 5.24 GB · 32,768",
        "azure", "llama8b_swa", 5_242_880_000, 32768, (27, 0.07, 4.47, 138.3)),
    Row("azure-gemma3_12b", "Azure conv · gemma3_12b (sliding window) · 5.24 GB · 16,384",
        "azure", "gemma3_12b", 5_242_880_000, 16384, (69, 50.11, 118.27, 255.8)),
    Row("mooncake-llama31_8b", "Mooncake · llama31_8b · prefix caching · 13.1 GB · 65,536",
        "mooncake", "llama31_8b", 13_107_200_000, 65536, (12, 256.43, 562.81, 742.1)),
)  # fmt: skip


def replay_argv(row: Row, models: Path, limit: int, runs: tuple[str, ...] = RUNS) -> list[str]:
    return ["replay", row.trace, "--offline", "--model", str(models / row.model / "config.json"),
            "--kv-cache-memory-bytes", str(row.kv_bytes), "--max-model-len", str(row.max_model_len),
            *ENGINE, *GROWTH, "--limit", str(limit), "--compare", ",".join(runs), "--json"]  # fmt: skip


def replay(row: Row, argv: list[str]) -> dict[str, dict]:
    done = subprocess.run([sys.executable, "-m", "kvbudget", *argv], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{row.key}: kvbudget replay failed: {done.stderr.strip()}")
    return {r["variant"]: r for r in json.loads(done.stdout)}


def run_row(row: Row, models: Path, limit: int, img_dir: Path | None) -> dict[str, dict]:
    """The row's runs by label (the watermark sweep's too); its plot copied into img_dir."""
    with tempfile.TemporaryDirectory() as report:
        runs = replay(row, [*replay_argv(row, models, limit), "--report", report])
        if img_dir is not None:
            img_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(report) / "replay.png", img_dir / f"replay-compare-{row.key}.png")
    return {**runs, **replay(row, replay_argv(row, models, limit, SWEEP_RUNS))}


def rerun_vllm(row: Row, models: Path, limit: int, venv: Path, peer: Path) -> tuple[int, float, float, float]:
    """vLLM's side of the row through the peer's sim_vllm.py (its JSON summary)."""
    from kvbudget.traces.loaders import resolve_trace_path

    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "vllm.json"
        argv = [str(venv / "bin" / "python"), str(peer / "sim_vllm.py"), "--model", str(models / row.model),
                "--trace", str(resolve_trace_path(row.trace)), "--limit", str(limit),
                "--kv-bytes", str(row.kv_bytes), "--max-model-len", str(row.max_model_len),
                *ENGINE, "--out", str(out)]  # fmt: skip
        if row.trace == "mooncake":
            argv.append("--prefix-caching")
        done = subprocess.run(argv, capture_output=True, text=True, cwd=peer)
        if done.returncode != 0 or not out.exists():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SystemExit(f"{row.key}: sim_vllm.py failed (exit {done.returncode}): {tail}")
        s = json.loads(out.read_text())
    wait = s["waiting_time_s"]
    return (int(s["preemptions"]["total"]), round(wait["p50"], 2), round(wait["p99"], 2), round(s["makespan_s"], 1))


# ---------------------------------------------------------------------- the doc


def cell(preemptions: int, p50: float, p99: float, makespan: float) -> str:
    return f"{preemptions:,} · {p50:,.2f}/{p99:,.2f} · {makespan:,.1f}"


def run_cell(summary: dict) -> str:
    text = cell(summary["preemptions"], summary["wait_p50_s"], summary["wait_p99_s"], summary["makespan_s"])
    # Rejected: could never fit (a prompt past max_model_len, or naive's whole-length charge);
    # vLLM drops the prompts past max_model_len before it starts.
    notes = [f"{summary[k]:,} {k}" for k in ("rejected", "unfinished", "lost") if summary.get(k)]
    return text + (f" ({', '.join(notes)})" if notes else "")


def goal(default: dict, vllm: tuple[int, float, float, float]) -> str:
    """Issue 28's goal for the default policy: preemptions <= 25% of vLLM's, waits and
    makespan no worse. "yes", or what misses."""
    preemptions, p50, p99, makespan = vllm
    misses = []
    if default["preemptions"] > 0.25 * preemptions:
        misses.append(f"preemptions {default['preemptions']:,} > {0.25 * preemptions:g}")
    for name, ours, theirs, digits in (("wait p50", default["wait_p50_s"], p50, 2),
                                       ("wait p99", default["wait_p99_s"], p99, 2),
                                       ("makespan", default["makespan_s"], makespan, 1)):  # fmt: skip
        if round(ours, digits) > theirs:  # (at the precision shown: what the table says)
            misses.append(f"{name} {ours:,.{digits}f} > {theirs:,.{digits}f}")
    return "yes" if not misses else "no: " + "; ".join(misses)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{platform.system()}, {cpu}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}"


def section(results: dict[str, dict[str, dict]], vllm: dict[str, tuple], *, rerun: bool, limit: int,
            command: str) -> str:  # fmt: skip
    source = ("rerun now through the vLLM peer's sim_vllm.py" if rerun
              else "issue 28's, measured with vLLM 0.33.0's scheduler (the peer's sim_vllm.py, CPU)")  # fmt: skip
    if not rerun and limit != 500:
        source += f", for 500 requests: not comparable with these {limit:,}"
    lines = [
        BEGIN,
        "## Against vLLM 0.33's scheduler (issue 28's four rows)",
        "",
        "Regenerate (under a minute here; add `--vllm-venv VENV --peer PEER` to rerun vLLM's side",
        "too, a venv with vllm 0.33.0 and the peer's folder):",
        "",
        "```sh",
        command,
        "```",
        "",
        "MODELS is the vLLM peer's models folder (`llama31_8b/`, `llama8b_swa/`, `gemma3_12b/`,",
        "each a config.json). Every replay is deterministic (seed 0): the same code gives the",
        "same table and plots.",
        "",
        f"Machine: {machine()}.",
        f"vLLM figures: {source}.",
        f"Both sides: first {limit:,} requests, block 16, max_num_seqs 256, max_num_batched_tokens",
        "8,192, step 20 ms + 50 us per prefill token; KVBudget sizes the pool from the same bytes",
        "with vLLM's grouping. `optimistic` is the default policy with the default settings;",
        "`vllm-strict` is optimistic with vLLM's FCFS queue (`backfill_depth=0`, `watermark=0`,",
        "`grow_ahead_blocks=0`), the check that both simulators agree. KVBudget's simulated engine",
        "asks growth as vLLM allocates it, and as the vLLM adapter asks (`--grow-ahead-blocks 0`).",
        "",
        "Each cell: preemptions · wait p50/p99 (s) · makespan (s). Goal (issue 28): the default",
        "policy makes at most 25% of vLLM's preemptions, with waits and makespan no worse.",
        "",
        f"| row | vLLM 0.33 | {' | '.join(COLUMNS)} | default meets the goal |",
        f"|---|---|{'---|' * len(COLUMNS)}---|",
    ]
    for row in ROWS:
        runs = results[row.key]
        cells = " | ".join(run_cell(runs[c]) for c in COLUMNS)
        lines.append(f"| {row.title} | {cell(*vllm[row.key])} | {cells} | {goal(runs['optimistic'], vllm[row.key])} |")
    lines += ["", "The default's watermark (`[admission] watermark`, 1.5% of the pool) against its",
              "neighbours, the rest of the settings the default's:", "",
              f"| row | {' | '.join(f'watermark {w:g}' for w in SWEEP)} | 0.015 (default) |",
              f"|---|{'---|' * (len(SWEEP) + 1)}"]
    for row in ROWS:
        runs = results[row.key]
        cells = " | ".join(run_cell(runs[label.split("=", 1)[0]]) for label in SWEEP_RUNS)
        lines.append(f"| {row.title} | {cells} | {run_cell(runs['optimistic'])} |")
    lines.append("")
    lines += [f"![{row.title}](img/replay-compare-{row.key}.png)" for row in ROWS]
    lines += ["", END]
    return "\n".join(lines) + "\n"


def write_doc(doc: Path, text: str) -> None:
    """The marked section replaced (or, the first time, added before the caveats)."""
    old = doc.read_text(encoding="utf-8") if doc.exists() else ""
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + text.rstrip("\n") + rest.split(END, 1)[1]
    elif "\n## Caveats" in old:
        head, rest = old.split("\n## Caveats", 1)
        new = head + "\n" + text + "\n## Caveats" + rest
    else:
        new = old + ("\n" if old else "") + text
    doc.write_text(new, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, type=Path, help="llama31_8b/, llama8b_swa/, gemma3_12b/ config.json")
    parser.add_argument("--limit", type=int, default=500, help="first N requests of each trace (500)")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "replay-compare.md")
    parser.add_argument("--img-dir", type=Path, default=ROOT / "docs" / "img", help="where the rows' plots go")
    parser.add_argument("--vllm-venv", type=Path, help="a venv with vllm 0.33.0: rerun vLLM's side")
    parser.add_argument("--peer", type=Path, help="the folder holding sim_vllm.py (with --vllm-venv)")
    args = parser.parse_args(argv)
    if (args.vllm_venv is None) != (args.peer is None):
        parser.error("--vllm-venv and --peer go together")
    results, vllm = {}, {}
    for row in ROWS:
        started = time.perf_counter()
        results[row.key] = run_row(row, args.models, args.limit, args.img_dir)
        vllm[row.key] = row.vllm
        if args.vllm_venv is not None:
            vllm[row.key] = rerun_vllm(row, args.models, args.limit, args.vllm_venv, args.peer)
        print(f"{row.key}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    command = ".venv/bin/python bench/replay_compare.py --models MODELS" + ("" if args.limit == 500 else f" --limit {args.limit}")
    write_doc(args.doc, section(results, vllm, rerun=args.vllm_venv is not None, limit=args.limit, command=command))
    print(f"wrote {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
