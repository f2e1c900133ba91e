"""deploy/kvbudget@.service, one daemon per engine: systemd accepts an instance of it, its
hardening scores as the plain unit's, it differs from kvbudget.service only where an
instance needs its own files, and the operator's guide's 8-GPU example configs load and
keep each instance in its own socket, log and metrics port.

Like test_systemd_unit.py (whose helpers these tests use), the systemd-analyze checks run
on a copy whose ExecStart names a binary that exists here, and skip without systemd's tools.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_systemd_unit import MAX_EXPOSURE, UNIT, require, unit_settings
from doc_tables import doc_section

from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.pool_setup import setup_pool

TEMPLATE = UNIT.with_name("kvbudget@.service")
TMPFILES = UNIT.with_name("kvbudget.tmpfiles")
GUIDE = UNIT.parent.parent / "docs" / "operators-guide.md"

# Every line where an instance differs from kvbudget.service, as the template must say it.
PER_INSTANCE = {
    "Description": ["KVBudget KV-cache budgeting and admission daemon for engine %i"],
    "Conflicts": ["kvbudget.service"],
    "Environment": [
        "KVBUDGET_CONFIG=/etc/kvbudget/%i.toml",
        "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "HOME=/var/lib/kvbudget/%i",
        "CUDA_CACHE_PATH=/var/cache/kvbudget/%i/cuda",
        "PYTHONUNBUFFERED=1",
    ],
    "EnvironmentFile": ["-/etc/kvbudget/%i.env"],
    "RuntimeDirectory": ["kvbudget/%i"],
    "StateDirectory": ["kvbudget/%i"],
    "CacheDirectory": ["kvbudget/%i"],
    "WorkingDirectory": ["/var/lib/kvbudget/%i"],
    "SyslogIdentifier": ["kvbudget-%i"],
}


def instance_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The template beside its instance `kvbudget@gpu0.service` (what verify is given), with
    only the ExecStart binary swapped for one that exists here."""
    text = TEMPLATE.read_text() if text is None else text
    swapped, count = re.subn(r"^ExecStart=\S+", f"ExecStart={Path(sys.executable).resolve()}", text, flags=re.M)
    assert count == 1
    if not Path("/bin/kill").exists():
        swapped = swapped.replace("ExecReload=/bin/kill", f"ExecReload={Path(sys.executable).resolve()}")
    (tmp_path / TEMPLATE.name).write_text(swapped)
    return tmp_path / "kvbudget@gpu0.service"


def analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    tool = require("systemd-analyze")
    return subprocess.run([tool, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_an_instance_verifies_clean(tmp_path: Path) -> None:
    result = analyze("verify", str(instance_copy(tmp_path)), cwd=tmp_path)
    assert (result.returncode, result.stderr) == (0, "")


def test_verify_reads_the_template_behind_the_instance(tmp_path: Path) -> None:
    """Not vacuous: a bad line in the template is reported when the instance is verified."""
    broken = TEMPLATE.read_text().replace("Type=notify", "Type=notifyy")
    result = analyze("verify", str(instance_copy(tmp_path, broken)), cwd=tmp_path)
    assert "notifyy" in result.stderr


def test_an_instance_scores_as_the_plain_unit(tmp_path: Path) -> None:
    scores = []
    for unit in (instance_copy(tmp_path), None):
        if unit is None:  # the plain unit, the same way
            (tmp_path / UNIT.name).write_text(
                re.sub(r"^ExecStart=\S+", f"ExecStart={Path(sys.executable).resolve()}", UNIT.read_text(), flags=re.M)
            )
            unit = tmp_path / UNIT.name
        result = analyze("security", "--offline=yes", "--no-pager", str(unit), cwd=tmp_path)
        match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
        assert match, result.stdout[-2000:] + result.stderr
        scores.append(float(match.group(1)))
    assert scores[0] == scores[1] <= MAX_EXPOSURE


def test_the_template_is_the_plain_unit_but_for_the_instance_lines() -> None:
    plain = unit_settings(UNIT.read_text())
    template = unit_settings(TEMPLATE.read_text())
    for key in plain.keys() | template.keys():
        if key in PER_INSTANCE:
            assert template[key] == PER_INSTANCE[key], key
        else:
            assert template.get(key) == plain.get(key), key


def test_two_instances_share_no_file() -> None:
    """Every path the template names with %i is one per instance: expanded for two names,
    none is the same, and none is the plain unit's."""
    template = unit_settings(TEMPLATE.read_text())
    plain = unit_settings(UNIT.read_text())
    for key in ("RuntimeDirectory", "StateDirectory", "CacheDirectory", "WorkingDirectory", "EnvironmentFile"):
        value = template[key][0]
        assert "%i" in value, key
        assert value.replace("%i", "a") != value.replace("%i", "b")
        assert value.replace("%i", "a") not in plain.get(key, []), key
    config = [e for e in template["Environment"] if e.startswith("KVBUDGET_CONFIG=")][0]
    assert config.replace("%i", "a") != config.replace("%i", "b")


def test_tmpfiles_covers_each_instances_config_and_env(tmp_path: Path) -> None:
    tmpfiles = require("systemd-tmpfiles")
    sysusers = require("systemd-sysusers")
    (tmp_path / "etc/kvbudget").mkdir(parents=True)
    subprocess.run([sysusers, f"--root={tmp_path}", str(UNIT.with_name("kvbudget.sysusers"))],
                   check=True, capture_output=True)
    files = [tmp_path / "etc/kvbudget" / name for name in ("llama70b-a.toml", "llama70b-a.env")]
    for path in files:
        path.write_text("x\n")
        path.chmod(0o644)
    result = subprocess.run([tmpfiles, f"--root={tmp_path}", "--create", str(TMPFILES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [path.stat().st_mode & 0o777 for path in files] == [0o640, 0o640]


# ------------------------------------------------------------------ the guide's 8-GPU example


def example_configs() -> dict[str, str]:
    """The guide's instance configs, by instance name: each TOML block that starts with
    `# /etc/kvbudget/NAME.toml`."""
    section = doc_section("Several engines on one host", GUIDE)
    blocks = re.findall(r"```toml\n# /etc/kvbudget/([\w.-]+)\.toml\n(.*?)```", section, flags=re.S)
    return {name: body for name, body in blocks}


def test_the_guides_instances_load_with_their_own_socket_log_and_port(tmp_path: Path) -> None:
    examples = example_configs()
    assert sorted(examples) == ["llama70b-a", "llama70b-b"]
    ports = set()
    for name, body in examples.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(body)
        config = load_config(path)  # the daemon's own loader: every key known and valid
        assert config.listen == (f"unix:///run/kvbudget/{name}/kvbudget.sock",)  # its RuntimeDirectory
        assert config.db_path == f"/var/lib/kvbudget/{name}/decisions.db"  # its StateDirectory
        assert (config.memory_mode, config.device, config.tensor_parallel_size) == ("accounting", "cuda:0", 4)
        # 20e9 B per GPU of 80 x 2 x 16 x 2 heads x 128 x 2 B = 1,310,720 B blocks: 15,258
        assert setup_pool(config, gpu=None).num_blocks == 15_258
        ports.add(config.metrics_address)
    assert ports == {"127.0.0.1:9401", "127.0.0.1:9402"}


def test_the_guides_gpu_sets_split_eight_gpus() -> None:
    section = doc_section("Several engines on one host", GUIDE)
    sets = dict(re.findall(r"echo CUDA_VISIBLE_DEVICES=([\d,]+) > /etc/kvbudget/([\w.-]+)\.env", section))
    by_name = {name: gpus for gpus, name in sets.items()}
    assert by_name == {"llama70b-a": "0,1,2,3", "llama70b-b": "4,5,6,7"}
    assert set(by_name) == set(example_configs())
