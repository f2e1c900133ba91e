"""The daemon's TOML config: the shipped example loads, and every mistake names its key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbudget.daemon.core.admission import POLICIES
from kvbudget.daemon.config.listen import MAX_UNIX_ADDRESS_PATH_BYTES, listen_kind, parse_host_port
from kvbudget.daemon.config.loading import load_config
from kvbudget.daemon.config.settings import (
    DEFAULT_DB_PATH,
    DEFAULT_LISTEN,
    KEYS,
    ConfigError,
    DaemonConfig,
    TenantQuota,
)
from kvbudget.daemon.core.records import MAX_TENANT_CHARS
from kvbudget.daemon.config.tokens_file import load_roles

from certificates import make_ca, make_pair

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "kvbudget.toml"
GOOD_TOKEN = "0123456789abcdef"


def write(tmp_path: Path, text: str, name: str = "kvbudget.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ----------------------------------------------------------------------- the example
def test_example_file_loads_with_its_documented_values() -> None:
    config = load_config(EXAMPLE)
    assert config.model == "llama-3.1-8b"
    assert config.block_size is None  # left out: 16, or 64 for an MLA model (hf_config.default_block_size)
    assert config.policy == "optimistic"
    assert config.listen == (DEFAULT_LISTEN,)
    assert config.db_path == DEFAULT_DB_PATH
    assert config.metrics_address == "127.0.0.1:9401"
    assert config.tenants == {
        "interactive": TenantQuota(max_share=0.6, weight=2.0),
        "batch": TenantQuota(max_share=0.4, weight=1.0),
    }
    assert config.retention_s == 30 * 86400.0  # retention_days = 30
    assert config.retention_bytes == 10 * 2**30  # retention_max_bytes = 10_737_418_240


def test_example_documents_every_key() -> None:
    text = EXAMPLE.read_text()
    section = ""
    documented: set[str] = set()
    for line in text.splitlines():
        header = re.match(r"^\[([a-z_.]+)\]", line)
        if header:
            section = header[1]
            continue
        key = re.match(r"^#? ?([a-z_]+) = ", line)
        if key and not section.startswith("tenants"):
            documented.add(f"{section}.{key[1]}")
    assert documented == {f"{key.section}.{key.name}" for key in KEYS}


def test_every_commented_out_key_in_the_example_is_accepted(tmp_path: Path) -> None:
    lines = EXAMPLE.read_text().splitlines()
    commented = [i for i, line in enumerate(lines) if re.match(r"^# [a-z_]+ = ", line)]
    assert len(commented) >= 6  # max_model_len and the five optional [pool] sizes
    for index in commented:
        variant = list(lines)
        variant[index] = variant[index][2:]
        load_config(write(tmp_path, "\n".join(variant)))  # raises if the key were unknown


# ----------------------------------------------------------------------- errors name keys
MODEL = '[model]\nname = "llama-3.1-8b"\n'


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        (MODEL + "[pool]\nfoo = 1\n", "pool.foo", "unknown key 'foo' in [pool]"),
        (MODEL + "[log]\nretention_max_bytes = -1\n", "log.retention_max_bytes", "must be zero or more"),
        (MODEL + "[log]\nretention_max_bytes = 4096\n", "log.retention_max_bytes", "at least 1048576 (1 MiB)"),
        (MODEL + "[log]\nretention_max_bytes = '8 furlongs'\n", "log.retention_max_bytes", "unknown unit 'furlongs'"),
        (MODEL + "[log]\nretention_max_bytes = 1.5\n", "log.retention_max_bytes", "must be a whole number of bytes"),
        (MODEL + "[poool]\ndevice = 'cpu'\n", "poool", "unknown section [poool]"),
        (MODEL + "block_size = '16'\n", "model.block_size", "must be an integer"),
        (MODEL + "block_size = true\n", "model.block_size", "must be an integer"),
        (MODEL + "block_size = 0\n", "model.block_size", "must be positive"),
        (MODEL + "max_model_len = -5\n", "model.max_model_len", "must be positive"),
        (MODEL + "kv_dtype = 'fp6'\n", "model.kv_dtype", "unknown dtype 'fp6'"),
        ("[model]\nkv_dtype = 'fp8'\n", "model.name", "required"),
        ('[model]\nname = "missing/config.json"\n', "model.name", "no such config.json"),
        ('[model]\nname = "llama-9"\n', "model.name", "unknown model 'llama-9': not a preset"),
        (MODEL + "[pool]\ngpu_memory_utilization = 1.5\n", "pool.gpu_memory_utilization", "must be in (0, 1]"),
        (MODEL + "[pool]\ngpu_memory_utilization = 0\n", "pool.gpu_memory_utilization", "must be in (0, 1]"),
        (MODEL + "[pool]\ngpu_memory_utilization = 'high'\n", "pool.gpu_memory_utilization", "must be a number"),
        (MODEL + "[pool]\ndevice = 'tpu'\n", "pool.device", "must be auto, cpu, cuda or cuda:N"),
        (MODEL + "[pool]\nmemory_mode = 'shared'\n", "pool.memory_mode", "must be one of owned, accounting"),
        (MODEL + "[pool]\nkv_cache_memory_bytes = 1000000\nnum_gpu_blocks = 100\n", "pool.num_gpu_blocks",
         "give one memory source, not pool.kv_cache_memory_bytes and pool.num_gpu_blocks"),
        (MODEL + "[pool]\nweights_bytes = -1\n", "pool.weights_bytes", "must be zero or more"),
        (MODEL + "[pool]\nnum_gpu_blocks = 1\n", "pool.num_gpu_blocks", "must be at least 2 (one is the null block), got 1"),
        (MODEL + "[admission]\npolicy = 'greedy'\n", "admission.policy", "unknown policy 'greedy'"),
        (MODEL + "[admission]\nwatermark = 1.0\n", "admission.watermark", "must be in [0, 1)"),
        (MODEL + "[admission]\nenable_prefix_caching = 'yes'\n", "admission.enable_prefix_caching",
         "must be true or false"),
        (MODEL + "[tenants.chat]\nmax_share = 1.5\n", "tenants.chat.max_share", "must be in (0, 1]"),
        (MODEL + "[tenants.chat]\nweight = 0\n", "tenants.chat.weight", "must be positive"),
        (MODEL + "[tenants.chat]\nshare = 0.5\n", "tenants.chat.share", "unknown key 'share' in [tenants.chat]"),
        (MODEL + "[server]\nlisten = []\n", "server.listen", "needs at least one address"),
        (MODEL + "[server]\nlisten = ['tcp://0.0.0.0']\n", "server.listen", "bad address 'tcp://0.0.0.0'"),
        (MODEL + "[server]\nlisten = ['127.0.0.1:99999']\n", "server.listen", "bad address"),
        (MODEL + "[server]\nlisten = ['unix://']\n", "server.listen", "bad address"),
        (MODEL + "[server]\nlisten = ['0.0.0.0:50051']\n", "server.listen", "needs tokens_file or TLS"),
        (MODEL + "[server]\nlisten = ['unix:///a.sock', 'unix:///a.sock']\n", "server.listen", "twice"),
        (MODEL + "[server]\nlisten = [1]\n", "server.listen", "must be a list of strings"),
        (MODEL + "[server]\ntokens_file = '/nonexistent/tokens.toml'\n", "server.tokens_file", "no tokens file at"),
        (MODEL + "[server]\nlease_ttl_s = 0\n", "server.lease_ttl_s", "must be positive"),
        # Engines are told the TTL in whole seconds and heartbeat at a third of it.
        (MODEL + "[server]\nlease_ttl_s = 0.3\n", "server.lease_ttl_s",
         "at least 1 s (engines are told it in whole seconds), got 0.3"),
        (MODEL + "[server]\nwatch_max_hz = -1\n", "server.watch_max_hz", "must be positive"),
        (MODEL + "[server]\nlog_level = 'loud'\n", "server.log_level",
         "must be one of debug, info, warning, error, got 'loud'"),
        (MODEL + "[log]\nretention_days = -1\n", "log.retention_days", "must be zero or more"),
        (MODEL + "[log]\ndb_path = ''\n", "log.db_path", "must not be empty"),
        (MODEL + "[metrics]\naddress = '9400'\n", "metrics.address", "bad address '9400'"),
        (MODEL + "[metrics]\nport = 9400\n", "metrics.port", "unknown key 'port' in [metrics]"),
        (MODEL + "pool = 3\n", "model.pool", "unknown key 'pool' in [model]"),
        ("device = 'cpu'\n", "device", "device: a key outside any section; it belongs under [pool]"),
        (MODEL + "[pool\n", "config", "is not valid TOML"),
        # NaN passed every `<= 0` check (a lease of NaN seconds failed each session at open;
        # max_head_wait_s = nan crashed the daemon at start), and no key means infinity.
        (MODEL + "[server]\nlease_ttl_s = nan\n", "server.lease_ttl_s", "must be a finite number, got nan"),
        (MODEL + "[admission]\nmax_head_wait_s = nan\n", "admission.max_head_wait_s", "must be a finite number"),
        (MODEL + "[log]\nretention_days = inf\n", "log.retention_days", "must be a finite number, got inf"),
        (MODEL + "[server]\nwatch_max_hz = inf\n", "server.watch_max_hz", "must be a finite number"),
        (MODEL + "[tenants.chat]\nweight = nan\n", "tenants.chat.weight", "must be a finite number"),
        (MODEL + "[tenants.chat]\nmax_share = -inf\n", "tenants.chat.max_share", "must be a finite number"),
        (MODEL + '[tenants."(other)"]\nweight = 2.0\n', "tenants.(other)", "'(other)' is reserved"),
        # A key above every [section] is not a section (it was "unknown section [policy]").
        ('policy = "naive"\n' + MODEL, "policy", "policy: a key outside any section; it belongs under [admission]"),
        ('metrics_address = "127.0.0.1:9400"\n' + MODEL, "metrics_address",
         "metrics_address: a key outside any section; it belongs under [metrics], as address"),
        ("weight = 2\n" + MODEL, "weight", "weight: a key outside any section; it belongs under [tenants.NAME]"),
        ("colour = 2\n" + MODEL, "colour", "colour: a key outside any section, and no section has it "
         "(sections: model, pool, parallel, admission, server, log, metrics, tenants)"),
        ("policy = { name = 'naive' }\n" + MODEL, "policy", "policy: unknown section [policy]"),  # (a table)
    ],
)
def test_every_error_names_its_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key
    assert fragment in str(caught.value)
    if key != "config":  # the file, the key, the problem
        assert str(caught.value).startswith(f"{path}: {key}: ")
    else:  # the file itself is the problem
        assert str(caught.value).startswith(f"config file {path} is not valid TOML")


def test_a_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "kvbudget.toml"
    path.write_bytes(MODEL.encode() + b"[pool]\ndevice = '\xff'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == "config"
    assert str(caught.value) == f"config file {path} is not valid TOML: not UTF-8 at byte {len(MODEL) + 17}"


def test_flags_that_are_not_finite_are_named(tmp_path: Path) -> None:
    for field_name, value in (("lease_ttl_s", float("nan")), ("gpu_probe_interval_s", float("inf"))):
        with pytest.raises(ConfigError, match=f"^{field_name}: must be a finite number, got {value}$"):
            load_config(None, {"model": "llama-3.1-8b", field_name: value})


def test_tls_half_configured_names_the_missing_key(tmp_path: Path) -> None:
    cert = write(tmp_path, "CERT", "cert.pem")  # (the files are read before they are parsed)
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, MODEL + f"[server]\ntls_cert_file = '{cert}'\n"))
    assert caught.value.key == "server.tls_key_file"
    assert "tls_cert_file is set but tls_key_file is not" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, MODEL + f"[server]\ntls_key_file = '{cert}'\n"))
    assert caught.value.key == "server.tls_cert_file"
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, MODEL + f"[server]\ntls_cert_file = '{cert}'\ntls_key_file = '{tmp_path}/no.pem'\n"))
    assert caught.value.key == "server.tls_key_file" and "cannot read" in str(caught.value)


def test_a_tls_pair_that_cannot_be_served_is_refused_naming_its_file(tmp_path: Path) -> None:
    cert, _ = make_pair(tmp_path, "a")
    _, other_key = make_pair(tmp_path, "b")
    config = write(tmp_path, MODEL + f"[server]\ntls_cert_file = '{cert}'\ntls_key_file = '{other_key}'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert caught.value.key == "server.tls_key_file"
    assert str(caught.value) == (
        f"{config}: server.tls_key_file: {other_key}: the key does not match the certificate in {cert}")
    config = write(tmp_path, MODEL + f"[server]\ntls_cert_file = '{config}'\ntls_key_file = '{other_key}'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert caught.value.key == "server.tls_cert_file" and "no PEM certificate in it" in str(caught.value)


def _tcp_config(tmp_path: Path, server_keys: str) -> DaemonConfig:
    return load_config(write(tmp_path, MODEL + f"[server]\nlisten = ['127.0.0.1:0', '[::1]:50051']\n{server_keys}\n"))


def test_tcp_is_accepted_with_tokens_or_an_explicit_opt_in(tmp_path: Path) -> None:
    tokens = write(tmp_path, f'engine = ["{GOOD_TOKEN}"]\n', "tokens.toml")
    for extra in (f"tokens_file = '{tokens}'", "allow_insecure_tcp = true"):
        assert _tcp_config(tmp_path, extra).listen == ("127.0.0.1:0", "[::1]:50051")


def test_tcp_is_accepted_with_tls(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "x")  # (a pair that serves: the config checks it)
    config = _tcp_config(tmp_path, f"tls_cert_file = '{cert}'\ntls_key_file = '{key}'")
    assert config.listen == ("127.0.0.1:0", "[::1]:50051") and config.tls_enabled


def test_a_client_ca_needs_tls_and_a_readable_ca_file(tmp_path: Path) -> None:
    cert, key = make_pair(tmp_path, "x")
    ca, _ = make_ca(tmp_path, "ca")
    config = _tcp_config(tmp_path, f"tls_cert_file = '{cert}'\ntls_key_file = '{key}'\ntls_client_ca_file = '{ca}'")
    assert config.tls_client_ca_file == str(ca)
    tokens = write(tmp_path, f'engine = ["{GOOD_TOKEN}"]\n', "tokens.toml")
    with pytest.raises(ConfigError) as caught:  # (tokens let TCP in, but client certificates need TLS)
        _tcp_config(tmp_path, f"tokens_file = '{tokens}'\ntls_client_ca_file = '{ca}'")
    assert caught.value.key == "server.tls_client_ca_file"
    assert "needs tls_cert_file and tls_key_file" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        _tcp_config(tmp_path, f"tls_cert_file = '{cert}'\ntls_key_file = '{key}'\ntls_client_ca_file = '{key}'")
    assert caught.value.key == "server.tls_client_ca_file"
    assert str(caught.value).endswith(f"server.tls_client_ca_file: {key}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)")


def test_check_config_says_how_tcp_callers_get_in(tmp_path: Path) -> None:
    from kvbudget.cli.cmd_daemon import tcp_access

    cert, key = make_pair(tmp_path, "x")
    ca, _ = make_ca(tmp_path, "ca")
    tokens = write(tmp_path, f'engine = ["{GOOD_TOKEN}"]\n', "tokens.toml")
    tls = f"tls_cert_file = '{cert}'\ntls_key_file = '{key}'"
    assert tcp_access(load_config(write(tmp_path, MODEL))) == ""  # the unix socket only
    assert tcp_access(_tcp_config(tmp_path, f"tokens_file = '{tokens}'")) == f", TCP over plaintext, roles from {tokens}"
    assert tcp_access(_tcp_config(tmp_path, tls)) == ", TCP over TLS, every client that reaches it is admin"
    assert tcp_access(_tcp_config(tmp_path, f"{tls}\ntls_client_ca_file = '{ca}'")) == (
        f", TCP over mutual TLS, every client {ca} signed is admin")
    assert tcp_access(_tcp_config(tmp_path, f"{tls}\ntls_client_ca_file = '{ca}'\ntokens_file = '{tokens}'")) == (
        f", TCP over mutual TLS, roles from {tokens}")


def test_a_bad_tokens_file_is_reported_under_tokens_file(tmp_path: Path) -> None:
    tokens = write(tmp_path, 'engine = ["short"]\n', "tokens.toml")
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, MODEL + f"[server]\ntokens_file = '{tokens}'\n"))
    assert caught.value.key == "server.tokens_file"
    assert "engine[0]" in str(caught.value) and "at least 8 characters" in str(caught.value)


# ----------------------------------------------------------------------- overrides
def test_overrides_win_and_none_is_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, MODEL + "block_size = 32\n[admission]\npolicy = 'guaranteed'\n")
    config = load_config(path, {"policy": "naive", "block_size": None, "listen": "unix:///x/k.sock"})
    assert config.policy == "naive"
    assert config.block_size == 32  # None override ignored: the file's value stays
    assert config.listen == ("unix:///x/k.sock",)  # one address as a string


def test_override_errors_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"model": "llama-3.1-8b", "gpu_memory_utilization": 2.0})
    assert caught.value.key == "gpu_memory_utilization"
    assert str(caught.value) == "gpu_memory_utilization: must be in (0, 1], got 2.0"
    with pytest.raises(ConfigError, match="^colour: unknown setting$"):
        load_config(None, {"model": "llama-3.1-8b", "colour": "blue"})
    with pytest.raises(ConfigError, match="^block_size: must be an integer"):
        load_config(None, {"model": "llama-3.1-8b", "block_size": "16"})
    # A value the file set, made invalid by an override elsewhere, names the file's key.
    path = write(tmp_path, MODEL + "[server]\nallow_insecure_tcp = true\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"listen": "0.0.0.0:7777"})
    assert caught.value.key == "server.allow_insecure_tcp" and str(caught.value).startswith(f"{path}: ")


def test_defaults_without_a_file() -> None:
    config = load_config(None, {"model": "llama-3.1-8b"})
    assert config == DaemonConfig(model="llama-3.1-8b")
    assert config.lease_ttl_s == 10.0
    assert config.memory_mode == "owned" and config.device == "auto"
    assert config.retention_rows is None  # retention_max_rows = 0: no cap
    assert config.retention_bytes == 10 * 2**30  # the disk is protected unless told otherwise
    assert load_config(None, {"model": "llama-3.1-8b", "retention_max_bytes": 0}).retention_bytes is None


def test_admission_config_follows_the_file(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MODEL + "max_num_batched_tokens = 2048\n[admission]\n"
                               "policy = 'predictive'\nwatermark = 0.05\nmax_queue_len = 64\n"))
    admission = config.admission_config(max_model_len=8192)
    assert admission.max_model_len == 8192  # not set in the file: the model's
    assert admission.max_num_batched_tokens == 2048
    assert (admission.policy, admission.watermark, admission.max_queue_len) == ("predictive", 0.05, 64)
    assert load_config(None, {"model": "llama-3.1-8b", "max_model_len": 4096}).admission_config(8192).max_model_len == 4096
    assert set(POLICIES) >= {"optimistic", "guaranteed", "predictive", "naive"}


def test_missing_or_unreadable_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^no config file at"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="^the config file's path is empty$"):  # (not "config file . is a directory")
        load_config("")


# ----------------------------------------------------------------------- tokens
def test_load_tokens_maps_token_to_role(tmp_path: Path) -> None:
    path = write(tmp_path, 'engine = ["engine-token-1", "engine-token-2"]\nobserver = ["observer-tok"]\n'
                 'admin = ["admin-token-x"]\n', "tokens.toml")
    assert load_roles(path).tokens == {
        "engine-token-1": "engine",
        "engine-token-2": "engine",
        "observer-tok": "observer",
        "admin-token-x": "admin",
    }


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        (f'root = ["{GOOD_TOKEN}"]\n', "root", "unknown role 'root'"),
        (f'engine = "{GOOD_TOKEN}"\n', "engine", "must be a list of token strings"),
        ('engine = ["abc"]\n', "engine[0]", "at least 8 characters"),
        ('observer = ["has a space in it"]\n', "observer[0]", "without spaces"),
        (f'engine = ["{GOOD_TOKEN}"]\nadmin = ["x{GOOD_TOKEN}", "{GOOD_TOKEN}"]\n', "admin[1]",
         "already listed for role 'engine'"),
        ("engine = [\n", "config", "not valid TOML"),
        # the [certificates] table of client certificate names
        ('certificates = ["vllm-0"]\n', "certificates", "must be a table"),
        ('[certificates]\nroot = ["vllm-0"]\n', "certificates.root", "unknown role 'root'"),
        ('[certificates]\nengine = "vllm-0"\n', "certificates.engine", "must be a list of certificate name strings"),
        ('[certificates]\nengine = [""]\n', "certificates.engine[0]", "must not be empty"),
        ('[certificates]\nengine = ["vllm-0"]\nadmin = ["vllm-0"]\n', "certificates.admin[0]",
         "certificate name already listed for role 'engine'"),
    ],
)
def test_load_tokens_errors(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_roles(write(tmp_path, text, "tokens.toml"))
    assert caught.value.key == key
    assert fragment in str(caught.value)


def test_the_tokens_file_may_name_client_certificates_by_role(tmp_path: Path) -> None:
    path = write(tmp_path, f'engine = ["{GOOD_TOKEN}"]\n[certificates]\nengine = ["vllm-0", "spiffe://gpu/vllm-1"]\n'
                 'observer = ["grafana"]\n', "tokens.toml")
    roles = load_roles(path)
    assert roles.tokens == {GOOD_TOKEN: "engine"}
    assert roles.certificate_names == {"vllm-0": "engine", "spiffe://gpu/vllm-1": "engine", "grafana": "observer"}
    assert load_roles(write(tmp_path, f'admin = ["{GOOD_TOKEN}"]\n', "plain.toml")).certificate_names == {}


def test_certificate_names_need_client_certificates(tmp_path: Path) -> None:
    tokens = write(tmp_path, '[certificates]\nengine = ["vllm-0"]\n', "tokens.toml")
    cert, key = make_pair(tmp_path, "x")
    with pytest.raises(ConfigError) as caught:
        _tcp_config(tmp_path, f"tokens_file = '{tokens}'\ntls_cert_file = '{cert}'\ntls_key_file = '{key}'")
    assert caught.value.key == "server.tokens_file"
    assert "[certificates] names client certificates, but tls_client_ca_file is not set" in str(caught.value)
    ca, _ = make_ca(tmp_path, "ca")
    config = _tcp_config(tmp_path, f"tokens_file = '{tokens}'\ntls_cert_file = '{cert}'\ntls_key_file = '{key}'\n"
                         f"tls_client_ca_file = '{ca}'")
    assert config.tokens_file == str(tokens)


def test_unreadable_tokens_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^no tokens file at"):
        load_roles(tmp_path / "absent.toml")


# ----------------------------------------------------------------------- address helpers
def test_address_parsing() -> None:
    assert parse_host_port("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_host_port("[::1]:0") == ("::1", 0)
    assert parse_host_port("localhost:65535") == ("localhost", 65535)
    assert parse_host_port("localhost:65536") is None
    assert parse_host_port("localhost") is None
    assert listen_kind("unix:///run/kvbudget/kvbudget.sock") == "unix"
    assert listen_kind("unix:relative.sock") == "unix"
    assert listen_kind("unix-abstract:kvbudget") == "unix"
    assert listen_kind("0.0.0.0:50051") == "tcp"
    assert listen_kind("unix:") is None


def test_model_may_be_a_config_json_or_a_folder_holding_one(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    assert load_config(None, {"model": str(folder)}).model == str(folder)
    assert load_config(None, {"model": str(folder / "config.json")}).model == str(folder / "config.json")
    (folder / "config.json").write_text("[1, 2")
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"model": str(folder)})
    assert caught.value.key == "model" and "not valid JSON" in str(caught.value)


def test_insecure_tcp_is_refused_off_loopback(tmp_path: Path) -> None:
    # The opt-in exists for loopback benches; on any other address it would hand engine and
    # admin rights to the network.
    for address in ("0.0.0.0:7777", "10.1.2.3:7777", "[::]:7777", "example.internal:7777"):
        with pytest.raises(ConfigError) as caught:
            load_config(write(tmp_path, MODEL + f"[server]\nlisten = ['{address}']\nallow_insecure_tcp = true\n"))
        assert caught.value.key == "server.allow_insecure_tcp"
        assert "loopback" in str(caught.value)
    config = load_config(write(tmp_path, MODEL + "[server]\nlisten = ['localhost:7777']\nallow_insecure_tcp = true\n"))
    assert config.listen == ("localhost:7777",)


# ----------------------------------------------------------------------- bounds of the wire
def test_counts_past_the_wire_format_are_refused_naming_the_key(tmp_path: Path) -> None:
    """Block counts and the plan's token counts travel as uint32: a larger value passed
    every check (`--check-config` said OK) and then failed start-up with a traceback."""
    largest_blocks = 2**32  # 2**32 - 1 usable, the most a uint32 holds, + the null block
    assert load_config(None, {"model": "llama-3.1-8b", "num_gpu_blocks": largest_blocks}).num_gpu_blocks == largest_blocks
    with pytest.raises(ConfigError) as caught:
        load_config(None, {"model": "llama-3.1-8b", "num_gpu_blocks": largest_blocks + 1})
    assert str(caught.value) == "num_gpu_blocks: must be at most 4294967296, got 4294967297"
    path = write(tmp_path, MODEL + "max_num_batched_tokens = 4294967296\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, {"num_gpu_blocks": 100})
    assert caught.value.key == "model.max_num_batched_tokens"
    assert str(caught.value) == f"{path}: model.max_num_batched_tokens: must be at most 4294967295, got 4294967296"


# ----------------------------------------------------------------------- tenants engines can send
@pytest.mark.parametrize(
    ("header", "key", "why"),
    [
        ('"a\\tb"', 'tenants."a\\tb"', "this one has a character that is not printable"),
        ('"new\\nline"', 'tenants."new\\nline"', "this one has a character that is not printable"),
        ("t" * (MAX_TENANT_CHARS + 1), "tenants." + "t" * (MAX_TENANT_CHARS + 1),
         f"this one has {MAX_TENANT_CHARS + 1}"),
    ],
    ids=["tab", "newline", "too-long"],
)
def test_a_tenant_name_no_engine_can_send_is_refused(tmp_path: Path, header: str, key: str, why: str) -> None:
    """gRPC refuses such a tenant on every request (`tenant: required, printable, at most
    128 characters`): its quota would never apply, and the config said nothing."""
    path = write(tmp_path, MODEL + f"[tenants.{header}]\nmax_share = 0.5\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == key
    assert str(caught.value) == (f"{path}: {key}: no engine can send this tenant: a tenant name is printable and at "
                                 f"most {MAX_TENANT_CHARS} characters ({why})")
    assert "\n" not in str(caught.value)  # one line, whatever the name holds


def test_a_tenant_name_an_engine_can_send_is_accepted_and_flags_are_held_to_the_rule() -> None:
    longest = "t" * MAX_TENANT_CHARS
    config = load_config(None, {"model": "llama-3.1-8b", "tenants": {longest: {"max_share": 0.5}, "équipe b": {}}})
    assert set(config.tenants) == {longest, "équipe b"}
    with pytest.raises(ConfigError) as caught:  # (`--tenant` gives its names here)
        load_config(None, {"model": "llama-3.1-8b", "tenants": {"a\tb": {"max_share": 0.5}}})
    assert str(caught.value).startswith('tenants."a\\tb": no engine can send this tenant')
    with pytest.raises(ConfigError, match="^tenants.x{129}: no engine can send"):  # quotas given as such, too
        load_config(None, {"model": "llama-3.1-8b", "tenants": {"x" * 129: TenantQuota(0.5)}})


# ----------------------------------------------------------------------- unix socket paths gRPC can bind
def test_a_unix_socket_path_too_long_to_bind_is_refused_naming_listen(tmp_path: Path) -> None:
    """gRPC counts what follows "unix:" (so the slashes of unix:///PATH count): the longest it
    binds passes, one byte more is refused at once (it failed the bind, after the pool and
    the log were set up)."""
    def config(address: str) -> DaemonConfig:
        return load_config(None, {"model": "llama-3.1-8b", "listen": address})

    for prefix in ("unix:///", "unix:"):
        longest = prefix + "s" * (len("unix:") + MAX_UNIX_ADDRESS_PATH_BYTES - len(prefix))
        assert config(longest).listen == (longest,)
        with pytest.raises(ConfigError) as caught:
            config(longest + "s")
        assert str(caught.value) == (
            f"listen: {longest}s: the socket path is too long: gRPC takes at most 107 bytes after \"unix:\", this "
            "address has 108; use a shorter path")
    path = write(tmp_path, MODEL + f"[server]\nlisten = ['unix:///{'é' * 60}']\n")  # bytes, not characters
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == "server.listen" and "this address has 123;" in str(caught.value)


# ----------------------------------------------------------------------- tenants: flags over the file
TWO_TENANTS = "[tenants.a]\nmax_share = 0.5\n[tenants.b]\nmax_share = 0.25\nweight = 3.0\n"


def test_a_tenant_flag_overrides_that_tenant_and_keeps_the_others(tmp_path: Path) -> None:
    """`--tenant c=0.1` dropped the file's tenants a and b (their quotas silently gone, at
    start and at every reload); a flag overrides the tenant it names, and what it gives."""
    path = write(tmp_path, MODEL + TWO_TENANTS)
    config = load_config(path, {"tenants": {"c": {"max_share": 0.1}}})
    assert dict(config.tenants) == {"a": TenantQuota(0.5, 1.0), "b": TenantQuota(0.25, 3.0), "c": TenantQuota(0.1, 1.0)}
    # b's share from the flag, its weight (not given) from the file
    config = load_config(path, {"tenants": {"b": {"max_share": 0.1}}})
    assert dict(config.tenants) == {"a": TenantQuota(0.5, 1.0), "b": TenantQuota(0.1, 3.0)}
    config = load_config(path, {"tenants": {"b": {"max_share": 0.1, "weight": 2.0}}})
    assert config.tenants["b"] == TenantQuota(0.1, 2.0)


def test_a_bad_tenant_value_names_where_it_came_from(tmp_path: Path) -> None:
    path = write(tmp_path, MODEL + TWO_TENANTS)
    with pytest.raises(ConfigError) as caught:  # the flag's, not the file's
        load_config(path, {"tenants": {"a": {"max_share": 2.0}}})
    assert str(caught.value) == "tenants.a.max_share: must be in (0, 1], got 2.0"
    bad_file = write(tmp_path, MODEL + "[tenants.a]\nweight = 0\n", name="bad.toml")
    with pytest.raises(ConfigError) as caught:  # the file's, with a good flag beside it
        load_config(bad_file, {"tenants": {"b": {"max_share": 0.5}}})
    assert str(caught.value) == f"{bad_file}: tenants.a.weight: must be positive, got 0.0"
