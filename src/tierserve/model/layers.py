"""Small building blocks of the decoder's forward pass: RMSNorm, activations and rotary
embeddings (`Rope`: rotate-half, over all of a head or its first `rotary_dim` dimensions)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)  # one fused kernel
    xf = x.float()  # half types: normalise in float32, as transformers does
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return xf.to(x.dtype) if weight is None else weight * xf.to(x.dtype)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# The gate's activation of a gated MLP, by its transformers name (`hidden_act`).
ACTIVATIONS = {
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r} (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies, with Llama-3 style or linear scaling when the config asks for it."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv.float()
    kind = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return (inv / factor).float()
    if kind == "llama3":
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        return torch.where(medium, smoothed, scaled).float()
    if kind in (None, "default"):
        return inv.float()
    raise ValueError(f"unsupported rope scaling {kind!r} (supported: linear, llama3)")


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin of shape [T, 1, head_dim] for rotate-half rope (computed in float32).
    The sin's first half is negated so that rotating needs no negation (see `apply_rope`)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    sin = emb.sin()
    sin[..., : inv_freq.numel()].neg_()
    return emb.cos().to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim] (any heads: queries and keys can be rotated in one call).
    rotate_half(x) * sin == roll(x, half) * [-sin, sin]: three kernels in all."""
    rolled = torch.roll(x, x.shape[-1] // 2, dims=-1)
    return torch.addcmul(x * cos, rolled, sin_signed)


class Rope:
    """Rotary embedding over the first `rotary_dim` dimensions of each head (all by default),
    from positions; an architecture with another rule subclasses it (`cos_sin`)."""

    def __init__(
        self,
        head_dim: int,
        theta: float,
        scaling: dict | None = None,
        rotary_dim: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.rotary_dim = rotary_dim or head_dim
        self.full = self.rotary_dim == head_dim
        self.inv_freq = rope_inv_freq(self.rotary_dim, theta, scaling).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        return rope_cos_sin(positions, self.inv_freq, dtype)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.full:
            return apply_rope(x, cos, sin)
        r = self.rotary_dim
        return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)
