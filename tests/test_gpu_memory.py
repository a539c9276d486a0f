"""KV cache sizing by --gpu-memory-utilization (engine/gpu_memory.py): the budget's arithmetic,
and the profiling steps themselves, run here on the CPU (on CUDA their peak is measured)."""

from __future__ import annotations

from tests.test_architectures import save_tiny
from tierserve.engine.gpu_memory import GIB, _profile_steps, kv_budget_bytes
from tierserve.model import registry
from tierserve.model.loader import load_model


def test_the_kv_budget_is_the_share_less_weights_activations_and_the_rest():
    total = 140 * GIB
    eager = kv_budget_bytes(total, 0.9, 16 * GIB, 3 * GIB, GIB, graphs=False)
    assert eager == int(total * 0.9) - 20 * GIB
    graphs = kv_budget_bytes(total, 0.9, 16 * GIB, 3 * GIB, GIB, graphs=True)
    assert graphs == eager - 3 * GIB  # the graphs' own pool
    assert kv_budget_bytes(total, 0.1, 16 * GIB, 3 * GIB, GIB, graphs=False) < 0


def test_the_profiling_steps_run_a_full_prefill_and_the_largest_decode(tmp_path):
    save_tiny(tmp_path, "LlamaForCausalLM")
    loaded = load_model(tmp_path)
    model = registry.build_model(loaded.config, dict(loaded.weights), kernels=False)
    seen = []
    forward = model.forward

    def spy(input_ids, positions, meta, *args, **kw):
        seen.append((input_ids.shape[0], int(positions.max()), getattr(meta, "decode_width", 0)))
        return forward(input_ids, positions, meta, *args, **kw)

    model.forward = spy
    _profile_steps(model, block_size=16, prefill_tokens=100, rows=8, context=200)
    # the whole token budget at once, then every row decoding at the whole context
    assert seen == [(100, 99, 0), (8, 199, 208)]
