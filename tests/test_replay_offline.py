"""Offline replay: determinism, the policy comparison on real trace slices, the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kvbudget.cli.main import main
from kvbudget.daemon.config.hf_config import load_model
from kvbudget.traces.loaders import load_trace
from kvbudget.traces.replay import ReplaySetup, run_offline
from kvbudget.traces.report import write_report
from kvbudget.traces.results import SUMMARY_FIELDS, percentile
from kvbudget.traces.sim_engine import EngineConfig

GEMMA = load_model("gemma-3-27b")  # 5 sliding (W=1024) : 1 full, 7 KV-cache groups
LLAMA = load_model("llama-3.1-8b")  # full attention only


def _setup(model, num_blocks: int, max_model_len: int, **kw) -> ReplaySetup:
    engine = EngineConfig(max_model_len=max_model_len, max_num_batched_tokens=2048)
    return ReplaySetup(layout=model.layout, num_blocks=num_blocks, engine=engine, model=model.name, **kw)


def _compare(requests, setup: ReplaySetup, policies: list[str]):
    """Each policy on the same trace and setup, as `kvbudget replay --compare` runs them."""
    return [run_offline(requests, setup, policy) for policy in policies]


def test_percentile_interpolates_like_numpy():
    # numpy.percentile([1, 2, 3, 4], 50) = 2.5; 99th = 3 + 0.97 x (4 - 3) = 3.97
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([], 50) == 0.0


def test_same_seed_same_numbers():
    # Mooncake timestamps come in 3 s buckets; the seed spreads each bucket's requests.
    trace = load_trace("mooncake", limit=40)
    setup = _setup(LLAMA, 6_000, 131_072, spread_s=trace.arrival_quantum_s, seed=7)
    first = run_offline(trace.requests, setup, "optimistic", trace_name=trace.name)
    again = run_offline(trace.requests, setup, "optimistic", trace_name=trace.name)
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_s"}  # noqa: E731
    assert strip(first.summary) == strip(again.summary)
    assert first.samples == again.samples
    assert first.summary["finished"] == 40
    assert first.summary["prefix_hit_ratio"] > 0  # every Mooncake prompt starts with block 0
    other_seed = run_offline(trace.requests, replace(setup, seed=8), "optimistic", trace_name=trace.name)
    assert strip(other_seed.summary) != strip(first.summary)


def test_compare_on_a_sliding_window_preset():
    # Azure prompts (no prefix info), Gemma 3 27B, max_model_len 4096 so `naive` can admit:
    # naive charges every one of the 7 groups for 4096 tokens = 7 x 256 = 1,792 blocks per
    # request, so a 4,000-block pool runs at most 2 requests at once under it, while the
    # layer-aware policies charge a ~1k-token request about 64 blocks per sliding group.
    trace = load_trace("azure", limit=120)
    setup = _setup(GEMMA, 4_000, 4_096)
    results = {r.policy: r.summary for r in _compare(trace.requests, setup, ["naive", "optimistic", "guaranteed", "predictive"])}
    assert results["naive"]["peak_running"] <= 2
    for policy in ("optimistic", "guaranteed", "predictive"):
        assert results[policy]["peak_running"] > results["naive"]["peak_running"]
        assert results[policy]["mean_running"] > results["naive"]["mean_running"]
    assert results["guaranteed"]["preemptions"] == 0
    for summary in results.values():
        assert set(SUMMARY_FIELDS) <= summary.keys()
        assert summary["finished"] + summary["rejected"] == summary["requests"] == 120


def test_report_writes_png_and_json(tmp_path):
    trace = load_trace("azure", limit=30)
    setup = _setup(LLAMA, 2_000, 8_192)
    results = _compare(trace.requests, setup, ["optimistic", "guaranteed"])
    png, data = write_report(results, tmp_path / "out")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    payload = json.loads(data.read_text())
    assert [p["summary"]["policy"] for p in payload] == ["optimistic", "guaranteed"]
    assert payload[0]["samples"][0].keys() == {"time_s", "free_blocks", "running", "waiting", "kv_usage", "preemptions"}


def test_cli_offline_json(capsys):
    code = main([
        "replay", "azure", "--offline", "--model", "llama-3.1-8b", "--num-gpu-blocks", "3000",
        "--limit", "25", "--json",
    ])  # fmt: skip
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 25 and summary["finished"] == 25
    assert summary["policy"] == "optimistic" and summary["mode"] == "offline"
    assert "decisions" not in summary  # counted in live mode only


@pytest.mark.parametrize(
    "argv, message",
    [
        (["replay", "nosuchtrace", "--offline"], "no trace 'nosuchtrace'"),
        (["replay", "azure", "--offline", "--compare", "optimistic,bogus"], "--compare 'bogus': unknown policy bogus"),
        (["replay", "azure", "--offline", "--limit", "0"], "--limit must be >= 1"),
        (["replay", "azure", "--offline", "--model", "no-such-model"], "--model"),
        (["replay", "azure", "--compare", "naive"], "--compare needs --offline"),
        (["replay", "azure", "--offline", "--speed", "2"], "offline runs at full speed"),
        (["replay", "azure", "--offline", "--step-base-ms", "-1"], "--step-base-ms must be >= 0 and finite"),
        (["replay", "azure", "--offline", "--step-base-ms", "inf"], "--step-base-ms must be >= 0 and finite, got 'inf'"),
        (["replay", "azure", "--offline", "--compare", ""], "--compare: no run given"),
        (["replay", "azure", "--offline", "--set", "admission.nope=1"], "expected admission.KEY=VALUE"),
        (["replay", "azure", "--offline", "--set", "admission.policy=naive"], "expected admission.KEY=VALUE"),
        (["replay", "azure", "--offline", "--set", "admission.backfill_depth=x"], "expected an integer"),
        (["replay", "azure", "--offline", "--limit", "3", "--set", "admission.backfill_depth=-1"],
         "--set admission.backfill_depth: backfill_depth: must not be negative"),
        (["replay", "azure", "--offline", "--limit", "3", "--set", "admission.admit_on=later"],
         "--set admission.admit_on: admit_on: must be one of whole_prompt, first_chunk"),
        (["replay", "azure", "--set", "admission.backfill_depth=0"], "offline only"),
    ],
)
def test_cli_bad_input_is_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cli_broken_trace_names_the_line(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n1,ten,1\n")
    assert main(["replay", str(path), "--offline", "--limit", "5"]) == 2
    assert "t.csv:3: prompt_tokens" in capsys.readouterr().err
    assert main(["replay", str(path), "--offline", "--skip-bad-rows", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 1 and summary["skipped_rows"] == 1


def _never_runs(monkeypatch):
    from kvbudget.cli import replay_offline

    monkeypatch.setattr(replay_offline, "run", lambda *a: pytest.fail("the replay ran"))


def test_report_dir_is_checked_before_the_replay(tmp_path, capsys, monkeypatch):
    _never_runs(monkeypatch)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for folder, message in [(a_file, "exists and is not a directory"), (a_file / "out", "Not a directory")]:
        assert main(["replay", "azure", "--offline", "--limit", "3", "--report", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err == f"kvbudget replay: error: --report {folder}: {message}\n"


def test_report_dir_is_made_before_the_replay(tmp_path, capsys, monkeypatch):
    from kvbudget.cli import cmd_replay, replay_offline

    made = tmp_path / "a" / "b"

    def offline(*args):
        assert made.is_dir()  # already there when the replay starts
        raise cmd_replay.CLIError("stop here")

    monkeypatch.setattr(replay_offline, "run", offline)
    assert main(["replay", "azure", "--offline", "--limit", "3", "--report", str(made)]) == 2
    assert capsys.readouterr().err == "kvbudget replay: error: stop here\n"


def test_report_without_matplotlib_is_refused_before_the_replay(tmp_path, capsys, monkeypatch):
    import importlib.util

    _never_runs(monkeypatch)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    assert main(["replay", "azure", "--offline", "--limit", "3", "--report", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        "kvbudget replay: error: --report needs matplotlib: pip install 'kvbudget[plots]'\n"
    )
    assert not (tmp_path / "out").exists()


def test_predictive_preempts_less_than_optimistic_at_comparable_throughput_on_a_window_model():
    # gpt-oss-120b: 18 sliding-window layers (W = 128) + 18 full. Azure prompts (~1k tokens)
    # fit one chunk, so a sliding group holds the whole prompt only while it is prefilled,
    # then the window. Reserving that prefill for the request's life (the worst case at
    # prompt + prediction) ran predictive at ~60% of optimistic's output tokens/s here;
    # reserving what a decoding request holds (fit.FitCheck.expected) runs it within 15%,
    # with fewer preemptions than optimistic, which reserves nothing.
    gpt_oss = load_model("gpt-oss-120b")
    trace = load_trace("azure", limit=1000)
    setup = ReplaySetup(layout=gpt_oss.layout, num_blocks=3000, engine=EngineConfig(max_model_len=16_384),
                        model=gpt_oss.name)  # fmt: skip
    results = {r.policy: r.summary for r in _compare(trace.requests, setup, ["optimistic", "predictive"])}
    optimistic, predictive = results["optimistic"], results["predictive"]
    assert optimistic["finished"] == predictive["finished"] == 1000
    assert predictive["preemptions"] < optimistic["preemptions"]
    assert predictive["output_tokens_per_s"] >= 0.85 * optimistic["output_tokens_per_s"]


def test_grow_ahead_default_depends_on_where_admission_runs() -> None:
    # Live, every ask is a round trip (16 ahead: ~37% fewer calls on Mooncake); offline, blocks
    # asked ahead are blocks other requests cannot have, so the default stays small.
    import argparse

    from kvbudget.cli.replay_flags import grow_ahead_blocks

    assert grow_ahead_blocks(argparse.Namespace(grow_ahead_blocks=None, offline=False)) == 16
    assert grow_ahead_blocks(argparse.Namespace(grow_ahead_blocks=None, offline=True)) == 4
    assert grow_ahead_blocks(argparse.Namespace(grow_ahead_blocks="0", offline=False)) == 0


# ------------------------------------------------------------- traces in any order


def _csv(tmp_path, name: str, rows: str):
    path = tmp_path / name
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return str(path)


def _offline_json(capsys, *argv: str) -> dict:
    assert main(["replay", *argv, "--offline", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_unsorted_trace_is_replayed_in_time_order(tmp_path, capsys):
    # The second row arrives first. Measured from the first row it arrived at -10 s and
    # "waited" 10 s for a run 0.2 s long.
    summary = _offline_json(capsys, _csv(tmp_path, "unsorted.csv", "10,100,10\n0,100,10\n"))
    assert summary["finished"] == 2
    assert summary["wait_p50_s"] < 0.1 and summary["wait_p99_s"] < 0.1
    assert summary["makespan_s"] >= 10.0


def test_cli_unsorted_mooncake_and_azure(tmp_path, capsys):
    mooncake = tmp_path / "mc.jsonl"
    mooncake.write_text(
        '{"timestamp": 9000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
        '{"timestamp": 0, "input_length": 700, "output_length": 6, "hash_ids": [0, 2]}\n'
    )
    azure = tmp_path / "az.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:55.0,374,44\r\n"
                     "2023-11-16 18:15:46.0,396,10")  # fmt: skip
    for path, span in ((mooncake, 9.0), (azure, 9.0)):
        summary = _offline_json(capsys, str(path))
        assert summary["finished"] == 2 and summary["wait_p99_s"] < 0.1
        assert summary["makespan_s"] >= span


def test_cli_default_max_new_tokens_is_the_whole_traces_longest_output(tmp_path, capsys):
    # --limit 1 keeps the 100-token prompt with 10 output tokens; the trace's longest output
    # (2,000, line 3, after the window) is what it asks for, as documented, not the slice's
    # 10: guaranteed reserves 100 + 2,000 tokens = 132 blocks > 99, and rejects it.
    trace = _csv(tmp_path, "t.csv", "0,100,10\n5,100,2000\n")
    argv = (trace, "--limit", "1", "--num-gpu-blocks", "100", "--policy", "guaranteed")
    summary = _offline_json(capsys, *argv)
    assert summary["max_new_tokens"] == 2000 and summary["rejected"] == 1
    # --start too: the window does not change what each request asks for
    assert _offline_json(capsys, trace, "--start", "1")["max_new_tokens"] == 2000
    # given, it is each request's max_tokens (or its output, if longer)
    summary = _offline_json(capsys, *argv, "--max-new-tokens", "64")
    assert summary["max_new_tokens"] == 64 and summary["finished"] == 1


def test_cli_max_new_tokens_help_says_it_is_a_floor(capsys):
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--max-new-tokens N max_tokens each request asks for, or its own output length if longer" in help_text


def test_offline_pool_keeps_the_null_block_like_the_daemon(tmp_path, capsys):
    # A daemon with --num-gpu-blocks 100 hands out 99 (block 0 is the null block) and rejects
    # a 1,590 + 10 token request under guaranteed (100 blocks > 99); the what-if must agree.
    trace = _csv(tmp_path, "one.csv", "0,1590,10\n")
    summary = _offline_json(capsys, trace, "--num-gpu-blocks", "100", "--policy", "guaranteed")
    assert summary["num_blocks"] == 99 and summary["rejected"] == 1
    summary = _offline_json(capsys, trace, "--num-gpu-blocks", "101", "--policy", "guaranteed")
    assert summary["num_blocks"] == 100 and summary["finished"] == 1
    assert main(["replay", trace, "--offline", "--num-gpu-blocks", "1"]) == 2
    err = capsys.readouterr().err
    assert "it needs at least 2 (one is the null block)" in err and err.count("\n") == 1


@pytest.mark.parametrize("flags, named", [
    (["--model", "llama-3.1-8b"], "--model"),
    (["--num-gpu-blocks", "100"], "--num-gpu-blocks"),
    (["--kv-cache-memory-bytes", "1GiB"], "--kv-cache-memory-bytes"),
    (["--block-size", "16"], "--block-size"),
    (["--max-model-len", "4096"], "--max-model-len"),
    (["--no-prefix-caching"], "--no-prefix-caching"),
    (["--max-num-batched-tokens", "2048"], "--max-num-batched-tokens"),
    (["--model", "llama-3.1-8b", "--max-model-len", "4096"], "--model / --max-model-len"),
])  # fmt: skip
def test_offline_only_flags_are_refused_live(flags, named, capsys, monkeypatch):
    # Live, the daemon's plan sets model, pool and limits: such a flag would be ignored (or,
    # --max-model-len, half-applied). Refused before any daemon or trace is touched.
    from kvbudget.cli import cmd_replay

    monkeypatch.setattr(cmd_replay, "_load", lambda args: pytest.fail("the trace was read"))
    assert main(["replay", "azure", "--target", "unix:///nowhere/kvbudget.sock", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbudget replay: error: {named}: offline only;") and err.count("\n") == 1


def test_nothing_to_replay_names_start_only_when_given(tmp_path, capsys):
    header_only = _csv(tmp_path, "h.csv", "")
    assert main(["replay", header_only, "--offline"]) == 2
    err = capsys.readouterr().err
    assert "no requests to replay: the file has a header and no rows" in err
    assert "--start" not in err and "--limit" not in err
    two = _csv(tmp_path, "two.csv", "0,10,1\n1,10,1\n")
    assert main(["replay", two, "--offline", "--start", "2", "--limit", "5"]) == 2
    assert capsys.readouterr().err == f"kvbudget replay: error: --start 2: {two} has only 2 requests\n"
    bad = _csv(tmp_path, "bad.csv", "0,ten,1\n")
    assert main(["replay", bad, "--offline", "--skip-bad-rows"]) == 2
    assert "all 1 rows are malformed (skipped)" in capsys.readouterr().err


def test_gzip_trace_through_the_cli(tmp_path, capsys):
    import gzip

    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"arrival_s,prompt_tokens,output_tokens\n0,100,10\n"))
    assert _offline_json(capsys, str(path))["finished"] == 1


def test_piped_table_is_wide_enough_for_its_labels(tmp_path, capsys, monkeypatch):
    # Not a terminal (captured): 80 columns would cut `output_tokens_per_s` to `output_token…`
    # with four policy columns.
    monkeypatch.delenv("COLUMNS", raising=False)
    trace = _csv(tmp_path, "t.csv", "0,100,10\n")
    assert main(["replay", trace, "--offline", "--compare", "naive,optimistic,guaranteed,predictive"]) == 0
    out = capsys.readouterr().out
    assert "output_tokens_per_s" in out and "predictive" in out and "offline" in out and "…" not in out


def test_cli_table_shows_a_trace_name_that_looks_like_markup_as_it_is(tmp_path, capsys):
    """The table's title is the trace's name: "[b]t" is a file the user named, shown as
    typed, not "t" in bold."""
    path = tmp_path / "[b]t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,1\n1,12,1\n")
    assert main(["replay", str(path), "--offline", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert out.lstrip().startswith("[b]t"), out


def test_live_replay_against_a_port_nobody_serves_says_connection_refused(capsys):
    """No waiting for a daemon that is not there: "Connection refused" at once, as doctor
    and admin say it, not DEADLINE_EXCEEDED after the snapshot's 5 s."""
    import socket

    with socket.socket() as probe:  # a port free a moment ago: nobody listens on it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["replay", "azure", "--target", f"127.0.0.1:{port}", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbudget replay: error: 127.0.0.1:{port}: UNAVAILABLE: ") and "Connection refused" in err
    assert err.count("\n") == 1


def test_admission_settings_offline_as_the_daemon_names_them(capsys):
    """--set takes the daemon's [admission] keys: a strict FCFS queue with no watermark
    and first-chunk admission are other runs than the defaults."""
    argv = ["replay", "azure", "--offline", "--limit", "300", "--kv-cache-memory-bytes", "2GiB",
            "--max-num-batched-tokens", "512", "--json"]  # F 512: prompts longer than a chunk
    runs = {}
    strict = ["--set", "admission.backfill_depth=0", "--set", "admission.watermark=0"]
    for name, extra in (("default", []), ("strict", strict), ("first_chunk", ["--set", "admission.admit_on=first_chunk"])):
        assert main([*argv, *extra]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert all(r["finished"] == 300 for r in runs.values())
    seen = {name: (r["preemptions"], r["wait_p50_s"], r["wait_p99_s"], r["makespan_s"]) for name, r in runs.items()}
    assert len(set(seen.values())) == 3, seen


def test_prefix_hits_count_once_a_request_and_recomputed_prefill_is_reported():
    """A preempted request that comes back finds its own prompt blocks in the cache: that is
    not a prefix hit (vLLM does not count it either), and what it computes again is
    `prefill_tokens_recomputed`."""
    trace = load_trace("mooncake", limit=200)
    setup = _setup(LLAMA, 1_500, 131_072, spread_s=trace.arrival_quantum_s,
                   admission=(("admit_on", "first_chunk"),))  # preempts often on this pool
    busy = run_offline(trace.requests, setup, "optimistic", trace_name=trace.name).summary
    calm = run_offline(trace.requests, replace(setup, num_blocks=400_000), "optimistic", trace_name=trace.name).summary
    assert busy["preemptions"] > 0 and busy["prefill_tokens_recomputed"] > 0
    assert calm["preemptions"] == 0 and calm["prefill_tokens_recomputed"] == 0
    # Each request's prompt is looked up once, whatever its readmissions.
    from kvbudget.daemon.core.admission import AdmissionController
    from kvbudget.traces.replay import ControllerBackend, admission_config
    from kvbudget.traces.simulation import Simulation

    controller = AdmissionController(setup.layout, setup.num_blocks, admission_config(setup, "optimistic"))
    run = Simulation(trace.requests, setup.layout, setup.engine, spread_s=setup.spread_s).run(ControllerBackend(controller))
    assert sum(r.preemptions for r in run.requests) == busy["preemptions"]
    assert all(r.query_blocks == len(r.hashes) for r in run.requests if r.admitted_s is not None)


def test_config_file_admission_settings_offline(tmp_path, capsys):
    """--config FILE takes the daemon's config file: its [admission] settings as --set
    would give them, its policy unless --policy says another, --set over the file."""
    argv = ["replay", "azure", "--offline", "--limit", "200", "--kv-cache-memory-bytes", "2GiB", "--json"]
    config = tmp_path / "kvbudget.toml"
    config.write_text('[admission]\npolicy = "predictive"\nbackfill_depth = 0\nwatermark = 0.0\n'
                      "[tenants.batch]\nmax_share = 0.5\n")  # (no request of it in the trace)
    assert main([*argv, "--config", str(config)]) == 0
    from_file = json.loads(capsys.readouterr().out)
    assert main([*argv, "--policy", "predictive", "--set", "admission.backfill_depth=0",
                 "--set", "admission.watermark=0"]) == 0  # fmt: skip
    from_flags = json.loads(capsys.readouterr().out)
    assert from_file["policy"] == "predictive"
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_s"}  # noqa: E731
    assert strip(from_file) == strip(from_flags)
    # --policy over the file's policy, --set over its keys
    assert main([*argv, "--config", str(config), "--policy", "optimistic", "--set", "admission.backfill_depth=16"]) == 0
    assert json.loads(capsys.readouterr().out)["policy"] == "optimistic"
    config.write_text("[admission]\nbackfill_depth = -1\n")
    assert main([*argv, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "--config" in err and "backfill_depth" in err and err.count("\n") == 1
