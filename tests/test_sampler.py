"""The batched sampler: filters per row, greedy rows exact, seeded draws independent of the batch,
the Gumbel-max draw's distribution, and the compiled draw against the PyTorch reference."""

import pytest
import torch

from tierserve import kernels
from tierserve.model.sampler import (
    Sampler,
    SampleRow,
    filter_logits,
    gumbel_argmax,
    seeded_key,
)
from tierserve.sampling_params import SamplingParams

CPU = torch.device("cpu")
EXT = kernels.get()
DRAWS = [pytest.param(None, id="pytorch")] + (
    [pytest.param(EXT, id="kernel")] if EXT is not None else []
)


def test_filters_on_a_batch_equal_each_row_alone():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 500, generator=g) * 3
    params = [
        SamplingParams(temperature=0.7),
        SamplingParams(top_k=5),
        SamplingParams(top_p=0.8, temperature=1.3),
        SamplingParams(min_p=0.05),
        SamplingParams(top_k=40, top_p=0.9, min_p=0.01, temperature=0.5),
        SamplingParams(top_k=3),
    ]
    batch = filter_logits(logits, params)
    for i, p in enumerate(params):
        assert torch.equal(batch[i], filter_logits(logits[i : i + 1], [p])[0]), i
    assert torch.isfinite(batch[1]).sum() == 5 and torch.isfinite(batch[5]).sum() == 3


@pytest.mark.parametrize("ext", DRAWS)
def test_greedy_rows_are_argmax_and_logprobs_are_unfiltered(ext):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 1000, generator=g) * 4
    rows = [
        SampleRow(SamplingParams(temperature=0.0 if i % 2 else 1.0, top_k=3), i) for i in range(8)
    ]
    out = Sampler(CPU, seed=0, kernels=ext).sample(logits, rows)
    tokens, lps = out.tokens, out.logprobs
    ref = torch.log_softmax(logits, -1)
    for i, (t, lp) in enumerate(zip(tokens, lps, strict=True)):
        if i % 2:
            assert t == int(logits[i].argmax())
        else:  # sampled within its top 3
            assert t in logits[i].topk(3).indices.tolist()
        assert lp == pytest.approx(float(ref[i, t]), abs=1e-5)


@pytest.mark.parametrize("ext", DRAWS)
def test_seeded_row_draws_the_same_token_whatever_the_batch(ext):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(12, 2000, generator=g)
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    s = Sampler(CPU, kernels=ext)
    for index in range(20):
        alone = s.sample(logits[:1], [SampleRow(seeded, index)]).tokens[0]
        others = [SampleRow(SamplingParams(temperature=0.8), 0) for _ in range(11)]
        mixed = s.sample(logits, [SampleRow(seeded, index), *others]).tokens[0]
        assert mixed == alone
    draws = {s.sample(logits[:1], [SampleRow(seeded, i)]).tokens[0] for i in range(20)}
    assert len(draws) > 5  # the output index changes the noise


@pytest.mark.parametrize("ext", DRAWS)
def test_draws_follow_the_distribution(ext):
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    n = 20_000
    logits = probs.log()[None].repeat(n, 1)
    keys = torch.tensor([seeded_key(7, i) for i in range(n)])
    draw = gumbel_argmax if ext is None else ext.gumbel_argmax
    freq = torch.bincount(draw(logits, keys), minlength=5).float() / n
    # 5 sigma of a binomial proportion at n = 20,000 is at most 0.018
    assert (freq - probs).abs().max() < 0.018, freq


@pytest.mark.skipif(EXT is None, reason="kernels not built")
def test_kernel_draw_matches_the_reference_draw():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 49152, generator=g) * torch.linspace(0.5, 12, 64)[:, None]
    logits[::3, ::7] = float("-inf")  # filtered tokens
    keys = torch.randint(0, 1 << 32, (64,), generator=g)
    assert torch.equal(EXT.gumbel_argmax(logits, keys), gumbel_argmax(logits, keys))


@pytest.mark.skipif(EXT is None, reason="kernels not built")
@pytest.mark.parametrize("vocab", [1, 7, 8, 9, 100, 49152, 49155])
def test_kernel_argmax_and_logsumexp_match_torch(vocab):
    # The greedy token and every chosen logprob's normaliser come from this kernel: ties go to
    # the lowest id, a NaN wins argmax and poisons the sum, -inf rows stay -inf, +inf wins.
    g = torch.Generator().manual_seed(vocab)
    logits = (torch.randn(6, vocab + 3, generator=g) * 8)[:, :vocab]  # rows strided
    logits[1] = float("-inf")
    if vocab > 2:
        logits[2, vocab // 2] = logits[2, vocab - 1] = float("nan")
        logits[3, vocab - 2] = float("inf")
        logits[4] = logits[4].round()
        logits[4, 1] = logits[4, vocab - 1] = 100.0  # a tie for the maximum
        logits[5, : vocab - 1] = float("-inf")  # one finite logit, last
    tokens, lse = EXT.argmax_logsumexp(logits)
    assert torch.equal(tokens, torch.argmax(logits, dim=-1))
    ref = torch.logsumexp(logits, dim=-1)
    assert torch.allclose(lse, ref, rtol=1e-6, atol=1e-6, equal_nan=True)
