"""`tierserve serve` options: flags and --config YAML become the engine and server settings."""

import pytest

from tierserve.cli import build_parser
from tierserve.cli.serve import build_configs, merged_options
from tierserve.priority import Priority


def parse(*argv):
    return build_configs(merged_options(build_parser().parse_args(["serve", *argv])))


def test_defaults():
    args, settings = parse()
    assert args.policy.name == "hybrid" and args.model is None
    assert settings.port == 8000 and settings.served_model_names == ("SmolLM2-135M-Instruct",)


def test_flags_reach_every_layer():
    args, settings = parse(
        "--policy",
        "wfq",
        "--max-num-seqs",
        "32",
        "--p1-reserve",
        "0.25",
        "--p0-floor-max",
        "64",
        "--ttft-sla",
        "0.3",
        "4",
        "30",
        "none",
        "--max-queued-requests",
        "1",
        "2",
        "3",
        "4",
        "--rate-limit",
        "100",
        "--burst",
        "500",
        "--p0-rate-reserve",
        "0.25",
        "--no-prefix-caching",
        "--port",
        "9000",
        "--borrowers",
        "p2",
        "p3",
        "--p0-express",
        "decode",
    )
    assert args.policy.name == "wfq" and args.max_num_seqs == 32
    assert args.partitions.p1_reserve == 0.25 and args.partitions.p0_floor_max == 64
    assert args.partitions.borrowers == (Priority.P2, Priority.P3)
    assert args.priorities.ttft_sla_s == (0.3, 4.0, 30.0, None)
    assert args.admission.max_queued_requests == (1, 2, 3, 4)
    assert args.admission.global_bucket.rate == 100 and args.admission.global_bucket.burst == 500
    assert args.admission.p0_rate_reserve == 0.25
    assert not args.enable_prefix_caching and args.p0_express == "decode"
    assert settings.port == 9000


def test_config_file_with_flags_winning(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "policy: drr\nmax_num_seqs: 16\nttft_sla: [0.5, 5, 60, none]\n"
        "max-queued-requests: [5, 6, 7, 8]\nno_aging: true\nport: 8111\n"
    )
    args, settings = parse("--config", str(cfg), "--max-num-seqs", "24")
    assert args.policy.name == "drr" and not args.policy.aging
    assert args.max_num_seqs == 24  # the flag wins
    assert args.priorities.ttft_sla_s == (0.5, 5.0, 60.0, None)
    assert args.admission.max_queued_requests == (5, 6, 7, 8)
    assert settings.port == 8111


def test_bad_config_is_a_clear_error(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max_num_sequences: 16\n")
    with pytest.raises(ValueError, match="'max_num_sequences': not a known field"):
        parse("--config", str(cfg))
    cfg.write_text("max_num_seqs: lots\n")
    with pytest.raises(ValueError, match="max_num_seqs"):
        parse("--config", str(cfg))


def test_chat_template_from_the_flag_or_the_config_file(tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0].content }}")
    _, settings = parse("--chat-template", str(template))
    assert settings.chat_template == str(template)
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(f"chat_template: {template}\n")
    _, settings = parse("--config", str(cfg))
    assert settings.chat_template == str(template)


def test_mmap_threshold_is_opt_in_and_checked(monkeypatch):
    from tierserve import server

    calls = []
    monkeypatch.setattr(server, "fix_mmap_threshold", lambda n: calls.append(n) or True)
    monkeypatch.delenv("TIERSERVE_MMAP_THRESHOLD_MIB", raising=False)
    server._memory_settings()
    assert calls == []  # glibc's defaults unless asked
    monkeypatch.setenv("TIERSERVE_MMAP_THRESHOLD_MIB", "4")
    server._memory_settings()
    assert calls == [4 << 20]
    monkeypatch.setenv("TIERSERVE_MMAP_THRESHOLD_MIB", "4MiB")
    with pytest.raises(SystemExit, match="TIERSERVE_MMAP_THRESHOLD_MIB must be an integer"):
        server._memory_settings()
