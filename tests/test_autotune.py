"""The step plan: chosen by measurement on this machine, cached per CPU and model, logged, and
never a path slower than the PyTorch reference where it was measured."""

import json
import logging

import pytest
import torch

from tierserve import kernels
from tierserve.executor import autotune
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model.config import ModelConfig
from tierserve.model.models.llama import LlamaForCausalLM
from tierserve.model.plan import NEVER, TORCH_ONLY, StepPlan


def test_choose_takes_the_fastest_path_per_size_and_merges_neighbours():
    timings = {
        1: {"fused": 1.0, "kernel": 2.0, "blas": 3.0, "torch": 4.0},
        4: {"fused": 1.5, "kernel": 2.0, "blas": 3.0, "torch": 4.0},
        16: {"fused": 5.0, "kernel": 2.0, "blas": 3.0, "torch": 4.0},
        512: {"kernel": 9.0, "blas": 3.0, "torch": 4.0},
    }
    plan = autotune.choose(timings)
    assert plan.table == ((10, "fused"), (264, "kernel"), (NEVER, "blas"))
    assert [plan.path(r) for r in (1, 10, 11, 264, 265, 10_000)] == [
        "fused", "fused", "kernel", "kernel", "blas", "blas",
    ]  # fmt: skip
    # where the PyTorch path wins, it is the plan (a CPU whose BLAS beats the kernels)
    slow = {r: {"fused": 9.0, "kernel": 9.0, "blas": 8.0, "torch": 1.0} for r in (1, 512)}
    assert autotune.choose(slow).table == ((NEVER, "torch"),)


def test_fused_is_timed_and_chosen_at_every_size():
    # the fused layer runs every op of a layer in the kernels' own threads: a prompt-sized step
    # may take it too (it used to be capped at 128 rows)
    timings = {64: {"fused": 1.0, "torch": 2.0}, 512: {"fused": 1.0, "kernel": 3.0, "torch": 2.0}}
    plan = autotune.choose(timings)
    assert plan.table == ((NEVER, "fused"),)


def test_plan_rejects_unknown_paths():
    with pytest.raises(ValueError, match="unknown step path"):
        StepPlan(((NEVER, "turbo"),))
    assert "1- rows: torch" in TORCH_ONLY.describe()


def tiny_model(use_kernels: bool, invariant: bool = False) -> LlamaForCausalLM:
    """`invariant` False: measured plans (--batch-invariant off); on, one path for every size."""
    cfg = ModelConfig("llama", 256, 64, 128, 2, 4, 2, 16, tie_word_embeddings=True)
    g = torch.Generator().manual_seed(0)
    w = {"model.embed_tokens.weight": torch.randn(256, 64, generator=g) * 0.1}
    w["model.norm.weight"] = torch.ones(64)
    for i in range(2):
        p = f"model.layers.{i}."
        for name, shape in (
            ("self_attn.q_proj", (64, 64)), ("self_attn.k_proj", (32, 64)),
            ("self_attn.v_proj", (32, 64)), ("self_attn.o_proj", (64, 64)),
            ("mlp.gate_proj", (128, 64)), ("mlp.up_proj", (128, 64)),
            ("mlp.down_proj", (64, 128)),
        ):  # fmt: skip
            w[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.1
        w[p + "input_layernorm.weight"] = torch.ones(64)
        w[p + "post_attention_layernorm.weight"] = torch.ones(64)
    model = LlamaForCausalLM(cfg, w, kernels=use_kernels)
    model.set_batch_invariant(invariant)
    return model


@pytest.mark.skipif(kernels.get() is None, reason="kernels unavailable or turned off")
def test_measured_plan_is_cached_per_machine_and_model_and_logged(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TIERSERVE_AUTOTUNE", raising=False)
    caplog.set_level(logging.INFO, logger="tierserve.executor.autotune")
    ex = TorchExecutor(tiny_model(True), num_blocks=700, block_size=16, measure=True)
    assert ex.plan.source == "measured"
    files = list((tmp_path / "autotune").glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())
    # every measured size has a time for a kernels' path (one more than 8x slower than the
    # best on its untimed first call goes untimed: on a busy machine that can be either), and
    # the plan took the fastest
    for rows, t in saved["timings"].items():
        assert set(t) & {"fused", "kernel"}
        assert all(0 < s < float("inf") for s in t.values())
        assert ex.plan.path(int(rows)) == min(t, key=t.get)
    assert "step plan (measured" in caplog.text
    caplog.clear()
    again = TorchExecutor(tiny_model(True), num_blocks=700, block_size=16, measure=True)
    assert again.plan.table == ex.plan.table and again.plan.source == str(files[0])
    assert "step plan (cached" in caplog.text
    files[0].write_text("{not json")  # a corrupt cache is measured again, with a warning
    third = TorchExecutor(tiny_model(True), num_blocks=700, block_size=16, measure=True)
    assert third.plan.source == "measured" and "unreadable step-plan cache" in caplog.text


def test_batch_invariance_keeps_one_path_for_every_size_and_measures_nothing(tmp_path, monkeypatch):
    """Paths differ in their bits (the fused layer's norms and rotary are not torch's), so a
    plan that switches path with the step size would make a row's result depend on its batch:
    with invariance on (the default) the plan is the default one, and no time is spent on it."""
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TIERSERVE_AUTOTUNE", raising=False)
    model = tiny_model(kernels.get() is not None, invariant=True)
    ex = TorchExecutor(model, num_blocks=700, block_size=16, measure=True)
    assert ex.plan.table == model.default_plan(16).table and len(ex.plan.table) == 1
    assert not (tmp_path / "autotune").exists()


def test_no_kernels_means_the_pytorch_plan_and_no_measurement(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    ex = TorchExecutor(tiny_model(False), num_blocks=700, block_size=16, measure=True)
    assert ex.plan is TORCH_ONLY or ex.plan.table == TORCH_ONLY.table
    assert not (tmp_path / "autotune").exists()


def test_autotune_off_keeps_the_default_plan(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TIERSERVE_AUTOTUNE", "off")
    model = tiny_model(kernels.get() is not None)
    ex = TorchExecutor(model, num_blocks=700, block_size=16, measure=True)
    assert ex.plan.table == model.default_plan(16).table
    assert not (tmp_path / "autotune").exists()


@pytest.mark.skipif(kernels.get() is None, reason="kernels unavailable or turned off")
def test_a_path_slow_only_on_its_first_call_at_a_size_is_timed_warm(monkeypatch):
    """A path's first call at a new step size pays for its scratch buffers. Timed cold, the
    fused layer once measured 24 ms against 12 warm at 4 rows, was dropped as more than 1.5x
    the best, and a path 1.6x slower ran every decode step from 3 rows up. Here "fused" takes
    20 ms on its first call at each size and 2 ms after, "kernel" 4 ms, the BLAS paths 50 ms:
    fused wins every size, and the BLAS paths are not timed again and again. (The times are
    a fake clock's, so that a busy machine cannot reorder them.)"""
    ex = TorchExecutor(tiny_model(True), num_blocks=700, block_size=16, measure=False)
    seen, calls, now = set(), [], [0.0]

    def fake_forward(states, sched, path):
        rows = sum(sched.values())
        calls.append(path)
        if path == "fused":
            cold = (path, rows) not in seen
            seen.add((path, rows))
            now[0] += 0.02 if cold else 0.002
        else:
            now[0] += 0.004 if path == "kernel" else 0.05

    monkeypatch.setattr(ex, "forward", fake_forward)
    timings = autotune.measure(ex, clock=lambda: now[0])
    plan = autotune.choose(timings)
    assert plan.table == ((NEVER, "fused"),), timings
    slow = [p for p in calls if p not in ("fused", "kernel")]
    # each slow path: one warm-up call at the first size, then one cold call per size
    assert len(slow) <= 2 * len({p for p in slow}) * len(timings), calls


@pytest.mark.skipif(kernels.get() is None, reason="kernels unavailable or turned off")
def test_the_plan_cache_key_changes_with_the_paths_on_offer(monkeypatch):
    """A plan measured with the bf16 path on offer is not reused where it is withheld
    (`TIERSERVE_BF16_PATH=off`, float32 products), and the other way round."""
    from tierserve.executor.autotune import plan_key
    from tierserve.model import base

    model = tiny_model(True)
    model.bf16_gemms = True
    ex = TorchExecutor(model, num_blocks=64, block_size=16, measure=False)
    monkeypatch.setattr(base, "amx_available", lambda: True)
    offered = plan_key(ex)
    monkeypatch.setattr(base, "amx_available", lambda: False)
    assert plan_key(ex) != offered
