"""A 16-bit KV cache (`--kv-cache-dtype`): the attention kernel reads float16 and bfloat16
caches exactly as the float32 kernel reads their values widened; the fused layer rounds what it
writes as torch's `.to()` does; every step path's logits stay within the cache's rounding of a
float32 cache; an engine fits twice the blocks in the same memory (auto: the model's dtype);
a name it does not know is a clear error."""

import pytest
import torch

from tests.test_model import GREEDY, chat_ids, rel_err, run_path
from tierserve import kernels
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.executor.state import RequestState
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model.attention.base import read_k, tile_k
from tierserve.model.loader import load_model
from tierserve.model.models.llama import LlamaForCausalLM
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

EXT = kernels.get()
needs_kernels = pytest.mark.skipif(EXT is None, reason="kernels unavailable or switched off")
HALF = (torch.float16, torch.bfloat16)


@needs_kernels
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "bs"), [(9, 3, 64, 16), (8, 2, 128, 32), (4, 4, 16, 16)]
)
def test_kernel_reads_a_16bit_cache_as_the_float32_kernel_reads_its_values(
    dtype, heads, kv_heads, dim, bs
):
    """Decodes (on and off block edges), a verification segment, a chunk after a cached prefix
    and a fresh prompt long enough to go by lanes: what the float32 kernel gives on the cache's
    values widened to float32, to the last bits (the two instantiations may fuse a multiply-add
    differently; within one, rows are bit-identical however they are batched: test_kernels)."""
    g = torch.Generator().manual_seed(heads * dim + bs)
    blocks = 48
    kc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    vc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    width = 300 // bs + 1
    tables = torch.randperm(blocks, generator=g)[: 3 * (blocks // 3)]
    tables = tables[: 3 * min(width, blocks // 3)].view(3, -1).int().contiguous()
    cap = tables.shape[1] * bs
    segments = [(0, 1, 0, 1), (1, 1, 1, bs), (2, 1, 2, bs + 1), (3, 5, 0, 33),
                (8, 40, 1, min(150, cap - 40)), (48, 24, 2, 1)]  # fmt: skip
    rows = 72
    q = torch.randn(rows, heads + kv_heads, dim, generator=g)[:, :heads]
    seg = torch.tensor(segments, dtype=torch.int32)
    narrow, wide = torch.zeros(rows, heads, dim), torch.zeros(rows, heads, dim)
    kt = tile_k(kc, EXT.vector_lanes())
    EXT.paged_attention_into(q, kt, vc, tables, seg, dim**-0.5, narrow)
    EXT.paged_attention_into(q, kt.float(), vc.float(), tables, seg, dim**-0.5, wide)
    torch.testing.assert_close(narrow, wide, rtol=1e-6, atol=1e-7)
    assert narrow.abs().sum() > 0


@needs_kernels
def test_kernel_rejects_caches_of_different_or_unknown_dtypes():
    tables = torch.zeros(1, 2, dtype=torch.int32)
    seg = torch.tensor([[0, 1, 0, 5]], dtype=torch.int32)
    q, out = torch.zeros(1, 1, 64), torch.zeros(1, 1, 64)
    k = torch.zeros(1, 4, 16, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="both alike"):
        EXT.paged_attention_into(q, k, k.float(), tables, seg, 0.125, out)
    with pytest.raises(RuntimeError, match="float32, float16 or bfloat16"):
        EXT.paged_attention_into(q, k.double(), k.double(), tables, seg, 0.125, out)


@needs_kernels
@pytest.mark.parametrize("dtype", HALF)
def test_the_fused_layer_rounds_what_it_writes_as_torch_does(dtype):
    """One fused decoder layer (float32 weights) over a fresh 37-token prompt, once into a
    float32 cache and once into a 16-bit one: the 16-bit cache holds exactly the float32
    cache's values rounded by `.to(dtype)` (round to nearest even), every slot the step wrote."""
    g = torch.Generator().manual_seed(5)
    hidden, heads, kvh, d, inter, bs, t = 64, 4, 2, 16, 96, 16, 37

    def w(k, n):
        return EXT.QWeight(0, torch.randn(k, n, generator=g) * 0.2)

    qkv, o = w(hidden, (heads + 2 * kvh) * d), w(heads * d, hidden)
    gate_up, down = w(hidden, 2 * inter), w(inter, hidden)
    ln = torch.rand(hidden, generator=g) + 0.5
    pos = torch.arange(t, dtype=torch.float32)[:, None]
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.cat([pos * inv, pos * inv], dim=1)
    cos, sin = ang.cos().contiguous(), ang.sin()
    sin = torch.cat([-sin[:, : d // 2], sin[:, d // 2 :]], dim=1).contiguous()
    x0 = torch.randn(t, hidden, generator=g) * 3  # values well outside bfloat16's 8 bits
    slots = torch.arange(t, dtype=torch.int64)
    tables = torch.arange(4, dtype=torch.int32).view(1, 4)
    seg = torch.tensor([[0, t, 0, 1]], dtype=torch.int32)
    caches = {}
    for dt in (torch.float32, dtype):
        kc, vc = torch.zeros(kvh, 4, bs, d, dtype=dt), torch.zeros(kvh, 4, bs, d, dtype=dt)
        x = x0.clone()
        EXT.decoder_layer(x, qkv, None, o, gate_up, down, ln, ln, cos, sin, kc, vc, slots,
                          tables, seg, heads, 1e-5)  # fmt: skip
        caches[dt] = (kc, vc, x)
    k32, v32, x32 = caches[torch.float32]
    k16, v16, x16 = caches[dtype]
    written = read_k(k32, slots, EXT.vector_lanes())  # [kvh, t, d]
    assert written.abs().min() > 0  # every slot of the step was written
    assert torch.equal(k16, k32.to(dtype)) and torch.equal(v16, v32.to(dtype))
    assert not torch.equal(k16.float(), k32)  # the rounding happened
    # the layer's output read the rounded cache: close to float32's, not equal
    assert 0 < rel_err(x16, x32) < (1e-2 if dtype == torch.bfloat16 else 2e-3)


@pytest.fixture(scope="module")
def loaded():
    m = load_model()
    m.weights = m.state_dict()
    return m


@pytest.mark.model
def test_every_step_path_with_a_float16_cache_tracks_the_float32_cache(loaded):
    """Fresh prefill, a chunk continuing its own prefix beside a prefill, decodes: the PyTorch
    path, kernel attention op by op and fused layers, each with a float16 cache, give the
    float32-cache logits within float16's rounding, and the same greedy tokens."""
    cfg, tok = loaded.config, loaded.tokenizer
    a = chat_ids(tok, "Name three prime numbers.")
    b = chat_ids(tok, "Why is the sky blue? Be brief.")
    steps = [{"a": len(a) - 4, "b": 9}, {"a": 1, "b": len(b) - 9}] + [{"a": 1, "b": 1}] * 3
    paths = ("torch", "kernel", "fused") if EXT is not None else ("torch",)
    out = {}
    for path in paths:
        for dt in (torch.float32, torch.float16):
            model = LlamaForCausalLM(cfg, dict(loaded.weights), kernels=path != "torch")
            model.kv_dtype = dt
            ex = TorchExecutor(model, num_blocks=16, block_size=16, measure=False)
            assert ex.kv_caches[0][0].dtype == dt
            ex.add_state("a", RequestState(list(a), len(a), list(range(0, 8)), 0, GREEDY))
            ex.add_state("b", RequestState(list(b), len(b), list(range(8, 16)), 0, GREEDY))
            out[path, dt] = run_path(model, ex, steps, path)
    ref = out["torch", torch.float32]
    for path in paths:
        half = out[path, torch.float16]
        err = rel_err(half, ref)
        assert 0 < err < 5e-3, (path, err)
        assert (half.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9, path


def test_an_engine_fits_twice_the_blocks_in_a_16bit_cache_and_auto_is_the_models_dtype():
    sizes = {}
    for name, want in (("auto", torch.float32), ("bf16", torch.bfloat16),
                       ("fp16", torch.float16)):  # fmt: skip
        built = build_engine(
            EngineArgs(kv_cache_gib=0.05, kv_cache_dtype=name, measure_costs=False)
        )
        ex = built.executor
        if ex.model.dtype != torch.float32:
            pytest.skip("the float32 model of the CPU")
        assert all(k.dtype == want and v.dtype == want for k, v in ex.kv_caches)
        sizes[name] = ex.num_blocks
        out = built.engine  # it serves: one greedy request end to end
        req = Request("r", [1, 2, 3, 4, 5], SamplingParams(temperature=0, max_tokens=4))
        out.add_request(req)
        while not req.is_finished:
            out.step()
        assert req.num_output_tokens == 4
    assert sizes["fp16"] == sizes["bf16"]
    assert 2 * sizes["auto"] <= sizes["fp16"] <= 2 * sizes["auto"] + 1


@pytest.mark.parametrize("bad", ["fp8", "float64", "int8", ""])
def test_an_unknown_kv_cache_dtype_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32"):
        EngineArgs(kv_cache_dtype=bad)
