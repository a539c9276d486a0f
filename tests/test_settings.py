"""A scheduler setting is declared once (config.py: its default, help and check) and reaches
the flag, the config check, the engine's record and the simulator's from there."""

from __future__ import annotations

from dataclasses import fields

import pytest

from tierserve.cli.serve_options import OPTIONS
from tierserve.config import ConfigError, SchedulerConfig
from tierserve.engine.args import EngineArgs
from tierserve.setting import carried, declared
from tierserve.sim.engine.runner import SimConfig, build


def test_a_declared_check_names_the_field_and_its_rule():
    with pytest.raises(ConfigError, match=r"p0_calm_fraction must lie in \(0, 1\].*got 2.0"):
        SchedulerConfig(p0_calm_fraction=2.0)
    with pytest.raises(ConfigError, match="step_time_fraction must lie in"):
        SchedulerConfig(step_time_fraction=True)  # a boolean is not a fraction
    assert SchedulerConfig(step_time_fraction=None).step_time_fraction is None


def test_every_scheduler_flag_takes_its_help_and_default_from_the_declaration():
    names = {f.name for f in fields(SchedulerConfig)}
    scheduler_flags = [o for o in OPTIONS if o.dest and o.dest.removeprefix("engine.") in names]
    declared_help = [o for o in scheduler_flags if declared(SchedulerConfig, o.key)[1].help]
    assert {o.key for o in declared_help} >= {
        "step_time_fraction",
        "p0_step_time_fraction",
        "p0_calm_fraction",
        "p0_cut_in",
    }
    for o in declared_help:
        default, s = declared(SchedulerConfig, o.key)
        shown = {True: "on", False: "off", None: "none"}.get(default, str(default))
        assert o.help.startswith(s.help) and shown in o.help


def test_the_engine_record_carries_every_scheduler_field_it_has_to_the_scheduler():
    shared = {f.name for f in fields(SchedulerConfig)} & {f.name for f in fields(EngineArgs)}
    args = EngineArgs(step_time_fraction=0.2, p0_cut_in=False, p0_calm_fraction=0.05)
    kw = carried(SchedulerConfig, args, max_num_batched_tokens=512, max_model_len=4096)
    assert set(kw) == shared
    config = SchedulerConfig(**kw)
    assert (config.step_time_fraction, config.p0_cut_in, config.p0_calm_fraction) == (
        0.2,
        False,
        0.05,
    )


def test_the_simulator_builds_its_scheduler_from_the_same_fields():
    engine, _, _ = build(SimConfig(step_time_fraction=0.25, p0_calm_fraction=0.1, max_num_seqs=7))
    config = engine.scheduler.config
    assert (config.step_time_fraction, config.p0_calm_fraction, config.max_num_seqs) == (
        0.25,
        0.1,
        7,
    )
