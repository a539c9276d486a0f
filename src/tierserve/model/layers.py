"""Small building blocks of the Llama forward pass: RMSNorm and rotary embeddings."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)  # one fused kernel
    xf = x.float()  # half types: normalise in float32, as transformers does
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


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
