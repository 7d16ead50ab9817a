"""Dropout between stacked layers with bool masks (1 byte per element saved for backward)."""
from __future__ import annotations

import torch


def dropout_keep(shape, dtype: torch.dtype, device: torch.device, p: float) -> torch.Tensor:
    """Bool keep-mask, drawn as F.dropout draws its noise on CPU (the same RNG stream), so a
    layer with inter-layer dropout matches torch.nn's under the same seed."""
    return torch.empty(shape, dtype=dtype, device=device).bernoulli_(1 - p).bool()


def dropout(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout with a given bool keep-mask: ``x * keep / (1 - p)`` (zeros at p = 1)."""
    return _MaskedDropout.apply(x, keep, 0.0 if p >= 1 else 1.0 / (1 - p))


class _MaskedDropout(torch.autograd.Function):
    """Dropout that saves its bool mask (F.dropout on CPU saves a float mask)."""

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return torch.where(keep, x * scale, 0.0)

    @staticmethod
    def backward(ctx, grad):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, grad * ctx.scale, 0.0), None, None
