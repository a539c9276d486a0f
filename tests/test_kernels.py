"""The compiled CPU kernels against the PyTorch reference: GEMM, paged attention straight from
the cache (random block tables, lengths, grouped-query layouts, prefill segments), and the
sampler's Gumbel-max draw. Whole-model parity is in test_model.py."""

import itertools

import pytest
import torch

from tierserve import kernels
from tierserve.model.attention.base import tile_k

if kernels.mode() == "off":
    pytest.skip("TIERSERVE_KERNELS=off", allow_module_level=True)
EXT = kernels.get()
LANES = EXT.vector_lanes() if EXT is not None else 16


def test_kernels_load_when_not_switched_off():
    # make setup builds them; a CI machine without them would silently lose the fast path.
    assert EXT is not None
    assert EXT.vector_lanes() in (4, 8, 16)


@pytest.mark.parametrize(
    ("m", "k", "n"),
    [(1, 576, 960), (2, 64, 96), (3, 576, 576), (5, 1536, 576), (7, 100, 70), (32, 576, 3072),
     (97, 64, 130), (200, 48, 64)],
)  # fmt: skip
def test_linear_matches_addmm_with_bias_and_residual(m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + n)
    a, w = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
    bias, res = torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    out = torch.empty(m, n)
    EXT.linear_into(a, w, bias, out, False)
    torch.testing.assert_close(out, torch.addmm(bias, a, w), rtol=1e-5, atol=1e-4)
    acc = res.clone()
    EXT.linear_into(a, w, None, acc, True)
    torch.testing.assert_close(acc, res + a @ w, rtol=1e-5, atol=1e-4)
    # Strided rows (a view into a wider tensor), as the model passes SiLU(gate) * up.
    wide = torch.randn(m, 2 * k, generator=g)
    EXT.linear_into(wide[:, :k], w, None, out, False)
    torch.testing.assert_close(out, wide[:, :k] @ w, rtol=1e-5, atol=1e-4)


def test_linear_rows_do_not_depend_on_the_batch():
    """Each output is one FMA chain in k order: a row's result is bit-identical whatever else
    is in the batch (so batching cannot flip a greedy token)."""
    g = torch.Generator().manual_seed(1)
    a, w = torch.randn(40, 576, generator=g), torch.randn(576, 960, generator=g)
    full = torch.empty(40, 960)
    EXT.linear_into(a, w, None, full, False)
    for rows in (slice(0, 1), slice(3, 5), slice(7, 20), slice(11, 40)):
        part = torch.empty(rows.stop - rows.start, 960)
        EXT.linear_into(a[rows], w, None, part, False)
        assert torch.equal(part, full[rows])


def test_linear_rejects_bad_shapes():
    with pytest.raises(RuntimeError, match="weight has"):
        EXT.linear_into(torch.randn(2, 8), torch.randn(9, 4), None, torch.empty(2, 4), False)


def reference_attention(q, kc, vc, table, ctx):
    """One query row [H, D] against positions [0, ctx) of its paged context."""
    hkv, _, bs, d = kc.shape
    pos = torch.arange(ctx)
    blk = table[pos // bs].long()
    k = kc[:, blk, pos % bs].repeat_interleave(q.shape[0] // hkv, 0)  # [H, ctx, D]
    v = vc[:, blk, pos % bs].repeat_interleave(q.shape[0] // hkv, 0)
    p = ((k @ q[:, :, None])[..., 0] * d**-0.5).softmax(-1)
    return (p[:, None, :] @ v)[:, 0]


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
def test_paged_attention_matches_reference(heads, kv_heads, dim):
    bs, blocks = 16, 64
    g = torch.Generator().manual_seed(heads * dim)
    kc = torch.randn(kv_heads, blocks, bs, dim, generator=g)
    vc = torch.randn(kv_heads, blocks, bs, dim, generator=g)
    tables = torch.randperm(blocks, generator=g)[:60].view(4, 15).int().contiguous()
    # (row0, rows, table, ctx0): decodes of several lengths (block edges included) and prefill
    # chunks continuing a cached prefix (each row sees one more position than the last).
    segments = [(0, 1, 0, 1), (1, 1, 1, 16), (2, 1, 2, 17), (3, 21, 3, 150), (24, 9, 0, 5)]
    rows = 33
    q_full = torch.randn(rows, heads + kv_heads, dim, generator=g)
    q = q_full[:, :heads]  # strided rows, as the model passes them
    out = torch.zeros(rows, heads, dim)
    seg = torch.tensor(segments, dtype=torch.int32)
    EXT.paged_attention_into(q, tile_k(kc, LANES), vc, tables, seg, dim**-0.5, out)
    for row0, n, t, ctx0 in segments:
        for i in range(n):
            ref = reference_attention(q[row0 + i], kc, vc, tables[t], ctx0 + i)
            torch.testing.assert_close(out[row0 + i], ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "bs"),
    [(9, 3, 64, 16), (16, 1, 64, 32), (8, 8, 128, 64), (6, 2, 256, 16), (4, 4, 16, 16)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_long_segments_go_by_lanes_and_match_the_reference(heads, kv_heads, dim, bs, dtype):
    """Prompt chunks of 16 rows or more run with queries across vector lanes (run_lanes):
    fresh prompts (context from 1) and chunks after a cached prefix, every group size the
    kernel takes; and a row's result does not depend on how its prompt was chunked (a float32
    or a 16-bit cache)."""
    blocks = 40
    g = torch.Generator().manual_seed(heads * dim + bs)
    kc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    vc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    width = -(-300 // bs)
    tables = torch.randperm(blocks, generator=g)[: 2 * width].view(2, width).int().contiguous()
    span = min(width * bs - 40, 157)  # rows of the fresh prompt below
    segments = [(0, span, 0, 1), (span, 37, 1, 3)]
    rows = span + 37
    q = torch.randn(rows, heads + kv_heads, dim, generator=g)[:, :heads]
    out = torch.zeros(rows, heads, dim)
    EXT.paged_attention_into(
        q, tile_k(kc, LANES), vc, tables, torch.tensor(segments, dtype=torch.int32), dim**-0.5, out
    )
    for row0, n, t, ctx0 in segments:
        for i in range(0, n, 7):
            ref = reference_attention(q[row0 + i], kc.float(), vc.float(), tables[t], ctx0 + i)
            torch.testing.assert_close(out[row0 + i], ref, rtol=1e-5, atol=2e-6)
    # the same fresh prompt in two chunks of 16+ rows: bit-identical rows
    cut = span // 2
    split = torch.tensor([(0, cut, 0, 1), (cut, span - cut, 0, 1 + cut)], dtype=torch.int32)
    again = torch.zeros(rows, heads, dim)
    EXT.paged_attention_into(q, tile_k(kc, LANES), vc, tables, split, dim**-0.5, again)
    assert torch.equal(again[:span], out[:span])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (4, 4, 16)])
def test_a_verification_row_is_bit_identical_to_the_same_row_decoded_alone(
    heads, kv_heads, dim, dtype
):
    """Speculative verification runs a request's last token and its drafts as one short
    segment; each row must be what a one-row decode at that length gives, bit for bit, so that
    drafts cannot change a greedy output. Contexts on and off block edges, 1-15 rows; float32
    and 16-bit caches (`--kv-cache-dtype`)."""
    bs, blocks = 16, 64
    g = torch.Generator().manual_seed(heads * dim + 7)
    kc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    vc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    tables = torch.randperm(blocks, generator=g)[:60].view(2, 30).int().contiguous()
    for rows, ctx0 in ((2, 1), (5, 14), (5, 800 // 2), (8, 33), (15, 47)):
        q = torch.randn(rows, heads, dim, generator=g)
        out = torch.zeros(rows, heads, dim)
        seg = torch.tensor([(0, rows, 1, ctx0)], dtype=torch.int32)
        EXT.paged_attention_into(q, tile_k(kc, LANES), vc, tables, seg, dim**-0.5, out)
        for i in range(rows):
            alone = torch.zeros(1, heads, dim)
            one = torch.tensor([(0, 1, 1, ctx0 + i)], dtype=torch.int32)
            EXT.paged_attention_into(
                q[i : i + 1], tile_k(kc, LANES), vc, tables, one, dim**-0.5, alone
            )
            assert torch.equal(alone[0], out[i]), (rows, ctx0, i)
            ref = reference_attention(q[i], kc.float(), vc.float(), tables[1], ctx0 + i)
            torch.testing.assert_close(out[i], ref, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "bs"),
    [(9, 3, 64, 16), (8, 2, 128, 32), (4, 4, 16, 16), (16, 1, 64, 64), (6, 2, 256, 16)],
)
def test_a_row_is_the_same_bits_whichever_kernel_runs_it(heads, kv_heads, dim, bs, dtype):
    """The batch-invariance promise of attention: a prompt's rows computed as one long segment
    (queries across lanes), in chunks of every size, 16+ rows and fewer (keys across lanes), or
    one row at a time as decodes give bit-identical outputs, so a prefix-cache hit, a chunked
    prompt, a recomputation after preemption and a decode all see the same values."""
    blocks = 48
    g = torch.Generator().manual_seed(heads * dim + bs + 3)
    kc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    vc = torch.randn(kv_heads, blocks, bs, dim, generator=g).to(dtype)
    width = -(-260 // bs)
    tables = torch.randperm(blocks, generator=g)[:width].view(1, width).int().contiguous()
    span = min(width * bs - 1, 203)
    q = torch.randn(span, heads + kv_heads, dim, generator=g)[:, :heads]

    def run(cuts):
        out = torch.zeros(span, heads, dim)
        edges = [0, *cuts, span]
        seg = [(a, b - a, 0, 1 + a) for a, b in itertools.pairwise(edges) if b > a]
        EXT.paged_attention_into(
            q, tile_k(kc, LANES), vc, tables, torch.tensor(seg, dtype=torch.int32), dim**-0.5, out
        )
        return out

    whole = run([])  # one segment: lanes
    for cuts in ([1, 2, 3, 9, 40, 41, 57], list(range(1, span)), [15, 31, 47, 100, 117, 133]):
        assert torch.equal(run(cuts), whole), cuts
    for i in (0, 15, 16, 17, span - 1):
        ref = reference_attention(q[i], kc.float(), vc.float(), tables[0], 1 + i)
        torch.testing.assert_close(whole[i], ref, rtol=1e-5, atol=2e-6)


def test_paged_attention_rejects_a_segment_past_its_table():
    kc = torch.zeros(1, 4, 16, 64)
    tables = torch.zeros(1, 2, dtype=torch.int32)
    seg = torch.tensor([[0, 1, 0, 40]], dtype=torch.int32)  # 40 positions need 3 blocks
    with pytest.raises(RuntimeError, match="out of range"):
        EXT.paged_attention_into(
            torch.zeros(1, 1, 64), kc, kc, tables, seg, 0.125, torch.zeros(1, 1, 64)
        )


def test_k_tiles_round_trip_through_the_python_writer_and_readers():
    """The K cache layout the kernels read (tiles of LANES keys, dimension-major): what
    `write_kv` stores with a tile, `read_k` and `untile_k` read back, and `tile_k` makes."""
    from tierserve.model.attention.base import read_k, untile_k, write_kv

    g = torch.Generator().manual_seed(11)
    h, nb, bs, d = 2, 6, 2 * LANES, 32
    logical = torch.randn(h, nb, bs, d, generator=g)
    assert torch.equal(untile_k(tile_k(logical, LANES), LANES), logical)
    cache = torch.zeros(h, nb, bs, d)
    slots = torch.randperm(nb * bs, generator=g)[:37]
    x = logical.view(h, nb * bs, d)[:, slots].transpose(0, 1)  # [T, H, D]
    write_kv(cache, slots, x, LANES)
    assert torch.equal(read_k(cache, slots, LANES), x.transpose(0, 1))
    every = torch.arange(nb * bs)
    write_kv(cache, every, logical.view(h, nb * bs, d).transpose(0, 1), LANES)
    assert torch.equal(cache, tile_k(logical, LANES))
