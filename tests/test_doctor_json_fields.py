"""`kvbudget doctor --json` against its field list in docs/cli-reference.md.

The doc's "`kvbudget doctor --json`" section lists the report's fields (tables whose first
column is `field`), each check's `data` fields (the table whose columns start `check`,
`field`), the verdicts and the values of the reservations check's `cause`. What `--json`
prints is `cmd_doctor.json_report` of `doctor.diagnose`: here on staged snapshot series that
between them reach every verdict, every check and every `data` field (no daemon needed),
then the real command against a real daemon.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvbudget.cli import doctor, doctor_samples
from kvbudget.cli.doctor_reservations import RESERVATION_CAUSES
from kvbudget.cli.cmd_doctor import json_report
from kvbudget.cli.doctor_samples import GpuSample, PlanView, PoolSample, Status, Verdict

import doc_tables
from doc_tables import names

TARGET = "unix:///run/kvbudget/kvbudget.sock"
GiB = 1 << 30
MiB = 1 << 20
BYTES_PER_BLOCK = 2 * MiB
PLAN = PlanView(num_blocks=1000, bytes_per_block=BYTES_PER_BLOCK, block_size=16, max_model_len=32768)
PLAN_2K = PlanView(num_blocks=2000, bytes_per_block=BYTES_PER_BLOCK, block_size=16, max_model_len=2048)


# ------------------------------------------------------------------ the doc


def table_rows(first_headers: tuple[str, ...]) -> list[list[str]]:
    return doc_tables.table_rows(doc_tables.doc_section("`kvbudget doctor --json`"), first_headers)


def doc_report_fields() -> tuple[set[str], set[str]]:
    """(the report's own fields, a finding's fields: `check`, not `findings[].check`)."""
    top, finding = set(), set()
    for row in table_rows(("field",)):
        for name in names(row[0]):
            if name.startswith("findings[]."):
                finding.add(name.removeprefix("findings[]."))
            else:
                top.add(name)
    return top, finding


def doc_data_fields() -> tuple[set[str], set[tuple[str, str]]]:
    """(every check named, every (check, data field) pair)."""
    checks, pairs = set(), set()
    for row in table_rows(("check", "field")):
        (check,) = names(row[0])
        checks.add(check)
        pairs |= {(check, name) for name in names(row[1])}
    return checks, pairs


def doc_values(first_header: str) -> set[str]:
    return {names(row[0])[0] for row in table_rows((first_header,))}


def test_the_doc_lists_fields() -> None:
    top, finding = doc_report_fields()
    checks, pairs = doc_data_fields()
    assert {"verdict", "findings"} <= top and {"check", "data"} <= finding
    assert ("reservations", "cause") in pairs and "queue" in checks


def test_the_doc_lists_every_verdict_and_cause() -> None:
    assert doc_values("verdict") == {v.value for v in Verdict}
    assert doc_values("cause") == set(RESERVATION_CAUSES)


# ------------------------------------------------------------------ staged series


def series(
    *,
    held: int | list[int] = 300,
    reserved: int = 0,
    waiting: int | list[int] = 0,
    running: int = 8,
    admits: list[int] | None = None,
    used: list[int] | None = None,
    n: int = 5,
    policy: str = "optimistic",
    plan: PlanView | None = PLAN,
    gpu_present: bool = True,
    **extra: Any,
) -> list[PoolSample]:
    """n samples 1 s apart of a 1,000-block pool; free + held = 1,000; a log far from
    filling its disk, unless `extra` says otherwise."""
    held_at = held if isinstance(held, list) else [held] * n
    waiting_at = waiting if isinstance(waiting, list) else [waiting] * n
    admits = admits or [100 + 3 * i for i in range(n)]
    used = used or [130 * GiB] * n
    fields = {"log_bytes": GiB, "log_max_bytes": 10 * GiB, "log_disk_free_bytes": 400 * GiB,
              "log_disk_total_bytes": 1000 * GiB, "daemon_started_s": 900.0, "daemon_version": "0.1.0", **extra}
    return [
        PoolSample(
            time_s=1000.0 + i, policy=policy, num_blocks=1000, free=1000 - held_at[i], held=held_at[i],
            reserved=reserved, running=running, waiting=waiting_at[i], preemptions=0, admits=admits[i],
            gpu=GpuSample(present=True, total_bytes=141 * GiB, used_bytes=used[i], pool_bytes=1000 * BYTES_PER_BLOCK)
            if gpu_present else GpuSample(present=False, note="no GPU"),
            plan=plan, **fields,
        )
        for i in range(n)
    ]  # fmt: skip


def one(*, held: int, reserved: int, running: int, policy: str = "guaranteed") -> list[PoolSample]:
    """One snapshot of a 2,000-block pool whose requests are at most 128 blocks."""
    return [PoolSample(time_s=1000.0, policy=policy, num_blocks=2000, free=2000 - held, held=held,
                       reserved=reserved, running=running, waiting=0, preemptions=0, admits=running,
                       plan=PLAN_2K)]  # fmt: skip


FLAT = [100] * 5
CONFIG_BLOCKS = doctor_samples.expectation_from_config(bytes_per_block=BYTES_PER_BLOCK, num_gpu_blocks=1001)
CONFIG_GPU = doctor_samples.expectation_from_config(
    bytes_per_block=BYTES_PER_BLOCK, gpu_total_bytes=141 * GiB, weights_bytes=16 * GiB
)
STAGED: dict[str, tuple[list[PoolSample], doctor_samples.PoolExpectation | None]] = {
    "healthy, config with a block count": (series(), CONFIG_BLOCKS),
    "healthy, config from GPU memory": (series(), CONFIG_GPU),
    # --config worked out from its own model (kvbudget.cli.doctor_config), and one it could not
    "healthy, config of its own model": (series(), replace(CONFIG_BLOCKS, model="llama-3.1-8b", block_size=16,
                                                           bytes_per_block=BYTES_PER_BLOCK)),
    # 32768 tokens in 16-token blocks: 2048 blocks a request, on a 1,000-block pool
    "no request of max_model_len fits": (series(plan=replace(PLAN, blocks_at_max_model_len=2048)), None),
    "config that cannot be worked out": (series(), doctor_samples.PoolExpectation(
        source="", unavailable="kvbudget.toml: no GPU; size the pool with num_gpu_blocks, ...")),
    "pool-bound": (series(held=950, waiting=3), None),
    "budget-bound": (series(held=500, reserved=450, waiting=3), None),
    "budget-bound (tenant quota)": (
        series(held=400, waiting=2, waiting_by_reason={"tenant_quota": 2},
               tenants=(doctor_samples.TenantSample("team-a", held=400, reserved=0, quota_blocks=400, waiting=2),)),
        None,
    ),
    # naive charges max_model_len: cause max_model_len
    "stuck queue": (series(held=20, reserved=730, waiting=1, running=1, admits=FLAT, policy="naive"), None),
    "memory growing": (series(used=[130 * GiB + i * GiB for i in range(5)]), None),
    # a pool over two GPUs (tensor parallel 2): the check's figures per GPU, in `gpus`
    "healthy, two GPUs": (series(gpus=tuple(
        GpuSample(present=True, total_bytes=141 * GiB, used_bytes=130 * GiB, label=f"cuda:{i} (NVML {4 + i})")
        for i in range(2))), None),
    "log cannot write": (series(log_unwritten=5, log_write_error="disk I/O error"), None),
    # one snapshot, draining, no plan, no GPU, no disk figures: the trend and draining findings,
    # pool size and gpu memory and log disk skipped
    "one sample, draining, nothing reported": (
        series(n=1, plan=None, gpu_present=False, draining=True, log_disk_total_bytes=0, log_disk_free_bytes=0,
               log_stalls=2, log_stall_s=0.5, daemon_started_s=0.0, daemon_version=""),
        None,
    ),
    "cause max_new_tokens": (one(held=20, reserved=780, running=20), None),
    "cause unknown": (one(held=90, reserved=1140, running=20), None),
}  # fmt: skip


def report_of(name: str) -> dict[str, Any]:
    samples, expected = STAGED[name]
    # (through json as --json prints it: everything in it must be JSON)
    return json.loads(json.dumps(json_report(doctor.diagnose(samples, expected), TARGET)))


def check_report_shape(report: dict[str, Any]) -> set[tuple[str, str]]:
    """Asserts the report's and its findings' fields are the documented ones; returns its
    (check, data field) pairs."""
    top, finding_fields = doc_report_fields()
    checks, pairs = doc_data_fields()
    assert set(report) == top, f"report fields: {sorted(set(report) ^ top)} differ from the doc"
    statuses = {s.value for s in Status}
    printed = set()
    for finding in report["findings"]:
        assert set(finding) == finding_fields, f"finding fields: {sorted(set(finding) ^ finding_fields)}"
        assert finding["check"] in checks, f"check {finding['check']!r} is not in the doc's data table"
        assert finding["status"] in statuses
        printed |= {(finding["check"], key) for key in finding["data"]}
    undocumented = printed - pairs
    assert not undocumented, f"data fields printed, not in docs/cli-reference.md: {sorted(undocumented)}"
    return printed


@pytest.mark.parametrize("name", list(STAGED))
def test_every_field_of_a_staged_report_is_documented(name: str) -> None:
    check_report_shape(report_of(name))


def test_the_staged_reports_print_exactly_the_documented_fields() -> None:
    reports = {name: report_of(name) for name in STAGED}
    printed: set[tuple[str, str]] = set()
    for report in reports.values():
        printed |= check_report_shape(report)
    checks, pairs = doc_data_fields()
    assert printed == pairs, (
        f"printed, not documented: {sorted(printed - pairs)}; documented, never printed: {sorted(pairs - printed)}"
    )
    assert {f["check"] for r in reports.values() for f in r["findings"]} == checks
    # every verdict, every status and every cause the doc lists is reached
    assert {r["verdict"] for r in reports.values()} == doc_values("verdict")
    assert {f["status"] for r in reports.values() for f in r["findings"]} == {s.value for s in Status}
    causes = {
        f["data"]["cause"] for r in reports.values() for f in r["findings"] if "cause" in f["data"]
    }
    assert causes == doc_values("cause")


def test_nulls_and_empties_are_where_the_doc_says() -> None:
    said = report_of("one sample, draining, nothing reported")
    assert said["daemon_uptime_s"] is None and said["daemon_version"] == ""
    assert {f["check"]: f["data"] for f in said["findings"]}["trend"] == {}
    healthy = report_of("healthy, config with a block count")
    assert healthy["ok"] is True and healthy["knob"] == "" and healthy["verdict"] == "healthy"
    assert healthy["daemon_uptime_s"] == 104.0 and healthy["window_s"] == 4.0
    # the queue finding is left out when the log cannot write or memory grows
    for name in ("log cannot write", "memory growing"):
        assert "queue" not in {f["check"] for f in report_of(name)["findings"]}


# ------------------------------------------------------------------ the real command


@pytest.mark.slow
def test_the_real_command_against_a_daemon_prints_documented_fields(tmp_path: Path) -> None:
    from daemon_harness import DaemonProcess

    # The harness's daemon: llama-3.1-8b, --num-gpu-blocks 65, no engine: healthy.
    config = tmp_path / "kvbudget.toml"
    config.write_text('[model]\nname = "llama-3.1-8b"\n[pool]\nnum_gpu_blocks = 65\n')
    with DaemonProcess(tmp_path) as daemon:
        runs = {
            "one sample, --config": ("--samples", "1", "--config", str(config)),
            "two samples": ("--samples", "2", "--interval", "0.2"),
        }
        reports = {}
        for name, extra in runs.items():
            result = subprocess.run(
                [sys.executable, "-m", "kvbudget", "doctor", "--target", daemon.target, "--json", *extra],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert result.returncode in (0, 1), result.stderr
            reports[name] = json.loads(result.stdout)
    for name, report in reports.items():
        printed = check_report_shape(report)
        assert report["target"] == daemon.target, name
        assert ("pool size", "plan_num_blocks") in printed, name
    by_check = {f["check"]: f for f in reports["one sample, --config"]["findings"]}
    assert by_check["pool size"]["data"]["config_num_blocks"] == 64  # 65: 64 usable + the null block
    assert "trend" in by_check
