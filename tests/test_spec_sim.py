"""Speculative decoding in the simulator: the same scheduler and rule, drafts priced by the cost
model, acceptance a workload parameter. P0 at low load gets a lower TPOT; a full batch keeps its
throughput (the rule stops drafting when the step is compute-bound)."""

from __future__ import annotations

from dataclasses import replace

from tierserve.core.speculation import SpecConfig
from tierserve.sim.engine.runner import SimConfig, run_simulation
from tierserve.workloads.synthetic import WorkloadConfig

BASE = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    max_num_seqs=64,
    max_num_batched_tokens=2048,
    workload=WorkloadConfig(concurrency=2, duration_s=30.0, warmup_s=5.0, seed=4),
)
SPEC = SpecConfig(num_speculative_tokens=4)


def _run(cfg: SimConfig, spec: SpecConfig | None) -> dict:
    return run_simulation(replace(cfg, speculative=spec, spec_acceptance=(0.7,) * 4))


def test_low_load_p0_and_p1_decode_faster_with_drafts():
    light = replace(BASE, workload=replace(BASE.workload, mix=(0.5, 0.5, 0, 0)))
    off, on = _run(light, None), _run(light, SPEC)
    assert on["speculation"]["accepted"][0] > 0
    for c in ("P0", "P1"):
        assert on["classes"][c]["tpot_p50_s"] < 0.75 * off["classes"][c]["tpot_p50_s"], c


def test_a_full_batch_keeps_its_throughput_and_p2_p3_never_draft_beside_others():
    full = replace(BASE, workload=replace(BASE.workload, concurrency=64))
    off, on = _run(full, None), _run(full, SPEC)
    assert on["throughput_tokens_per_s"] >= 0.98 * off["throughput_tokens_per_s"]
    drafted = on["speculation"]["drafted"]  # P2/P3 only while alone (the ramp's first client)
    assert drafted[2] + drafted[3] < 0.01 * (drafted[0] + drafted[1])


def test_simulate_flags_name_bad_values():
    import pytest

    from tierserve.sim.engine.runner import with_speculation

    got = with_speculation([BASE], '{"num_speculative_tokens": 2}', [0.5, 0.6, 0.7, 0.8])
    assert got[0].speculative.num_speculative_tokens == 2
    assert got[0].spec_acceptance == (0.5, 0.6, 0.7, 0.8)
    assert with_speculation([BASE], None, [0.7]) == [BASE]
    with pytest.raises(ValueError, match="spec-acceptance"):
        with_speculation([BASE], "{}", [0.5, 0.5])
    with pytest.raises(ValueError, match="spec-acceptance"):
        with_speculation([BASE], "{}", [1.5])


def test_a_draft_model_config_runs_in_the_simulator_with_the_modelled_acceptance():
    """Nothing is loaded: the simulator prices the drafts and draws their acceptance."""
    from tierserve.sim.engine.runner import with_speculation

    light = replace(BASE, workload=replace(BASE.workload, mix=(1.0, 0, 0, 0), duration_s=10.0))
    raw = '{"method": "draft_model", "model": "/nowhere/draft.gguf"}'
    cfg = with_speculation([light], raw, [0.8])[0]
    assert cfg.speculative.method == "draft_model"
    spec = run_simulation(cfg)["speculation"]
    # per draft 0.8, and drafts after a rejected one are never accepted: ~0.59 per drafted token
    assert 0.45 < spec["accepted"][0] / spec["drafted"][0] < 0.75
