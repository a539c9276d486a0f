"""Batch inputs built with array operations from persistent block tables: positions, KV slots,
kernel segments and the PyTorch path's padded tables, against per-token definitions."""

import random

import torch

from tierserve.executor.batch import build_batch
from tierserve.executor.block_table import BlockTables
from tierserve.executor.state import RequestState
from tierserve.model.attention import KernelPagedAttention, TorchPagedAttention
from tierserve.sampling_params import SamplingParams

BS = 4
TORCH, KERNEL = TorchPagedAttention(), KernelPagedAttention(kernels=None)  # metadata only


def make_states(tables: BlockTables, specs):
    """specs: (tokens, computed); each request gets shuffled, distinct block ids."""
    ids = list(range(1000))
    random.Random(0).shuffle(ids)
    states = {}
    for i, (n_tokens, computed) in enumerate(specs):
        blocks = [ids.pop() for _ in range(-(-n_tokens // BS))]
        st = RequestState(list(range(n_tokens)), n_tokens, blocks, computed, SamplingParams())
        st.table_row = tables.assign(blocks)
        states[f"r{i}"] = st
    return states


def test_tables_grow_in_rows_and_width_and_reuse_released_rows():
    t = BlockTables(rows=2, width=2)
    a, b = t.assign([1, 2]), t.assign([3])
    t.extend(b, [4, 5, 6])  # past the width
    c = t.assign([7])  # past the rows
    assert t.array[a, :2].tolist() == [1, 2]
    assert t.array[b, :4].tolist() == [3, 4, 5, 6]
    assert t.array[c, 0] == 7 and len({a, b, c}) == 3
    t.release(a)
    assert t.assign([9]) == a


def test_positions_slots_and_segments_match_per_token_definitions():
    tables = BlockTables(rows=2, width=2)  # forces growth while assigning
    # a fresh prompt, a chunk after a cached prefix, two decodes (one at a block edge)
    states = make_states(tables, [(11, 0), (30, 13), (9, 8), (17, 16)])
    sched = {"r0": 11, "r1": 10, "r2": 1, "r3": 1}
    for backend in (TORCH, KERNEL):
        b = build_batch(states, sched, BS, tables, backend)
        pos, slots, ids = [], [], []
        for rid, n in sched.items():
            st = states[rid]
            for p in range(st.num_computed, st.num_computed + n):
                pos.append(p)
                slots.append(st.block_ids[p // BS] * BS + p % BS)
                ids.append(st.tokens[p])
        assert b.positions.tolist() == pos
        assert b.meta.slot_mapping.tolist() == slots
        assert b.input_ids.tolist() == ids
        assert b.logits_rows.tolist() == [10, 21, 22]  # r1 stops short of its known tokens
    rows = {rid: states[rid].table_row for rid in sched}
    # Batch-invariant (the default): the fresh prompt is a segment too, attending through the
    # cache as a cached prefix or a decode would.
    b = build_batch(states, sched, BS, tables, KERNEL)
    assert b.meta.segments.tolist() == [
        [0, 11, rows["r0"], 1],
        [11, 10, rows["r1"], 14],
        [21, 1, rows["r2"], 9],
        [22, 1, rows["r3"], 17],
    ]
    assert not b.meta.fresh and b.meta.all_cached
    # --batch-invariant off: the fresh prompt attends to its own keys (SDPA).
    loose = KernelPagedAttention(kernels=None)
    loose.invariant = False
    b = build_batch(states, sched, BS, tables, loose)
    assert b.meta.segments.tolist() == [
        [11, 10, rows["r1"], 14],
        [21, 1, rows["r2"], 9],
        [22, 1, rows["r3"], 17],
    ]
    assert [(p.start, p.end) for p in b.meta.fresh] == [(0, 11)]
    fused = build_batch(states, sched, BS, tables, KERNEL, fused=True)
    assert fused.meta.segments.tolist()[0] == [0, 11, rows["r0"], 1] and fused.meta.all_cached
    assert fused.meta.fused and not fused.meta.fresh
    b = build_batch(states, sched, BS, tables, TORCH)  # the PyTorch path's padded decode tables
    width = 5  # 17 positions need 5 blocks of 4
    assert b.meta.decode_rows.tolist() == [21, 22]
    expect = [(states[r].block_ids + [0] * width)[:width] for r in ("r2", "r3")]
    got = b.meta.decode_blocks.view(2, width).tolist()
    assert got[1] == expect[1] and got[0][:3] == expect[0][:3]
    bias = b.meta.decode_bias(None, 1)[:, 0]  # 0 = attend, -inf = padding past each context
    assert (bias[0, :9] == 0).all() and torch.isinf(bias[0, 9:]).all()
    assert (bias[1, :17] == 0).all() and torch.isinf(bias[1, 17:]).all()
    # a sliding window of 4: each decode sees its last 4 positions (itself included)
    win = b.meta.decode_bias(4, 2)[:, 0]  # one row per (kv head, decode)
    assert win.shape[0] == 4 and torch.equal(win[:2], win[2:])
    assert (
        torch.isinf(win[0, :5]).all() and (win[0, 5:9] == 0).all() and torch.isinf(win[0, 9:]).all()
    )
    assert torch.isinf(win[1, :13]).all() and (win[1, 13:17] == 0).all()
