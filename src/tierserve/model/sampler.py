"""Batched sampling: greedy, temperature, top-k, top-p, min-p, seeds, penalties, `logit_bias`,
`min_tokens`, grammar masks, logprobs. One step samples all its rows with a few tensor
operations, never a Python loop over rows' logits:

1. Rows with a grammar get its token mask on their raw logits (`processors.apply_token_bitmask`:
   a bitmask the executor's matchers filled for this step's grammar rows only).
2. ``lse`` and ``argmax`` over every row: greedy rows with nothing else to apply take the argmax
   exactly, and every row's logprob (chosen token and top-k, `logprobs.py`) is read here, under
   the model's raw distribution (vLLM's default ``raw_logprobs``).
3. The rows that sample or use a per-request processor are gathered once (``[S', V]``) and go
   through the stages in order, each applied only to the rows whose parameters ask for it:
   `min_tokens` (EOS and stop ids masked), `logit_bias`, penalties (from `TokenCounts`, the
   executor's per-request counts; `processors.py`), then, for sampling rows, temperature,
   top-k, top-p, min-p. Greedy rows among them take the argmax of the processed logits.
4. The draw is the Gumbel-max trick, ``argmax(logits + G)`` with ``G = -log(-log(u))``, which
   samples softmax(logits) exactly. ``u`` is a counter-based hash of (row key, token id): a
   seeded request's key is a hash of (seed, output index), so the same seed gives the same text
   whatever the batch and after preemption and recompute; unseeded rows draw their keys from
   the sampler's generator. The compiled kernel (`tierserve.kernels`) computes the same noise
   and skips tokens too far below the row's maximum to win; the PyTorch path below is its
   reference.

A plain row (no penalty, bias, min_tokens, grammar or top-k logprobs) costs two attribute
checks beyond what it cost before these features.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tierserve.logprobs import TopLogprobs
from tierserve.model.logprobs import TopRows, top_logprobs
from tierserve.model.penalties import TokenCounts
from tierserve.model.processors import apply_token_bitmask, needs_processing, process_logits
from tierserve.sampling_params import SamplingParams

_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SampleRow:
    params: SamplingParams
    output_index: int  # how many tokens the request has generated before this one
    slot: int = -1  # the request's slot in the penalty TokenCounts (-1: none)
    eos: int | None = None  # the request's EOS, masked with stop_token_ids until min_tokens

    def stop_ids(self) -> tuple[int, ...]:
        p = self.params
        eos = () if self.eos is None or p.ignore_eos else (self.eos,)
        return eos + p.stop_token_ids


@dataclass
class GrammarMasks:
    """This step's grammar bitmasks: row `rows[g]` of the logits gets `bitmask[g]`."""

    rows: list[int]
    bitmask: torch.Tensor  # int32 [G, ceil(V / 32)]


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[float]  # the chosen tokens' (NaN: the row's logits were not finite)
    top: dict[int, TopLogprobs] = field(default_factory=dict)  # rows that asked for top-k


def fmix32(h):
    """MurmurHash3's 32-bit finaliser on Python ints or int64 tensors holding 32-bit values
    (products are masked, so int64 wrap-around keeps the right low bits)."""
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & _M32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & _M32
    return h ^ (h >> 16)


def seeded_key(seed: int, output_index: int) -> int:
    """The noise key of a seeded request's `output_index`-th token."""
    s = seed & ((1 << 64) - 1)
    h = fmix32(fmix32(s & _M32) ^ (s >> 32))
    return fmix32(h ^ ((output_index * 0x9E3779B9 + 0x7F4A7C15) & _M32))


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """G[r, v] = -log(-log(u)), u = ((hash(key_r, v) >> 9) + 0.5) / 2^23 in [2^-24, 1 - 2^-24]
    (float32, exactly as kernels/csrc/sample.cpp computes it)."""
    v = torch.arange(vocab, dtype=torch.int64, device=keys.device)
    vh = fmix32((v * 0x9E3779B9 + 1) & _M32)
    h = fmix32(vh[None, :] ^ keys[:, None])
    u = ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))
    return -torch.log(-torch.log(u))


def gumbel_argmax(logits: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Reference draw: one token per row of (filtered) logits."""
    return torch.argmax(logits + gumbel_noise(keys, logits.shape[1]), dim=-1)


def filter_logits(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p for a batch of rows, each row with its own values;
    a stage runs only on the rows that use it. Returns new logits, excluded tokens at -inf."""
    dev, vocab = logits.device, logits.shape[1]
    temp = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=dev)
    logits = logits / temp[:, None]
    rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
    if rows:
        r = torch.tensor(rows, device=dev)
        ks = [params[i].top_k for i in rows]
        k = torch.tensor(ks, device=dev)
        sub = logits[r]
        kth = torch.topk(sub, max(ks)).values.gather(1, (k - 1)[:, None])  # (k from the host)
        logits[r] = sub.masked_fill(sub < kth, float("-inf"))
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if rows:
        r = torch.tensor(rows, device=dev)
        top_p = torch.tensor([params[i].top_p for i in rows], dtype=logits.dtype, device=dev)
        sub = logits[r]
        sorted_logits, idx = torch.sort(sub, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs >= top_p[:, None]  # keep the token that crosses top_p
        logits[r] = sub.masked_fill(torch.zeros_like(drop).scatter(1, idx, drop), float("-inf"))
    rows = [i for i, p in enumerate(params) if p.min_p > 0.0]
    if rows:
        r = torch.tensor(rows, device=dev)
        min_p = torch.tensor([params[i].min_p for i in rows], dtype=logits.dtype, device=dev)
        sub = logits[r]
        probs = sub.softmax(-1)
        low = probs < min_p[:, None] * probs.max(-1, keepdim=True).values
        logits[r] = sub.masked_fill(low, float("-inf"))
    return logits


def read_back(tokens: torch.Tensor, chosen: torch.Tensor, top: TopRows | None) -> Sampled:
    """What a step produced, brought to the host in one device-to-host copy: the tokens, their
    logprobs and the asked-for top-k packed into one float64 tensor (token ids and float32
    values are exact in float64), so a GPU step waits for the device once."""
    parts = [tokens.to(torch.float64), chosen.to(torch.float64)]
    if top is not None:
        parts += [top.ids.reshape(-1).to(torch.float64), top.logprobs.reshape(-1).to(torch.float64)]
    flat = torch.cat(parts).tolist()  # the one copy
    n = tokens.shape[0]
    toks, lps = [int(t) for t in flat[:n]], flat[n : 2 * n]
    return Sampled(toks, lps, top.unpack(flat[2 * n :]) if top is not None else {})


class Sampler:
    def __init__(self, device: torch.device, seed: int | None = None, kernels=None) -> None:
        self.device = device
        self.kernels = kernels  # the compiled module, or None for the PyTorch draw
        self._rng = torch.Generator(device="cpu")
        self._rng.seed() if seed is None else self._rng.manual_seed(seed)

    def _keys(self, rows: list[SampleRow]) -> torch.Tensor:
        # (a host generator's draw: numpy's list, no device read)
        fresh = torch.randint(0, 1 << 32, (len(rows),), generator=self._rng).numpy().tolist()
        keys = [
            fresh[i] if r.params.seed is None else seeded_key(r.params.seed, r.output_index)
            for i, r in enumerate(rows)
        ]
        return torch.tensor(keys, dtype=torch.int64, device=self.device)

    @torch.inference_mode()
    def sample(
        self,
        logits: torch.Tensor,
        rows: list[SampleRow],
        counts: TokenCounts | None = None,
        masks: GrammarMasks | None = None,
    ) -> Sampled:
        """logits: [S, V] float32 (grammar rows are masked in place). Returns token ids, their
        logprobs under the model's raw distribution, and the top-k of the rows that ask."""
        if masks is not None:
            apply_token_bitmask(logits, masks.rows, masks.bitmask)
        if self.kernels is not None and logits.device.type == "cpu" and logits.stride(-1) == 1:
            tokens, lse = self.kernels.argmax_logsumexp(logits)  # one kernel, 2 reads a row
        else:
            lse = torch.logsumexp(logits, dim=-1)
            tokens = torch.argmax(logits, dim=-1)
        work = [i for i, r in enumerate(rows) if r.params.temperature != 0.0 or needs_processing(r)]
        if work:
            wrows = [rows[i] for i in work]
            idx = torch.tensor(work, device=logits.device)
            sub = logits[idx]
            if any(needs_processing(r) for r in wrows):
                sub = process_logits(sub, wrows, counts)
            tokens[idx] = self._draw(sub, wrows)
        chosen = logits.gather(1, tokens[:, None]).squeeze(1) - lse
        return read_back(tokens, chosen, top_logprobs(logits, lse, rows))

    def _draw(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """Greedy rows: the argmax; the others: filtered, then the Gumbel-max draw."""
        sampled = [j for j, r in enumerate(rows) if r.params.temperature != 0.0]
        if not sampled:
            return torch.argmax(logits, dim=-1)
        srows = [rows[j] for j in sampled]
        every = len(sampled) == len(rows)
        sub = logits if every else logits[sampled]
        filtered = filter_logits(sub, [r.params for r in srows])
        keys = self._keys(srows)
        if self.kernels is not None and filtered.device.type == "cpu":
            drawn = self.kernels.gumbel_argmax(filtered, keys)
        else:
            drawn = gumbel_argmax(filtered, keys)
        if every:
            return drawn
        out = torch.argmax(logits, dim=-1)
        out[torch.tensor(sampled, device=logits.device)] = drawn
        return out
