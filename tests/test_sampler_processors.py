"""Per-request logits processing in the batched sampler (issue 15): penalties against a per-row
reference of vLLM's semantics, incremental token counts, logit_bias, min_tokens, grammar
bitmasks, top-k logprobs; and rows that use none of these are untouched by rows that do."""

import pytest
import torch

from tierserve.model.logprobs import score_positions
from tierserve.model.penalties import TokenCounts
from tierserve.model.processors import apply_token_bitmask, unpack_bitmask
from tierserve.model.sampler import GrammarMasks, Sampler, SampleRow
from tierserve.sampling_params import SamplingParams

CPU = torch.device("cpu")
V = 300


def logits_for(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def reference_penalties(row: torch.Tensor, prompt, output, p: SamplingParams) -> torch.Tensor:
    """vLLM's penalties for one row, token by token."""
    row = row.clone()
    for t in set(prompt) | set(output):
        x = row[t]
        row[t] = x / p.repetition_penalty if x > 0 else x * p.repetition_penalty
    for t in set(output):
        row[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return row


def test_penalties_match_the_per_row_reference():
    params = [
        SamplingParams(temperature=0, presence_penalty=1.5),
        SamplingParams(temperature=0, frequency_penalty=-0.7, repetition_penalty=1.3),
        SamplingParams(temperature=0, repetition_penalty=0.6, presence_penalty=-2.0),
    ]
    histories = [([1, 2, 3, 3], [4, 4, 4, 9]), ([7, 8], [8, 8, 1, 299]), ([5], [])]
    counts = TokenCounts(V, CPU, capacity=1)  # grows on the way
    rows = []
    for p, (prompt, out) in zip(params, histories, strict=True):
        rows.append(SampleRow(p, len(out), counts.add(prompt, out)))
    logits = logits_for(3)
    got = Sampler(CPU).sample(logits.clone(), rows, counts)
    for i, (p, (prompt, out)) in enumerate(zip(params, histories, strict=True)):
        ref = reference_penalties(logits[i], prompt, out, p)
        assert got.tokens[i] == int(ref.argmax()), i
        # the reported logprob is the raw model's (vLLM's raw_logprobs)
        raw = torch.log_softmax(logits[i], -1)[got.tokens[i]]
        assert got.logprobs[i] == pytest.approx(float(raw), abs=1e-5)


def test_token_counts_updated_incrementally_equal_counts_built_at_once():
    inc = TokenCounts(V, CPU, capacity=1)
    a, b = inc.add([1, 2], [3]), inc.add([9], [])
    steps = [[5, 6], [5, 9], [3, 9], [7, 9]]
    for ta, tb in steps:
        inc.append([a, b], [ta, tb])
    inc.release(a)
    c = inc.add([4], [4, 4])  # reuses a's slot: nothing of a's history may remain
    assert c == a
    fresh = TokenCounts(V, CPU)
    b2 = fresh.add([9], [s[1] for s in steps])
    c2 = fresh.add([4], [4, 4])
    assert torch.equal(inc.counts[b], fresh.counts[b2])
    assert torch.equal(inc.in_prompt[b], fresh.in_prompt[b2])
    assert torch.equal(inc.counts[c], fresh.counts[c2])
    assert torch.equal(inc.in_prompt[c], fresh.in_prompt[c2])
    assert inc.counts[b, 9] == 3 and inc.counts[c, 4] == 2


def test_logit_bias_and_min_tokens():
    logits = logits_for(4, seed=1)
    top = [int(t) for t in logits.argmax(-1)]
    rows = [
        SampleRow(SamplingParams(temperature=0, logit_bias={17: 100}), 0),
        SampleRow(SamplingParams(temperature=0, logit_bias={top[1]: -100}), 0),
        # min_tokens: EOS (the row's) and stop ids are masked until 3 tokens are out
        SampleRow(SamplingParams(temperature=0, min_tokens=3, stop_token_ids=(top[2],)), 2),
        SampleRow(SamplingParams(temperature=0, min_tokens=3), 2, eos=top[3]),
    ]
    got = Sampler(CPU).sample(logits.clone(), rows).tokens
    assert got[0] == 17
    assert got[1] == int(logits[1].topk(2).indices[1])
    assert got[2] != top[2] and got[3] != top[3]
    done = [SampleRow(r.params, 3, eos=r.eos) for r in rows[2:]]  # min_tokens reached
    assert Sampler(CPU).sample(logits[2:].clone(), done).tokens == top[2:]


def test_plain_rows_are_untouched_by_rows_that_use_processors():
    logits = logits_for(6, seed=2)
    plain = [
        SampleRow(SamplingParams(temperature=0), 0),
        SampleRow(SamplingParams(temperature=0.8, top_p=0.9, seed=5), 4),
        SampleRow(SamplingParams(temperature=1.0, seed=11), 0),
    ]
    counts = TokenCounts(V, CPU)
    busy = [
        SampleRow(SamplingParams(temperature=0.7, seed=3, frequency_penalty=1.0), 2,
                  counts.add([1], [2, 2])),
        SampleRow(SamplingParams(temperature=0, logit_bias={3: 50}, top_logprobs=4), 0),
        SampleRow(SamplingParams(temperature=1.0, min_tokens=5, seed=8), 1, eos=0),
    ]  # fmt: skip
    alone = Sampler(CPU).sample(logits[:3].clone(), plain)
    mixed = Sampler(CPU).sample(logits.clone(), plain + busy, counts)
    assert mixed.tokens[:3] == alone.tokens
    assert mixed.logprobs[:3] == alone.logprobs
    assert set(mixed.top) == {4} and not alone.top
    # and a seeded processed row draws the same token whatever its neighbours
    solo = Sampler(CPU).sample(logits[3:4].clone(), busy[:1], counts)
    assert solo.tokens[0] == mixed.tokens[3]


def test_top_logprobs_are_the_raw_top_k():
    logits = logits_for(3, seed=4)
    rows = [
        SampleRow(SamplingParams(temperature=0, top_logprobs=5), 0),
        SampleRow(SamplingParams(temperature=0.5, top_logprobs=2, seed=1), 0),
        SampleRow(SamplingParams(temperature=0), 0),
    ]
    got = Sampler(CPU).sample(logits.clone(), rows)
    ref = torch.log_softmax(logits, -1).topk(5)
    assert set(got.top) == {0, 1}
    for i, k in ((0, 5), (1, 2)):
        ids, lps = got.top[i]
        assert list(ids) == ref.indices[i, :k].tolist()
        assert lps == pytest.approx(ref.values[i, :k].tolist(), abs=1e-5)
    assert got.top[0][0][0] == got.tokens[0]  # greedy: the chosen token is the most likely


def test_grammar_bitmask_restricts_rows_and_reports_masked_logprobs():
    words = (V + 31) // 32
    allowed = [{5, 40, 299}, {0, 31, 32, 64}]
    bitmask = torch.zeros(2, words, dtype=torch.int32)
    for g, toks in enumerate(allowed):
        for t in toks:
            w = bitmask[g, t // 32].item() | (1 << (t % 32))
            bitmask[g, t // 32] = w - (1 << 32) if w >= 1 << 31 else w
    unpacked = unpack_bitmask(bitmask, V)
    assert [set(torch.nonzero(r).flatten().tolist()) for r in unpacked] == allowed
    logits = logits_for(3, seed=5)
    rows = [
        SampleRow(SamplingParams(temperature=0), 0),
        SampleRow(SamplingParams(temperature=1.0, seed=2), 0),
        SampleRow(SamplingParams(temperature=0, top_logprobs=6), 0),
    ]
    got = Sampler(CPU).sample(logits.clone(), rows, masks=GrammarMasks([1, 2], bitmask))
    assert got.tokens[0] == int(logits[0].argmax())  # no grammar: untouched
    assert got.tokens[1] in allowed[0] and got.tokens[2] in allowed[1]
    masked = logits[2].clone()
    apply_token_bitmask(masked[None], [0], bitmask[1:])
    assert got.tokens[2] == int(masked.argmax())
    ids, lps = got.top[2]
    assert set(ids[:4]) == allowed[1] and all(lp == float("-inf") for lp in lps[4:])
    lp = torch.log_softmax(masked, -1)[got.tokens[2]]  # under the masked distribution
    assert got.logprobs[2] == pytest.approx(float(lp), abs=1e-5)


def test_score_positions_in_chunks_equal_one_pass(monkeypatch):
    import tierserve.model.logprobs as lp

    head_w = torch.randn(8, V, generator=torch.Generator().manual_seed(6))
    hidden = torch.randn(10, 8, generator=torch.Generator().manual_seed(7))
    targets = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(8))
    whole = score_positions(lambda h: h @ head_w, hidden, targets, 3)
    monkeypatch.setattr(lp, "CHUNK_ROWS", 3)
    chunked = score_positions(lambda h: h @ head_w, hidden, targets, 3)
    assert chunked[0] == pytest.approx(whole[0], abs=1e-5) and chunked[1] == whole[1]
    ref = torch.log_softmax(hidden @ head_w, -1)
    assert whole[0] == pytest.approx(ref.gather(1, targets[:, None]).flatten().tolist(), abs=1e-5)
