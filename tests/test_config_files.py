"""The tenants file and the `--config` file are validated strictly: a wrong type, a missing
field or a typo is a one-line error naming the file, the tenant (or setting) and the field, and
`tierserve serve` exits with it before loading the model, never with a traceback."""

import subprocess
import sys

import pytest

from tierserve.api.tenancy import TenantRegistry
from tierserve.cli import build_parser
from tierserve.cli.serve import build_configs, merged_options
from tierserve.config_file import ConfigFileError
from tierserve.priority import Priority


def tenants(tmp_path, text):
    path = tmp_path / "tenants.yaml"
    path.write_text(text)
    return path


def test_keys_written_as_a_string_is_an_error_not_one_key_per_character(tmp_path):
    path = tenants(tmp_path, "tenants:\n  acme:\n    keys: sk-abc123\n")
    with pytest.raises(ConfigFileError) as info:
        TenantRegistry.from_yaml(path)
    msg = str(info.value)
    assert str(path) in msg and "'acme'" in msg and "'keys'" in msg and "list" in msg
    assert "sk-abc123" not in msg  # keys are never echoed


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("keys: [k1]\n    rate_limit: {tokens_per_s: 10}", ["'rate_limit.burst'", "missing"]),
        ("keys: [k1]\n    share_prefix_cache: 'false'", ["'share_prefix_cache'", "true or false"]),
        ("keys: [k1]\n    max_teir: batch", ["'max_teir'", "did you mean 'max_tier'"]),
        ("keys: [k1]\n    max_tier: urgent", ["'max_tier'", "realtime"]),
        (
            "keys: [k1]\n    rate_limit: {tokens_per_s: '10', burst: 5}",
            ["'rate_limit.tokens_per_s'"],
        ),
        ("keys: [7]", ["'keys.0'", "string"]),
        ("keys: []", ["'keys'"]),
        ("max_tier: batch", ["'keys'", "missing"]),
    ],
)
def test_bad_tenant_fields_name_the_file_tenant_and_field(tmp_path, spec, needles):
    path = tenants(tmp_path, f"tenants:\n  acme:\n    {spec}\n")
    with pytest.raises(ConfigFileError) as info:
        TenantRegistry.from_yaml(path)
    msg = str(info.value)
    assert str(path) in msg and "'acme'" in msg
    for needle in needles:
        assert needle in msg, msg


def test_a_valid_tenants_file_loads(tmp_path):
    path = tenants(
        tmp_path,
        "tenants:\n"
        "  web:\n    keys: [k-web]\n    max_tier: online\n    default_tier: 2\n"
        "    rate_limit: {tokens_per_s: 100, burst: 400.5}\n    share_prefix_cache: true\n"
        "  rt:\n    keys: [k-rt-1, k-rt-2]\n",
    )
    reg = TenantRegistry.from_yaml(path)
    assert reg.keys == {"k-web": "web", "k-rt-1": "rt", "k-rt-2": "rt"}
    web = reg.tenants["web"]
    assert (web.max_priority, web.default_priority) == (Priority.P1, Priority.P2)
    assert (web.bucket.rate, web.bucket.burst, web.cache_salt) == (100.0, 400.5, None)
    assert reg.tenants["rt"].cache_salt == "rt"
    for bad in ("s", "a", "k", "-"):
        assert bad not in reg.keys


def test_unreadable_or_malformed_files_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigFileError, match="cannot read the tenants file"):
        TenantRegistry.from_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigFileError, match="not valid YAML at line"):
        TenantRegistry.from_yaml(tenants(tmp_path, "tenants:\n  acme: [\n"))
    with pytest.raises(ConfigFileError, match="'tenants'"):
        TenantRegistry.from_yaml(tenants(tmp_path, "tenants: {}\n"))


def parse_config(tmp_path, text, *flags):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(text)
    ns = build_parser().parse_args(["serve", "--config", str(cfg), *flags])
    return build_configs(merged_options(ns))


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("no_aging: 'false'\n", ["'no_aging'", "true or false"]),
        ("max_num_seqs: '16'\n", ["'max_num_seqs'", "integer"]),
        ("max_num_sequences: 16\n", ["'max_num_sequences'", "did you mean 'max_num_seqs'"]),
        ("ttft_sla: [0.5, 5, 60]\n", ["'ttft_sla'", "4 items"]),
        ("drr_weights: 8\n", ["'drr_weights'", "list"]),
        ("max_num_seqs: 8\nmax-num-seqs: 9\n", ["'max_num_seqs'", "twice"]),
        ("- policy\n", ["mapping"]),
    ],
)
def test_bad_config_file_settings_are_named(tmp_path, text, needles):
    with pytest.raises(ConfigFileError) as info:
        parse_config(tmp_path, text)
    msg = str(info.value)
    assert "serve.yaml" in msg
    for needle in needles:
        assert needle in msg, msg


def test_config_switch_false_means_false(tmp_path):
    args, _ = parse_config(tmp_path, "no_aging: false\nno_prefix_caching: true\n")
    assert args.policy.aging and not args.enable_prefix_caching
    args, _ = parse_config(tmp_path, "served_model_name: mine\nborrowers: [p2, p3]\n")
    assert args.partitions.borrowers == (Priority.P2, Priority.P3)


@pytest.mark.parametrize(
    ("flag", "text", "needle"),
    [
        ("--tenants", "tenants:\n  acme:\n    keys: sk-abc123\n", "'keys'"),
        (
            "--tenants",
            "tenants:\n  acme:\n    keys: [k]\n    rate_limit: {tokens_per_s: 1}\n",
            "burst",
        ),
        ("--config", "no_aging: 'false'\n", "'no_aging'"),
        ("--config", "chat_template: 5\n", "'chat_template'"),
        ("--chat-template", "{{ messages }}\n{% for %}\n", "not valid Jinja (line 2)"),
    ],
)
def test_serve_exits_with_a_one_line_error(tmp_path, flag, text, needle):
    path = tmp_path / "file.yaml"
    path.write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", "tierserve", "serve", flag, str(path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("tierserve serve: ") and str(path) in lines[0]
    assert needle in lines[0]
