"""`kvbudget doctor`'s diagnosis on staged snapshot series (pure functions, no daemon).

Every series is a pool of 1,000 usable blocks sampled 5 times 1 s apart unless a test says
otherwise; shares below are of those 1,000 blocks.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvbudget.cli import doctor, doctor_samples
from kvbudget.cli.main import main
from kvbudget.cli.cmd_doctor import render
from kvbudget.cli.doctor_samples import GpuSample, PlanView, PoolSample, Status, TenantSample, Verdict
from kvbudget.v1 import common_pb2

GiB = 1 << 30
MiB = 1 << 20
H200 = 141 * GiB
BYTES_PER_BLOCK = 2 * MiB
PLAN = PlanView(num_blocks=1000, bytes_per_block=BYTES_PER_BLOCK, block_size=16, max_model_len=32768)


def gpu(used: int) -> GpuSample:
    return GpuSample(present=True, total_bytes=H200, used_bytes=used, pool_bytes=1000 * BYTES_PER_BLOCK)


def series(
    *,
    held: int | list[int],
    reserved: int = 0,
    waiting: int | list[int] = 0,
    running: int = 8,
    admits: list[int] | None = None,
    preemptions: list[int] | None = None,
    used: list[int] | None = None,
    n: int = 5,
    policy: str = "optimistic",
    **extra: object,
) -> list[PoolSample]:
    """n samples; free is derived so free + held = 1000 unless a test overrides it."""
    held_at = held if isinstance(held, list) else [held] * n
    waiting_at = waiting if isinstance(waiting, list) else [waiting] * n
    admits = admits or [100 + 3 * i for i in range(n)]  # a moving queue by default
    preemptions = preemptions or [0] * n
    used = used or [130 * GiB] * n
    disk = {"log_bytes": 1 * GiB, "log_max_bytes": 10 * GiB, "log_disk_free_bytes": 400 * GiB,
            "log_disk_total_bytes": 1000 * GiB}  # a log far from filling its disk
    extra = {**disk, **extra}
    return [
        PoolSample(
            time_s=1000.0 + i,
            policy=policy,
            num_blocks=1000,
            free=1000 - held_at[i],
            held=held_at[i],
            reserved=reserved,
            running=running,
            waiting=waiting_at[i],
            preemptions=preemptions[i],
            admits=admits[i],
            gpu=gpu(used[i]),
            plan=PLAN,
            **extra,  # type: ignore[arg-type]
        )
        for i in range(n)
    ]


def finding(diagnosis: doctor_samples.Diagnosis, check: str) -> doctor_samples.Finding:
    (found,) = [f for f in diagnosis.findings if f.check == check]
    return found


FLAT = [0] * 5


# ------------------------------------------------------------------ the five verdicts


def test_healthy_pool_with_headroom() -> None:
    # 300 held + 50 reserved = 35 % committed, no queue, admissions moving, memory flat
    d = doctor.diagnose(series(held=[280, 290, 300, 295, 300], reserved=50))
    assert d.verdict is Verdict.HEALTHY
    assert d.ok
    assert d.knob == ""
    assert all(f.status in (Status.OK, Status.INFO) for f in d.findings)
    assert d.window_s == 4.0  # 5 samples 1 s apart


def test_budget_bound_queue_with_flat_memory() -> None:
    # held 600 (60 %) + reserved 350 = 950 committed (95 % >= 90 %): blocks are free but promised
    d = doctor.diagnose(series(held=600, reserved=350, waiting=5, admits=[40] * 5, policy="guaranteed"))
    assert d.verdict is Verdict.BUDGET_BOUND
    assert not d.ok
    assert "350 reserved" in d.knob and "max new tokens" in d.knob
    assert finding(d, "gpu memory").status is Status.OK  # flat: the budget is the limit, not memory


def test_pool_bound_when_blocks_are_really_held() -> None:
    # held 960 of 1000 = 96 % >= 90 %, preemptions rising 2 -> 6, a queue of 4
    d = doctor.diagnose(series(held=960, waiting=4, preemptions=[2, 3, 4, 5, 6]))
    assert d.verdict is Verdict.POOL_BOUND
    assert "more memory" in d.knob
    assert finding(d, "preemptions").data == {"preemptions": 4, "admits": 12}  # 6-2, 112-100


def test_stuck_queue_behind_max_model_len_reservations() -> None:
    # naive: 40 held but 900 reserved (22.5x >= 4x); 6 wait for the whole window, 0 admitted,
    # 96 % of the pool physically free
    d = doctor.diagnose(series(held=40, reserved=900, waiting=6, admits=[17] * 5, policy="naive"))
    assert d.verdict is Verdict.STUCK_QUEUE
    reservations = finding(d, "reservations")
    assert reservations.status is Status.WARN
    assert "max_model_len-sized reservations" in reservations.summary
    assert "lower max new tokens" in d.knob and "layer-aware policy" in d.knob
    queue = finding(d, "queue")
    assert queue.status is Status.PROBLEM
    assert "96% of the pool is free" in queue.summary


def test_stuck_queue_without_reservations_is_formula_drift() -> None:
    # 100 held, nothing reserved, 3 waiting all window, nothing admitted: admission refuses
    # what the pool has room for
    d = doctor.diagnose(series(held=100, waiting=3, admits=[9] * 5))
    assert d.verdict is Verdict.STUCK_QUEUE
    assert "formula drift" in d.knob
    assert finding(d, "reservations").status is Status.OK


def test_memory_growing_outside_the_pool() -> None:
    # used climbs 100 -> 104 GiB (+4 GiB > max(256 MiB, 1 % of 141 GiB = 1.41 GiB)), pool fixed
    used = [100 * GiB + i * GiB for i in range(5)]
    d = doctor.diagnose(series(held=960, waiting=4, used=used))
    assert d.verdict is Verdict.MEMORY_GROWING  # wins over pool-bound: the cause comes first
    memory = finding(d, "gpu memory")
    assert memory.status is Status.PROBLEM
    assert memory.data["rise_bytes"] == 4 * GiB
    assert "nvidia-smi" in d.knob


def test_memory_noise_under_the_threshold_is_flat() -> None:
    # +1 GiB on a 141 GiB GPU: under 1 % (1.41 GiB) -> flat
    d = doctor.diagnose(series(held=300, used=[100 * GiB, 100 * GiB, 101 * GiB, 101 * GiB, 101 * GiB]))
    assert finding(d, "gpu memory").status is Status.OK
    assert d.verdict is Verdict.HEALTHY


# ------------------------------------------------------------------ single checks


def test_waiting_but_moving_queue_is_healthy() -> None:
    # a queue of 2 with admissions every sample (100 -> 112) and 40 % held
    d = doctor.diagnose(series(held=400, waiting=2))
    assert d.verdict is Verdict.HEALTHY


def test_queue_that_does_not_move_on_a_half_full_pool_is_pool_bound() -> None:
    # 70 % held, 10 % reserved (80 % committed < 90 %), no admission: the head needs more room
    d = doctor.diagnose(series(held=700, reserved=100, waiting=2, admits=[50] * 5))
    assert d.verdict is Verdict.POOL_BOUND


def test_a_quota_used_up_is_budget_bound_not_formula_drift() -> None:
    # An older daemon (no waiting_by_reason): 10 % held, the queue stuck, the tenant's quota used up.
    tenants = (TenantSample("batch", held=100, reserved=0, quota_blocks=100, waiting=3),)
    d = doctor.diagnose(series(held=100, waiting=3, admits=[5] * 5, tenants=tenants))
    assert d.verdict is Verdict.BUDGET_BOUND
    assert d.knob.startswith("tenant(s) batch at quota: raise [tenants.NAME] max_share")


@pytest.mark.parametrize(("held", "admits"), [(400, [5] * 5), (600, [5] * 5), (600, [5, 6, 7, 8, 9])])
def test_requests_waiting_for_a_quota_with_room_left_are_budget_bound(held: int, admits: list[int]) -> None:
    # The tenant holds 400 of its 499-block quota and the next request needs 200: the daemon
    # says the waiting requests wait for the quota. Counting blocks alone called a 40 %-held
    # pool "formula drift" (switch to optimistic), and a 60 %-held one "pool-bound".
    tenants = (TenantSample("team-a", held=400, reserved=0, quota_blocks=499, waiting=6),)
    d = doctor.diagnose(series(held=held, waiting=6, admits=admits, tenants=tenants,
                               waiting_by_reason={"tenant_quota": 1, "queue_ahead": 5}))
    assert d.verdict is Verdict.BUDGET_BOUND
    assert d.knob.startswith("tenant(s) team-a at quota")
    assert finding(d, "queue").summary == f"6 requests waiting, 1 of them for a tenant quota; {held // 10}% of the pool held"


def test_a_queue_waiting_for_room_is_not_blamed_on_a_quota() -> None:
    # Some wait for the quota, but the head waits for free blocks: the pool is the limit.
    tenants = (TenantSample("team-a", held=400, reserved=0, quota_blocks=499, waiting=2),)
    d = doctor.diagnose(series(held=960, waiting=4, admits=[5] * 5, tenants=tenants,
                               waiting_by_reason={"pool_full": 1, "tenant_quota": 1, "queue_ahead": 2}))
    assert d.verdict is Verdict.POOL_BOUND


def test_draining_daemon_is_not_stuck_and_says_it_drains() -> None:
    d = doctor.diagnose(series(held=100, waiting=3, admits=[5] * 5, draining=True))
    assert d.verdict is not Verdict.STUCK_QUEUE
    draining = finding(d, "draining")
    assert draining.status is Status.WARN
    assert draining.summary == "draining: no new sessions or requests, nothing more admitted; 8 requests still running"


def test_pool_size_against_plan_and_config() -> None:
    samples = series(held=100)
    # kv_cache_memory_bytes 1,000,000,000 // 2,097,152 = 476 blocks (476 x 2 MiB = 998,244,352),
    # 475 of them usable: block 0 is the null block, which the plan does not count
    expected = doctor_samples.expectation_from_config(bytes_per_block=BYTES_PER_BLOCK, kv_cache_memory_bytes=1_000_000_000)
    assert expected is not None and expected.num_blocks == 475
    d = doctor.diagnose(samples, expected)
    size = finding(d, "pool size")
    assert size.status is Status.PROBLEM
    assert "475" in size.summary and "1000" in size.summary
    assert not d.ok  # healthy queue, but a failed check still makes doctor exit 1
    # the plan's 1000 usable blocks are what num_gpu_blocks = 1001 implies (the null block too)
    pinned = doctor_samples.expectation_from_config(bytes_per_block=BYTES_PER_BLOCK, num_gpu_blocks=1001)
    assert finding(doctor.diagnose(samples, pinned), "pool size").status is Status.OK
    assert finding(doctor.diagnose(samples, replace(pinned, num_blocks=1001)), "pool size").status is Status.PROBLEM
    by_bytes = doctor_samples.expectation_from_config(bytes_per_block=BYTES_PER_BLOCK, kv_cache_memory_bytes=1001 * BYTES_PER_BLOCK)
    assert finding(doctor.diagnose(samples, by_bytes), "pool size").status is Status.OK


def test_pool_larger_than_gpu_memory_utilization_allows() -> None:
    # 10 GiB GPU x 0.9 = 9,663,676,416 B, minus 8 GiB weights = 1,073,741,824 B bound;
    # the plan's 1000 x 2 MiB = 2,097,152,000 B exceeds it
    expected = doctor_samples.expectation_from_config(
        bytes_per_block=BYTES_PER_BLOCK, gpu_total_bytes=10 * GiB, gpu_memory_utilization=0.9, weights_bytes=8 * GiB
    )
    assert expected is not None and expected.max_pool_bytes == 1_073_741_824
    assert finding(doctor.diagnose(series(held=1), expected), "pool size").status is Status.PROBLEM


def test_pool_count_differs_from_plan() -> None:
    samples = series(held=100)
    wrong = [
        replace(s, plan=PlanView(2000, BYTES_PER_BLOCK, 16, 32768)) for s in samples
    ]
    assert finding(doctor.diagnose(wrong), "pool size").status is Status.PROBLEM


def test_unbalanced_books_are_a_problem() -> None:
    # 300 held + 690 free = 990: 10 blocks are nowhere
    samples = [replace(s, free=690) for s in series(held=300)]
    accounting = finding(doctor.diagnose(samples), "block accounting")
    assert accounting.status is Status.PROBLEM
    assert accounting.data["unaccounted_blocks"] == 10


def test_running_requests_that_hold_nothing_are_flagged() -> None:
    accounting = finding(doctor.diagnose(series(held=0, running=4)), "block accounting")
    assert accounting.status is Status.WARN


def test_preempt_readmit_loop() -> None:
    # 8 preemptions (2 -> 10) for 8 admissions (50 -> 58) in the window
    d = doctor.diagnose(series(held=500, preemptions=[2, 4, 6, 8, 10], admits=[50, 52, 54, 56, 58]))
    loop = finding(d, "preemptions")
    assert loop.status is Status.WARN
    assert "readmit" in loop.summary


def test_never_fits_rejections() -> None:
    samples = series(held=100)
    samples[-1] = replace(samples[-1], rejections_by_reason={"never_fits": 3})
    assert finding(doctor.diagnose(samples), "rejections").status is Status.WARN


def test_without_a_gpu_memory_is_skipped_and_the_pool_still_judged() -> None:
    no_gpu = GpuSample(present=False, note="no GPU: NVML not available")
    samples = [replace(s, gpu=no_gpu) for s in series(held=600, reserved=350, waiting=5, admits=[1] * 5)]
    d = doctor.diagnose(samples)
    assert finding(d, "gpu memory").status is Status.SKIPPED
    assert "NVML" in finding(d, "gpu memory").summary
    assert d.verdict is Verdict.BUDGET_BOUND


def test_one_sample_cannot_call_a_queue_stuck() -> None:
    (only,) = series(held=40, reserved=900, waiting=6, admits=[17], n=1)
    d = doctor.diagnose([only])
    assert d.verdict is not Verdict.STUCK_QUEUE
    assert finding(d, "trend").status is Status.INFO


def test_no_samples_is_misuse() -> None:
    with pytest.raises(ValueError, match="samples"):
        doctor.diagnose([])


def test_diagnosis_is_json() -> None:
    d = doctor.diagnose(series(held=40, reserved=900, waiting=6, admits=[17] * 5))
    decoded = json.loads(json.dumps(d.as_dict()))
    assert decoded["verdict"] == "stuck queue (formula drift)"
    assert decoded["ok"] is False
    assert {f["check"] for f in decoded["findings"]} >= {"pool size", "gpu memory", "queue"}


# ------------------------------------------------------------------ intake from the proto


def test_sample_from_a_snapshot_message() -> None:
    msg = common_pb2.Snapshot(
        time_unix_s=12.5,
        policy=common_pb2.POLICY_NAIVE,
        num_blocks=1000,
        num_free_blocks=960,
        num_held_blocks=40,
        num_reserved_blocks=900,
        num_running=2,
        num_waiting=6,
        num_preemptions=3,
        decisions_by_kind={"admit": 17, "queue": 6},
        rejections_by_reason={"never_fits": 1},
        waiting_by_reason={"tenant_quota": 2, "queue_ahead": 4},
        gpu=common_pb2.GpuState(present=False, note="no GPU: test"),
        plan=common_pb2.PoolPlan(num_blocks=1000, bytes_per_block=BYTES_PER_BLOCK, block_size_tokens=16,
                                 max_model_len_tokens=32768),
        tenants=[common_pb2.TenantState(tenant="a", blocks_held=40, quota_blocks=500, waiting=6)],
        decision_log=common_pb2.DecisionLogState(rows_written=500, rows_folded=380, stalls=2, stall_s=0.75,
                                                 database_bytes=3000, wal_bytes=1000, max_bytes=10_000,
                                                 disk_free_bytes=70_000, disk_total_bytes=100_000,
                                                 num_unwritten_decisions=7, write_error="disk full"),
        started_unix_s=2.5,
        daemon_version="0.4.0",
    )
    s = doctor_samples.sample_from_snapshot(msg)
    assert (s.log_stalls, s.log_stall_s, s.log_unindexed) == (2, 0.75, 120)
    assert (s.log_unwritten, s.log_write_error) == (7, "disk full")
    assert (s.log_bytes, s.log_max_bytes, s.log_disk_free_bytes, s.log_disk_total_bytes) == (
        4000, 10_000, 70_000, 100_000)  # the log's bytes: database + WAL
    assert (s.policy, s.num_blocks, s.free, s.held, s.reserved) == ("naive", 1000, 960, 40, 900)
    assert (s.running, s.waiting, s.preemptions, s.admits) == (2, 6, 3, 17)
    assert s.plan == PLAN
    assert s.gpu.note == "no GPU: test"
    assert s.tenants == (TenantSample("a", 40, 0, 500, 6),)
    assert s.rejections_by_reason == {"never_fits": 1}
    assert s.waiting_by_reason == {"tenant_quota": 2, "queue_ahead": 4}
    assert (s.daemon_started_s, s.daemon_version) == (2.5, "0.4.0")


def test_the_report_names_the_daemon_and_its_uptime() -> None:
    """Which daemon answered: its version (a host still on the old one after an upgrade)
    and how long it has run (at the last sample, on its own clock)."""
    started = 1000.0 - (2 * 3600 + 13 * 60)  # the series' samples are at t = 1000 .. 1004
    samples = [replace(sample, daemon_started_s=started, daemon_version="0.4.0") for sample in series(held=300)]
    d = doctor.diagnose(samples)
    assert (d.daemon_version, d.daemon_uptime_s) == ("0.4.0", 2 * 3600 + 13 * 60 + 4)
    decoded = json.loads(json.dumps(d.as_dict()))
    assert (decoded["daemon_version"], decoded["daemon_uptime_s"]) == ("0.4.0", 7984.0)
    assert render(d, "unix:///k.sock").splitlines()[0] == (
        "kvbudget doctor: unix:///k.sock (daemon 0.4.0, up 2h13m), 5 samples over 4.0 s"
    )
    # An older daemon says neither: the line is as it was.
    older = doctor.diagnose(series(held=300))
    assert (older.daemon_version, older.daemon_uptime_s) == ("", None)
    assert render(older, "unix:///k.sock").splitlines()[0] == "kvbudget doctor: unix:///k.sock, 5 samples over 4.0 s"


def test_commits_waiting_for_the_log_are_a_finding_of_their_own() -> None:
    # A healthy pool; commits waited 0.2 + 0.3 + 0.5 s in 3 stalls over the 4 s window.
    stalls, stall_s = [4, 5, 5, 6, 7], [1.0, 1.2, 1.2, 1.5, 2.0]
    samples = [replace(sample, log_stalls=stalls[i], log_stall_s=stall_s[i], log_unindexed=131_000)
               for i, sample in enumerate(series(held=300))]
    d = doctor.diagnose(samples)
    found = finding(d, "decision log")
    assert found.status is Status.WARN
    assert found.summary.startswith("commits waited 1.0 s (25% of the window), 3 times, for the decision log's upkeep")
    assert "faster disk for db_path" in found.knob
    assert found.data == {"stalls": 3, "stall_s": 1.0, "rows_unindexed": 131_000}
    assert d.verdict is Verdict.HEALTHY  # the pool is not the limit: the log's finding says what is
    # Stalls before the window only: fine now.
    still = [replace(sample, log_stalls=7, log_stall_s=2.0) for sample in series(held=300)]
    assert finding(doctor.diagnose(still), "decision log").status is Status.OK
    # One sample cannot tell: it says what happened since the start.
    once = finding(doctor.diagnose(still[:1]), "decision log")
    assert once.status is Status.INFO and once.summary.startswith("commits waited 2.0 s, 7 times")


def test_a_log_that_would_fill_its_disk_is_a_warning() -> None:
    def log_disk(**figures: int) -> doctor_samples.Finding:
        return finding(doctor.diagnose(series(held=300, **figures)), "log disk")

    fine = log_disk()  # 1 GiB of a 10 GiB bound, 400 GiB free
    assert fine.status is Status.OK
    assert fine.summary == "decision log 1.00 GiB of its bound 10.00 GiB; 400.00 GiB free on its disk"
    # Room to grow 9 GiB to the bound, 5 GiB free: it will fill the disk first.
    short = log_disk(log_disk_free_bytes=5 * GiB)
    assert short.status is Status.WARN
    assert short.summary == ("the decision log (1.00 GiB) may grow 9.00 GiB more to its bound 10.00 GiB, but its "
                             "disk has 5.00 GiB free: once full, commits fail and engines get UNAVAILABLE")
    assert "retention_max_bytes" in short.knob and "db_path" in short.knob
    assert log_disk(log_disk_free_bytes=9 * GiB + 1).status is Status.OK  # just room enough
    # No size bound: only how full the disk is tells (under 10% free: a warning).
    unbounded = log_disk(log_max_bytes=0, log_disk_free_bytes=50 * GiB)
    assert unbounded.status is Status.WARN
    assert unbounded.summary.startswith("the decision log (1.00 GiB, no size bound) is on a disk 95% full (50.00 GiB free)")
    assert log_disk(log_max_bytes=0, log_disk_free_bytes=101 * GiB).status is Status.OK
    # A daemon that does not report it (older than its DecisionLogState fields): skipped.
    assert log_disk(log_disk_total_bytes=0).status is Status.SKIPPED
    assert doctor.diagnose(series(held=300, log_disk_free_bytes=1 * GiB)).verdict is Verdict.HEALTHY  # pool's fine


def test_a_log_that_cannot_write_is_the_verdict_whatever_the_pool_shows() -> None:
    error = "decisions.db: write failed: database or disk is full"
    # A queue and a pool 95% held would read pool-bound; nothing is admitted while the log
    # cannot write, so that is the cause to name first.
    failing = doctor.diagnose(series(held=950, waiting=12, log_unwritten=40, log_write_error=error,
                                     log_disk_free_bytes=0))
    assert failing.verdict is Verdict.LOG_CANNOT_WRITE
    found = finding(failing, "log disk")
    assert found.status is Status.PROBLEM
    assert found.summary == (f"writes to the decision log fail ({error}): 40 decisions wait to be written, "
                             "and every step is refused (UNAVAILABLE) until they are")
    assert failing.knob == found.knob and "free space on the decision log's disk" in found.knob
    assert not failing.ok
    assert doctor.diagnose(series(held=950, waiting=12)).verdict is Verdict.POOL_BOUND  # the same, writing


def test_snapshot_without_plan() -> None:
    s = doctor_samples.sample_from_snapshot(common_pb2.Snapshot(num_blocks=10, num_free_blocks=10))
    assert s.plan is None
    assert finding(doctor.diagnose([s]), "pool size").status is Status.SKIPPED


# ------------------------------------------------------------------ properties


@given(
    held=st.lists(st.integers(0, 1000), min_size=2, max_size=6),
    reserved=st.integers(0, 1000),
    waiting=st.integers(1, 50),
)
def test_a_queue_that_never_moves_is_never_healthy(held: list[int], reserved: int, waiting: int) -> None:
    n = len(held)
    samples = series(held=held, reserved=min(reserved, 1000 - max(held)), waiting=waiting, admits=[7] * n, n=n)
    assert doctor.diagnose(samples).verdict is not Verdict.HEALTHY


@given(held=st.lists(st.integers(0, 899), min_size=1, max_size=6), reserved=st.integers(0, 100))
def test_no_queue_no_preemption_flat_memory_is_healthy(held: list[int], reserved: int) -> None:
    n = len(held)
    d = doctor.diagnose(series(held=held, reserved=min(reserved, 899 - max(held)), n=n))
    assert d.verdict is Verdict.HEALTHY
    assert d.ok


# ------------------------------------------------------------------ the command


def test_unreachable_daemon_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    target = f"unix://{tmp_path}/nothing.sock"
    assert main(["doctor", "--target", target, "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kvbudget doctor: error: --target {target}: no daemon socket at {tmp_path}/nothing.sock "
        "(is `kvbudget daemon` running?)\n"
    )


def test_a_socket_nobody_listens_on_is_one_line_with_the_status(capsys: pytest.CaptureFixture[str], tmp_path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    path = tmp_path / "stale.sock"
    monkeypatch.setenv("KVBUDGET_TARGET", f"unix:{path}")  # the target may come from the environment
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))  # bound, never listening: connecting is refused
        assert main(["doctor", "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvbudget doctor: error: unix:{path}: UNAVAILABLE: ")
    assert err.count("\n") == 1


def test_bad_sample_count_is_a_cli_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--samples", "0"]) == 2
    assert "--samples" in capsys.readouterr().err


@pytest.mark.parametrize("interval", ["-1", "nan", "inf", "1e9"])
def test_bad_interval_is_a_cli_error(interval: str, capsys: pytest.CaptureFixture[str]) -> None:
    # (inf passed the check and then broke time.sleep with a traceback)
    assert main(["doctor", "--interval", interval]) == 2
    assert capsys.readouterr().err == f"kvbudget doctor: error: --interval must be 0 to 3600 seconds, got {float(interval)}\n"


def test_the_verdict_line_says_why_the_exit_status_is_1_when_healthy() -> None:
    """Nothing limits admission (verdict healthy), yet a check found a problem (a pool of
    2,000 blocks where the plan says 1,000): `ok` is false and the exit status 1, so the
    human report's verdict line says which check, not a bare "healthy"."""
    samples = series(held=100)
    wrong = [replace(s, plan=PlanView(2000, BYTES_PER_BLOCK, 16, 32768)) for s in samples]
    d = doctor.diagnose(wrong)
    assert d.verdict is Verdict.HEALTHY and not d.ok
    verdict_line = [line for line in render(d, "unix:///k.sock").splitlines() if line.startswith("verdict:")]
    assert verdict_line == ["verdict: healthy (nothing limits admission), but 1 check found a problem: pool size (above)"]
    fine = doctor.diagnose(samples)
    assert fine.ok and "verdict: healthy: nothing binds: no queue" in render(fine, "unix:///k.sock").splitlines()


def test_a_queue_waiting_for_free_blocks_under_promises_gets_advice_that_follows() -> None:
    # Issue 32: predictive, 251 waiting "with 51% of the pool held ... waiting for free
    # blocks", then "the pool is really full: give it more memory", while 98% was held or
    # promised. The line says both shares, and the advice names the promises.
    samples = series(held=510, reserved=470, waiting=251, policy="predictive", waiting_by_reason={"pool_full": 251})
    diagnosis = doctor.diagnose(samples)
    queue = finding(diagnosis, "queue")
    assert queue.summary == ("251 requests waiting with 51% of the pool held (mean of 5 samples under pressure) "
                             "and 47% promised (98% in all), waiting for free blocks")
    assert "really full" not in diagnosis.knob
    assert diagnosis.knob.startswith("the pool's free blocks are promised to running requests (470 reserved): "
                                     "reserve less")
    # The verdict line names the limit, the free blocks that ran out and the promises on them.
    assert diagnosis.binds == "pool"
    assert diagnosis.because == ("251 requests waiting (251 for free blocks); 510 of 1000 blocks held now, 51% on "
                                 "the mean; 490 free; 470 of them promised (47% promised on the mean, 98% held "
                                 "or promised)")
