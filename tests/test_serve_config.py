"""One table (serve_options.OPTIONS) generates `tierserve serve`'s flags and the `--config` file
schema, and fills one frozen tree (serve_config.ServeConfig); the device-dependent defaults are
resolved in one function (engine.args.resolve_defaults)."""

import argparse
import dataclasses

import pytest

from tierserve.cli import build_parser
from tierserve.cli.serve import CLI_ONLY, ServeConfigFile, build_configs, merged_options
from tierserve.cli.serve_config import ServeConfig, build_serve_config, destination_exists
from tierserve.cli.serve_options import OPTIONS
from tierserve.config_file import ConfigFileError
from tierserve.engine.args import DEVICE_DEFAULTS, EngineArgs, resolve_defaults
from tierserve.priority import Priority


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def parser_keys() -> set[str]:
    return {a.dest for a in serve_parser()._actions if a.dest != "help"}


def test_every_flag_is_a_file_key_and_every_file_key_a_flag():
    flags, keys = parser_keys(), set(ServeConfigFile.model_fields)
    assert flags - keys == set(CLI_ONLY)
    assert keys - flags == set()
    assert {o.key for o in OPTIONS} <= flags  # the table is the parser's source


def test_every_destination_is_a_field_of_the_tree():
    dests = [o.dest for o in OPTIONS if o.dest is not None]
    assert len(dests) == len(set(dests)), "two options fill the same field"
    missing = [d for d in dests if not destination_exists(d)]
    assert missing == []
    assert not destination_exists("engine.policy.no_such_field")
    assert not destination_exists("engine.max_num_seqs.deeper")
    assert destination_exists("engine.admission.global_bucket.burst")


def test_a_config_file_and_the_same_flags_build_the_same_settings(tmp_path):
    flags = [
        "--max-num-batched-tokens", "300", "--drr-weights", "4", "3", "2", "1",
        "--rate-limit", "50", "--no-aging", "--step-time-fraction", "none",
        "--borrowers", "p2", "--sla-admission", "on", "--port", "9123",
    ]  # fmt: skip
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        "max_num_batched_tokens: 300\ndrr_weights: [4, 3, 2, 1]\nrate_limit: 50\n"
        "no_aging: true\nstep_time_fraction: none\nborrowers: p2\nsla_admission: on\n"
        "port: 9123\n"
    )
    parser = build_parser()
    from_flags = build_configs(merged_options(parser.parse_args(["serve", *flags])))
    from_file = build_configs(merged_options(parser.parse_args(["serve", "--config", str(cfg)])))
    assert from_flags == from_file
    args, settings = from_flags
    assert args.max_num_batched_tokens == 300 and args.step_time_fraction is None
    assert args.policy.drr_weights == (4.0, 3.0, 2.0, 1.0) and not args.policy.aging
    assert (args.admission.global_bucket.rate, args.admission.global_bucket.burst) == (50, 50)
    assert args.partitions.borrowers == (Priority.P2,) and args.admission.sla_admission
    assert settings.port == 9123


def test_the_tree_holds_engine_server_and_cluster():
    parser = build_parser()
    tree = build_serve_config(merged_options(parser.parse_args(["serve", "--max-num-seqs", "8"])))
    assert isinstance(tree, ServeConfig) and tree.cluster is None
    assert tree.engine.max_num_seqs == 8 and tree.server.port == 8000
    with pytest.raises(dataclasses.FrozenInstanceError):
        tree.engine = EngineArgs()  # type: ignore[misc]
    argv = ["serve", "--replicas", "3", "--router", "least-loaded"]
    tree = build_serve_config(merged_options(parser.parse_args(argv)))
    assert (tree.cluster.replicas, tree.cluster.router) == (3, "least-loaded")


def test_device_defaults_are_resolved_in_one_function():
    cpu, cuda = resolve_defaults(EngineArgs(), "cpu"), resolve_defaults(EngineArgs(), "cuda:1")
    assert (cpu.dtype, cpu.max_num_batched_tokens, cpu.swap_space_gib, cpu.p0_express) == (
        "float32",
        512,
        0.0,
        "exclusive",
    )
    assert (cuda.dtype, cuda.max_num_batched_tokens, cuda.swap_space_gib, cuda.p0_express) == (
        "bfloat16",
        2048,
        4.0,
        "decode",
    )
    given = EngineArgs(dtype="float16", max_num_batched_tokens=100, swap_space_gib=1.0)
    kept = resolve_defaults(given, "cuda")
    assert (kept.dtype, kept.max_num_batched_tokens, kept.swap_space_gib) == ("float16", 100, 1.0)
    assert kept.p0_express == "decode"
    for name in DEVICE_DEFAULTS:  # each is a None-by-default EngineArgs field
        assert getattr(EngineArgs(), name) is None


def test_an_unknown_config_key_is_refused_by_name(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max_num_batched_token: 300\n")
    argv = ["serve", "--config", str(cfg)]
    with pytest.raises(ConfigFileError) as info:
        merged_options(build_parser().parse_args(argv))
    msg = str(info.value)
    assert "'max_num_batched_token'" in msg and "did you mean 'max_num_batched_tokens'" in msg
